"""What every fitting stage shares: the LP solve, an LP's rows, and a model's load on a kernel.

The core LP and the per-form LPs solve through ``_solve``, the joint refit's cutting plane
through ``_GrowingLP`` (which keeps its basis between solves), both on HiGHS itself (highspy),
so their solves and seconds add up in one ``_LPStats`` per stage (the build reports them), and
all of them build their bounds, and the stages their predictions, from the same per-resource
load ``_predict``: a kernel takes the max of it, as in ``cpumap.model.resmodel.predict``.

HiGHS runs single-threaded here (``_highs``): the per-form LPs are small, the noisy passes
solve them in forked worker processes (``forms.set_lp_workers``), and a fork must not copy a
solver whose scheduler threads it leaves behind.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import highspy
import numpy as np
from scipy.sparse import csr_matrix, vstack

from cpumap.model.palmed.config import Kernel


@dataclass
class _LPStats:
    solves: int = 0
    seconds: float = 0.0
    # the joint refit's size and whether it ran (``refit._polish``): the statistics say
    # when a model is the per-form fits alone
    refit: dict[str, Any] | None = None


#: This process's HiGHS instance for ``_solve`` (pid, instance): a forked worker makes its own.
_HIGHS: tuple[int, Any] | None = None


def _highs() -> Any:
    """A quiet, single-threaded HiGHS instance (see the module's docstring)."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    return h


def _highs_lp(c: np.ndarray, a: Any, row_lo: np.ndarray, row_hi: np.ndarray, lb: np.ndarray,
              ub: np.ndarray) -> Any:
    """The LP  min c x  s.t.  row_lo <= a x <= row_hi,  lb <= x <= ub  as HiGHS takes it
    (column-wise matrix, infinities as HiGHS's own)."""
    inf = highspy.kHighsInf
    a = csr_matrix(a, shape=(len(row_lo), len(c))).tocsc()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(c), a.shape[0]
    lp.col_cost_ = np.asarray(c, dtype=float)
    lp.col_lower_ = np.where(np.isinf(lb), -inf, lb).astype(float)
    lp.col_upper_ = np.where(np.isinf(ub), inf, ub).astype(float)
    lp.row_lower_ = np.where(np.isinf(row_lo), -inf, row_lo).astype(float)
    lp.row_upper_ = np.where(np.isinf(row_hi), inf, row_hi).astype(float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = len(c), a.shape[0]
    lp.a_matrix_.start_, lp.a_matrix_.index_ = a.indptr, a.indices
    lp.a_matrix_.value_ = a.data
    return lp


def _solve(c: np.ndarray, a_ub: Any, b_ub: np.ndarray, a_eq: Any, b_eq: np.ndarray,
           ub: np.ndarray, stats: _LPStats, lb: np.ndarray | None = None) -> np.ndarray:
    """The small LPs (core, per form), each built and solved once (HiGHS picks the method).

    Why HiGHS directly rather than scipy's ``linprog``: half the time per LP, the same optima
    (the per-form LPs of a 10-port/300-form simulated fit at 2 % noise, 571 of them: 3.0 ms
    through linprog, 1.5 ms here, objectives equal within 4e-16), and the full profile
    solves some 200,000 of them."""
    global _HIGHS
    t0 = time.perf_counter()
    if _HIGHS is None or _HIGHS[0] != os.getpid():
        _HIGHS = (os.getpid(), _highs())
    h = _HIGHS[1]
    n_ub, n_eq = len(b_ub), len(b_eq)
    a = vstack([csr_matrix(a_ub, shape=(n_ub, len(c))), csr_matrix(a_eq, shape=(n_eq, len(c)))])
    rhs_eq = np.asarray(b_eq, dtype=float)
    h.clearModel()
    h.passModel(_highs_lp(c, a, np.concatenate([np.full(n_ub, -np.inf), rhs_eq]),
                          np.concatenate([np.asarray(b_ub, dtype=float), rhs_eq]),
                          np.zeros(len(c)) if lb is None else lb, ub))
    h.run()
    stats.solves += 1
    stats.seconds += time.perf_counter() - t0
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"Palmed LP failed: {h.modelStatusToString(status)}")
    return np.maximum(np.asarray(h.getSolution().col_value), 0.0)


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
        self._h = _highs()
        self._stats = stats
        b_eq = np.asarray(b_eq, dtype=float)
        lp = _highs_lp(c, a_eq, b_eq, b_eq, np.asarray(lb, dtype=float), ub)
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
