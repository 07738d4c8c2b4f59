"""The 512-bit mode's probe and its states: which 512-bit forms change which narrow ones.

The probe (stage 1, right after the singletons) measures each narrow vector form among the
pair candidates beside each candidate *carrier* (a 512-bit form that executes: not a move,
no memory operand, ``transition.carriers``), by two dense kernels (``wide.mode_kernels``):
its time in the mode. A probe slower than alone by more than ``MODE_TOLS`` tol is the mode.

A host may have more than one mode. Cascade Lake has two (measured on the guest,
2026-11-28): beside ``VADDPD zmm`` (an FP form, which wakes the second FMA unit on port 5)
``MULSD xmm`` runs 2 a cycle as alone and ``VPADDD xmm`` 2 instead of 3 (port 1 is gone, port
5 takes FP μops); beside ``VPADDQ zmm``, ``VPERMQ zmm`` or a 512-bit load or store, ``MULSD``
runs 1 a cycle (port 0 alone) and ``VPMULLD ymm`` at half speed. One carrier's uses
mispredicted the other kind: held-out kernels mixing narrow forms with 512-bit integer or
memory forms 19.4 % RMS, with 512-bit FP forms 8.8 %. So the carriers whose probes agree
(within ``MODE_TOLS`` tol, all but fewer than ``STATE_MIN_PROBES``) form a *state*, each
state gets the wide stage's uses of its own (``fit_states``), and a kernel holding forms of
two states takes the state that the two carriers together show (``_order``). Once some
probe is slower, every group of carriers is a state, one whose probes all run as alone
too: beside a 512-bit FP form the narrow FP forms keep two ports, but share them with it.
The 512-bit forms that were no carrier join the state whose probe times they match best on
the ``TELL_PROBES`` probes that tell the states apart best (two kernels each).

The probes are also counted per encoding (legacy, VEX/EVEX), and the mode covers only the
narrow forms of an encoding with ``STATE_MIN_PROBES`` slower probes in some state or too few
probes (``mode_widths``): Zen 4 slows only legacy-SSE forms beside a 512-bit one.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

from cpumap.isa.transition import WIDE_BITS
from cpumap.model.palmed.config import Kernel, Log, Measurements, PalmedConfig, _nolog
from cpumap.model.palmed.kernels import _text
from cpumap.model.palmed.lp import _LPStats
from cpumap.model.palmed.wide import (
    MODE_TOLS,
    carrier,
    fit_wide,
    mode_kernels,
    split,
    time_in_mode,
)

#: At most this many candidate carriers, fastest first, are probed with every probe form.
MAX_STATE_CARRIERS = 8
#: Two carriers are in different states when at least this many probes (or all their
#: common probes, if fewer) differ by more than ``MODE_TOLS`` tol in two measurements each
#: (``probe``): one probe apart is noise, and so is a probe apart once. Cascade Lake,
#: 2026-11-28, 33 probes: ``VMULPD zmm`` against ``VADDPD zmm`` 2 apart once (``VFMADD231PD
#: ymm`` 1.73 x against 1.00, ``VMOVSD m64, xmm`` 1.30 against 1.00: a neighbour's work),
#: which made it a state of its own; ``VPERMQ zmm`` 3 to 7 apart from the other integer
#: carriers, for real (port 5 alone: ``VADDPD ymm`` 1.57 x beside it, 2.01 beside
#: ``VPADDQ zmm``).
STATE_MIN_PROBES = 2
#: A 512-bit form that was no carrier joins the state whose probe times it is nearest on
#: this many probes, those that tell the states apart best (two kernels each): one probe
#: put the 512-bit store in a state of its own by one noisy time.
TELL_PROBES = 3
#: An encoding is left out of the mode only if at least this many of its probes, none
#: slower, say so.
MODE_CALM_MIN = 4


def probe(forms: Sequence[str], widths: Mapping[str, int], singletons: Mapping[str, float],
          meas: Measurements, probes: Sequence[str] | None = None,
          config: PalmedConfig | None = None, carriers: Sequence[str] | None = None,
          encodings: Mapping[str, str] | None = None,
          ) -> tuple[list[str], dict[str, Any] | None]:
    """(kernels to measure, None) until the probes are measured, then ([], record): whether
    the host has the mode (``record["observed"]``), its states (``record["states"]``: carrier
    and trigger forms of each, in priority order), the probes' slowdowns.

    Run right after the singletons: where the mode exists, no later stage may mix 512-bit and
    narrower vector forms (their uses differ by kernel), and the wide stage fits those
    kernels at the end, one state at a time."""
    cfg = config or PalmedConfig()
    wide, narrow = split(forms, widths)
    record: dict[str, Any] = {"observed": False, "wide_forms": len(wide),
                              "narrow_forms": len(narrow)}
    if not wide or not narrow:
        record["reason"] = "no 512-bit form" if not wide else "no narrower vector form"
        return [], record
    z0 = carrier(wide, singletons, carriers)
    pool = sorted(set(wide) & set(carriers)) if carriers is not None else list(wide)
    allowed = set(probes) if probes is not None else set(pool)
    pool = [f for f in pool if f in allowed] or [z0]
    cands = sorted({z0, *pool}, key=lambda f: (f != z0, singletons[f], f))[:MAX_STATE_CARRIERS]
    chosen = sorted(set(narrow) & set(probes)) if probes is not None else narrow
    pairs = {(c, f): mode_kernels(f, c, singletons, cfg) for c in cands for f in chosen}
    need = _missing(pairs.values(), meas)
    if need:
        return need, None
    ratio = {c: {f: t / singletons[f] for f in chosen
                 if (t := time_in_mode(f, pairs[c, f], meas)) is not None} for c in cands}
    slow_at = 1 + MODE_TOLS * cfg.tol
    # a probe apart between two carriers is measured again, by a pair of kernels of its own
    # (twice the carrier): a neighbour that slowed one kernel must not make a state
    again = {(c, f): mode_kernels(f, {c: 2}, singletons, cfg)
             for a, b in itertools.combinations(cands, 2)
             for f in _apart_probes(ratio[a], ratio[b], slow_at - 1) for c in (a, b)}
    need = _missing(again.values(), meas)
    if need:
        return need, None
    confirm: dict[str, dict[str, float]] = {c: {} for c in cands}
    for (c, f), pair in again.items():
        if (t := time_in_mode(f, pair, meas)) is not None:
            confirm[c][f] = t / singletons[f]
    clusters = _cluster(cands, ratio, slow_at - 1, confirm)
    slower = {f for cl in clusters for f, v in ratio[cl[0]].items() if v > slow_at}
    first = ratio[z0]
    probed = sorted(set().union(*(ratio[cl[0]] for cl in clusters)))
    # per encoding: [probes, probes slower in some state] (Zen 4: only legacy-SSE ones)
    by: dict[str, list[int]] = {}
    for f in probed:
        n = by.setdefault(_encoding_group((encodings or {}).get(f)), [0, 0])
        n[0] += 1
        n[1] += f in slower
    record.update(carrier=z0, carriers=len(cands), probes=len(first),
                  probe_max_slowdown=round(max(first.values(), default=math.nan), 4),
                  probes_slower=sum(v > slow_at for v in first.values()),
                  observed=any(slowed(n, k) for n, k in by.values()))
    if encodings is not None:
        record["encodings"] = by
    if not record["observed"]:
        record["reason"] = (f"fewer than {STATE_MIN_PROBES} probes of an encoding slower beside "
                            "a carrier than alone")
        return [], record
    calm = _calm(by) if encodings is not None else set()
    if calm:
        # the states are told apart by the probes of the forms the mode covers only: the
        # others meet the 512-bit forms in the plain stages, where sharing a unit with one
        # is plain resource sharing (Zen 4, a default run of 2026-12-02: VEX probes apart
        # between carriers made four states of the 512-bit forms, one of them a single form,
        # where the legacy-SSE probes tell two)
        enc = encodings or {}
        ratio = {c: {f: v for f, v in r.items() if _encoding_group(enc.get(f)) not in calm}
                 for c, r in ratio.items()}
        confirm = {c: {f: v for f, v in r.items() if f in ratio[c]} for c, r in confirm.items()}
        clusters = _cluster(cands, ratio, slow_at - 1, confirm)
    # the probes that tell the states apart best: the largest smallest gaps between them
    reps = [cl[0] for cl in clusters]
    common = sorted(set.intersection(*(set(ratio[c]) for c in reps)))
    tells = sorted(common, key=lambda f: (-min((abs(ratio[a][f] - ratio[b][f]) for a, b
                                                in itertools.combinations(reps, 2)),
                                               default=0.0), f))[:TELL_PROBES]
    others = [w for w in wide if w not in cands] if len(clusters) > 1 and tells else []
    # every cluster is a state once the mode is seen, one with no probe slower too: beside
    # Cascade Lake's 512-bit FP forms no narrow form runs slower alone (port 5 takes the FP
    # μops port 1 gave up), but they and the narrow FP forms share two ports, not three
    # (``ADDSD*3 VADDPD_YMM_YMM_M256*2 VFMADD231PS_ZMM_ZMM_ZMM*4``: 4.50 cycles, 2.47 at the
    # plain uses, 2026-11-28)
    joint = {(a[0], b[0]): mode_kernels(_apart(a[0], b[0], ratio), {a[0]: 1, b[0]: 1},
                                        singletons, cfg)
             for a, b in itertools.combinations(clusters, 2)}
    assign = {(w, f): mode_kernels(f, w, singletons, cfg) for w in others for f in tells}
    need = _missing([*joint.values(), *assign.values()], meas)
    if need:
        return need, None
    member = {c: k for k, cl in enumerate(clusters) for c in cl}
    for w in others:
        seen = {f: t / singletons[f] for f in tells
                if (t := time_in_mode(f, assign[w, f], meas)) is not None}
        if seen:
            member[w] = min(range(len(clusters)), key=lambda k: sum(
                abs(v - ratio[clusters[k][0]][f]) for f, v in seen.items()))
    # the others (one cluster, no probe to tell the states apart, kernels that failed): the
    # first cluster's, as a single mode would take them
    member = dict.fromkeys(wide, 0) | member
    order = _order(clusters, ratio, joint, meas, singletons)
    index = {c: k for k, cl in enumerate(clusters) for c in cl[:1]}
    record["states"] = [{"carrier": cl[0],
                         "trigger": sorted(w for w in wide if member.get(w) == index[cl[0]]),
                         "probes_slower": sum(v > slow_at for v in ratio[cl[0]].values())}
                        for cl in order]
    record["carrier"] = order[0][0]
    return [], record


def _calm(by: Mapping[str, Sequence[int]]) -> set[str]:
    """The encodings the mode leaves alone, of the probe record's ``encodings``: at least
    ``MODE_CALM_MIN`` probes and too few of them slower (``slowed``)."""
    return {e for e, (n, slower) in by.items() if not slowed(n, slower) and n >= MODE_CALM_MIN}


def slowed(probes: int, slower: int) -> bool:
    """Whether probes show a mode: ``STATE_MIN_PROBES`` of them slower (all, if fewer); an
    encoding's here, the dirty-upper probe's in ``palmed.dirty``. One slower probe is a
    neighbour or a form's own quirk, not a mode: on Zen 4 (default run, 2026-12-02)
    ``VCVTSI2SD xmm, xmm, r64`` ran 1.24 x its time alone beside ``VFMADD231PD zmm`` (1.17 x
    beside ``VPADDQ zmm``), the only one of 37 VEX/EVEX probes over 1.2 x, against 14 of 19
    legacy-SSE ones at 1.8-1.9 x; it put every VEX and EVEX form in the mode, which kept them
    out of the plain stages' kernels with 512-bit forms and made the wide stage measure 106
    narrow forms instead of 22 (its three states 530 s of a 30-minute default run)."""
    return slower >= min(STATE_MIN_PROBES, probes) and slower > 0


def _missing(pairs: Any, meas: Measurements) -> list[str]:
    return sorted({_text(k) for pair in pairs for k in pair} - set(meas))


def _cluster(cands: Sequence[str], ratio: Mapping[str, Mapping[str, float]], tol: float,
             confirm: Mapping[str, Mapping[str, float]] | None = None) -> list[list[str]]:
    """The candidates grouped, in order, with the first cluster whose first member's probes
    theirs match: fewer than ``STATE_MIN_PROBES`` (or than all common ones) apart by more
    than ``tol`` of the larger, in ``ratio`` and, where measured again, in ``confirm``."""
    again = confirm or {}
    out: list[list[str]] = []
    for c in cands:
        for cl in out:
            rep = cl[0]
            first = _apart_probes(ratio[c], ratio[rep], tol)
            second = set(_apart_probes(again.get(c, {}), again.get(rep, {}), tol))
            apart = sum(f in second or f not in again.get(c, {}) or f not in again.get(rep, {})
                        for f in first)
            common = set(ratio[c]) & set(ratio[rep])
            if apart < min(STATE_MIN_PROBES, max(len(common), 1)):
                cl.append(c)
                break
        else:
            out.append([c])
    return out


def _apart_probes(a: Mapping[str, float], b: Mapping[str, float], tol: float) -> list[str]:
    """The probes two carriers' times differ on by more than ``tol`` of the larger."""
    return sorted(f for f in set(a) & set(b) if abs(a[f] - b[f]) > tol * max(a[f], b[f]))


def _apart(a: str, b: str, ratio: Mapping[str, Mapping[str, float]]) -> str:
    """The probe on which carriers ``a`` and ``b`` differ most (first by name among equals)."""
    common = sorted(set(ratio[a]) & set(ratio[b]))
    return max(common, key=lambda f: (abs(ratio[a][f] - ratio[b][f]), f))


def _order(states: Sequence[list[str]], ratio: Mapping[str, Mapping[str, float]],
           joint: Mapping[tuple[str, str], tuple[Kernel, Kernel]], meas: Measurements,
           singletons: Mapping[str, float]) -> list[list[str]]:
    """The states by how many others they win over: state a wins over b when the probe that
    tells them apart, beside both carriers, runs nearer a's time than b's (a kernel holding
    forms of both is in a's state); the first found among ties."""
    wins = [0] * len(states)
    for (i, a), (j, b) in itertools.combinations(enumerate(states), 2):
        f = _apart(a[0], b[0], ratio)
        t = time_in_mode(f, joint[a[0], b[0]], meas)
        if t is None or abs(t / singletons[f] - ratio[a[0]][f]) \
                <= abs(t / singletons[f] - ratio[b[0]][f]):
            wins[i] += 1
        else:
            wins[j] += 1
    return [states[k] for k in sorted(range(len(states)), key=lambda k: (-wins[k], k))]


def _encoding_group(encoding: str | None) -> str:
    """VEX and EVEX count as one: Intel's port-1 rule holds for any vector μop, and few EVEX
    forms are among the probes (on the Sapphire Rapids-class guest 2 of 22 probes showed
    the mode), so a calm EVEX handful must not take EVEX forms out of it."""
    return "VEX/EVEX" if encoding in ("VEX", "EVEX") else str(encoding or "")


def mode_widths(widths: Mapping[str, int], record: Mapping[str, Any],
                encodings: Mapping[str, str] | None) -> dict[str, int]:
    """``widths`` without the narrow forms the mode leaves alone: those of an encoding whose
    probes (``MODE_CALM_MIN`` at least) were all as fast beside every carrier as alone.
    The later stages take a narrow form in ``widths`` for one the mode changes
    (``transition.mixes_512``, ``split``).

    Why: on Zen 4 only the legacy-SSE probes slow down beside a 512-bit form (17 of 21; every
    VEX and EVEX probe within 1.13 x); keeping all 3,615 narrow forms out of the plain stages'
    kernels with 512-bit forms left the plain model blind to how VEX/EVEX forms share the
    units its 512-bit basic forms define (``VPADDD ymm`` got its use of the four FP pipes on
    the FP multipliers, and kernels with it beside AES or FMA forms came out 30-50 % slow).
    An encoding no probe had stays in (the mode's, as before).
    """
    by = record.get("encodings")
    if not record.get("observed") or encodings is None or by is None:
        return dict(widths)
    calm = _calm(by)
    return {f: w for f, w in widths.items()
            if w >= WIDE_BITS or _encoding_group(encodings.get(f)) not in calm}


def fit_states(record: Mapping[str, Any], forms: Sequence[str], widths: Mapping[str, int],
               singletons: Mapping[str, float], meas: Measurements,
               rho: Mapping[str, Mapping[int, float]],
               saturating: Sequence[tuple[Mapping[str, int], float]],
               t_plain: Sequence[float], classes: Mapping[str, Sequence[str]],
               config: PalmedConfig, run: Callable[[list[str]], None], log: Log = _nolog,
               lp_stats: _LPStats | None = None, above: Set[str] = frozenset(),
               only_narrow: bool = False, first: Set[str] = frozenset(),
               units: Set[int] = frozenset(),
               ) -> list[tuple[list[str], dict[str, dict[int, float]], dict[str, float]]]:
    """Stage 8: the wide stage (``wide.fit_wide``) once per state of the probe's ``record``,
    in priority order, each with its carrier and the triggers of the states before it kept
    out; ``run`` measures the kernels a step needs (into ``meas``). Returns (trigger forms,
    uses, own uses) per state.

    A record without states (one carrier, as written before the states) is one state of
    every 512-bit form. ``above``: the triggers of states of another mode before these
    (``palmed.dirty``: the 512-bit ones); ``only_narrow``, ``first`` (the training
    kernels) and ``units`` (the mode's own): ``wide.fit_wide``'s."""
    states = record.get("states") or [{"carrier": record["carrier"],
                                       "trigger": split(forms, widths)[0]}]
    out = []
    above = set(above)
    for st in states:
        t0 = time.perf_counter()
        while True:
            step = fit_wide(forms, widths, singletons, rho, saturating, meas, st["carrier"],
                            t_plain=t_plain, classes=classes, config=config, log=log,
                            lp_stats=lp_stats, own=set(st["trigger"]), above=frozenset(above),
                            only_narrow=only_narrow, first=first, units=units)
            if step.done:
                break
            run(step.need)
        uses, own = step.result
        log(f"wide: state of {st['carrier']} ({len(st['trigger'])} trigger forms) fitted in "
            f"{time.perf_counter() - t0:.1f} s")
        out.append((list(st["trigger"]), uses, own))
        above |= set(st["trigger"])
    return out
