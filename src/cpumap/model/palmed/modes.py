"""Stage 8 of a build (``Build.wide``): the uses of forms in the host's modes, fitted after
the plain model, in the order predictions consult them: the 512-bit mode's states
(``palmed.wide``, ``palmed.states``), then the dirty-upper state (``palmed.dirty``)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from cpumap.isa import transition
from cpumap.measure.asmgen import parse_canonical
from cpumap.model.palmed.config import Log, PalmedConfig, _nolog
from cpumap.model.palmed.dirty import above
from cpumap.model.palmed.kernels import _holds_any, _text
from cpumap.model.palmed.lp import _LPStats
from cpumap.model.palmed.refit import _one_unit
from cpumap.model.palmed.states import fit_states
from cpumap.model.resmodel import OWN, ResourceModel, private
from cpumap.model.resmodel import predict as resmodel_predict

Measure = Callable[[list[str]], Sequence[float]]


class Build(Protocol):
    """What stage 8 reads and writes of a ``palmed.build.Build``."""

    config: PalmedConfig
    forms: list[str]
    meas: dict[str, float]
    counts: dict[str, int]
    wall: dict[str, float]
    lp: dict[str, dict[str, float]]
    apart: dict[str, str]
    avoided: list[str]
    widths: dict[str, int]
    wide_mode: dict[str, Any]
    dirty: dict[str, Any]
    dirty_widths: dict[str, int]

    @property
    def singletons(self) -> dict[str, float]: ...

    def run(self, stage: str, kernels: Sequence[str], measure: Measure, log: Log) -> None: ...

    def training(self, wide: bool = False) -> list[str]: ...


def fit_modes(b: Build, model: ResourceModel, measure: Measure, t_plain: Sequence[float],
              log: Log = _nolog) -> None:
    """The vector forms' uses beside a 512-bit form, then the legacy-SSE forms' beside a
    256-bit one, where the probes saw the modes, set in ``model.wide`` in that order; the
    probes' records go to the model's provenance either way. ``t_plain``: the saturating
    kernels' construction times, which found the plain stages' mixes."""
    for key, record in (("wide", b.wide_mode), ("dirty_upper", b.dirty)):
        if record:
            model.provenance[key] = dict(record)
    seen = b.wide_mode.get("observed"), b.dirty.get("observed")
    if not any(seen):
        return
    t0 = time.perf_counter()
    # the kernels the plain stages kept apart for a mode are the wide stage's own (a
    # mix of a narrow form with a 512-bit saturating kernel is the same kernel in both):
    # no longer known as failed, so that the stage asks for them
    mode = {k for k in b.avoided if not transition.mixes(parse_canonical(k), b.apart)}
    b.avoided = [k for k in b.avoided if k not in mode]
    for k in mode:
        b.meas.pop(k, None)
    # the shared resources: those with a saturating kernel (own resources are the plain
    # uses' business, a form in the mode gets its own below)
    shared = [r for r in model.resources if not private(r)]
    index = {r: i for i, r in enumerate(shared)}
    rho = {f: {index[r]: v for r, v in u.items() if r in index} for f, u in model.rho.items()}
    texts = [model.provenance["resources"][r]["saturating"] for r in shared]
    # a saturating kernel whose measurement failed is sized by the model's prediction
    saturating = [(sk, m if math.isfinite(m := b.meas.get(t, math.nan))
                   else resmodel_predict(model, sk)[0])
                  for t in texts for sk in [parse_canonical(t)]]
    classes = model.provenance.get("behaviour_classes") or {}
    fitted = []
    for stage, key, record, widths in (("wide", "wide", b.wide_mode, b.widths),
                                       ("wide-dirty", "dirty_upper", b.dirty, b.dirty_widths)):
        if not record.get("observed"):
            continue
        dirty = stage != "wide"
        training = [] if dirty else b.training(wide=True)
        if not dirty:  # fitted only by its refit (``wide._refit_mode``)
            b.run("wide-training", training, measure, log)
        st = _LPStats()

        def run(need: list[str], stage: str = stage) -> None:
            b.run(stage, need, measure, log)

        # the 512-bit mode also meets the units of the 512-bit forms' own
        units = [] if dirty else _trigger_units(model, widths, b.singletons, saturating)
        if units:
            log(f"wide: {len(units)} units of 512-bit forms' own met in the mode: "
                + ", ".join(f"{name} ({u})" for name, u, _sk, _t in units))
        # each unit's first form holds it for its time per copy, as outside the mode, and
        # every other 512-bit form its plain use of the unit (where its mixes with the unit's
        # kernel, which it meets, fail)
        rho_s = {f: dict(u) for f, u in rho.items()}
        for j, (name, u_own, sk, t_sk) in enumerate(units):
            model.provenance["resources"][name] = {"defining": _text(sk),
                                                   "saturating": _text(sk), "stage": "wide"}
            (h, n), = sk.items()
            for f, u in model.rho.items():
                if u.get(u_own, 0.0) > 0 and widths.get(f, 0) >= transition.WIDE_BITS:
                    rho_s.setdefault(f, {})[len(shared) + j] = u[u_own]
            rho_s.setdefault(h, {})[len(shared) + j] = t_sk / n
        names_s = shared + [name for name, *_ in units]
        fitted += [(trig, uses, own, names_s) for trig, uses, own in fit_states(
            record, b.forms, widths, b.singletons, b.meas, rho_s,
            saturating + [(sk, t_sk) for *_, sk, t_sk in units],
            [*t_plain, *(math.nan for _ in units)], classes, b.config, run, log, st,
            above(b.wide_mode, b.widths) if dirty else frozenset(),
            only_narrow=dirty, first=set(training),
            units=set(range(len(shared), len(shared) + len(units))))]
        model.provenance[key]["kernels"] = b.counts.get(stage, 0)
        b.lp[stage] = {"solves": st.solves, "seconds": st.seconds, "refit": st.refit}
    rep_of = {m: rep for rep, members in classes.items() for m in members}
    unit = {f: r for f, u in model.rho.items() for r in u if r.startswith(OWN)}  # plain
    states = []
    for trigger, uses, own, res_names in fitted:
        names = {f: unit.get(f, OWN + rep_of.get(f, f)) for f in own}
        one = _one_unit_in_mode(uses, own, names, trigger, b.meas, b.config.tol)
        if one:
            log(f"wide: {len(one)} resources of their own are one unit in the mode of "
                f"{len(trigger)} trigger forms ({', '.join(sorted(set(one.values())))})")
        states.append({"trigger": trigger,
                       "rho": {f: {res_names[i]: v for i, v in sorted(u.items())}
                               | ({one.get(names[f], names[f]): own[f]} if f in own else {})
                               for f, u in sorted(uses.items())}})
    model.wide = states[0] | ({"next": states[1:]} if states[1:] else {})
    mode_units = sorted({r for *_, res_names in fitted for r in res_names[len(shared):]})
    model.resources = shared + mode_units + sorted(
        {*(r for r in model.resources if private(r)),
         *(r for st in states for u in st["rho"].values() for r in u if private(r))})
    model.provenance["kernels"] = dict(b.counts)
    b.wall["wide"] = b.wall.get("wide", 0.0) + time.perf_counter() - t0


def _one_unit_in_mode(uses: dict[str, dict[int, float]], own: dict[str, float],
                      names: dict[str, str], trigger: Sequence[str],
                      meas: dict[str, float], tol: float) -> dict[str, str]:
    """own unit -> the unit it is one with in this state of the mode (``refit._one_unit``
    over the measured kernels that hold one of the state's ``trigger`` forms).

    Why: outside the mode, a narrow shuffle with two ports and a 512-bit one with one
    each had a resource of their own when no basic instruction was a shuffle (a run on
    the Emerald Rapids-class guest, 2026-12-02: ``VPSHUFB ymm`` in the class of ``VADDPD
    xmm``, ``VBROADCASTSS ymm``, ``VPERMQ zmm``); in the mode all of them run on port 5
    alone, but as three units the model predicted ``VBROADCASTSS_YMM_XMM*4 VMOVSD_M64_XMM*3
    VPERMQ_ZMM_ZMM_I8*4 VPSHUFB_YMM_YMM_YMM*3`` at 5.5 cycles, measured 11.0. The wide stage
    measures only against the shared resources' saturating kernels; the kernels in the mode
    that hold two such forms (training kernels, probes, mixes) tell whether their units add
    up."""
    trig = set(trigger)
    held = {t: m for t, m in meas.items() if _holds_any(t, trig)}
    return _one_unit(uses, {f: (names[f], v) for f, v in own.items()}, held, tol)


#: Name prefix of the 512-bit mode's resources for the units of the 512-bit forms' own
#: (``_trigger_units``): ``W00``, ``W01``...
MODE_UNIT = "W"
#: At most this many such units, those most trigger forms take for their bottleneck first.
MAX_MODE_UNITS = 4


def _trigger_units(model: ResourceModel, widths: dict[str, int], singletons: dict[str, float],
                   saturating: Sequence[tuple[dict[str, int], float]],
                   ) -> list[tuple[str, str, dict[str, int], float]]:
    """(name, unit, saturating kernel, its time) for the resources of their own that are the
    bottleneck of 512-bit forms outside the mode, most such forms first: the wide stage
    meets them as it meets the shared resources, a kernel of the unit's first form by name
    about the shared saturating kernels' median time.

    Why: the plain model can hold the 512-bit mode's port 5 only as units of their own (on
    the Emerald Rapids-class guest, a run whose basic instructions held no VEX shuffle:
    ``VPERMQ zmm``, ``VINSERTF64X4 zmm``, ``VBROADCASTSS zmm`` a unit each), and a narrow
    form whose shared uses explain it alone (``VMOVQ xmm, r64``, ``VUNPCKHPD xmm``) has no
    unit of its own to join them in the mode (``_one_unit_in_mode``): its kernels beside
    them were predicted 50-67 % fast."""
    held: dict[str, list[str]] = {}
    for f in sorted(model.rho):
        u = model.rho[f]
        if widths.get(f, 0) < transition.WIDE_BITS or not u or f not in singletons:
            continue
        top = max(sorted(u), key=u.__getitem__)
        if top.startswith(OWN):
            held.setdefault(top, []).append(f)
    if not held or not saturating:
        return []
    t_ref = statistics.median_high(t for _, t in saturating)
    out = []
    for unit_name in sorted(held, key=lambda r: (-len(held[r]), r))[:MAX_MODE_UNITS]:
        h = held[unit_name][0]
        n = max(1, round(t_ref / singletons[h]))
        out.append((f"{MODE_UNIT}{len(out):02d}", unit_name, {h: n}, n * singletons[h]))
    return out
