"""Stage 7, ``fit_remaining``: every form's uses, and the resources the core missed.

The loop that ties the per-form fit (``forms``) to the whole-model corrections (``refit``):
kernels the fitted model under-predicts become refinement resources, measured and fitted in
rounds; under noise a round is dropped if it raises the misfit of singletons and pairs, and
the result is refitted jointly; last, every form explains its own singleton. It is the only
module that needs both, hence the last one before ``build``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from cpumap.measure.asmgen import parse_canonical
from cpumap.model.palmed.classes import behaviour_classes, substituted, through
from cpumap.model.palmed.config import (
    NOISY_TOL,
    REFINE_GAIN,
    REFINE_MIN_GAP,
    Kernel,
    Log,
    Measurements,
    PalmedConfig,
    _nolog,
)
from cpumap.model.palmed.core import Core, Step, _sat_est, _source_time
from cpumap.model.palmed.forms import _fit_forms, select_mapping_kernels
from cpumap.model.palmed.kernels import (
    _alone,
    _reduce,
    _text,
    _usable,
    interacting_pairs,
    mix,
    pair_kernel,
)
from cpumap.model.palmed.lp import _LPStats, _predict
from cpumap.model.palmed.refit import (
    _explained,
    _misfit,
    _owned,
    _polish,
    _serialised,
    serialising,
)


def fit_remaining(core: Core, forms: Sequence[str], singletons: Mapping[str, float],
                  meas: Measurements, *,
                  state: Sequence[tuple[Mapping[str, int], float, int, float]] = (),
                  classes: Mapping[str, Sequence[str]] | None = None,
                  config: PalmedConfig | None = None, log: Log = _nolog,
                  lp_stats: _LPStats | None = None, unsteady: Set[str] = frozenset(),
                  training: Set[str] = frozenset()) -> Step:
    """Stage 7: the uses of every form, then refinement with the resources the core missed.

    ``state`` lists the refinement resources found so far as (defining kernel, construction
    time, round, misfit of singletons and pairs before the round). Returns a Step whose
    ``need`` lists kernels to measure (mapping kernels of new resources: one or two
    measurement rounds per refinement round), or ``done`` with
    ``result = (rho, defining, saturating, behaviour, own)``: rho maps form -> resource index
    -> use, saturating pairs each resource's saturating kernel with its construction time (as
    its mixes were built), behaviour maps each representative of a class of several forms to
    its members, own maps each form explained by its class's resource of its own
    (``refit._owned``; noisy measurements only) to (the representative, its use).

    Every form meets each refinement resource at the lightest proportion; only the
    representatives of the behaviour classes (``classes.behaviour_classes``, recomputed on
    every call as those mixes come in) get the lighter proportions and an LP of their own, and
    the other members take their representative's uses. ``unsteady``: the layout-sensitive
    forms (``palmed.layout``), fitted but never in a refinement round's candidates or checks.
    """
    cfg = config or PalmedConfig()
    forms = sorted(set(forms))
    target = cfg.sat_factor * max(singletons[b] for b in core.basic)
    core_sat = [_sat_est(d, t, target, cfg.max_kernel)
                for d, t in zip(core.defining, core.t_defining, strict=True)]

    def sat_of(st: Sequence[tuple]) -> list:
        return core_sat + [_sat_est(dict(d), float(t), target, cfg.max_kernel)
                           for d, t, *_ in st]

    saturating = sat_of(state)
    # every form meets every refinement resource at the lightest proportion, where that
    # resource stays the bottleneck and the rise over SK alone is the form's use of it: what
    # tells the forms of a class apart where the core's resources could not (the balanced
    # proportion did not: a form with μops on ALU ports 0-2 and 0-3 measured as one with two
    # on 0-3, its bottleneck moved to the wider resource)
    light = sorted({text for f in forms for sk, t in saturating[core.n_resources:]
                    for k in mix(dict(sk), t, f, singletons[f], cfg.betas[-1], cfg.max_kernel)
                    if (text := _text(k)) not in meas})
    if light:
        return Step(need=light, state=list(state))
    behaviour = behaviour_classes(forms, core.basic, saturating, singletons, meas, cfg,
                                  full=core.n_resources)
    first = {_text(through(parse_canonical(t), behaviour)) for t in training}
    step = _fit_reps(core, behaviour.reps, singletons, substituted(meas, behaviour), state,
                     classes, cfg, log, lp_stats or _LPStats(), unsteady, first)
    if step.need:
        return step
    rho, defining, saturating_out, own = step.result
    # a member's uses are its representative's per unit of singleton time: the classes
    # hold forms whose singletons differ by up to tol, and a member given its
    # representative's uses unscaled missed its own singleton by that much (a simulated
    # 10-port/300-form machine at 2 % noise: 4.7 % RMS held-out error against 3.5 %); a
    # class's own resource is one unit the members share (their kernels add on it)
    of = {f: behaviour.of(f) for f in forms}
    rho = {f: {r: v * singletons[f] / singletons[rep] for r, v in rho.get(rep, {}).items()}
           for f, rep in of.items()}
    own_of = {f: (rep, own[rep] * singletons[f] / singletons[rep])
              for f, rep in of.items() if rep in own}
    log(f"classes: {len(behaviour.members)} behaviour classes of {len(forms)} forms; "
        f"{len(own)} with a resource of their own")
    return Step(need=[], result=(rho, defining, saturating_out,
                                 {r: m for r, m in behaviour.members.items() if len(m) > 1},
                                 own_of),
                state=step.state)


def _fit_reps(core: Core, forms: list[str], singletons: Mapping[str, float],
              meas: Measurements, state: Sequence[tuple[Mapping[str, int], float, int, float]],
              classes: Mapping[str, Sequence[str]] | None, cfg: PalmedConfig, log: Log,
              stats: _LPStats, unsteady: Set[str] = frozenset(),
              first: Set[str] = frozenset()) -> Step:
    """``fit_remaining`` for forms that each stand for themselves (the representatives,
    sorted); ``first``: the training kernels as the representatives see them."""
    # (defining kernel, construction time, round, misfit of singletons and pairs before the
    # round: what the round is judged against)
    refined = [(dict(k), float(t), int(rnd), float(before)) for k, t, rnd, before in state]
    defining = [dict(d) for d in core.defining] + [r[0] for r in refined]
    t_def = list(core.t_defining) + [r[1] for r in refined]
    rounds = 1 + max((r[2] for r in refined), default=-1)
    target = cfg.sat_factor * max(singletons[b] for b in core.basic)
    # pairs measured between each form and a basic form: extra upper bounds, cheap information
    pair_index: dict[str, list[str]] = {}
    for f in forms:
        for b in core.basic:
            if b == f:
                continue
            text = _text(pair_kernel(f, singletons[f], b, singletons[b], cfg.max_mult))
            if text in meas:
                pair_index.setdefault(f, []).append(text)
    rep_of = {m: rep for rep, members in (classes or {}).items() for m in members}
    noisy = cfg.tol >= NOISY_TOL
    # layout-sensitive forms define no resource and judge no round (``palmed.layout``)
    known = set(forms) - set(unsteady)
    bad = interacting_pairs({f: singletons[f] for f in forms}, meas, cfg.tol, cfg.max_mult)
    # the fixed in-sample check of a refinement round: singletons and balanced pairs
    checks: list[tuple[Kernel, float]] = []
    if noisy:
        for text, m in sorted(meas.items()):
            k = parse_canonical(text)
            if len(k) > 2 or not _usable(k, m, known, singletons, cfg.tol, bad):
                continue
            if _alone(k):
                checks.append((k, m))
            elif len(k) == 2:
                a, b = sorted(k)
                if k == pair_kernel(a, singletons[a], b, singletons[b], cfg.max_mult):
                    checks.append((k, m))

    # the serialising forms against the first n resources: measurements only, and within
    # this call the measurements and each prefix of the saturating kernels stay the same
    serial_at: dict[int, list[str]] = {}

    def fitted(sat: list) -> dict[str, dict[int, float]]:
        """Every form's LP against the resources of ``sat``; serialising forms on all."""
        rho = _fit_forms(core, forms, singletons, meas, sat, pair_index, cfg, stats, bad)
        if len(sat) not in serial_at:
            serial_at[len(sat)] = serialising(forms, sat, singletons, meas, cfg)
        return _serialised(rho, len(sat), serial_at[len(sat)], singletons, log)

    def result(rho: dict[str, dict[int, float]], sat: list) -> tuple:
        """The stage's result with the resources of ``sat`` (the first of ``defining``).
        Noisy: the joint refit, then the serialising forms' rule again (the refit does not
        know it; the forms ``fitted`` found for the same resources), then a resource of their
        own for the forms its shared uses leave short of their singleton. Every other form
        explains its singleton (``_explained``)."""
        n = len(sat)
        own: dict[str, float] = {}
        if noisy:
            rho = _polish(rho, n, forms, singletons, meas, cfg, bad, stats, log, first=first)
            rho = _serialised(rho, n, serial_at[n], singletons, lambda _m: None)
            own = _owned(rho, forms, singletons, cfg.tol, meas)
        return (*_explained(rho, defining[:n], sat, forms, singletons, cfg, log, set(own)), own)

    while True:
        saturating = [_sat_est(d, t, target, cfg.max_kernel)
                      for d, t in zip(defining, t_def, strict=True)]
        need = select_mapping_kernels(saturating, forms, singletons, meas, cfg)
        if need:
            return Step(need=need, state=refined)
        n_res = len(defining)
        rho = fitted(saturating)
        now_s = _misfit(rho, n_res, checks) if noisy else 0.0
        if noisy and refined and rounds > 0:
            # drop the last refinement round where it explains the singletons and pairs
            # worse: with noisy measurements a new resource can fit noise and make the
            # model worse (seen: 8% -> 27% RMS at 2% noise; there the misfit rose by 4-42 %).
            # A round that leaves it as it was is kept: its resources come from measured
            # under-predicted pairs, and a Zen 4 full profile that kept two such rounds
            # (misfit 23.4 -> 18.5 -> 15.8 %) predicted the held-out kernels of a later run
            # and of a refit of it, which dropped theirs on 21.3 vs 20.9 % and 23.04 vs
            # 23.09 %, better than their own models did (10.6 vs 11.7 %, 9.1 vs 13.6 % RMS).
            # Judged against the misfit of the fit that found the round, not a fit without
            # it made again: that refit differs only by the behaviour classes the round's
            # mixes split, and took half of a native round's fitting (3 of 6.5 min on the
            # full profile); it is made only for a dropped round, whose model is the result
            n_prev = n_res - sum(1 for r in refined if r[2] == rounds - 1)
            prev_s = next(r[3] for r in refined if r[2] == rounds - 1)
            if now_s > prev_s * (1 + REFINE_GAIN):
                prev = fitted(saturating[:n_prev])
                log(f"refine: round {rounds - 1} dropped (misfit of singletons and pairs "
                    f"{now_s:.2%} vs {prev_s:.2%} without it)")
                return Step(need=[], result=result(prev, saturating[:n_prev]),
                            state=[r for r in refined if r[2] != rounds - 1])
            log(f"refine: round {rounds - 1} kept (misfit {now_s:.2%} vs {prev_s:.2%})")
            if now_s > prev_s * (1 - REFINE_GAIN):
                # kept, but it did not lower the misfit: the next round's candidates are the
                # same kind of kernel the fit cannot explain (seen: legacy-SSE/VEX pairs at
                # about twice their prediction, natively, four rounds of ~40 s each at a
                # misfit of 15.5-16.4 % in the default run)
                log(f"refine: no round after round {rounds - 1} (it lowered the misfit by "
                    f"less than {REFINE_GAIN:.0%})")
                return Step(need=[], result=result(rho, saturating), state=refined)
        # refinement: measured kernels the model under-predicts reveal missing resources
        cands: list[tuple[int, float, str]] = []
        used = {_text(_reduce(d)) for d in defining}
        # noisy: only singletons and balanced pairs may define a resource (a large mix
        # defines a resource mixing several bottlenecks, that noise then spreads over forms)
        pool = ((_text(k), m) for k, m in checks) if noisy else meas.items()
        # noisy: the pairs first, ranked on the model whose forms explain their singletons
        # (``_pair_judge``), then the singletons on the fit itself
        pair_rho, pair_n = _pair_judge(rho, defining, saturating, forms, singletons, cfg) \
            if noisy else (rho, n_res)
        for text, m in pool:
            k = parse_canonical(text)
            if not _usable(k, m, known, singletons, cfg.tol, bad):
                continue
            pair = noisy and len(k) == 2
            r_k, n_k = (pair_rho, pair_n) if pair else (rho, n_res)
            pred = float(_predict(r_k, n_k, k).max()) if n_k else 0.0
            gap = (m - pred) / m
            if gap > max(3 * cfg.tol, REFINE_MIN_GAP) and _text(_reduce(k)) not in used:
                cands.append((0 if pair else 1, -round(gap, 9), text))
        cands.sort()
        if not cands or rounds >= cfg.max_refine or n_res >= cfg.max_resources:
            if cands:
                log(f"refine: stopping with {len(cands)} under-predicted kernels "
                    f"(worst {-cands[0][1]:.1%})")
            return Step(need=[], result=result(rho, saturating), state=refined)
        added: list[Kernel] = []
        taken: set[str] = set()
        for _, gap, text in cands:
            k = parse_canonical(text)
            # one candidate per form (and per class) a round: two under-predicted kernels
            # sharing a form are most often short of the same resource
            key = {rep_of.get(f, f) for f in k}
            if key & taken:
                continue
            taken |= key
            d, t = _source_time(k, meas)
            added.append(d)
            refined.append((d, t, rounds, now_s))
            t_def.append(t)
            log(f"refine: resource R{n_res + len(added) - 1:02d} from {text} "
                f"(under-predicted by {-gap:.1%})")
            if len(added) >= cfg.refine_batch:
                break
        defining += added
        rounds += 1


def _pair_judge(rho: dict[str, dict[int, float]], defining: list[Kernel],
                saturating: list[tuple[Kernel, float]], forms: Sequence[str],
                singletons: Mapping[str, float], cfg: PalmedConfig,
                ) -> tuple[dict[str, dict[int, float]], int]:
    """The model pairs are ranked on as refinement candidates: every form explaining its own
    singleton (``_explained``), so that a pair's gap is what the two forms lose to each other.

    Why: on the fit itself a form with (almost) no use makes every kernel holding it look
    under-predicted, and the worst candidates natively were lone non-temporal stores (91 %
    under-predicted alone, a resource only their variants use: the round was dropped, 11 min
    of measuring on the full profile) while vector forms sharing ports 0/1/5 (POR xmm x3 with
    VFMADD132PD xmm x2: 1.71 cycles measured, 0.95 predicted once explained) never came up.
    A pair under-predicted once both forms explain their singletons shares a unit the model
    lacks, which a resource of its own then gives every form that uses it.
    """
    ex, d, _ = _explained(rho, defining, saturating, forms, singletons, cfg, _nolog)
    return ex, len(d)
