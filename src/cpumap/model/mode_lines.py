"""The modes' probe records (``palmed.states``, ``palmed.dirty``) in words, for the model
report."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def wide_line(record: Mapping[str, Any] | None) -> str:
    """The wide probe and stage (``palmed.wide``) in words."""
    if not record:
        return "not probed"
    if not record.get("observed"):
        return (f"not seen ({record.get('reason')}; {record.get('probes', 0)} probes beside "
                f"{record.get('carriers', 1)} carriers, slowest "
                f"{record.get('probe_max_slowdown', 'n/a')} x alone)")
    by = record.get("encodings") or {}
    per = "; per encoding (slower of probes) " + ", ".join(
        f"{e or '?'} {s} of {n}" for e, (n, s) in sorted(by.items())) if by else ""
    states = record.get("states") or [{"carrier": record["carrier"],
                                       "probes_slower": record["probes_slower"]}]
    each = "; ".join(f"beside {st['carrier']}"
                     + (f" and {len(st['trigger']) - 1} more 512-bit forms" if "trigger" in st
                        else "") + f": {st['probes_slower']} of {record['probes']} slower"
                     for st in states)
    return (f"seen, {len(states)} state{'s' if len(states) > 1 else ''} ({each}; "
            f"{record.get('carriers', 1)} carriers probed{per}); the vector forms and the "
            f"others' uses of vector resources measured again in each state: "
            f"{record.get('kernels', 0)} kernels")


def dirty_line(record: Mapping[str, Any] | None) -> str:
    """The dirty-upper probe and state (``palmed.dirty``) in words."""
    if not record:
        return "not probed (the host pays a penalty per switch, or no mode is probed)"
    pairs = (f"{record.get('probes', 0)} legacy-SSE probes beside {record.get('carriers', 0)} "
             f"256-bit carriers against their 128-bit twins, slowest "
             f"{record.get('probe_max_slowdown', 'n/a')} x")
    if not record.get("observed"):
        return f"not seen ({record.get('reason')}; {pairs})"
    return (f"seen ({record['probes_slower']} probes slower beside a carrier, twice; {pairs}); "
            f"the legacy-SSE forms' uses measured beside {record['carrier']}: "
            f"{record.get('kernels', 0)} kernels")
