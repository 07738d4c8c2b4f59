"""The issue width beside the resources: no kernel runs more instructions a cycle than the
host's front end renames (``cpumap.model.outside.add_issue_width`` measures it,
``cpumap.model.resmodel`` predicts with it).

Palmed's LPs hold the front end only as small uses spread over the resources that the
fastest forms met (on the Emerald Rapids-class guest, default run of 2026-12-06: ``NOP`` used
15 resources at 0.03-0.18 each), so a kernel of forms that take no port, or few, came out
faster than the host runs it: ``NOP*2 VMOVDQA_XMM_XMM*3`` (a move renaming removes) 0.50
cycles predicted, 0.84 measured, five instructions at six a cycle. The 183 of that run's 1,000
held-out kernels measured above 4.5 instructions a cycle were its worst (12.8 % RMS against
7.4 % for the others).

Model file: ``provenance.issue = {"width": instructions a cycle, "form": the fastest form
alone, which set it, "fastest_kernel" and "fastest_rate": the measured kernel that ran
fastest, "over": how many measured kernels ran faster than the width}``. Imports nothing: it
is on the prediction path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The name a prediction gives the issue width when it is the bottleneck.
ISSUE = "issue"


def read(provenance: Mapping[str, Any]) -> float:
    """The model's issue width in instructions a cycle; 0.0 where it has none."""
    rec = provenance.get("issue") or {}
    return float(rec.get("width") or 0.0)


def cycles(width: float, kernel: Mapping[str, int]) -> float:
    """Cycles per instance the issue width takes for a kernel (form -> count): its
    instructions over the width, 0 without one."""
    return sum(kernel.values()) / width if width > 0 else 0.0


def label(width: float) -> str:
    """What the bound is, for a reader of a prediction."""
    return f"issue width: at most {width:.3g} instructions per cycle (measured)"
