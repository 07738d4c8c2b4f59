"""L1 residency of a kernel on a warm cache, from Cachegrind (DESIGN §9, seed 003).

The seed discards kernels with more than 15 % cache misses on a warm cache: their time is
memory time, which no throughput model of the core claims to predict. "Warm" is made exact
here by differencing: Cachegrind runs the benchmark binary twice, with ``--reps 1`` and with
``--reps 1+K``, and the misses and accesses of the kernel function in the second run minus
those of the first are those of K repetitions that all ran after a first one, i.e. on a warm
cache; set-up code and the first (cold) repetition cancel out.

The miss rate is that of the simulated L1 data cache (D1), reads and writes together, of the
kernel function only (Cachegrind's per-function counts; compiler clones such as
``kernel_x.constprop.0`` included). Valgrind 3.19 cannot decode AVX-512 (EVEX) instructions:
such binaries stop with "unhandled instruction bytes"; that is recorded as ``unsupported`` with
Valgrind's own message, and the kernel's residency is then unchecked rather than guessed.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from cpumap.evaluate.analyzers.base import run_tool

__all__ = ["EVENTS", "function_counts", "parse_cachegrind_out", "warm_miss_rate"]

EVENTS = ["Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw"]
_UNHANDLED = re.compile(r"vex amd64->IR: unhandled instruction bytes:[^\n]*")


def parse_cachegrind_out(text: str) -> tuple[list[str], dict[str, list[int]]]:
    """(event names, per-function event totals) of a cachegrind.out file."""
    events: list[str] = []
    totals: dict[str, list[int]] = {}
    fn = None
    names: dict[str, str] = {}  # compressed "(id) name" references
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split(":", 1)[1].split()
        elif line.startswith("fn="):
            ref = line[3:].strip()
            m = re.fullmatch(r"\((\d+)\)(?: (.*))?", ref)
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                ref = names.get(m.group(1), ref)
            fn = ref
            totals.setdefault(fn, [0] * len(events))
        elif fn is not None and line[:1].isdigit():
            vals = [int(v) for v in line.split()[1:]]
            acc = totals[fn]
            for i, v in enumerate(vals[:len(acc)]):
                acc[i] += v
    return events, totals


def function_counts(events: list[str], totals: dict[str, list[int]],
                    function: str) -> dict[str, int]:
    """Event totals of ``function`` and its compiler clones (``function.<suffix>``)."""
    out = dict.fromkeys(events, 0)
    for fn, vals in totals.items():
        if fn == function or fn.startswith(function + "."):
            for e, v in zip(events, vals, strict=False):
                out[e] += v
    return out


def _run(binary: Path, args: list[str], out: Path, timeout_s: float, valgrind: str):
    cmd = [valgrind, "--tool=cachegrind", "--cache-sim=yes", f"--cachegrind-out-file={out}",
           str(binary), *args]
    return run_tool(cmd, timeout_s)


def warm_miss_rate(binary: str | Path, function: str, args: list[str] | None = None,
                   reps: int = 3, timeout_s: float = 600.0,
                   valgrind: str = "valgrind") -> dict:
    """D1 miss rate of ``function`` over ``reps`` warm repetitions (see module docstring).

    Returns ``status`` (ok | unsupported | failed), ``error``, and for ok the warm
    ``d1_accesses``, ``d1_misses``, ``d1_miss_rate``, ``ll_misses``, ``instructions``.
    """
    binary = Path(binary)
    base = list(args or [])
    counts = []
    with tempfile.TemporaryDirectory(prefix="cpumap-cg-") as d:
        for k in (1, 1 + int(reps)):
            out = Path(d) / f"cg-{k}.out"
            res = _run(binary, [*base, "--reps", str(k)], out, timeout_s, valgrind)
            m = _UNHANDLED.search(res.stderr)
            if m:
                return {"status": "unsupported", "error": (
                    f"valgrind cannot run this binary (AVX-512 / EVEX code): {m.group(0)}")}
            if res.status != "ok" or not out.exists():
                return {"status": "failed", "error": f"valgrind: {res.describe()}"}
            events, totals = parse_cachegrind_out(out.read_text())
            counts.append(function_counts(events, totals, function))
    if not any(counts[1].values()):
        return {"status": "failed", "error": f"no Cachegrind counts for function {function}"}
    diff = {e: counts[1][e] - counts[0][e] for e in counts[0]}
    acc = diff.get("Dr", 0) + diff.get("Dw", 0)
    miss = diff.get("D1mr", 0) + diff.get("D1mw", 0)
    return {"status": "ok", "error": "", "reps": int(reps), "instructions": diff.get("Ir", 0),
            "d1_accesses": acc, "d1_misses": miss,
            "d1_miss_rate": miss / acc if acc > 0 else 0.0,
            "ll_misses": diff.get("DLmr", 0) + diff.get("DLmw", 0)}
