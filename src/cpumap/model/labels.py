"""Names and labels of a resource model's resources (``cpumap.model.resmodel``): which are one
form's or class's alone, and a readable label for each, derived from the forms that define it.

On the prediction path (``cpumap predict`` labels its bottlenecks): imports nothing heavy.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping
from typing import Any

from cpumap.model import flagchain, issue

#: Name prefixes of the resources of one form or class alone: ``chain:FORM``, a dependence
#: chain's (``cpumap.model.outside``), and ``own:FORM``, a unit a class of alike forms holds
#: longer than the ports it shares (``cpumap.model.palmed.refit._owned``).
CHAIN = "chain:"
OWN = "own:"


def private(resource: str) -> bool:
    """Whether a resource belongs to one form or class alone (a chain's or a class's own)."""
    return resource.startswith((CHAIN, OWN))


#: A use within this fraction of a form's largest one saturates with it (rounding in files).
_SATURATES = 1e-6
#: Mnemonics named in a label; the rest are counted.
_LABEL_NAMES = 4


def mnemonic(form: str) -> str:
    """The instruction of a form name (``VADDPD_YMM_YMM_YMM`` -> ``VADDPD``)."""
    return form.split("_", 1)[0]


def resource_labels(model: Any) -> dict[str, str]:
    """A readable label per resource, derived from the forms that define it.

    A form *saturates* resource r alone when r is its bottleneck (its use of r is its largest):
    a kernel of only that form runs at 1/use instances per cycle, limited by r. The label names
    the instructions (mnemonics, most forms first) that saturate r alone and their rates alone
    (one figure, or the range when they differ: multi-μop forms take more of r per
    instance): "ADD/SUB/XOR +9: 4 per cycle". A resource no form saturates alone (found
    from combinations only, e.g. a front-end limit) names the forms using the most of it:
    "shared by 38 forms, most VMOVUPD/VFMADD231PS". Deterministic: ties by name.

    Forms that take their whole time on every resource at once (the serialising forms of
    ``palmed.refit``: fences, LSL, RDSEED) name no resource: they would otherwise head every
    label and stretch every range (seen on the native full model: 20 of 24 labels
    "LFENCE/MFENCE/LAR/LSL +N: 0.000893-2 per cycle").

    A resource no form uses outside the 512-bit mode is labelled from the uses of the first
    state of the mode that has users for it, and says so: the joint refit can leave a plain
    resource to the wide uses alone (the Cascade Lake default run of 2026-11-28: 8 of 30,
    "unused" before).
    """
    labels = _labels(model.resources, model.rho)
    for _, table in model.wide_states:
        idle = [r for r in model.resources if labels[r] == "unused"]
        if not idle:
            break
        labels |= {r: f"{text} (beside 512-bit forms)"
                   for r, text in _labels(idle, table).items() if text != "unused"}
    if links := model.flags_chain[0]:  # not a resource, but a bottleneck predictions name
        labels[flagchain.FLAGS] = flagchain.label(links)
    if width := issue.read(model.provenance):  # nor is the issue width
        labels[issue.ISSUE] = issue.label(width)
    return labels


def _labels(resources: list[str], rho: Mapping[str, Mapping[str, float]]) -> dict[str, str]:
    """``resource_labels`` from one table of uses."""
    alone: dict[str, list[tuple[float, str]]] = {r: [] for r in resources}
    users: dict[str, list[tuple[float, str]]] = {r: [] for r in resources}
    mn = {form: mnemonic(form) for form in rho}
    # resources of one form or class (``private``) do not count towards "every resource"
    n_users = Counter(r for uses in rho.values() for r in uses)
    shared = sum(1 for r in n_users if n_users[r] > 1 and not private(r))
    for form in sorted(rho):
        uses = rho[form]
        top = max(uses.values(), default=0.0)
        if _everywhere(uses, top, shared):
            continue
        for r, v in uses.items():
            if v <= 0 or r not in alone:
                continue
            users[r].append((v, form))
            if v >= top * (1 - _SATURATES):
                alone[r].append((v, form))
    labels = {}
    for r in resources:
        if alone[r]:
            count: dict[str, int] = {}
            for _, form in alone[r]:
                count[mn[form]] = count.get(mn[form], 0) + 1
            names = sorted(count, key=lambda m: (-count[m], m))
            fast, slow = 1.0 / min(v for v, _ in alone[r]), 1.0 / max(v for v, _ in alone[r])
            rate = f"{fast:.3g}" if f"{fast:.3g}" == f"{slow:.3g}" else f"{slow:.3g}-{fast:.3g}"
            labels[r] = f"{_names(names, len(names))}: {rate} per cycle"
        elif users[r]:
            # the heaviest users' instructions first (a partial sort: a resource of a big
            # model has thousands of users)
            distinct = len({mn[f] for _, f in users[r]})
            names: list[str] = []
            for head in (64, len(users[r])):  # the first 64 users almost always suffice
                names = []
                for _, f in heapq.nsmallest(head, users[r], key=lambda t: (-t[0], t[1])):
                    if mn[f] not in names:
                        names.append(mn[f])
                if len(names) >= min(_LABEL_NAMES, distinct):
                    break
            labels[r] = f"shared by {len(users[r])} forms, most {_names(names, distinct)}"
        else:
            labels[r] = "unused"
    return labels


#: A form at its largest use on at least this many resources (and half of them) uses them all
#: for its own time: a serialising form, which names no resource.
_EVERYWHERE = 3


def _everywhere(uses: Mapping[str, float], top: float, n_res: int) -> bool:
    """Whether a form is at its largest use on (nearly) every shared resource."""
    if top <= 0:
        return False
    at_top = sum(1 for v in uses.values() if v >= top * (1 - _SATURATES))
    return at_top >= max(_EVERYWHERE, n_res // 2)


def _names(names: list[str], distinct: int) -> str:
    """The first names and how many distinct ones are left out."""
    text = "/".join(names[:_LABEL_NAMES])
    left = distinct - min(len(names), _LABEL_NAMES)
    return text + (f" +{left}" if left > 0 else "")
