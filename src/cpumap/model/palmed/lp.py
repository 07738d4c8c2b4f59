"""What every fitting stage shares: the LP solve, an LP's rows, and a model's load on a kernel.

The core LP and the per-form LPs solve through ``_solve`` (HiGHS through scipy), the joint
refit's cutting plane through ``_GrowingLP`` (HiGHS itself, which keeps its basis between
solves), so their solves and seconds add up in one ``_LPStats`` per stage (the build reports
them), and all of them build their bounds, and the stages their predictions, from the same
per-resource load ``_predict``: a kernel takes the max of it, as in
``cpumap.model.resmodel.predict``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np
from scipy.optimize import linprog
from scipy.sparse import csr_matrix

from cpumap.model.palmed.config import Kernel


@dataclass
class _LPStats:
    solves: int = 0
    seconds: float = 0.0
    # the joint refit's size and whether it ran (``refit._polish``): the statistics say
    # when a model is the per-form fits alone
    refit: dict[str, Any] | None = None


def _solve(c: np.ndarray, a_ub: Any, b_ub: np.ndarray, a_eq: Any, b_eq: np.ndarray,
           ub: np.ndarray, stats: _LPStats, lb: np.ndarray | None = None) -> np.ndarray:
    """The small LPs (core, per form), each built and solved once: HiGHS picks the method."""
    t0 = time.perf_counter()
    res = linprog(c, A_ub=a_ub if len(b_ub) else None, b_ub=b_ub if len(b_ub) else None,
                  A_eq=a_eq if len(b_eq) else None, b_eq=b_eq if len(b_eq) else None,
                  bounds=np.stack([np.zeros_like(ub) if lb is None else lb, ub], axis=1),
                  method="highs")
    stats.solves += 1
    stats.seconds += time.perf_counter() - t0
    if res.status != 0:
        raise RuntimeError(f"Palmed LP failed: {res.message}")
    return np.maximum(res.x, 0.0)


class _GrowingLP:
    """min c x  s.t.  a_eq x = b_eq,  rows added by ``add_upper`` (a x <= b),  lb <= x <= ub:
    an LP solved again each time upper-bound rows join it (the joint refit's cutting plane).

    Why HiGHS itself rather than ``linprog``: linprog builds and solves every LP from nothing,
    while here the first solve (interior point, crossover to a vertex) leaves a basis that
    stays dual feasible when rows join, so each later solve is a short dual simplex from it.
    Emerald Rapids-class guest, the native full profile's refit (148,148 kernels x 27
    resources, 6,034 classes; ``fit_model`` resumed from its database, 2026-11-29): 276 s
    for the first LP, then 80, 14, 6 and 6 s for the four that added the 64,000 bounds its
    solutions broke; through linprog the same refit was still in its LPs after 45 min
    (each an interior point solve of the whole LP again).
    """

    def __init__(self, c: np.ndarray, a_eq: Any, b_eq: np.ndarray, lb: np.ndarray,
                 ub: np.ndarray, stats: _LPStats) -> None:
        inf = highspy.kHighsInf
        self._h = highspy.Highs()
        self._h.setOptionValue("output_flag", False)
        self._stats = stats
        a = csr_matrix(a_eq).tocsc()
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = len(c), a.shape[0]
        lp.col_cost_ = np.asarray(c, dtype=float)
        lp.col_lower_ = np.asarray(lb, dtype=float)
        lp.col_upper_ = np.where(np.isinf(ub), inf, ub).astype(float)
        lp.row_lower_ = lp.row_upper_ = np.asarray(b_eq, dtype=float)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = len(c), a.shape[0]
        lp.a_matrix_.start_, lp.a_matrix_.index_ = a.indptr, a.indices
        lp.a_matrix_.value_ = a.data
        self._h.passModel(lp)
        self._solved = False

    def add_upper(self, a: Any, b: np.ndarray) -> None:
        a = csr_matrix(a)
        if not a.shape[0]:
            return
        self._h.addRows(a.shape[0], np.full(a.shape[0], -highspy.kHighsInf),
                        np.asarray(b, dtype=float), a.nnz, a.indptr[:-1].astype(np.int32),
                        a.indices.astype(np.int32), a.data.astype(float))

    def solve(self) -> np.ndarray:
        t0 = time.perf_counter()
        self._h.setOptionValue("solver", "simplex" if self._solved else "ipm")
        self._h.run()
        self._stats.solves += 1
        self._stats.seconds += time.perf_counter() - t0
        status = self._h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            raise RuntimeError(f"Palmed LP failed: {self._h.modelStatusToString(status)}")
        self._solved = True
        return np.maximum(np.asarray(self._h.getSolution().col_value), 0.0)


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
