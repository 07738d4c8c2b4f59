"""Whole-model corrections at the end of stage 7: the joint refit, the misfit, the safety net.

The per-form LPs see each other only through fixed uses; these work on every form's uses at
once: ``_polish`` refits them jointly against every measured kernel (noisy measurements),
``_misfit`` scores a model on a set of kernels (it decides whether a refinement round is
kept), ``serialising`` finds the forms that overlap with nothing and ``_serialised`` gives
them every resource, ``_owned`` gives a form whose shared uses are shorter than its
singleton a resource of its own, and ``_explained`` makes every other form explain its own
singleton when refinement stops short.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Mapping, Sequence, Set
from itertools import combinations

import numpy as np
from scipy.sparse import coo_matrix

from cpumap.measure.asmgen import parse_canonical
from cpumap.model.palmed.config import SOFT_UPPER, Kernel, Log, Measurements, PalmedConfig
from cpumap.model.palmed.kernels import _alone, _floor, _text, _usable, mix
from cpumap.model.palmed.lp import _GrowingLP, _LPStats, _predict

#: Serialising forms: their balanced mixes with the saturating kernels take at least this
#: share of the sum of the two parts alone (``SERIAL_QUANTILE`` of the resources may do
#: better). Native full profile, Sapphire Rapids-class guest, 6,143 forms against 24 core
#: resources: the 45 fences, segment-limit and random-seed forms (LFENCE, MFENCE, PAUSE,
#: SERIALIZE, LAR, LSL, VERR, VERW, RDSEED) at 0.88 and above, every other form at 0.70 or
#: below (an ALU form beside the saturated ALU: 0.67).
SERIAL_ADDITIVITY = 0.8
SERIAL_QUANTILE = 0.1


def serialising(forms: Sequence[str], saturating: Sequence[tuple[Mapping[str, int], float]],
                singletons: Mapping[str, float], meas: Measurements,
                cfg: PalmedConfig) -> list[str]:
    """Forms that run beside nothing: their mixes with (nearly) every saturating kernel take
    the sum of the parts, or more.

    Why: a fence or a microcoded form that drains the pipeline (LFENCE waits for every older
    instruction to finish) adds its own time to whatever it is mixed with, whichever resource
    that saturates, and often a drain on top. Its mixes are then slower than the sum of their
    parts and left out of the LPs as no resource model's (``kernels._resource_like``), so
    its uses came from its singleton alone, on one resource: a kernel with a fence and
    anything else was predicted at the larger of the two, 3-8 x too fast (Zen 3 held-out
    kernels with LFENCE, CLFLUSHOPT, LSL). A resource model does express "adds to
    everything": a use of every resource equal to the form's own time.
    """
    out = []
    for f in forms:
        q = []
        for sk, t_sk in saturating:
            base, k = mix(dict(sk), t_sk, f, singletons[f], cfg.betas[0], cfg.max_kernel)
            m_base, m_mix = meas.get(_text(base)), meas.get(_text(k))
            if m_base is None or m_mix is None or not (
                    math.isfinite(m_base) and math.isfinite(m_mix) and m_base > 0):
                continue
            q.append(m_mix / (m_base + (k[f] - base.get(f, 0)) * singletons[f]))
        # most resources measured: a form seen beside two saturating kernels says little
        if len(q) >= max(3, len(saturating) // 2) and \
                float(np.quantile(q, SERIAL_QUANTILE)) >= SERIAL_ADDITIVITY:
            out.append(f)
    return out


def _serialised(rho: Mapping[str, Mapping[int, float]], n_res: int, serial: Sequence[str],
                singletons: Mapping[str, float], log: Log) -> dict[str, dict[int, float]]:
    """``rho`` with each ``serial`` form using every resource for its own time: predictions
    add it to the rest of the kernel (``serialising``)."""
    out = {f: dict(v) for f, v in rho.items()}
    for f in serial:
        out[f] = dict.fromkeys(range(n_res), singletons[f])
    if serial:
        log(f"serialising: {len(serial)} forms use every resource for their own time: "
            f"{', '.join(serial[:12])}{' ...' if len(serial) > 12 else ''}")
    return out


def _explained(rho: dict[str, dict[int, float]], defining: list[Kernel],
               saturating: list[tuple[Kernel, float]], forms: Sequence[str],
               singletons: Mapping[str, float], cfg: PalmedConfig, log: Log,
               own: Set[str] = frozenset(),
               ) -> tuple[dict[str, dict[int, float]], list[Kernel], list[tuple[Kernel, float]]]:
    """Last safety net: every form's model explains its own singleton.

    When refinement stops (``max_refine``, ``max_resources``) a form may still lack its
    bottleneck resource; predicting (almost) nothing for it would make any kernel holding it
    look free (seen: 900% IPC errors on a 300-form machine). A form predicted below
    t(form)(1 - tol) alone gets its uses scaled up to t(form); a form with no use at all gets a
    resource of its own (defining kernel: the form alone). ``saturating`` pairs each
    resource's saturating kernel with its construction time, as its mixes were built. The
    forms of ``own`` are explained by a resource of their own (``_owned``) and left alone.
    """
    rho = {f: dict(v) for f, v in rho.items()}
    defining, saturating = list(defining), list(saturating)
    for f in forms:
        if f in own:
            continue
        uses = rho.get(f, {})
        p = max(uses.values(), default=0.0)
        t = singletons[f]
        if p >= t * (1 - max(cfg.tol, 1e-9)):
            continue
        if p > 1e-9 * t:
            rho[f] = {r: v * t / p for r, v in uses.items()}
            log(f"explain: {f} predicted {p:.4g} alone, measured {t:.4g}: uses scaled")
        else:
            rho[f] = {len(defining): t}
            defining.append({f: 1})
            saturating.append(({f: 1}, t))
            log(f"explain: {f} has no use: resource R{len(defining) - 1:02d} of its own")
    return rho, defining, saturating


#: Joint refit: the upper bounds it starts with, those the current model brings within this
#: share of their bound (the others join as a solution breaks them).
POLISH_NEAR = 0.8


def _owned(rho: Mapping[str, Mapping[int, float]], forms: Sequence[str],
           singletons: Mapping[str, float], tol: float,
           meas: Measurements | None = None) -> dict[str, float]:
    """form -> the use of a resource of its own, for the forms whose shared uses predict
    them alone below their singleton by more than ``tol`` after the joint refit: the
    singleton's time, or less where a measured kernel of ``meas`` holding the form beside
    other forms took less per copy of it by more than twice ``tol`` (``_per_copy_caps``).

    Why: a form that holds a unit of its own longer than the ports it shares (a
    non-pipelined unit: VPCLMULQDQ ymm on Zen 4 takes 2 cycles alone, its port 1 beside
    other work) can only explain its singleton by a large use of a shared resource, which
    then over-charges every kernel it is mixed into (measured fully overlapped beside
    VCVTPH2PS ymm, 6.01 cycles, predicted 7.50). A resource only its class uses, of its
    singleton's size, lets the shared uses be what the mixes say (``_polish`` frees the
    kernels whose own floor is above the shared prediction). Zen 4 full profile, its
    database refitted (docs/model.md): held-out tau 0.885 -> 0.888, RMS 8.2 -> 8.3 %.
    Only beyond ``tol``: within the noise the shared resource stays the bottleneck a user
    reads (for any shortfall, 4,327 of 5,627 forms had a resource of their own, ADD r64
    alone had ``own:ADD_R16_R16_OP03`` for its bottleneck, and the held-out figures were the
    same within 0.001 of tau and 0.01 point of RMS).

    Why the kernels' cap: a singleton can be slower than the form's own unit: a chain only
    the form alone makes (``ROL r64, imm8`` writes part of the flags and waits for the last
    writer's: 0.98 cycles alone, 0.50 a copy beside full-flags writers), or a neighbour
    that held the ALU slots through every round of it (``TEST r64, r64`` 0.38 cycles, 0.25
    a copy in mixes). Cascade Lake guest, default run's database (2026-11-28), the model as
    fitted with those uses capped offline: held-out tau 0.891 -> 0.897, RMS 9.13 -> 9.07 %,
    MAPE 4.70 -> 4.50 %, kernels off by more than 20 % 35 -> 31 (capping the wide uses' own
    resources too made the kernels mixing 512-bit forms worse, 11.1 -> 12.3 % RMS: a form in
    the mode is slower than beside plain forms, so the wide stage keeps its floor).
    """
    t_tol = max(tol, 1e-9)
    short = [f for f in forms
             if max(rho.get(f, {}).values(), default=0.0) < singletons[f] * (1 - t_tol)]
    caps = _per_copy_caps(meas or {}, short) if short else {}
    out = {}
    for f in short:
        t = singletons[f]
        # beyond the noise of both only (each within tol of the CPU): the least of thousands
        # of kernels is their fastest noise, the singleton may be its slowest
        out[f] = cap if (cap := caps.get(f, math.inf)) < t * (1 - 2 * t_tol) else t
    return out


#: Two resources of their own are one unit when at least this many measured kernels holding
#: both tell the two apart and side with the sum, and ``ONE_UNIT_RATIO`` times as many as
#: side with the larger.
ONE_UNIT_MIN = 2
ONE_UNIT_RATIO = 3


def _one_unit(rho: Mapping[str, Mapping[int, float]], own: Mapping[str, tuple[str, float]],
              meas: Measurements, tol: float) -> dict[str, str]:
    """unit -> the unit it is one with (the first by name of its group), for the resources
    of their own (``own``: form -> (its unit, its use)) whose kernels together take the sum
    of their uses.

    Why: ``_owned`` gives each class its own unit, but two classes can hold the same one:
    ``VDIVPD ymm`` (8 cycles) and ``VSQRTPD ymm`` (12) on the divider, whose kernels with both
    take the sum (``VDIVPD VSQRTPD*2 ...``: 32.0 cycles measured, 23.9 predicted as two
    units). A measured kernel holding both tells them apart where the prediction with one
    unit exceeds that with two by more than 4 tol; it sides with the one it is nearer.
    Cascade Lake guest, default run's database (2026-11-28; its 18 forms with resources of
    their own, 132 pairs told apart by some kernel): the divider pair 6 to 0; the others at
    most 8 to 6 (``ROL r64, imm8`` and ``VPERMQ zmm``: ROL's flags chain), most with more
    kernels for two units (``ANDN``/``POPCNT`` 4 to 145).

    Two groups join only where no unit of one is told apart from a unit of the other (as
    many kernels siding with the larger as it takes to side with the sum): joined pair by
    pair, one form whose kernels side with the sum beside everything (``ROL r64, imm8``,
    whose flags chain lengthens them) chained unrelated units into one. Emerald
    Rapids-class guest, default run of 2026-12-06: 42 forms on ``own:ADD_R64_I8``, the ALU
    forms at 0.2, `NOP` at 0.17, the shuffle ``VEXTRACTF64X2 xmm, ymm`` at 1.01, so that
    ``AND_R64_R64*4 VEXTRACTF64X2_XMM_YMM_I8*2`` was predicted 2.81 cycles, 2.00 measured."""
    votes: dict[tuple[str, str], list[int]] = {}
    n_res = 1 + max((r for uses in rho.values() for r in uses), default=-1)
    for text, m in meas.items():
        if not (m > 0 and math.isfinite(m)) or " " not in text:
            continue
        k = parse_canonical(text)
        alone: dict[str, float] = {}
        for f, n in k.items():
            if f in own:
                alone[own[f][0]] = alone.get(own[f][0], 0.0) + n * own[f][1]
        if len(alone) < 2:
            continue
        shared = float(_predict(rho, n_res, k).max(initial=0.0))
        for a, b in combinations(sorted(alone), 2):
            rest = max((v for u, v in alone.items() if u not in (a, b)), default=0.0)
            apart = max(shared, rest, alone[a], alone[b])
            one = max(shared, rest, alone[a] + alone[b])
            if one > apart * (1 + 4 * tol):
                votes.setdefault((a, b), [0, 0])[abs(m - one) >= abs(m - apart)] += 1
    group = {u: u for u, _ in own.values()}
    members = {u: [u] for u in group}

    def root(u: str) -> str:
        while group[u] != u:
            u = group[u]
        return u

    def apart(x: str, y: str) -> bool:
        same, other = votes.get((min(x, y), max(x, y)), (0, 0))
        return other >= ONE_UNIT_MIN and other >= ONE_UNIT_RATIO * same

    for (a, b), (same, other) in sorted(votes.items()):
        if same >= ONE_UNIT_MIN and same >= ONE_UNIT_RATIO * other:
            ra, rb = sorted((root(a), root(b)))
            if ra == rb or any(apart(x, y) for x in members[ra] for y in members[rb]):
                continue
            group[rb] = ra
            members[ra] += members.pop(rb)
    return {u: root(u) for u in group if root(u) != u}


def _per_copy_caps(meas: Measurements, forms: Sequence[str]) -> dict[str, float]:
    """form -> the least time per copy of it among the measured kernels that hold it beside
    other forms: no unit of its own can hold it longer (interference only slows a kernel)."""
    want = set(forms)
    caps: dict[str, float] = {}
    for text, m in meas.items():
        if not (m > 0 and math.isfinite(m)) or " " not in text:
            continue
        k = parse_canonical(text)
        for f, n in k.items():
            if f in want and m / n < caps.get(f, math.inf):
                caps[f] = m / n
    return caps


def _polish(rho: Mapping[str, Mapping[int, float]], n_res: int, forms: Sequence[str],
            singletons: Mapping[str, float], meas: Measurements, cfg: PalmedConfig,
            bad: set[frozenset[str]], stats: _LPStats, log: Log,
            free: Mapping[str, Set[int]] | None = None, first: Set[str] = frozenset(),
            ) -> dict[str, dict[int, float]]:
    """Noisy measurements: one joint LP over every form's uses and every measured kernel.

    Why: the per-form LPs fix every other form's uses, so each form absorbs the errors of the
    forms fitted before it, and a form's uses are only checked against kernels built around
    it (its mixes with the saturating kernels). Pairs of two non-basic forms then show up as
    kernels where two forms' uses of a shared unit sit on different resources, and held-out
    kernels of three or more forms are predicted too fast (Zen 4, quick set: held-out RMS IPC
    error 15.5%, MAPE 9.4%, Kendall's tau 0.861; with this refit of the same model from the
    same database 13.1%, 6.8%, 0.880).
    Variables: rho[f, r] >= 0 for every form f and resource r; e+[k], e-[k], u[k] >= 0 for
    every measured kernel k (singletons, pairs, core kernels, mixes; not those holding an
    interacting pair, nor super-additive ones).
    Constraints, with d(k) the bottleneck the current model predicts for k:
      * tightness: sum_f sigma(k, f) rho[f, d(k)] + e-[k] - e+[k] = M(k);
      * soft upper bounds: sum_f sigma(k, f) rho[f, r] <= M(k) (1 + tol) + u[k], r != d(k).
    Objective: min sum_k (e+[k] + e-[k] + SOFT_UPPER u[k]) / M(k) + 1e-6 sum rho / t_ref.
    ``free`` (form -> resources): only those uses move, the others keep their value in
    ``rho`` (the wide stage's refit, whose kernels say nothing of a use the mode left alone).
    The current model is a feasible point, so the refit never fits the measurements worse.
    The upper bounds join by a cutting plane (``POLISH_NEAR``): the LP's solution is the
    optimum of all of them, without building the rows that no solution comes near.
    One pass only: redesignating and refitting again lowered the in-sample misfit further
    (4.4% -> 3.2% -> 2.9% mean relative) but raised the held-out error (13.1% -> 13.6%).
    Exact measurements skip it: every kernel is already explained there, and the LP would
    only choose among equally exact uses. Above ``cfg.refit_max_bounds`` candidate upper
    bounds (kernels x (resources - 1)) it refits on a sample of the kernels that fits the
    budget (``_within_budget``): the native full profile's sample of 148,148 kernels x 27
    took 6.4 min in 5 LPs (``lp._GrowingLP``, Emerald Rapids-class guest; 1.3 GB offline; a
    first LP over every kernel and resource would not be solved: see the cutting plane
    below). ``stats.refit["sampled"]`` says how
    many kernels the sample kept; ``first``: kernels (texts) the sample takes before the other
    mixes (the random training kernels, drawn like the held-out ones), weighted
    ``cfg.training_weight`` in the objective. Zen 4 full profile's database, the plain refit
    redone offline with weight 3 against 1 (2026-11-27): Kendall's tau of the held-out
    kernels without a 512-bit form +0.001 to +0.005 on each of five held-out sets (0.880 ->
    0.884 on the run's own), RMS IPC error 0.1-0.4 point lower.
    """
    tol = cfg.tol
    known = set(forms)
    rows: list[tuple[Kernel, float, int]] = []
    for text, m in sorted(meas.items()):
        k = parse_canonical(text)
        if _usable(k, m, known, singletons, tol, bad):
            load = _predict(rho, n_res, k)
            d = int(np.argmax(load))
            # the form's own resource (``_owned``) explains the kernel: no tightness row
            rows.append((k, m, -1 if _alone(k) or _floor(k, singletons) > load[d] else d))
    if not rows or not n_res:
        return {f: dict(v) for f, v in rho.items()}
    n_bounds = len(rows) * (n_res - 1)
    stats.refit = {"kernels": len(rows), "single_form": sum(len(k) == 1 for k, _, _ in rows),
                   "first": sum(_text(k) in first for k, _, _ in rows),
                   "resources": n_res, "candidate_bounds": n_bounds,
                   "max_bounds": cfg.refit_max_bounds, "done": False}
    if cfg.refit_max_bounds is not None and n_bounds > cfg.refit_max_bounds:
        rows = _within_budget(rows, cfg.refit_max_bounds // max(n_res - 1, 1), first)
        stats.refit["sampled"] = len(rows)
        stats.refit["sampled_first"] = sum(_text(k) in first for k, _, _ in rows)
        log(f"polish: {stats.refit['kernels']} kernels x {n_res - 1} resources = {n_bounds} "
            f"candidate upper bounds, above refit_max_bounds {cfg.refit_max_bounds}: the "
            f"refit runs on a sample of {len(rows)} kernels (every single-form kernel kept, "
            f"{stats.refit['sampled_first']} training kernels)")
        if not rows:
            return {f: dict(v) for f, v in rho.items()}
    fidx = {f: i for i, f in enumerate(forms)}
    nv_rho = len(forms) * n_res
    nk = len(rows)
    nv = nv_rho + 3 * nk
    c = np.zeros(nv)
    c[:nv_rho] = 1e-6 / max(singletons[f] for f in forms)
    eq_r: list[int] = []
    eq_c: list[int] = []
    eq_v: list[float] = []
    s_r: list[int] = []
    s_c: list[int] = []
    s_v: list[float] = []
    designated = np.array([d for _, _, d in rows])
    tight = np.flatnonzero(designated >= 0)
    weight = np.array([cfg.training_weight if _text(k) in first else 1.0 for k, _, _ in rows])
    for j, (k, m, _d) in enumerate(rows):
        c[nv_rho + 2 * nk + j] = SOFT_UPPER * weight[j] / m
        s_r += [j] * len(k)
        s_c += [fidx[f] for f in k]
        s_v += [float(n) for n in k.values()]
    for i, j in enumerate(tight):
        k, m, d = rows[j]
        eq_r += [i] * (len(k) + 2)
        eq_c += [fidx[f] * n_res + d for f in k] + [nv_rho + 2 * j, nv_rho + 2 * j + 1]
        eq_v += [float(n) for n in k.values()] + [1.0, -1.0]
        c[nv_rho + 2 * j] = c[nv_rho + 2 * j + 1] = weight[j] / m
    a_eq = coo_matrix((eq_v, (eq_r, eq_c)), shape=(len(tight), nv)).tocsr()
    # sigma(k, f): the load of every kernel on every resource is sigma @ rho
    sigma = coo_matrix((s_v, (s_r, s_c)), shape=(nk, len(forms))).tocsr()
    cycles = np.array([m for _, m, _ in rows])
    bound = cycles * (1 + tol)

    def loads(x: np.ndarray) -> np.ndarray:
        return np.asarray(sigma @ x[:nv_rho].reshape(len(forms), n_res))

    x0 = np.zeros(nv_rho)
    for f, uses in rho.items():
        if f in fidx:
            for r, v in uses.items():
                if r < n_res:
                    x0[fidx[f] * n_res + r] = v
    lower, upper = np.zeros(nv), np.full(nv, np.inf)
    pinned = np.zeros(nv_rho, dtype=bool)
    if free is not None:
        pinned[:] = True
        for f, rs in free.items():
            if f in fidx:
                pinned[[fidx[f] * n_res + r for r in rs if r < n_res]] = False
    # a form in no kernel of the LP (a sample left it out) keeps its uses: nothing but the
    # objective's small weight would see them, and it would take them to zero
    unseen = np.asarray(sigma.sum(axis=0)).ravel() == 0
    pinned |= np.repeat(unseen, n_res)
    lower[:nv_rho][pinned] = upper[:nv_rho][pinned] = x0[pinned]
    # a kernel without a tightness row has no use for its e+-
    untight = np.flatnonzero(designated < 0)
    upper[nv_rho + 2 * untight] = upper[nv_rho + 2 * untight + 1] = 0.0
    # a cutting plane: the upper bounds the current model comes near first, then those the
    # solution breaks, until it breaks none; it then solves the LP of all the bounds (one per
    # kernel and resource: 5 million rows, 9.7 GB and no solution after 30 min for 2,837
    # native forms), whose rows mostly lie far from binding
    add = loads(x0) >= POLISH_NEAR * bound[:, None]
    add[tight, designated[tight]] = False
    active = np.zeros_like(add)
    lp = _GrowingLP(c, a_eq, cycles[tight], lower, upper, stats)
    lps = 0
    while add.any() or not lps:
        lps += 1
        jj, rr = np.nonzero(add)
        # row i: kernel jj[i]'s counts on resource rr[i] of its forms, and -1 on its u
        sub = sigma[jj]
        per = np.diff(sub.indptr)
        lp.add_upper(coo_matrix((np.concatenate([sub.data, -np.ones(len(jj))]),
                                 (np.concatenate([np.repeat(np.arange(len(jj)), per),
                                                  np.arange(len(jj))]),
                                  np.concatenate([sub.indices * n_res + np.repeat(rr, per),
                                                  nv_rho + 2 * nk + jj]))),
                                shape=(len(jj), nv)), bound[jj])
        active |= add
        t_lp = time.perf_counter()
        x = lp.solve()
        slack = bound[:, None] + x[nv_rho + 2 * nk:][:, None]
        add = (loads(x) > slack * (1 + 1e-9)) & ~active
        add[tight, designated[tight]] = False
        # a native full profile's LPs take minutes each: say how far the cutting plane is
        log(f"polish: LP {lps} over {int(active.sum())} upper bounds in "
            f"{time.perf_counter() - t_lp:.1f} s; the solution breaks {int(add.sum())} more")
    fitted = [(k, m) for k, m, _ in rows]
    before = _misfit(rho, n_res, fitted, singletons)
    out = {f: {r: float(x[fidx[f] * n_res + r]) for r in range(n_res)
               if x[fidx[f] * n_res + r] > tol * singletons[f]} for f in forms}
    stats.refit.update(done=True, lps=lps, bounds_used=int(active.sum()),
                       own_rows=int(nk - len(tight)), misfit_before=before,
                       misfit_after=_misfit(out, n_res, fitted, singletons))
    log(f"polish: joint refit over {nk} kernels ({int(active.sum())} of "
        f"{nk * n_res - len(tight)} "
        f"upper bounds, {lps} LP(s); {nk - len(tight)} kernels at their forms' own floor "
        f"fit no tightness row), RMS relative misfit with own resources "
        f"{before:.2%} -> {stats.refit['misfit_after']:.2%}")
    return out


def _within_budget(rows: list[tuple[Kernel, float, int]], n_max: int,
                   first: Set[str] = frozenset()) -> list[tuple[Kernel, float, int]]:
    """At most ``n_max`` of ``rows``: every single-form kernel, then the kernels of ``first``,
    then the others, each group in the order of a hash of their text.

    Why a sample rather than no refit: a kept refinement round took a native full profile's
    refit over its budget (199,471 kernels x 25 resources, Sapphire Rapids-class guest), and
    that run's held-out kernels without a 512-bit form came out at 13.3 % RMS against 8.3 %
    in the run before, whose refit ran; offline on that earlier database, a refit on 5 % of
    the mixes gave 9.2 %. The singletons stay so that every form keeps a kernel of
    its own time; the hash (CRC-32, not Python's salted ``hash``) gives the same sample in
    every process and run, and one that does not depend on the order of the database.
    ``first`` (the random training kernels) go before the mixes Palmed's stages chose, which
    outnumber them ten to one and are not the kernels the model is used on.
    """
    def order(row: tuple[Kernel, float, int]) -> tuple[bool, int]:
        text = _text(row[0])
        return text not in first, zlib.crc32(text.encode())

    single = [row for row in rows if len(row[0]) == 1]
    mixed = sorted((row for row in rows if len(row[0]) != 1), key=order)
    return single[:n_max] + mixed[:max(n_max - len(single), 0)]


def _misfit(rho: Mapping[str, Mapping[int, float]], n_res: int,
            checks: Sequence[tuple[Kernel, float]],
            singletons: Mapping[str, float] | None = None) -> float:
    """RMS relative error of the predicted cycles of (kernel, measured cycles) pairs; with
    ``singletons``, never below ``_floor``: as predicted once the forms
    short of their singleton have a resource of their own (``_owned``; those short by less
    than tol, which get none, are counted at their singleton here)."""
    if not checks:
        return 0.0
    err = [(max(float(_predict(rho, n_res, k).max()),
                _floor(k, singletons) if singletons else 0.0) - m) / m
           for k, m in checks]
    return float(np.sqrt(np.mean(np.square(err))))
