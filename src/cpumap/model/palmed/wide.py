"""The 512-bit mode: the uses of forms in kernels that hold a 512-bit form (stage 8).

A resource model gives every form one set of uses, whatever else is in the kernel. Intel
cores break that: while 512-bit μops are in flight, port 1 takes no vector μops (its vector
unit is fused with port 0's for the 512-bit ones). On a Sapphire Rapids-class guest
``VPADDD xmm`` x 30 runs at 3 per cycle, 10 cycles; with one ``VPADDD zmm`` among them, 15.5
(2 per cycle). The full-profile model, fitted without knowing it, predicted held-out kernels
mixing 512-bit and narrower vector forms 20 % too fast on average (38.6 % RMS; the other
kernels 9.9 %), and the mixed kernels it measured spoilt its other uses (on a simulated core
with the mode: 42 resources for 15 forms, 9.7 % RMS on kernels without a 512-bit form).

So the model gets a second set of uses, its *wide* uses, that predictions take in a kernel
holding a 512-bit form (``ResourceModel.wide``), measured against the plain model's own
resources with a *carrier*: the fastest register-only 512-bit form but moves (a memory one
adds a load to every kernel: on the Sapphire Rapids-class guest ``VMOVUPD zmm, m512`` as
carrier left the mixed held-out kernels at 24 % RMS, ``VPADDQ zmm`` brought them to 12 %),
added once to kernels that hold no 512-bit form of their own.

1. **Probe** (``states.probe``, right after the singletons): each narrow vector form among
   the pair candidates beside each candidate carrier, by two dense kernels
   (``mode_kernels``: the form's time in the mode is their difference per copy); slower than
   alone by more than ``MODE_TOLS`` tol is the mode. None: nothing more is done. Carriers
   whose probes differ are *states* of the mode, each fitted apart (``states``: Cascade
   Lake's FP and integer 512-bit forms). Zen 4 has a mode of its own: legacy-SSE forms run
   at half speed while 512-bit μops execute (``MULSD xmm`` 2 a cycle alone, 1 beside
   ``VPADDQ zmm``; the VEX ``VMULSD`` keeps 2), seen only with a carrier that executes
   (``transition.carriers`` leaves out register moves, which renaming removes). The probes
   are counted per encoding (legacy, VEX/EVEX) and the mode covers only the narrow forms of
   an encoding with a slower probe or too few probes (``states.mode_widths``: on Zen 4 the
   legacy ones, on Intel all).
2. Where the mode is seen, **the plain stages never mix** 512-bit forms and the narrower
   vector forms it covers in a kernel (``transition.mixes_512``; ``Build`` keeps them apart
   as it does the SSE/AVX families): the plain model is then the host outside the mode.
3. **Wide stage** (``fit_wide``, after the refinement, once per state): the mode kernels
   of every narrow vector form; the forms against the saturating kernels with the carrier
   added (``SK^s + Z``) whose mixes the mode can change (``_meets``: a narrow vector form
   against all, a 512-bit one against those holding a narrow vector form, a general-purpose
   form against the vector resources it shares outside the mode), screened by proportion as the
   mapping kernels are (``select_mapping_kernels``) and by the plain stages' own mixes
   (``_as_plain``: a pair whose balanced mix rose as in the plain model keeps its plain use,
   with no lighter proportion beside the carrier); then Palmed's per-form LPs over those
   kernels (``forms._fit_forms``), each mix held to its saturated resource (``hold``). The
   other forms keep their plain uses of the resources no vector form saturates.
4. **Joint refit** (noisy measurements, ``_refit_mode``): the representatives' wide uses
   refitted together over every measured kernel that holds a 512-bit form (``refit._polish``,
   as stage 7 ends for the plain uses), moving only the uses a form met beside the carrier.
   The per-form LPs fix every other form's uses, so each absorbs the others' errors; the
   stage has no refinement of its own to repair that. Simulated core at 2 % noise, mixed
   kernels, seeds 0-2: 5.60, 5.96, 5.73 % RMS without it, 4.31, 3.95, 3.74 % with it.

On the simulated core of ``portmap.wide_mode_mapping`` the mixed kernels come out at 0.07 %
RMS relative IPC error, 1.4 % at most (24 % without the stage; two states: 1.2 %, 11 % at
most); at 2 % noise 5.7 % RMS on mixed kernels, 19 % without the
stage (``benchmarks/palmed_sim.py --wide``). Approximate where the mode's port groups have
no resource of their own among the plain model's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence, Set

from cpumap.isa.transition import WIDE_BITS, mixes_512
from cpumap.measure.asmgen import parse_canonical
from cpumap.model.palmed.classes import Classes, through
from cpumap.model.palmed.config import NOISY_TOL, Kernel, Log, Measurements, PalmedConfig, _nolog
from cpumap.model.palmed.core import Core, Step
from cpumap.model.palmed.forms import _fit_forms, no_slower, select_mapping_kernels
from cpumap.model.palmed.kernels import (
    _add,
    _holds_any,
    _ok,
    _text,
    interacting_pairs,
    mix,
)
from cpumap.model.palmed.lp import _LPStats
from cpumap.model.palmed.refit import _owned, _polish

#: A mode kernel holds the narrow form for about this many times the carrier's time, and a
#: second one twice as many copies (``mode_kernels``): dense enough that the mode stays on.
MODE_SHARE = 2.0
#: The host has the mode when a probe's time in the mode is slower than alone by more than
#: this many tol.
MODE_TOLS = 4.0
#: Noisy measurements: the wide uses end with a joint refit (``_refit_mode``).
WIDE_REFIT = True


def split(forms: Sequence[str], widths: Mapping[str, int]) -> tuple[list[str], list[str]]:
    """(512-bit forms, narrower vector forms) among ``forms`` (``widths``: vector length in
    bits, ``cpumap.isa.transition.vector_lengths``; 0 or absent for forms without a vector
    register)."""
    wide = sorted(f for f in forms if widths.get(f, 0) >= WIDE_BITS)
    narrow = sorted(f for f in forms if 0 < widths.get(f, 0) < WIDE_BITS)
    return wide, narrow


def carrier(wide: Sequence[str], singletons: Mapping[str, float],
            allowed: Sequence[str] | None = None) -> str:
    """The 512-bit form added to kernels that hold none: the fastest of ``allowed`` (all when
    None or none of them is modelled) for the smallest share of any kernel, the first by name
    among equals (measured alike within 0.5 %: the singletons' noise)."""
    pool = sorted(set(wide) & set(allowed)) if allowed is not None else list(wide)
    pool = pool or list(wide)
    fastest = min(singletons[f] for f in pool)
    return min(f for f in pool if singletons[f] <= fastest * 1.005)


def mode_kernels(form: str, z: str | Mapping[str, int], singletons: Mapping[str, float],
                 cfg: PalmedConfig) -> tuple[Kernel, Kernel]:
    """(Z^s + form^n, Z^s + form^2n), n t(form) ~ ``MODE_SHARE`` s t(Z): the form's time in
    the mode is the second's time less the first's, per added copy (``time_in_mode``).

    Why two dense kernels: on Cascade Lake the mode fades where 512-bit μops are sparse, as
    fast as ``VPMULLD ymm`` runs: 2.0 cycles a copy beside one ``VPADDQ zmm`` per 1-4 copies,
    1.18 per 8, 1.04 per 32 (1.05 alone). One kernel with the carrier at 1/65 of its time,
    as the stage had, saw no mode for it; a single dense kernel would count the carrier's
    own time in the form's, as its share (when the two share no resource) or as a sequence
    (when they do), and the difference of two counts is the form's, either way. ``z``: the
    carrier, or a kernel of carriers (``states``: two states' together)."""
    zk = {z: 1} if isinstance(z, str) else dict(z)
    t_z = sum(n * singletons[f] for f, n in zk.items())
    _, k = mix(zk, t_z, form, singletons[form], MODE_SHARE, cfg.max_kernel)
    return k, _add(k, form, k[form])


def time_in_mode(form: str, pair: tuple[Kernel, Kernel], meas: Measurements) -> float | None:
    """The form's cycles a copy in the mode from its ``mode_kernels`` (None: not measured)."""
    k1, k2 = pair
    if not (_ok(meas, _text(k1)) and _ok(meas, _text(k2))):
        return None
    return (meas[_text(k2)] - meas[_text(k1)]) / (k2[form] - k1[form])


def _with_carrier(sk: Mapping[str, int], own: set[str], z: str) -> Kernel:
    return dict(sk) if any(f in own for f in sk) else _add(sk, z, 1)


def fit_wide(forms: Sequence[str], widths: Mapping[str, int], singletons: Mapping[str, float],
             rho: Mapping[str, Mapping[int, float]],
             saturating: Sequence[tuple[Mapping[str, int], float]], meas: Measurements,
             z: str, *, t_plain: Sequence[float] | None = None,
             classes: Mapping[str, Sequence[str]] | None = None,
             config: PalmedConfig | None = None, log: Log = _nolog,
             lp_stats: _LPStats | None = None, own: Set[str] | None = None,
             above: Set[str] = frozenset(), only_narrow: bool = False,
             first: Set[str] = frozenset(), units: Set[int] = frozenset()) -> Step:
    """Stage 8: the wide uses of the vector forms in one state of the mode, on a host where
    ``states.probe`` saw it.

    ``rho`` is the plain model (form -> resource index -> use), ``saturating`` its saturating
    kernels with their times, in resource order, ``z`` the carrier. The wide uses come from
    Palmed's per-form LPs (``forms._fit_forms``) over the kernels measured in the mode only
    (mode kernels, ``SK^s + Z`` and its mixes): the vector forms' against every resource,
    the other forms' against those a vector form saturates; every form keeps its plain use
    of a resource it met in no such mix. ``classes`` (representative -> members: the plain
    model's behaviour classes) spare the mixes and LPs of members: only representatives
    (``_wide_reps``) meet the saturating kernels, and members take their wide uses. Returns a
    Step whose ``need`` lists kernels to measure, or ``done`` with ``result`` = (form ->
    resource index -> wide use, form -> own use).

    ``t_plain`` (the saturating kernels' construction times, which built the plain stages'
    mixes) screens the lighter proportions: a form whose balanced mix beside ``SK^s + Z``
    rose as much a copy as its balanced mix beside ``SK^s`` did in the plain stages
    (``_as_plain``) keeps its plain use of that resource, measured at every proportion
    already; only a mix that rose otherwise gets the lighter ones.

    The result, under noise, also holds form -> the use of a resource of its own, as the
    plain stage's (``refit._owned``): ``(uses, own)``; without noise ``own`` is empty.

    The state (``states``): ``own``, its trigger forms (None: every 512-bit form), and
    ``above``, those of the states before it, which take a kernel holding both: the stage
    fits no form of ``above``, reads no kernel holding one (it is another state's), and
    meets no saturating kernel holding one (its forms keep their plain uses of that
    resource).

    ``only_narrow``: only the narrow forms' uses change in this state (the dirty-upper
    state, ``palmed.dirty``: its trigger forms and the others run as outside it); the others
    keep their plain uses, fixed in the joint refit, and the result holds the narrow forms'.

    ``first``: the stage's random training kernels (``Build.training(wide=True)``), which the
    joint refit samples first and weights ``training_weight``, as the plain refit does its
    own.

    ``units``: the indices in ``saturating`` of the mode's own units (``modes``: the units of
    the 512-bit forms' own, which the plain stages never met as resources): every vector
    form meets them.
    """
    cfg = config or PalmedConfig()
    forms = [f for f in forms if f not in above]
    wide, narrow = split(forms, widths)
    if above:
        meas = {t: m for t, m in meas.items()
                if not _holds_any(t, above)}
    mode = {f: mode_kernels(f, z, singletons, cfg) for f in narrow}
    need = sorted({_text(k) for pair in mode.values() for k in pair} - set(meas))
    if need:
        return Step(need=need)
    # each form's time in the mode: a narrow one's beside the carrier, a 512-bit one's alone;
    # never under its time alone (noise in the difference of two kernels)
    t_mode = {f: singletons[f] for f in wide}
    for f, pair in mode.items():
        if (t := time_in_mode(f, pair, meas)) is not None:
            t_mode[f] = max(t, singletons[f])
    vector = sorted(t_mode)
    rep_of = _wide_reps({r: [f for f in members if f not in above]
                         for r, members in (classes or {}).items()}, widths, mode, meas,
                        singletons, cfg.tol)
    # a narrow member's time in the mode is its representative's per unit of singleton time
    # (what joined them), not its own difference of two noisy kernels
    for f, rep in rep_of.items():
        if f in t_mode and rep in t_mode and 0 < widths.get(f, 0) < WIDE_BITS:
            t_mode[f] = max(t_mode[rep] * singletons[f] / singletons[rep], singletons[f])
    mine = set(wide) if own is None else set(own)
    sat = [(_with_carrier(sk, mine, z), t + (0.0 if any(f in mine for f in sk)
                                             else singletons[z]))
           for sk, t in saturating]
    usable = [r for r, (sk, _) in enumerate(saturating) if not any(f in above for f in sk)]
    # the other forms only meet the resources a vector form saturates: what the mode can
    # change for them (general-purpose forms beside vector μops that left port 1); their uses
    # of the others stay the plain ones
    vres = [r for r in usable if any(widths.get(f, 0) for f in saturating[r][0])]
    # (a narrow form whose mode kernels failed, e.g. legacy SSE kept apart from the
    # carrier's AVX family, keeps its plain uses everywhere)
    other = sorted(f for f in forms if not widths.get(f, 0))
    reps = [f for f in vector if rep_of.get(f, f) == f]
    other_reps = [f for f in other if rep_of.get(f, f) == f]
    # forms whose uses this state leaves alone: plain uses, no kernel of their own
    fixed = [*(f for f in reps if f in wide), *other_reps] if only_narrow else []
    if fixed:
        reps, other_reps = [f for f in reps if f not in wide], []
    # saturating kernel with the carrier -> (its time, the plain one, its construction time)
    t_built = t_plain or [math.nan] * len(sat)
    plain = {_text(sk_z): (t_z, sk, t) for (sk_z, t_z), (sk, _), t
             in zip(sat, saturating, t_built, strict=True)}

    def shares(f: str, r: int) -> bool:
        """Whether ``f`` has a use of resource r outside the mode that can matter: the plain
        stages' balanced mix of ``f`` with r's saturating kernel rose over the kernel alone
        by more than ``tol`` (unknown without the construction times: it did), and its plain
        use of r is over ``tol`` of its own time (the LPs leave residues of a few tol: a
        fall of one under that moves no kernel's time by more than tol)."""
        if rho.get(f, {}).get(r, 0.0) <= max(cfg.tol, 1e-9) * singletons[f]:
            return False
        if not (math.isfinite(t_built[r]) and t_built[r] > 0):
            return True
        base, k = mix(saturating[r][0], t_built[r], f, singletons[f], cfg.betas[0],
                      cfg.max_kernel)
        return not no_slower(_text(base), _text(k), meas, cfg.tol)

    meets = _meets(reps, other_reps, usable, vres, saturating, widths, shares,
                   [r for r in usable if r in units])
    t_of = {**singletons, **t_mode}
    same: dict[tuple[str, str], bool] = {}

    def settled(sk_z: Mapping[str, int], f: str) -> bool:
        key = (_text(sk_z), f)
        if key not in same:
            t_sk_z, sk, t_sk = plain[key[0]]
            same[key] = _as_plain(f, (sk_z, t_sk_z, t_of[f]), (sk, t_sk, singletons[f]),
                                  widths, meas, cfg)
        return same[key]

    need = sorted({k for f, rs in meets.items()
                   for k in select_mapping_kernels([sat[r] for r in rs], [f], t_of, meas, cfg,
                                                   settled)})
    if need:
        return Step(need=need)
    start = {f: dict(u) for f, u in rho.items()}
    core = Core(basic=[], defining=[dict(sk) for sk, _ in sat], rho=start)
    # every mix keeps its saturated resource (``hold``) also under noise: released, the
    # LPs traded uses between resources that the mode makes alike (VADDPD zmm's use of the
    # p05-like resource moved to another one, which VADDPD xmm did not use: a kernel of the
    # two predicted half its time on a simulated machine with 2 % noise)
    fitted = _fit_forms(core, [*reps, *other_reps], t_of, meas, sat, {}, cfg,
                        lp_stats or _LPStats(), hold=True) | {f: {} for f in fixed}
    # a form keeps its plain use of every resource it met in no measured mix beside the
    # carrier: the resources no vector form saturates (for the other forms), and those whose
    # saturating kernel may not meet the carrier (legacy SSE on a host with the SSE/AVX
    # penalty; seen: VDIVPD ymm's divider use sat on such a resource and was lost, its
    # kernels beside zmm forms predicted 3-5 x too fast)
    # and of every resource against which its balanced mix rose as in the plain model
    met = {f: {r for r in rs if _met(f, *sat[r], t_of[f], meas, cfg)
               and not settled(sat[r][0], f)}
           for f, rs in meets.items()} | {f: set() for f in fixed}
    fitted = {f: {r: v for r, v in fitted[f].items() if r in met[f]}
              | {r: v for r, v in rho.get(f, {}).items() if r not in met[f]}
              for f in [*reps, *other_reps, *fixed]}
    refit = cfg.tol >= NOISY_TOL and WIDE_REFIT
    if refit:
        fitted = _refit_mode(fitted, len(sat), met, t_of, meas, rep_of, mine, cfg,
                             lp_stats or _LPStats(), log, first)
    # a member takes its representative's wide uses of the resources the representative met,
    # per unit of its time in the mode (``fit_remaining`` scales the plain uses alike)
    for f in [*vector, *other]:
        rep = rep_of.get(f, f)
        fitted[f] = {r: v * t_of[f] / t_of[rep] for r, v in fitted[rep].items()
                     if r in met[rep]} | \
            {r: v for r, v in rho.get(f, {}).items() if r not in met[rep]}
    log(f"wide: {sum(same.values())} of {len(same)} balanced mixes beside the carrier rose "
        "as in the plain model: their plain uses kept, their lighter proportions not measured")
    log(f"wide: wide uses of {len(vector)} vector forms ({len(narrow)} narrower, "
        f"{len(wide)} triggers; {len(reps)} representatives) against {len(sat)} resources "
        f"with carrier {z}, and of {len(other)} other forms ({len(other_reps)} "
        f"representatives) against the {len(vres)} a vector form saturates: "
        f"{sum(map(len, meets.values()))} pairs met of "
        f"{len(reps) * len(usable) + len(other_reps) * len(vres)}")
    # a form is never faster beside other forms than alone, nor a narrow one than beside the
    # carrier, but the wide LPs and refit bound a use only by the kernels in the mode (Zen
    # 4, full profile: 188 of 5,627 forms' wide uses under their singleton, the dividers' at
    # 1.7 of 3.0 cycles; its 609 held-out kernels mixing 512-bit and narrower forms 13.7 %
    # RMS, 11.9 % refitted from the same database with this floor). After the refit (which
    # left the kernels at that floor free, as the plain one does) the floor is a resource
    # of the form's own (``refit._owned``); without it, the largest use is raised to it
    if fixed:
        fitted = {f: u for f, u in fitted.items() if f in narrow}
    floor = {f: max(singletons[f], t_of[f]) for f in fitted}
    if refit:
        fitted = {f: {r: v for r, v in u.items() if v > 0} or dict(rho.get(f, {}))
                  for f, u in fitted.items()}
        own = _owned(fitted, sorted(fitted), floor, cfg.tol)
    else:
        fitted = {f: _up_to(u, floor[f], cfg.tol, rho.get(f, {})) for f, u in fitted.items()}
        own = {}
    return Step(need=[], result=({f: {r: v for r, v in u.items() if v > 0}
                                  for f, u in fitted.items()}, own))


def _up_to(uses: Mapping[int, float], t: float, tol: float,
           plain: Mapping[int, float]) -> dict[int, float]:
    """``uses`` with the largest raised to ``t`` when they predict the form alone below
    ``t (1 - tol)`` (its other uses as they are: scaling them all, as the plain model's
    safety net does, would add the shortfall to every resource it shares); the ``plain``
    uses for a form left with none."""
    out = {r: v for r, v in uses.items() if v > 0} or dict(plain)
    if out and max(out.values()) < t * (1 - max(tol, 1e-9)):
        out[max(out, key=out.__getitem__)] = t
    return out


def _wide_reps(classes: Mapping[str, Sequence[str]], widths: Mapping[str, int],
               mode: Mapping[str, tuple[Kernel, Kernel]], meas: Measurements,
               singletons: Mapping[str, float], tol: float) -> dict[str, str]:
    """form -> its representative in the wide stage: within a plain behaviour class, per
    vector length, the first form (by name) alike with it in the mode; a narrower vector
    form is alike with a representative when its two mode kernels (its verification
    kernels) measured as the representative's predict them within ``tol``
    (``_alike_in_mode``), a 512-bit one always.

    Why: forms alike against every saturating kernel outside the mode are most often alike
    in it (the same μops on the same ports), and the wide stage measures every
    representative against every resource (about 35 kernels a form on the Sapphire
    Rapids-class guest). A 512-bit form's plain class was measured in the mode already (its
    mixes with 512-bit saturating kernels), and a form of another length is never in its
    class (the mixes kept apart for the mode fail for one and not the other). The check is
    on the two kernels' times, not on the time in the mode their difference gives: that
    difference carries both kernels' noise over a third of the second's time, and at tol
    it split nearly every class (the Emerald Rapids-class full profile of 2026-11-29: 4,351
    representatives for 4,376 vector forms)."""
    rep_of: dict[str, str] = {}
    for members in classes.values():
        heads: dict[int, list[str]] = {}
        for f in sorted(members):
            w = widths.get(f, 0)
            mine = heads.setdefault(w, [])
            narrow = 0 < w < WIDE_BITS
            head = next((h for h in mine if not narrow or _alike_in_mode(
                f, h, mode, meas, singletons, tol)), None)
            if head is None:
                mine.append(f)
            else:
                rep_of[f] = head
    return rep_of


def _alike_in_mode(form: str, head: str, mode: Mapping[str, tuple[Kernel, Kernel]],
                   meas: Measurements, singletons: Mapping[str, float], tol: float) -> bool:
    """Whether ``form``'s mode kernels measured within ``tol`` of what ``head``'s predict
    for them: the head's two kernels are a line in the copies of the head (the carrier's
    part, then its time in the mode a copy), and the form takes the head's time per unit of
    singleton time, as a class member does outside the mode."""
    if form not in mode or head not in mode or not all(_ok(meas, _text(k)) for k in mode[form]):
        return False
    t_head = time_in_mode(head, mode[head], meas)
    if t_head is None:
        return False
    h1 = mode[head][0]
    fixed = meas[_text(h1)] - h1[head] * t_head
    per_copy = t_head * singletons[form] / singletons[head]
    t_tol = max(tol, 1e-9)
    return all(abs(meas[t] - (fixed + k[form] * per_copy)) <= t_tol * meas[t]
               for k in mode[form] for t in [_text(k)])


def _meets(reps: Sequence[str], other_reps: Sequence[str], usable: Sequence[int],
           vres: Sequence[int], saturating: Sequence[tuple[Mapping[str, int], float]],
           widths: Mapping[str, int], shares: Callable[[str, int], bool],
           units: Sequence[int] = ()) -> dict[str, list[int]]:
    """form -> the resources (indices into ``saturating``) whose saturating kernel it meets
    beside the carrier; a form keeps its plain use of every other resource.

    Why not every pair: the mode moves vector μops between ports, and that changes a use
    only where the plain stages could not have seen it.

    - A narrow vector form's μops are the ones that move: it meets every usable resource.
      Even one as fast beside the carrier as alone, and whose plain mix with a resource's
      kernel did not rise, may collide with it in the mode: on the simulated core ``VMULX``
      (a μop on p0/p1, one on p5) keeps its time, but its first μop leaves p1 for p0, where
      ``SHL`` runs; skipped, that pair was predicted 6.7 % fast.
    - A 512-bit form was in the mode in every plain mix it was in: it meets only the
      resources whose saturating kernel holds a narrow vector form (those mixes were kept
      apart for the mode), and the mode's own ``units``, which no plain mix met: left out,
      the 512-bit shuffles of another unit than a unit's first form never took it, and
      beside the narrow shuffles that did (all on port 5 in the mode) they were predicted
      half their time (Emerald Rapids-class guest, default run of 2026-12-06:
      ``VBROADCASTSS_ZMM_XMM*2 VMOVSD_XMM_M64*4 VPERMQ_ZMM_ZMM_I8*4
      VUNPCKHPD_XMM_XMM_XMM_EVEX*4`` 5.05 cycles predicted, 10.0 measured).
    - A form without a vector register keeps its μops, and beside vector μops that moved
      its use of a resource can fall but not rise from nothing: it meets only the resources
      a vector form saturates that it ``shares`` outside the mode.

    On the Sapphire Rapids-class guest's default-run database (offline, the same
    measurements): 2,963 of the 3,741 pairs met, the stage's kernels 5,588 -> 4,874, the
    held-out kernels mixing 512-bit and narrower forms 8.2 -> 8.1 % RMS (docs/model.md)."""
    narrow_sk = [r for r in usable
                 if any(0 < widths.get(f, 0) < WIDE_BITS for f in saturating[r][0])]
    wide_sk = sorted({*narrow_sk, *units})
    out = {f: list(wide_sk if widths.get(f, 0) >= WIDE_BITS else usable) for f in reps}
    out |= {f: [r for r in vres if shares(f, r)] for f in other_reps}
    return out


def _met(form: str, sk: Kernel, t_sk: float, t_form: float, meas: Measurements,
         cfg: PalmedConfig) -> bool:
    """Whether the form's balanced mix with ``sk`` (carrier included) and its base were
    measured: the mode uses of that resource come from a measurement."""
    base, k = mix(sk, t_sk, form, t_form, cfg.betas[0], cfg.max_kernel)
    return _ok(meas, _text(base)) and _ok(meas, _text(k))


def _as_plain(form: str, mode: tuple[Mapping[str, int], float, float],
              plain: tuple[Mapping[str, int], float, float], widths: Mapping[str, int],
              meas: Measurements, cfg: PalmedConfig) -> bool:
    """Whether the form's balanced mix beside a saturating kernel and the carrier (``mode``:
    that kernel, its time, the form's time in the mode) rose over its base as much a copy as
    its balanced mix beside the same saturating kernel alone did (``plain``: the kernel, its
    construction time, the form's singleton), within ``tol`` of the mode mix's time.

    Why: the mode changes the uses of a few forms against a few resources (the vector μops
    that leave port 1); elsewhere the lighter proportions beside the carrier measured again
    what the plain stages had measured (on the full profile of the Sapphire Rapids-class
    guest, 97,000 of the wide stage's first 184,000 kernels were lighter proportions). A mix
    of 512-bit and narrower vector forms settles nothing: the plain stages kept it apart for
    the mode, and the wide stage's own measurement of that same kernel is what it finds
    (on the simulated core, narrow forms then lost their uses of 512-bit resources: mixed
    kernels 1.7 % RMS, 33 % at most, against 0.06 %)."""
    sk_z, t_sk_z, t_mode = mode
    sk, t_sk, t_form = plain
    if not (math.isfinite(t_sk) and t_sk > 0):
        return False
    beta = cfg.betas[0]
    base_z, k_z = mix(sk_z, t_sk_z, form, t_mode, beta, cfg.max_kernel)
    base, k = mix(sk, t_sk, form, t_form, beta, cfg.max_kernel)
    if mixes_512(k, widths):
        return False
    texts = [_text(x) for x in (base_z, k_z, base, k)]
    if not all(_ok(meas, t) for t in texts):
        return False
    m_base_z, m_z, m_base, m = (meas[t] for t in texts)
    rise = (m - m_base) / (k[form] - base.get(form, 0))
    expect = m_base_z + rise * (k_z[form] - base_z.get(form, 0))
    return abs(m_z - expect) <= max(cfg.tol, 1e-9) * m_z


def _refit_mode(rho: dict[str, dict[int, float]], n_res: int, met: Mapping[str, set[int]],
                t_of: Mapping[str, float], meas: Measurements, rep_of: Mapping[str, str],
                wide: set[str], cfg: PalmedConfig, stats: _LPStats,
                log: Log, first: Set[str] = frozenset()) -> dict[str, dict[int, float]]:
    """The joint refit (``refit._polish``) of the wide uses over every measured kernel that
    holds a 512-bit form, members seen as their representatives; only the uses of resources
    a form met beside the carrier move. ``first`` (training kernels) are seen through the
    representatives as well."""
    known = set(rho)
    classes = Classes(dict(rep_of))
    sub: dict[str, float] = {}
    for text, m in meas.items():
        k = parse_canonical(text)
        if not any(f in wide for f in k):
            continue
        kk = through(k, classes)
        # the first measurement found of a kernel, its own or a member's, stands for it
        if set(kk) <= known:
            sub.setdefault(_text(kk), m)
    forms = sorted(known)
    bad = interacting_pairs({f: t_of[f] for f in forms}, sub, cfg.tol, cfg.max_mult)
    log(f"wide: joint refit of the wide uses over {len(sub)} kernels holding a 512-bit form")
    return _polish(rho, n_res, forms, t_of, sub, cfg, bad, stats, log, free=met,
                   first={_text(through(parse_canonical(t), classes)) for t in first})
