"""The SSE/AVX transition probe: does switching between legacy-SSE and 256-bit AVX forms cost
this host a penalty, and how many cycles per switch (:mod:`cpumap.isa.transition` says why it
matters and which forms are in which family).

One legacy-SSE and one 256-bit AVX form, both cheap, are measured alone and mixed in kernels
that make a known number of switches per instance (the generator interleaves a kernel's
forms, :func:`cpumap.measure.asmgen.interleave`). A mix's excess over the sum of its parts'
cycles (an upper bound of what a resource model would predict), divided by its switches, is
the cost of a switch. The penalty exists when every mix shows at least ``MIN_CYCLES_PER_SWITCH``
of it: Zen 3 shows about 170, Zen 4 none (a mix at or under the sum of its parts). The
reported cost is the smallest of the mixes' (a neighbour only slows a kernel down); the mixes
with 2 and 6 switches per instance tell whether the cost is per switch, as modelled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from cpumap.isa import transition
from cpumap.measure import asmgen

#: Forms tried first (cheap, register-only, on every host with SSE2 and AVX); else the first
#: measurable form of the family in the catalogue's order.
PREFERRED = {transition.SSE: ("ADDPD_XMM_XMM", "MULPD_XMM_XMM", "ANDPD_XMM_XMM"),
             transition.AVX: ("VSHUFPD_YMM_YMM_YMM_I8", "VADDPD_YMM_YMM_YMM",
                              "VANDPD_YMM_YMM_YMM")}
#: A switch costing at least this many cycles is a penalty (the micro-fault is ~100 times
#: more; a mix measured 2 cycles slower than its parts per switch is noise or a port clash).
MIN_CYCLES_PER_SWITCH = 5.0
#: The mixes probed: (SSE copies, AVX copies) per kernel instance.
MIXES = ((1, 1), (3, 3), (4, 1))


def _pick(forms: Any, fam: str) -> str | None:
    pool = [str(name) for name, status, encoding, ops in zip(
        forms["name"], forms["status"], forms["encoding"], forms["operands"], strict=True)
            if status == "ok" and transition.family(str(encoding), ops) == fam
            and not any(o.get("kind") == "mem" for o in transition.operands(ops))]
    for name in PREFERRED[fam]:
        if name in pool:
            return name
    return pool[0] if pool else None


def probe_kernels(sse: str, avx: str) -> list[str]:
    """The probe's kernels: both forms alone, then each mix of ``MIXES``."""
    alone = [asmgen.canonical({sse: 1}), asmgen.canonical({avx: 1})]
    return alone + [asmgen.canonical({sse: a, avx: b}) for a, b in MIXES]


def probe(forms: Any, measure: Callable[[list[str]], Mapping[str, float]]) -> dict[str, Any]:
    """The probe's record: forms, each mix's cycles, parts, switches and excess per switch,
    ``penalty`` and ``cycles_per_switch`` (0 without a penalty). ``probed`` is false, with a
    ``reason``, where the host or the catalogue has no form of one family or a kernel failed."""
    sse, avx = _pick(forms, transition.SSE), _pick(forms, transition.AVX)
    if sse is None or avx is None:
        missing = "legacy-SSE" if sse is None else "256-bit AVX"
        return {"probed": False, "penalty": False, "cycles_per_switch": 0.0,
                "reason": f"no measurable register-only {missing} form in the catalogue: "
                          "nothing can switch"}
    kernels = probe_kernels(sse, avx)
    got = measure(kernels)
    failed = [k for k in kernels if not (got.get(k, math.nan) > 0)]
    if failed:
        return {"probed": False, "penalty": False, "cycles_per_switch": 0.0,
                "sse_form": sse, "avx_form": avx,
                "reason": f"probe kernel(s) failed to measure: {', '.join(failed)}"}
    fams_pair = {sse: transition.SSE, avx: transition.AVX}
    t_sse, t_avx = got[kernels[0]], got[kernels[1]]
    mixes = []
    for text in kernels[2:]:
        k = asmgen.parse_canonical(text)
        parts = k[sse] * t_sse + k[avx] * t_avx
        n = transition.switches(asmgen.interleave(k), fams_pair)
        mixes.append({"kernel": text, "cycles": got[text], "parts": parts, "switches": n,
                      "excess_per_switch": (got[text] - parts) / n})
    penalty = all(m["excess_per_switch"] >= MIN_CYCLES_PER_SWITCH for m in mixes)
    return {"probed": True, "sse_form": sse, "avx_form": avx,
            "alone": {kernels[0]: t_sse, kernels[1]: t_avx}, "mixes": mixes,
            "penalty": penalty,
            "cycles_per_switch": min(m["excess_per_switch"] for m in mixes) if penalty else 0.0}


def summary(record: Mapping[str, Any]) -> str:
    """One line for logs and reports."""
    if not record.get("probed"):
        return f"SSE/AVX transition not probed: {record.get('reason', '')}"
    mixes = "; ".join(f"{m['kernel']} {m['cycles']:.2f} cycles ({m['switches']} switches, "
                      f"parts {m['parts']:.2f})" for m in record["mixes"])
    verdict = (f"penalty {record['cycles_per_switch']:.1f} cycles per switch"
               if record["penalty"] else "no penalty")
    return f"SSE/AVX transition: {verdict} ({mixes})"
