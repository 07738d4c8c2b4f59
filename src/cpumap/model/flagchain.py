"""The loop-carried chain through the flags, beside the resources (``cpumap.model.outside``
finds it, ``cpumap.model.resmodel`` predicts with it).

Forms that write only part of the status flags merge their result with the flags before
them: a loop of them is a dependence chain, one link per copy, unless a form that writes all
the flags and reads none (a *breaker*: ADD, CMP, ...) runs anywhere in the loop. In program
order every flags writer waits for the one before it, so a loop-carried cycle passes through
all of them, and one breaker cuts it whatever the order of the kernel.

Model file: ``provenance.flags_chain = {"links": {form: cycles}, "breakers": [forms]}``.
Imports nothing: it is on the prediction path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The name a prediction gives the chain when it is the bottleneck.
FLAGS = "chain:flags"


def read(provenance: Mapping[str, Any]) -> tuple[dict[str, float], frozenset[str]]:
    """(links, breakers) of a model's provenance; ({}, ∅) where it has no chain."""
    rec = provenance.get("flags_chain") or {}
    return ({str(f): float(v) for f, v in (rec.get("links") or {}).items()},
            frozenset(rec.get("breakers") or ()))


def cycles(links: Mapping[str, float], breakers: frozenset[str],
           kernel: Mapping[str, int]) -> float:
    """Cycles per instance the flags chain takes in a kernel (form -> count): the sum of its
    links' times, 0 when it holds none or a breaker cuts the chain."""
    if not links or not breakers.isdisjoint(kernel):
        return 0.0
    return sum(n * links[f] for f, n in kernel.items() if f in links)


def label(links: Mapping[str, float]) -> str:
    """What the chain is, for a reader of a prediction."""
    names = sorted({f.split("_", 1)[0] for f in links})
    return (f"flags chain of {'/'.join(names[:4])}{f' +{len(names) - 4}' if len(names) > 4 else ''}"
            " (no form writing all the flags between them)")
