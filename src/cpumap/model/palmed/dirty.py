"""The dirty-upper state: legacy-SSE forms beside 256-bit AVX forms, on a host that pays no
penalty per switch between the two (part of stage 8, after the 512-bit states).

Intel cores since Skylake pay no switch between legacy SSE and AVX (the transition probe,
``cpumap.measure.transition``, sees none), but a legacy-SSE form that writes an xmm register
while a VEX or EVEX form of 256 bits or more has left the upper halves of the registers dirty
merges them with an extra μop. Measured on the Cascade Lake guest (2026-11-29, ``cpumap
measure --no-db``): ``MOVSD xmm, m64`` x 4 2.0 cycles alone, 2.92 beside ``VCVTDQ2PD ymm, xmm``
x 2, 2.77 beside ``VADDPD ymm`` x 2 (both on ports 0 and 1, as the merge μop), 2.01 beside
``VSHUFPD ymm`` x 2 (port 5); ``ADDPD xmm`` x 4 2.25 beside ``VSHUFPD ymm``, 1.98 beside
its 128-bit VEX twin, which zeroes the upper halves. It depends on which forms share the
kernel, not on their order: a state of the machine, like the 512-bit mode's. A model fitted
without it was worst there: on the default run of d554f42 the 229 held-out kernels mixing the
two families 11.1 % RMS IPC error, tau 0.848, the 771 others 6.5 %, 0.886.

So the mode machinery of ``palmed.wide`` and ``palmed.states`` runs once more, with other
roles (``roles``): the forms of the AVX family (``transition.family``) that are no trigger
of a 512-bit state are the *triggers* (the 512-bit ones' role), the legacy-SSE forms the
*narrow* ones, the others neither.

1. **Probe** (``probe``, in ``Build.start`` right after the 512-bit one): each SSE pair
   candidate in a balanced kernel with a register-only 256-bit carrier
   (``transition.carriers(cat, 256)``), against the same kernel with the carrier's 128-bit
   VEX twin (``twin``), which runs alike alone (within 2 tol, both measured) and leaves the
   upper halves clean. The 512-bit probe's way (the form's time a copy beside the carrier)
   cannot see it: the merge μop goes to other ports than the form's own (``MOVSD`` loads),
   so the form alone is no slower, but the kernel beside a carrier on the FP pipes is.
   Slower by more than ``MODE_TOLS`` tol in ``STATE_MIN_PROBES`` probes measured twice: the
   state is seen; none: nothing more.
2. Seen: the plain stages keep the two families apart (the plain model is the clean state).
3. **Fit** (``Build.wide``, after the 512-bit states): ``states.fit_states`` with
   ``only_narrow``: the SSE forms' uses beside the carrier against every resource; the
   triggers and the other forms keep their plain uses. The states go to the model after the
   512-bit ones: a kernel holding a 512-bit form is in that state, whose SSE uses were
   measured beside a 512-bit carrier, which leaves the upper halves dirty too.

Where the host pays a penalty per switch (Zen 2 and 3, the Sapphire Rapids-class guest) the
families are kept apart anyway and nothing is probed. Not modelled: ``VZEROUPPER`` cleans the
state, so a block holding it and a trigger runs its SSE forms in either state, by order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Any

from cpumap.isa.transition import AVX, SSE, WIDE_BITS
from cpumap.model.palmed.config import Measurements, PalmedConfig
from cpumap.model.palmed.kernels import _ok, _text, balanced
from cpumap.model.palmed.states import slowed
from cpumap.model.palmed.wide import MODE_TOLS, split

#: The dirty state's carriers are AVX forms of at least this many bits.
DIRTY_BITS = 256
#: The width the mode machinery reads for the narrow forms (legacy SSE writes xmm).
NARROW_BITS = 128
#: At most this many carriers (those with a twin, fastest first) are probed.
MAX_CARRIERS = 4


def roles(families: Mapping[str, str], above: Set[str] = frozenset()) -> dict[str, int]:
    """Form -> the vector length the mode machinery reads (``wide.split``,
    ``transition.mixes_512``): ``WIDE_BITS`` for an AVX-family form not in ``above`` (the
    512-bit states' triggers), ``NARROW_BITS`` for a legacy-SSE form; no entry for the
    others."""
    out = {}
    for f, fam in families.items():
        if fam == SSE:
            out[f] = NARROW_BITS
        elif fam == AVX and f not in above:
            out[f] = WIDE_BITS
    return out


def above(wide_mode: Mapping[str, Any], widths: Mapping[str, int]) -> set[str]:
    """The 512-bit states' triggers (every 512-bit form where the probe saw the mode, none
    else): kernels holding one are in those states, not in the dirty one."""
    if not wide_mode.get("observed"):
        return set()
    return {f for f, w in widths.items() if w >= WIDE_BITS}


def twin(form: str) -> str:
    """The 128-bit VEX twin's name of a 256-bit form (``VADDPD_YMM_YMM_YMM`` ->
    ``VADDPD_XMM_XMM_XMM``): the same μops on most cores, the upper halves left clean."""
    return form.replace("YMM", "XMM")


def _probe_kernels(z: str, f: str, singletons: Mapping[str, float], cfg: PalmedConfig,
                   times: int) -> tuple[dict[str, int], dict[str, int]]:
    """(carrier + form, twin + form) balanced, each count ``times`` over: not a plain
    stage's pair kernel, which the plain stages must measure clean."""
    m, n = balanced(singletons[z], singletons[f], cfg.max_mult)
    return {z: m * times, f: n * times}, {twin(z): m * times, f: n * times}


def probe(forms: Sequence[str], widths: Mapping[str, int], singletons: Mapping[str, float],
          meas: Measurements, candidates: Sequence[str], config: PalmedConfig,
          carriers: Sequence[str]) -> tuple[list[str], dict[str, Any] | None]:
    """(kernels to measure, None) until the probe is measured, then ([], record): whether
    the host has the state (``record["observed"]``), its carrier and (one) state, as
    ``states.probe``'s record says them. ``widths``: ``roles``."""
    cfg = config
    wide, narrow = split(forms, widths)
    record: dict[str, Any] = {"observed": False, "wide_forms": len(wide),
                              "narrow_forms": len(narrow)}
    t_tol = max(cfg.tol, 1e-9)
    # (a 512-bit carrier, where no 512-bit state took it, has no twin: its name is its own)
    zs = sorted((z for z in set(wide) & set(carriers) if twin(z) != z and twin(z) in singletons
                 and abs(singletons[twin(z)] - singletons[z]) <= 2 * t_tol * singletons[z]),
                key=lambda z: (singletons[z], z))[:MAX_CARRIERS]
    probes = sorted(set(narrow) & set(candidates))
    if not zs or not probes:
        record["reason"] = ("no 256-bit carrier with a 128-bit twin alike" if not zs
                            else "no legacy-SSE pair candidate")
        return [], record
    slow_at = 1 + MODE_TOLS * cfg.tol
    first: dict[tuple[str, str], float] = {}
    again: dict[tuple[str, str], float] = {}
    for times in (2, 4):  # the second measures again the pairs the first found slower
        todo = ([(z, f) for z in zs for f in probes] if times == 2
                else [zf for zf, v in first.items() if v > slow_at])
        pairs = {zf: _probe_kernels(*zf, singletons, cfg, times) for zf in todo}
        need = sorted({_text(k) for pair in pairs.values() for k in pair} - set(meas))
        if need:
            return need, None
        seen = {zf: meas[_text(a)] / meas[_text(b)] for zf, (a, b) in pairs.items()
                if _ok(meas, _text(a)) and _ok(meas, _text(b))}
        first, again = (seen, again) if times == 2 else (first, seen)
    slower = {zf for zf, v in again.items() if min(v, first[zf]) > slow_at}
    by = {z: sum(zf[0] == z for zf in slower) for z in zs}
    z0 = max(zs, key=lambda z: (by[z], -singletons[z]))
    record.update(carrier=z0, carriers=len(zs), probes=len(probes),
                  probe_max_slowdown=round(max(first.values(), default=float("nan")), 4),
                  probes_slower=len(slower),
                  observed=slowed(len(probes), len(slower)))
    if not record["observed"]:
        record["reason"] = "no probe slower beside a carrier than beside its 128-bit twin"
        return [], record
    record["states"] = [{"carrier": z0, "trigger": sorted(wide), "probes_slower": by[z0]}]
    # the probed forms no carrier slowed run alike in either state: the plain stages may mix
    # them with AVX forms (``calm``), as the 512-bit mode leaves calm encodings alone
    record["calm"] = sorted(f for f in probes if all((z, f) in first for z in zs)
                            and not any(zf[1] == f for zf in slower))
    return [], record


def calm_roles(widths: Mapping[str, int], record: Mapping[str, Any]) -> dict[str, int]:
    """``roles`` without the legacy-SSE forms the probe found as fast beside every carrier as
    beside its twin (``record["calm"]``), where it saw the state.

    Why: kept apart, no such form meets a 256-bit one in the plain stages, and where it
    defines a resource the 256-bit forms never meet it. On Zen 4 (default runs of
    2026-12-02) the state is the register moves' (``MOVAPD xmm, xmm`` renamed away while
    the upper halves are clean, on an FP pipe beside a 256-bit form); with every legacy form
    kept apart, ``ADDPD xmm`` defined the FP adders, the 256-bit adds got a resource of their
    own, and the kernels mixing the families came out 11.6-15.3 % RMS on four held-out sets,
    against 6.6-10.5 % from a run whose probe missed the state and mixed them all."""
    if not record.get("observed"):
        return dict(widths)
    calm = set(record.get("calm", ()))
    return {f: w for f, w in widths.items() if f not in calm}
