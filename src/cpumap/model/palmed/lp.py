"""What every fitting stage shares: the LP solve, an LP's rows, and a model's load on a kernel.

The core LP, the per-form LPs and the joint refit all solve through ``_solve`` (HiGHS through
scipy), so their solves and seconds add up in one ``_LPStats`` per stage (the build reports
them), and all of them build their bounds, and the stages their predictions, from the same
per-resource load ``_predict``: a kernel takes the max of it, as in
``cpumap.model.resmodel.predict``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linprog

from cpumap.model.palmed.config import Kernel


@dataclass
class _LPStats:
    solves: int = 0
    seconds: float = 0.0
    # the joint refit's size and whether it ran (``refit._polish``): the statistics say
    # when a model is the per-form fits alone
    refit: dict[str, Any] | None = None


def _solve(c: np.ndarray, a_ub: Any, b_ub: np.ndarray, a_eq: Any, b_eq: np.ndarray,
           ub: np.ndarray, stats: _LPStats, lb: np.ndarray | None = None,
           method: str = "highs") -> np.ndarray:
    """``method``: HiGHS's choice (dual simplex) for the small LPs; the joint refit asks for
    the interior point method (then crossover to a vertex), 3x faster on its LPs of tens of
    thousands of rows (``refit._polish``)."""
    t0 = time.perf_counter()
    res = linprog(c, A_ub=a_ub if len(b_ub) else None, b_ub=b_ub if len(b_ub) else None,
                  A_eq=a_eq if len(b_eq) else None, b_eq=b_eq if len(b_eq) else None,
                  bounds=np.stack([np.zeros_like(ub) if lb is None else lb, ub], axis=1),
                  method=method)
    stats.solves += 1
    stats.seconds += time.perf_counter() - t0
    if res.status != 0:
        raise RuntimeError(f"Palmed LP failed: {res.message}")
    return np.maximum(res.x, 0.0)


@dataclass
class _Row:
    """One measured kernel inside an LP: its multiset, cycles and designated resource."""

    kernel: Kernel
    cycles: float
    designated: int | None  # index of the resource that must be tight, or None
    base_text: str | None = None  # mixes: the SK^s it extends (difference formulation)
    saturated: int | None = None  # mixes: the resource SK^s saturates


def _predict(rho: Mapping[str, Mapping[int, float]], n_res: int,
             k: Mapping[str, int]) -> np.ndarray:
    load = np.zeros(n_res)
    for f, n in k.items():
        for r, v in rho.get(f, {}).items():
            load[r] += n * v
    return load
