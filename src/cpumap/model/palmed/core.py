"""Stage 4, the core mapping: the resources Palmed finds among the basic instructions.

The only stage that discovers resources by a cutting plane over kernels of basic instructions
alone, refitting all their uses in one LP (``_core_lp``) per round; its resources (defining
kernels with their construction times, ``_sat_est``) are what the saturating and mapping
kernels of the later stages are built from, and ``Step``, the result of a resumable stage, is
shared with stage 7 (``remaining``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.sparse import coo_matrix

from cpumap.model.palmed.config import (
    NOISY_TOL,
    SOFT_UPPER,
    Kernel,
    Log,
    Measurements,
    PalmedConfig,
    _nolog,
)
from cpumap.model.palmed.kernels import (
    Basic,
    _measured_like,
    _reduce,
    _scale,
    _text,
    interacting_pairs,
    mix,
    pair_kernel,
    random_kernels,
)
from cpumap.model.palmed.lp import _LPStats, _predict, _Row, _solve


@dataclass
class Core:
    """Result of stage 4: resources (by defining kernel) and the basic forms' uses."""

    basic: list[str]
    defining: list[Kernel]  # one defining kernel per resource, in discovery order
    rho: dict[str, dict[int, float]]  # form -> resource index -> use
    tests: list[str] = field(default_factory=list)
    t_defining: list[float] = field(default_factory=list)  # construction times (see _Res)

    @property
    def n_resources(self) -> int:
        return len(self.defining)

    def as_dict(self) -> dict[str, Any]:
        return {"basic": self.basic, "defining": self.defining,
                "rho": {f: {str(r): v for r, v in sorted(u.items())}
                        for f, u in sorted(self.rho.items())},
                "tests": self.tests, "t_defining": self.t_defining}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Core:
        return cls(basic=d["basic"], defining=[dict(k) for k in d["defining"]],
                   rho={f: {int(r): float(v) for r, v in u.items()} for f, u in d["rho"].items()},
                   tests=list(d["tests"]), t_defining=[float(t) for t in d["t_defining"]])


@dataclass
class Step:
    """What a stage returns: kernels still to measure (``need``), or ``done`` and ``result``.

    ``state`` holds the resources found so far as tuples (defining kernel, construction time,
    ...); pass it back with the next call.
    """

    need: list[str]
    result: Any = None
    state: list[Any] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.need


def _saturating(defining: Kernel, t_def: float, target: float, max_kernel: int) -> Kernel:
    d = _reduce(defining)
    cap = max(1, (max_kernel // 4) // sum(d.values()))
    return _scale(d, max(1, min(cap, math.ceil(target / t_def - 1e-9))))


def _sat_est(defining: Kernel, t_def: float, target: float,
             max_kernel: int) -> tuple[Kernel, float]:
    """The saturating kernel of a resource and its *construction* time.

    Kernels are built from construction times, never from the measurement of the kernel being
    extended: the saturating kernel SK = d^s takes about s t(d), so SK and all its mixes can be
    chosen, and measured, in the same round as the resource is found (one measurement round per
    resource instead of three; on hardware every round starts the harness ``bench.rounds``
    times). The fit itself only uses measured values.
    """
    sk = _saturating(defining, t_def, target, max_kernel)
    return sk, t_def * sum(sk.values()) / max(1, sum(defining.values()))


def _source_time(k: Mapping[str, int], meas: Measurements) -> tuple[Kernel, float]:
    """(reduced kernel, its construction time) of a measured kernel k = g x reduced."""
    d = _reduce(k)
    return d, meas[_text(k)] * sum(d.values()) / sum(k.values())


def _mix_texts(sk: Kernel, t_sk: float, forms: Sequence[str], singletons: Mapping[str, float],
               betas: Sequence[float], max_kernel: int) -> list[str]:
    out = [_text(sk)]
    for f in forms:
        for beta in betas:
            base, k = mix(sk, t_sk, f, singletons[f], beta, max_kernel)
            out += [_text(base), _text(k)]
    return out


def _core_lp(basic: Sequence[str], upper: list[tuple[Kernel, float]],
             tight: list[tuple[Kernel, float, int]], n_res: int, t_ref: float,
             stats: _LPStats, soft: bool = False) -> dict[str, dict[int, float]]:
    """The core mapping LP, over the uses of all basic forms at once.

    Variables: rho[b, r] >= 0 for every basic form b and resource r, plus e+[k], e-[k] >= 0
    for every kernel k with a designated resource d(k).
    Constraints, for every measured core kernel k with cycles M(k):
      * upper bounds: sum_b sigma(k, b) rho[b, r] <= M(k) (1 + tol) for every r -- no resource
        may be busier than the measured time (``upper`` carries M (1 + tol));
      * tightness: sum_b sigma(k, b) rho[b, d(k)] + e-[k] - e+[k] = M(k) -- the designated
        resource is the bottleneck (the resource the saturating kernel defines, for SK and its
        mixes; the predicted bottleneck for tests that it explains).
    Objective: minimise sum_k (e+[k] + e-[k]) / M(k) (relative L1 misfit: robust to noisy
    outliers, exact when the data are exact) + 1e-6 sum rho / t_ref (among equally good fits,
    prefer no phantom uses).
    Noisy measurements (``soft``): every upper bound of kernel k gets a slack u[k] >= 0 costing
    ``SOFT_UPPER`` / M(k): one outlier (on hardware, a neighbour's burst) must not force every
    use down, which leaves singletons unexplained and makes the cutting plane add resource
    after resource for the same form.
    Why an LP and not a MILP: which resource is tight in which kernel is decided outside (by
    construction of the kernels, then by the alternation in ``_fit_core_rho``), so everything
    left is linear.
    """
    nb = len(basic)
    bidx = {b: i for i, b in enumerate(basic)}
    nv_rho = nb * n_res
    nv_fit = nv_rho + 2 * len(tight)
    nv = nv_fit + (len(upper) if soft else 0)
    c = np.zeros(nv)
    c[:nv_rho] = 1e-6 / t_ref
    ub_r: list[int] = []
    ub_c: list[int] = []
    ub_v: list[float] = []
    b_ub: list[float] = []
    row_i = 0
    for j, (kernel, bound) in enumerate(upper):
        if soft:
            c[nv_fit + j] = SOFT_UPPER / bound
        for r in range(n_res):
            for f, n in kernel.items():
                ub_r.append(row_i)
                ub_c.append(bidx[f] * n_res + r)
                ub_v.append(float(n))
            if soft:
                ub_r.append(row_i)
                ub_c.append(nv_fit + j)
                ub_v.append(-1.0)
            b_ub.append(bound)
            row_i += 1
    eq_r: list[int] = []
    eq_c: list[int] = []
    eq_v: list[float] = []
    b_eq: list[float] = []
    for j, (kernel, cycles, d) in enumerate(tight):
        for f, n in kernel.items():
            eq_r.append(j)
            eq_c.append(bidx[f] * n_res + d)
            eq_v.append(float(n))
        eq_r += [j, j]
        eq_c += [nv_rho + 2 * j, nv_rho + 2 * j + 1]
        eq_v += [1.0, -1.0]
        b_eq.append(cycles)
        c[nv_rho + 2 * j] = c[nv_rho + 2 * j + 1] = 1.0 / cycles
    a_ub = coo_matrix((ub_v, (ub_r, ub_c)), shape=(row_i, nv)).tocsr()
    a_eq = coo_matrix((eq_v, (eq_r, eq_c)), shape=(len(tight), nv)).tocsr()
    ub = np.full(nv, np.inf)
    x = _solve(c, a_ub, np.array(b_ub), a_eq, np.array(b_eq), ub, stats)
    return {b: {r: float(x[i * n_res + r]) for r in range(n_res) if x[i * n_res + r] > 1e-12}
            for i, b in enumerate(basic)}


def _keep_fixed(load: np.ndarray, fix: int, cycles: float, tol: float) -> int | None:
    """A saturating kernel keeps its resource unless another one explains it within tol."""
    others = np.delete(load, fix)
    ambiguous = others.size and others.max() >= cycles * (1 - tol)
    return None if ambiguous else fix


def _redesignate(rows: list[_Row], fixed: list[int | None], rho: Mapping[str, Mapping[int, float]],
                 n_res: int, tol: float) -> None:
    """Decide which resource each kernel's measured time is attributed to.

    Kernels built to saturate resource r keep r unless another resource is predicted within
    tol of the measured time (then they only bound the uses: the saturated resource may not be
    the bottleneck). Other kernels (singletons, pairs, tests) are attributed to their predicted
    bottleneck when it explains the measurement within tol.
    """
    for row, fix in zip(rows, fixed, strict=True):
        load = _predict(rho, n_res, row.kernel)
        if fix is not None:
            row.designated = _keep_fixed(load, fix, row.cycles, tol)
        else:
            top = int(np.argmax(load)) if n_res else 0
            row.designated = top if n_res and load[top] >= row.cycles * (1 - tol) else None


def fit_core(basic: Basic | Sequence[str], singletons: Mapping[str, float],
             meas: Measurements, *, state: Sequence[tuple[Mapping[str, int], float]] = (),
             config: PalmedConfig | None = None, log: Log = _nolog,
             lp_stats: _LPStats | None = None) -> Step:
    """Stage 4: the core mapping of the basic instructions (cutting plane + joint LP).

    ``state`` holds the defining kernels found so far (from the previous Step's ``state``), so
    that a pipeline can resume the loop between measurement rounds. Returns a Step whose
    ``need`` lists kernels to measure before calling again, or ``done`` with a ``Core``.
    """
    cfg = config or PalmedConfig()
    stats = lp_stats or _LPStats()
    bas = sorted(basic.basic if isinstance(basic, Basic) else basic)
    t_ref = max(singletons[b] for b in bas)
    target = cfg.sat_factor * t_ref
    tests: list[Kernel] = [{b: 1} for b in bas]
    for i, a in enumerate(bas):
        for b in bas[i + 1:]:
            tests.append(pair_kernel(a, singletons[a], b, singletons[b], cfg.max_mult))
    n_tests = cfg.core_tests if cfg.core_tests is not None else 8 * len(bas)
    tests += random_kernels(bas, n_tests, cfg.seed)
    test_texts = [_text(k) for k in tests]
    need = sorted({t for t in test_texts if t not in meas})
    if need:
        return Step(need=need, state=list(state))
    defining = [(dict(k), float(t)) for k, t in state]
    gone: set[str] = set()  # defining kernels of resources dropped in this call: never again
    bad = interacting_pairs({b: singletons[b] for b in bas}, meas, cfg.tol, cfg.max_mult)

    def sane(k: Kernel) -> bool:
        return _measured_like(meas, _text(k), k, singletons, cfg.tol, bad)

    while True:
        # kernels of every resource found so far must be measured before fitting
        need_set: set[str] = set()
        rows: list[_Row] = []
        fixed: list[int | None] = []
        for k in tests:
            if sane(k):
                rows.append(_Row(k, meas[_text(k)], None))
                fixed.append(None)
        for r, (d, t_def) in enumerate(defining):
            sk, t_sk = _sat_est(d, t_def, target, cfg.max_kernel)
            texts = _mix_texts(sk, t_sk, bas, singletons, cfg.betas, cfg.max_kernel)
            missing = {t for t in texts if t not in meas}
            if missing:
                need_set |= missing
                continue
            if sane(sk):
                rows.append(_Row(sk, meas[_text(sk)], r))
                fixed.append(r)
            for b in bas:
                for beta in cfg.betas:
                    base, k = mix(sk, t_sk, b, singletons[b], beta, cfg.max_kernel)
                    for kk in (base, k):
                        if sane(kk):
                            rows.append(_Row(kk, meas[_text(kk)], r))
                            fixed.append(r)
        if need_set:
            return Step(need=sorted(need_set), state=defining)
        rho = _fit_core_rho(bas, rows, fixed, len(defining), t_ref, cfg, stats)
        # cutting plane: the most under-predicted test defines a missing resource
        worst: tuple[float, str, Kernel] | None = None
        cands: list[tuple[float, str, Kernel]] = []
        used = {_text(_reduce(d)) for d, _ in defining} | gone
        for k in tests:
            if not sane(k):
                continue
            m = meas[_text(k)]
            pred = float(_predict(rho, len(defining), k).max()) if defining else 0.0
            gap = (m - pred) / m
            # twice the tolerance: the measurement and the fitted model both carry noise; a
            # resource defined by noise would mislead every later stage
            if gap > 2 * cfg.tol and _text(_reduce(k)) not in used:
                key = (-round(gap, 9), _text(k), k)
                cands.append(key)
                if worst is None or key[:2] < (worst[0], worst[1]):
                    worst = (key[0], key[1], k)
        empty = _empty_resources(rho, defining, meas, cfg.tol)
        if empty:
            for r in sorted(empty, reverse=True):
                log(f"core: resource from {_text(defining[r][0])} dropped: no basic form uses "
                    "it (another resource explains its defining kernel)")
                gone.add(_text(_reduce(defining[r][0])))
                del defining[r]
            continue
        if worst is None or len(defining) >= cfg.core_cap:
            log(f"core: {len(defining)} resources over {len(bas)} basic instructions")
            core = Core(basic=bas, defining=[d for d, _ in defining], rho=rho, tests=test_texts,
                        t_defining=[t for _, t in defining])
            return Step(need=[], result=core, state=defining)
        # core_batch > 1 (hardware: fewer measurement rounds): also the next most
        # under-predicted tests that share no form with those taken this round
        taken: set[str] = set()
        added = 0
        for gap, text, k in sorted(cands, key=lambda c: c[:2]):
            if added >= cfg.core_batch or len(defining) >= cfg.core_cap:
                break
            if set(k) & taken:
                continue
            taken |= set(k)
            log(f"core: resource R{len(defining):02d} from {text} "
                f"(under-predicted by {-gap:.1%})")
            defining.append(_source_time(k, meas))
            added += 1


def _empty_resources(rho: Mapping[str, Mapping[int, float]],
                     defining: Sequence[tuple[Kernel, float]], meas: Measurements,
                     tol: float) -> list[int]:
    """Resources the fit left (almost) empty, whose defining kernel the others explain.

    A batch of the cutting plane can define two resources for one unit (Zen 4: MULSD and
    VMULPD ymm, both the FP multipliers, in the same round); the LP then gives every use to
    one and leaves the other empty. An empty resource is worse than none: the later stages
    attribute each form's slowdown of its saturating kernel to it, a use no basic form shares
    (on a Zen 4 full profile the empty resource of ``MULSD*17`` was the bottleneck of 41 of
    200 held-out kernels, 15.8 % RMS on them).
    Only a kernel the remaining resources explain within twice the tolerance is let go, the
    bar the cutting plane uses, so it is never defined again.
    """
    n_res = len(defining)
    out = []
    for r, (d, t) in enumerate(defining):
        m = meas.get(_text(d), t)
        load = _predict(rho, n_res, d)
        if load[r] <= tol * m and np.delete(load, r).max(initial=0.0) >= (1 - 2 * tol) * m:
            out.append(r)
    return out


def _fit_core_rho(bas: list[str], rows: list[_Row], fixed: list[int | None], n_res: int,
                  t_ref: float, cfg: PalmedConfig, stats: _LPStats) -> dict[str, dict[int, float]]:
    """Alternate: solve the core LP for the current designations, then re-decide them."""
    if n_res == 0:
        return {b: {} for b in bas}
    for row, fix in zip(rows, fixed, strict=True):
        row.designated = fix
    upper = [(r.kernel, r.cycles * (1 + cfg.tol)) for r in rows]
    rho: dict[str, dict[int, float]] = {}
    for _ in range(cfg.fit_rounds):
        tight = [(r.kernel, r.cycles, r.designated) for r in rows if r.designated is not None]
        rho = _core_lp(bas, upper, tight, n_res, t_ref, stats,  # type: ignore[arg-type]
                       soft=cfg.tol >= NOISY_TOL)
        before = [r.designated for r in rows]
        _redesignate(rows, fixed, rho, n_res, cfg.tol)
        if before == [r.designated for r in rows]:
            break
    return rho
