"""Forms whose throughput depends on the code's layout, not on the multiset of instructions.

A resource model predicts a kernel from its multiset; the harness measures a multiset as a
loop body of about ``unroll_size`` instructions whose length and alignment change with the
forms' counts. For most forms that does not matter. For some it decides everything: on the
Sapphire Rapids-class guest, ``SUB r16, imm16`` alone measured from 0.21 to 2.7 cycles a
copy depending on how many copies a kernel instance held (a 16-bit immediate behind an
operand-size prefix is a length-changing prefix: the legacy decoders stall on it, the μop
cache does not, and which of them serves the loop depends on its size and alignment). Eight
of the 24 core resources of that host's full profile were defined by such forms, and every
other form measured against them got uses from noise.

So every form is measured alone at a few counts besides its singleton (``LAYOUT_COUNTS``);
where the time a copy spreads by more than ``LAYOUT_TOLS`` tol, or a probe could not be
measured at all, at a second set of counts (``LAYOUT_CONFIRM``): one of those not measurable,
or a spread as large over every count but 1, confirms it (so a singleton measured slow, or a
first probe lost, during a neighbour's burst does not condemn a form). Such forms are
*layout-sensitive*: never pair candidates (so never basic instructions, never defining a
resource), never in a refinement round's candidates, still fitted (their uses from the
singleton), and modelled approximately (``provenance.approximate`` names each with its
times), so that every prediction holding one is flagged and the held-out validation leaves
them out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from cpumap.model.palmed.config import Measurements
from cpumap.model.palmed.kernels import _text

#: Instance counts a form is measured at alone besides 1 (the loop bodies differ in length:
#: the generator unrolls ceil(unroll_size / count) instances).
LAYOUT_COUNTS = (24, 56)
#: Second counts, for the forms whose first ones spread.
LAYOUT_CONFIRM = (40, 88)
#: A form is layout-sensitive where its time a copy spreads by more than this many tol
#: (max / min - 1), at both sets of counts.
LAYOUT_TOLS = 5.0


def _per_copy(form: str, counts: Sequence[int], meas: Measurements) -> dict[int, float]:
    """Cycles a copy at each count; NaN where the kernel could not be measured."""
    out = {}
    for c in counts:
        v = meas.get(_text({form: c}), math.nan)
        out[c] = v / c if math.isfinite(v) and v > 0 else math.nan
    return out


def _spread(values: Sequence[float]) -> float:
    """max / min - 1; infinite where one could not be measured (the harness leaves out a
    kernel whose repetitions disagree beyond its uncertainty limit: on the Sapphire
    Rapids-class guest most length-changing-prefix probes, whose single repetitions ran from
    negative to 100 x the singleton's time)."""
    if any(not math.isfinite(v) for v in values):
        return math.inf
    return max(values) / min(values) - 1 if len(values) > 1 else 0.0


def layout_probe(forms: Sequence[str], meas: Measurements, tol: float,
                 ) -> tuple[list[str], dict[str, dict[int, float]]]:
    """The probe kernels still to measure (measure them and ask again), else none and the
    layout-sensitive forms with their cycles a copy at each count (1 included)."""
    limit = LAYOUT_TOLS * max(tol, 1e-9)
    need = [_text({f: c}) for f in forms for c in LAYOUT_COUNTS
            if _text({f: c}) not in meas]
    if need:
        return need, {}
    suspects = [f for f in forms
                if _spread(list(_per_copy(f, (1, *LAYOUT_COUNTS), meas).values())) > limit]
    need = [_text({f: c}) for f in suspects for c in LAYOUT_CONFIRM
            if _text({f: c}) not in meas]
    if need:
        return need, {}
    found = {}
    for f in suspects:
        # the second counts: one not measurable, or a spread among every count but 1 (a
        # first probe lost once to a neighbour's burst does not count against the form)
        times = _per_copy(f, (1, *LAYOUT_COUNTS, *LAYOUT_CONFIRM), meas)
        later = [t for c, t in times.items() if c != 1 and math.isfinite(t)]
        if _spread([times[c] for c in LAYOUT_CONFIRM]) == math.inf or _spread(later) > limit:
            found[f] = times
    return [], found


def layout_note(times: Mapping[int, float]) -> str:
    """Why a layout-sensitive form is approximate, with its measured times."""
    shown = ", ".join(f"{c}: {t:.3g}" if math.isfinite(t) else f"{c}: not measurable"
                      for c, t in sorted(times.items()))
    return ("throughput depends on the code layout, not on the instruction counts "
            f"(alone, cycles a copy at <copies per instance>: {shown}); predicted from its "
            "singleton")


def layout_json(layout: Mapping[str, Mapping[int, float]]) -> dict[str, dict[str, Any]]:
    """The layout probes' times for JSON (stage states, provenance): None where a probe could
    not be measured."""
    return {f: {str(c): t if math.isfinite(t) else None for c, t in sorted(u.items())}
            for f, u in sorted(layout.items())}


def layout_from_json(d: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """``layout_json`` read back: NaN where a probe could not be measured."""
    return {f: {int(c): math.nan if t is None else float(t) for c, t in u.items()}
            for f, u in d.items()}
