"""Stages 5-6 and the per-form fit: every form outside the basic set against every resource.

Each remaining form is measured against every saturating kernel at a few proportions and gets
its uses from a small LP of its own (``_form_lp``) with every other form's uses fixed, so the
cost stays linear in the number of forms; the rows of that LP, the bounds its mixes imply and
the alternation with the designations (``_fit_forms``) are here because nothing else uses
them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from scipy.sparse import coo_matrix

from cpumap.measure.asmgen import parse_canonical
from cpumap.model.palmed.config import (
    MIN_SHARE,
    NOISY_TOL,
    SINGLETON_WEIGHT,
    SOFT_UPPER,
    Kernel,
    Measurements,
    PalmedConfig,
)
from cpumap.model.palmed.core import Core, _keep_fixed, _mix_texts, _sat_est
from cpumap.model.palmed.kernels import _measured_like, _text, mix
from cpumap.model.palmed.lp import _LPStats, _predict, _Row, _solve


def select_saturating(core: Core, meas: Measurements, singletons: Mapping[str, float],
                      config: PalmedConfig | None = None) -> list[tuple[Kernel, float]]:
    """Stage 5: one saturating kernel per resource: its defining kernel scaled so that it takes
    about ``sat_factor`` times the slowest basic form (large enough for balanced mixes with
    integer counts), with its construction time (``_sat_est``)."""
    cfg = config or PalmedConfig()
    target = cfg.sat_factor * max(singletons[b] for b in core.basic)
    return [_sat_est(d, t, target, cfg.max_kernel)
            for d, t in zip(core.defining, core.t_defining, strict=True)]


def select_mapping_kernels(saturating: Sequence[tuple[Mapping[str, int], float]],
                           forms: Sequence[str], singletons: Mapping[str, float],
                           meas: Measurements, config: PalmedConfig | None = None,
                           settled: Callable[[Mapping[str, int], str], bool] | None = None,
                           ) -> list[str]:
    """Stage 6: every form against every saturating kernel (with its construction time) at
    each proportion of ``betas`` (and each scaled SK^s alone, the base of the difference):
    ``|R| (1 + 2 len(betas))`` kernels per form at most, linear in the number of forms.

    Screened (``config.screen``): the balanced proportion (``betas[0]``) first, and each
    lighter one only once the one before it has measured slower than its SK^s alone by more
    than ``tol``. The increase bounds the form's use of the saturated resource from above at
    every proportion (``_increase``), and the lighter the mix the fewer copies of the form
    share that bound: a mix no slower than SK^s says the use is nil, which the lighter mixes
    could only say again, less precisely; a slower one may be a use or a bottleneck moved
    elsewhere, which the next lighter one tells apart. A form uses a few of the resources, so
    most pairs stop after one mix. Until a proportion is measured the next is not returned;
    the callers measure and ask again (one round per proportion). On the native full profile
    (Zen 3, 2,837 forms, 24 core resources) 38,305 of 68,088 balanced mixes were slower than
    their SK^s (the shared front end), and 11,546 of the 37,783 quarter-proportion mixes:
    screening 1/16 behind 1/4 leaves out about 26,000 of 78,684 lighter kernels.

    ``settled(sk, form)``, asked once the balanced mix is measured: True when it already
    says all the lighter ones would (the wide stage's mixes that rose as in the plain model).
    """
    cfg = config or PalmedConfig()
    out: set[str] = set()
    for sk, t_sk in saturating:
        sk = dict(sk)
        if not cfg.screen:
            out |= set(_mix_texts(sk, t_sk, sorted(forms), singletons, cfg.betas,
                                  cfg.max_kernel))
            continue
        out.add(_text(sk))
        for f in sorted(forms):
            for beta in cfg.betas:
                base, k = mix(sk, t_sk, f, singletons[f], beta, cfg.max_kernel)
                tb, tk = _text(base), _text(k)
                out |= {tb, tk}
                if tb not in meas or tk not in meas:
                    break
                if settled is not None and beta == cfg.betas[0] and settled(sk, f):
                    break
                if no_slower(tb, tk, meas, cfg.tol):
                    break
    return sorted(t for t in out if t not in meas)


def no_slower(base: str, k: str, meas: Measurements, tol: float) -> bool:
    """Whether mix ``k`` measured no slower than its ``base`` (SK^s alone) within ``tol``:
    the form's use of the saturated resource is nil (``select_mapping_kernels``)."""
    if base not in meas or k not in meas:
        return False
    m_base, m_mix = meas[base], meas[k]
    return math.isfinite(m_base) and math.isfinite(m_mix) and \
        m_mix <= m_base * (1 + max(tol, 1e-9))


def _form_lp(form: str, t_form: float, rows: list[_Row], rho: Mapping[str, Mapping[int, float]],
             n_res: int, meas: Measurements, tol: float, stats: _LPStats) -> dict[int, float]:
    """The small LP of one remaining form (Palmed's per-instruction LP).

    Variables: x[r] >= 0, the form's use of resource r; e+[k], e-[k] >= 0 per designated kernel;
    with noisy measurements (tol >= NOISY_TOL) also u[k] >= 0 per kernel.
    Every other form's uses are fixed (core LP, or the previous refinement round).
    For every measured kernel k containing the form c = sigma(k, form) times:
      * upper bounds: base(k, r) + c x[r] <= M(k) (1 + tol) + u[k] for every r, where
        base(k, r) is the other forms' load of r (u = 0 when exact). Noisy: soft, u[k] costs
        ``SOFT_UPPER`` c / M(k): the other forms' fixed uses carry their own errors, and a hard
        bound from one unlucky kernel would crush the form's use to zero (seen: singletons
        predicted 37% short at 2% noise); bounds where the others alone already fill the
        measured time carry no information and are left out;
      * tightness, for mixes SK^s + form^n designated to resource r:
        n x[r] + e-[k] - e+[k] = M(SK^s + form^n) - M(SK^s) -- the increase of the measured time
        is the form's use of the saturated resource (a difference of measurements, so that
        errors of the model of SK do not leak in); for a singleton designated to its predicted
        bottleneck r: x[r] + e- - e+ = t(form).
    Objective: min sum_k (e+ + e-) c / M(k) (relative L1, weights favour the kernels where the
    form is a large part, whose difference is least amplified by noise; the singleton counts
    ``SINGLETON_WEIGHT`` times: it is the one kernel where the form is everything)
    + sum_k SOFT_UPPER u[k] c / M(k) + 1e-6 sum x / t(form).
    """
    noisy = tol >= NOISY_TOL
    nrow = len(rows)
    nv = n_res + 2 * nrow + (nrow if noisy else 0)
    c = np.zeros(nv)
    c[:n_res] = 1e-6 / t_form
    ub = np.full(nv, np.inf)
    ub[:n_res] = t_form * (1 + tol)
    lb = np.zeros(nv)
    eq_rows: list[np.ndarray] = []
    b_eq: list[float] = []
    ub_r: list[int] = []
    ub_c: list[int] = []
    ub_v: list[float] = []
    b_ub: list[float] = []
    for j, row in enumerate(rows):
        cnt = row.kernel[form]
        others = {f: n for f, n in row.kernel.items() if f != form}
        base = _predict(rho, n_res, others)
        room = row.cycles * (1 + tol) - base
        if noisy and cnt * t_form >= MIN_SHARE * row.cycles:
            # where the other forms already fill a resource, the row is inconsistent with their
            # (noisy) fixed uses and would force a zero use: it carries no information there
            u = n_res + 2 * nrow + j
            c[u] = SOFT_UPPER * cnt / row.cycles
            for r in np.flatnonzero(room > tol * row.cycles):
                ub_r += [len(b_ub), len(b_ub)]
                ub_c += [int(r), u]
                ub_v += [float(cnt), -1.0]
                b_ub.append(float(room[r]))
        elif not noisy:
            # every upper bound involves a single x[r] (the other forms are fixed)
            ub[:n_res] = np.minimum(ub[:n_res], np.maximum(room, 0.0) / cnt)
        if not noisy and row.saturated is not None and row.base_text is not None:
            # SK^s saturates r, so M(SK^s + form^n) >= M(SK^s) + n x[r] at every proportion,
            # with equality while r stays the bottleneck: the use is at most the smallest
            # increase (a balanced mix can move the bottleneck to a resource not found yet,
            # whose larger increase must not become a use of r)
            ub[row.saturated] = min(ub[row.saturated], _increase(row, form, meas, tol))
        if row.designated is None:
            continue
        a = np.zeros(nv)
        if row.base_text is not None:
            a[row.designated] = cnt - _count(row.base_text, form)
            rhs = row.cycles - meas[row.base_text]
        else:
            a[row.designated] = cnt
            rhs = row.cycles - base[row.designated]
        a[n_res + 2 * j] = 1.0
        a[n_res + 2 * j + 1] = -1.0
        w = SINGLETON_WEIGHT if noisy and not others else 1.0
        c[n_res + 2 * j] = c[n_res + 2 * j + 1] = w * a[row.designated] / row.cycles
        if noisy and not others and _increase_bound(form, rows, meas, row.designated, tol) \
                >= t_form * (1 - tol):
            # the form alone is the best-measured fact about it: its bottleneck keeps it,
            # unless a mix with the resource's saturating kernel says the form uses much
            # less of it (a divider has no resource yet: forced onto the FP multiplier, it
            # made every kernel with both up to 38% slow); the singleton is then left
            # unexplained, and the refinement gives the form a resource of its own
            lb[row.designated] = t_form * (1 - tol)
        eq_rows.append(a)
        b_eq.append(rhs)
    a_ub = coo_matrix((ub_v, (ub_r, ub_c)), shape=(len(b_ub), nv)).tocsr()
    x = _solve(c, a_ub, np.array(b_ub), np.array(eq_rows) if eq_rows else np.zeros((0, nv)),
               np.array(b_eq), ub, stats, lb)
    # uses below the tolerance are noise (or LP round-off): a phantom use of a resource that
    # the form does not touch would add up over large kernels
    return {r: float(x[r]) for r in range(n_res) if x[r] > max(tol, 1e-9) * t_form}


def _increase_bound(form: str, rows: Sequence[_Row], meas: Measurements, r: int,
                    tol: float) -> float:
    """The least use of resource r that the form's mixes with r's saturating kernel allow.

    ``M(SK^s + form^n) - M(SK^s) >= n rho(form, r)`` whatever the bottleneck (within noise, so
    ``2 tol`` of the mix's time is added): the smallest increase over the proportions bounds
    the use from above. Infinite when no mix saturates r.
    """
    return min((_increase(row, form, meas, tol) for row in rows
                if row.saturated == r and row.base_text is not None), default=math.inf)


def _increase(row: _Row, form: str, meas: Measurements, tol: float) -> float:
    """A mix's increase over its saturating kernel per added instance of the form, plus
    ``2 tol`` of the mix's time (noise): ``(M(SK^s + form^n) - M(SK^s)) / n``, at least 0;
    infinite when the mix adds no instance."""
    assert row.base_text is not None
    n_add = row.kernel[form] - _count(row.base_text, form)
    if n_add <= 0:
        return math.inf
    return max(row.cycles - meas[row.base_text] + 2 * tol * row.cycles, 0.0) / n_add


def _count(text: str, form: str) -> int:
    return parse_canonical(text).get(form, 0)


def _form_rows(form: str, saturating: Sequence[tuple[Mapping[str, int], float]],
               singletons: Mapping[str, float], meas: Measurements, cfg: PalmedConfig,
               pair_index: Mapping[str, list[str]],
               bad: set[frozenset[str]]) -> tuple[list[_Row], list[int | None]]:
    """The kernels of one form's LP: its singleton, its pairs with basic forms, its mixes
    with every saturating kernel; kernels no resource model explains (``_resource_like``)
    left out."""
    rows: list[_Row] = [_Row({form: 1}, singletons[form], None)]
    fixed: list[int | None] = [None]

    def sane(k: Mapping[str, int], text: str) -> bool:
        return _measured_like(meas, text, k, singletons, cfg.tol, bad)

    for text in pair_index.get(form, []):
        k = parse_canonical(text)
        if sane(k, text):
            rows.append(_Row(k, meas[text], None))
            fixed.append(None)
    for r, (sk, t_sk) in enumerate(saturating):
        for beta in cfg.betas:
            base, k = mix(dict(sk), t_sk, form, singletons[form], beta, cfg.max_kernel)
            if sane(k, _text(k)) and sane(base, _text(base)):
                rows.append(_Row(k, meas[_text(k)], r, _text(base), r))
                fixed.append(r)
    return rows, fixed


#: Worker processes for the per-form LPs of a noisy fitting pass (``set_lp_workers``).
_LP_WORKERS = 1
#: Below this many forms a pass is solved in this process (forking costs more than it saves).
_PARALLEL_MIN = 64
#: What the forked workers read: the pass's LPs (set just before forking, cleared after).
_PASS: dict = {}


def set_lp_workers(n: int) -> None:
    """Solve the per-form LPs of noisy fitting passes in ``n`` worker processes (the pipeline
    gives the fit job its threads). Each LP of a pass sees the previous pass's uses (Jacobi),
    so the order does not matter and the model is the same for every ``n``."""
    global _LP_WORKERS
    _LP_WORKERS = max(1, int(n))


def _lp_chunk(chunk: list[str]) -> tuple[dict[str, dict[int, float]], int, float]:
    p, st = _PASS, _LPStats()
    out = {f: _form_lp(f, p["t"][f], p["rows"][f][0], p["rho"], p["n_res"], p["meas"],
                       p["tol"], st) for f in chunk}
    return out, st.solves, st.seconds


def _parallel_lps(forms: Sequence[str], per_form: Mapping, singletons: Mapping[str, float],
                  rho: Mapping[str, Mapping[int, float]], n_res: int, meas: Measurements,
                  tol: float, stats: _LPStats) -> dict[str, dict[int, float]]:
    """The per-form LPs of one Jacobi pass in ``_LP_WORKERS`` forked processes (they inherit
    the pass's data instead of receiving it pickled)."""
    import multiprocessing

    global _PASS
    _PASS = {"t": singletons, "rows": per_form, "rho": rho, "n_res": n_res, "meas": meas,
             "tol": tol}
    n_chunks = 4 * _LP_WORKERS
    chunks = [list(forms[i::n_chunks]) for i in range(n_chunks)]
    out: dict[str, dict[int, float]] = {}
    try:
        with multiprocessing.get_context("fork").Pool(_LP_WORKERS) as pool:
            for part, solves, seconds in pool.map(_lp_chunk, chunks):
                out.update(part)
                stats.solves += solves
                stats.seconds += seconds
    finally:
        _PASS = {}
    return {f: out[f] for f in forms}


#: The last fits of this process, by everything they depend on (``_fit_key``): the fit
#: without a dropped refinement round is the previous round's, solved again unless its
#: inputs (the behaviour classes among them) changed meanwhile.
_FITS: dict = {}
_FITS_KEPT = 4


def _fit_key(core: Core, forms: Sequence[str], singletons: Mapping[str, float],
             meas: Measurements, per_form: Mapping, n_res: int, cfg: PalmedConfig) -> tuple:
    """Everything ``_fit_forms`` reads: each form's singleton and LP rows (kernel, cycles,
    designation, the SK it extends and that SK's cycles), the core's uses, the resources'
    count and the knobs."""
    rows = tuple((f, singletons[f], tuple(
        (_text(r.kernel), r.cycles, r.designated, r.base_text,
         meas.get(r.base_text) if r.base_text else None, r.saturated)
        for r in per_form[f][0])) for f in forms)
    core_rho = tuple(sorted((f, tuple(sorted(u.items()))) for f, u in core.rho.items()))
    return rows, core_rho, n_res, cfg


def _fit_forms(core: Core, forms: Sequence[str], singletons: Mapping[str, float],
               meas: Measurements, saturating: Sequence[tuple[Mapping[str, int], float]],
               pair_index: Mapping[str, list[str]], cfg: PalmedConfig,
               stats: _LPStats, bad: set[frozenset[str]] | None = None,
               hold: bool = False) -> dict[str, dict[int, float]]:
    """Every form's uses of the resources of ``saturating``: per-form LPs (``_form_lp``),
    alternated with the designations until both are stable (at most ``fit_rounds``).
    ``hold``: every mix keeps its saturated resource, also under noise (as exact fits do)."""
    n_res = len(saturating)
    rho: dict[str, dict[int, float]] = {f: dict(v) for f, v in core.rho.items()}
    per_form = {f: _form_rows(f, saturating, singletons, meas, cfg, pair_index, bad or set())
                for f in forms}
    key = (_fit_key(core, forms, singletons, meas, per_form, n_res, cfg), hold)
    if key in _FITS:
        return {f: dict(v) for f, v in _FITS[key].items()}
    exact = cfg.tol < NOISY_TOL
    for _ in range(cfg.fit_rounds):
        new_rho: dict[str, dict[int, float]] = {}
        # exact: Gauss-Seidel, each form's LP sees the uses already refitted in this pass;
        # fitting all forms against the previous pass (Jacobi) oscillated when resources were
        # new: a pass with no bounds from the other forms, then a pass crushed by them
        current = {f: dict(v) for f, v in rho.items()} if exact else rho
        if not exact and _LP_WORKERS > 1 and len(forms) >= _PARALLEL_MIN:
            new_rho = _parallel_lps(forms, per_form, singletons, current, n_res, meas,
                                    cfg.tol, stats)
        else:
            for f in forms:
                rows, fixed = per_form[f]
                new_rho[f] = _form_lp(f, singletons[f], rows, current, n_res, meas, cfg.tol,
                                      stats)
                if exact:
                    current[f] = new_rho[f]
        moved = max((abs(new_rho[f].get(r, 0.0) - rho.get(f, {}).get(r, 0.0))
                     for f in forms for r in range(n_res)), default=0.0)
        rho = new_rho
        before = [row.designated for f in forms for row in per_form[f][0]]
        for f in forms:
            rows, fixed = per_form[f]
            _redesignate_form(f, rows, fixed, rho, n_res, cfg.tol, hold)
        if before == [row.designated for f in forms for row in per_form[f][0]] \
                and moved <= 1e-9:
            break
    _FITS[key] = {f: dict(v) for f, v in rho.items()}
    while len(_FITS) > _FITS_KEPT:
        _FITS.pop(next(iter(_FITS)))
    return rho


def _redesignate_form(form: str, rows: list[_Row], fixed: list[int | None],
                      rho: Mapping[str, Mapping[int, float]], n_res: int, tol: float,
                      hold: bool = False) -> None:
    """As _redesignate, for one form's rows: only its singleton follows its bottleneck.

    Exact measurements: a mix keeps its saturated resource (its increase bounds the use from
    above, ``_form_lp``). Releasing it whenever another resource happened to explain the mix
    let uses drop to zero and come back from one alternation round to the next (seen: the
    fit never settled, and a form lost its use of the one resource of its own μop kind).
    """
    for row, fix in zip(rows, fixed, strict=True):
        load = _predict(rho, n_res, row.kernel)
        if fix is not None:
            row.designated = fix if tol < NOISY_TOL or hold else \
                _keep_fixed(load, fix, row.cycles, tol)
        elif row.kernel == {form: 1} and n_res:
            row.designated = int(np.argmax(load))
