"""Kernel points of the real-kernel suite: operations, bytes and cycles per call.

For one benchmark (``<kernel>.<flagset>`` binary with the shared driver), one problem size n
and one cache state (warm: the data as the driver's setup left it; cold: after the driver's
eviction pass, ``--cold``):

* operations, exact, from the executed instructions: every instruction's execution count x
  its flops (cpumap.roofline.flops: FMA = 2, vector width and precision from the encoding).
  Counts come from Callgrind (valgrind's per-instruction execution counts, ``--dump-instr``,
  restricted to the kernel function) or, where valgrind cannot run the code (AVX-512: valgrind
  3.19 does not decode EVEX), from the basic blocks (cpumap.evaluate.blocks) x their gdb occurrences
  (cpumap.evaluate.counting) -- the same numbers, see tests;
* core-side bytes, exact: execution count x the bytes of the instruction's memory operands;
* memory-side bytes: no hardware counters here, so from Callgrind's cache simulation (D1 and
  LL with this machine's L1d and L3 geometry, write-back simulated): 64 x (LL misses + dirty
  evictions) of the measured call -- labelled ``callgrind-sim``; None (with the reason) where
  valgrind cannot run the binary.  The simulated call is the second of two (``--reps 2``,
  ``--dump-after``), so "warm" is the steady state of repeated calls;
* cycles: the driver's K repetitions (TSC ticks x calibrated core cycles per tick, or PAPI),
  natively, each repetition warm or cold as asked, in each of ``processes`` driver processes;
  the process with the fastest repetition is kept (a whole process can run slow on this
  guest, see suite.run_driver), the others' minima recorded as ``process_cycles_min``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from cpumap.evaluate import suite
from cpumap.evaluate.blocks import extract_blocks, function_bounds
from cpumap.evaluate.counting import count_blocks
from cpumap.isa.x86 import decode_all, instruction_hexes
from cpumap.roofline.flops import work_of_hex

LINE = 64


class PointError(RuntimeError):
    """A point could not be computed (counting, simulation or the driver failed)."""


class SkipPoint(RuntimeError):
    """A point left out on purpose (the reason says why)."""


# ----------------------------------------------------------------------------- code


def function_code(binary: Path, function: str) -> dict[int, str]:
    """Address -> instruction bytes (hex) of every instruction of ``function``."""
    addr, _size, code = function_bounds(binary, function)
    return {addr + ins.ip: h for ins, h in instruction_hexes(code)}


def has_evex(binary: Path, function: str) -> bool:
    """Does the function use EVEX (AVX-512) encodings, which valgrind 3.19 cannot run?"""
    import iced_x86 as ix

    _addr, _size, code = function_bounds(binary, function)
    return any(i.encoding == ix.EncodingKind.EVEX for i in decode_all(code))


def work_totals(code: Mapping[int, str], counts: Mapping[int, int]) -> dict:
    """Flops (total, per precision and kind, masked upper bound) and core-side bytes."""
    flops = 0
    masked = 0
    by_prec: dict[str, int] = defaultdict(int)
    by_kind: dict[str, int] = defaultdict(int)
    rd = wr = insns = 0
    for addr, n in counts.items():
        if n == 0:
            continue
        if addr not in code:
            raise PointError(f"count for address {addr:#x} outside the function")
        w = work_of_hex(code[addr])
        insns += n
        f = n * w.flops.flops
        if f:
            flops += f
            by_prec[w.flops.precision] += f
            by_kind[w.flops.kind] += f
            if w.flops.masked:
                masked += f
        rd += n * w.read_bytes
        wr += n * w.write_bytes
    return {"flops": flops, "flops_by_precision": dict(by_prec), "flops_by_kind": dict(by_kind),
            "flops_masked": masked, "core_read_bytes": rd, "core_write_bytes": wr,
            "core_bytes": rd + wr, "instructions": insns}


# ----------------------------------------------------------------------------- callgrind


_EVENTS_RE = re.compile(r"^events:\s*(.*)$")


def parse_callgrind(text: str, function: str) -> dict[int, dict[str, int]]:
    """Self cost per instruction address of ``function`` in one callgrind dump.

    Handles the format's name compression (``fn=(id) name`` / ``fn=(id)``, a name first
    defined in a ``cfn=`` line), relative
    instruction positions (``+n``, ``-n``, ``*``) and skips the inclusive cost line that
    follows a ``calls=`` line.
    """
    events: list[str] = []
    names: dict[str, str] = {}
    current = ""
    last_addr = 0
    skip_next = False
    out: dict[int, dict[str, int]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _EVENTS_RE.match(line)
        if m:
            events = m.group(1).split()
            continue
        if line.startswith(("fn=", "cfn=")):
            # a name is defined once per file, at its first use, in fn= or cfn= alike
            spec = line.split("=", 1)[1]
            mm = re.match(r"^\((\d+)\)\s*(.*)$", spec)
            name = spec
            if mm:
                if mm.group(2):
                    names[mm.group(1)] = mm.group(2)
                name = names.get(mm.group(1), "")
            if line.startswith("fn="):
                current = name
            continue
        if line.startswith("calls="):
            skip_next = True
            continue
        if "=" in line.split()[0] or not (line[0] in "+-*" or line.startswith("0x")):
            continue
        parts = line.split()
        pos = parts[0]
        if pos.startswith("0x"):
            addr = int(pos, 16)
        elif pos == "*":
            addr = last_addr
        else:
            addr = last_addr + int(pos)
        last_addr = addr
        if skip_next:
            skip_next = False
            continue
        if current != function:
            continue
        vals = [int(x) for x in parts[2:]]  # positions: instr line
        rec = out.setdefault(addr, dict.fromkeys(events, 0))
        for name, v in zip(events, vals, strict=False):
            rec[name] += v
    return out


def callgrind_run(binary: Path, function: str, args: Sequence[str], caches: Mapping[str, dict],
                  timeout: float = 600.0, valgrind: str = "valgrind") -> dict[int, dict[str, int]]:
    """Per-instruction costs of the LAST call of ``function`` (callgrind, cache simulation)."""
    if shutil.which(valgrind) is None:
        raise PointError("valgrind is not installed")
    with tempfile.TemporaryDirectory(prefix="cpumap-cg.") as tmp:
        out = Path(tmp) / "cg.out"
        cmd = [valgrind, "--tool=callgrind", "--dump-instr=yes", "--cache-sim=yes",
               "--simulate-wb=yes", f"--dump-after={function}", f"--toggle-collect={function}",
               "--collect-atstart=no", f"--callgrind-out-file={out}"]
        for key, flag in (("I1", "--I1"), ("D1", "--D1"), ("LL", "--LL")):
            if key in caches:
                c = caches[key]
                cmd.append(f"{flag}={c['bytes']},{c['ways']},{c['line']}")
        cmd += [str(binary), *map(str, args)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            raise PointError(f"callgrind ran past {timeout} s") from exc
        if proc.returncode != 0:
            raise PointError(f"callgrind failed ({proc.returncode}): {proc.stderr[-800:]}")
        dumps = sorted(Path(tmp).glob("cg.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1])
                       if p.name.rsplit(".", 1)[1].isdigit() else -1)
        dumps = [d for d in dumps if d.name.rsplit(".", 1)[1].isdigit()]
        if not dumps:
            raise PointError("callgrind wrote no dump after the function")
        return parse_callgrind(dumps[-1].read_text(), function)


def simulable_geometry(size: int, ways: int, line: int) -> dict:
    """A cache geometry Valgrind can simulate: same size and line, a power-of-two set count.

    Why: Valgrind's cache simulator needs 2^k sets (size = sets x ways x line) and refuses
    anything else, while caches need not have them (a KVM guest here reports a 480 MiB,
    16-way L3: 491,520 sets). The sets become the largest power of two at or below the real
    count that divides the number of lines, and the associativity takes the rest (262,144
    sets of 30 ways there): the same size and line, as many sets as the rule allows.
    """
    lines = max(1, size // line)
    sets = 1 << (max(1, lines // ways).bit_length() - 1)
    while lines % sets:
        sets >>= 1
    return {"bytes": lines * line, "ways": lines // sets, "line": line}


def callgrind_caches(machine: Mapping) -> dict[str, dict]:
    """I1, D1 and LL (the last level) geometry of machine.json for callgrind."""
    out: dict[str, dict] = {}
    caches = machine.get("caches", [])
    for c in caches:
        geo = simulable_geometry(int(c["size_bytes"]), int(c.get("ways") or 8),
                                 int(c.get("line_bytes") or LINE))
        if c.get("level") == 1 and c.get("type") == "Instruction":
            out["I1"] = geo
        elif c.get("level") == 1 and c.get("type") == "Data":
            out["D1"] = geo
    last = [c for c in caches if c.get("type") in ("Unified", "Data")]
    if last:
        c = max(last, key=lambda c: c["level"])
        out["LL"] = simulable_geometry(int(c["size_bytes"]), int(c.get("ways") or 16),
                                       int(c.get("line_bytes") or LINE))
    return out


def memory_bytes(costs: Mapping[int, Mapping[str, int]], line: int = LINE) -> dict:
    """DRAM-view bytes from callgrind: line x (LL misses + dirty evictions)."""
    tot: dict[str, int] = defaultdict(int)
    for rec in costs.values():
        for k, v in rec.items():
            tot[k] += v
    misses = tot["ILmr"] + tot["DLmr"] + tot["DLmw"]
    dirty = tot["ILdmr"] + tot["DLdmr"] + tot["DLdmw"]
    return {"mem_bytes": line * (misses + dirty), "mem_read_bytes": line * misses,
            "mem_write_bytes": line * dirty, "ll_misses": misses, "ll_dirty_evictions": dirty,
            "d1_misses": tot["D1mr"] + tot["D1mw"]}


# ----------------------------------------------------------------------------- points


def quantiles(values: Sequence[float]) -> dict:
    v = np.asarray(values, dtype=float)
    q = np.quantile(v, [0.0, 0.25, 0.5, 0.75, 1.0])
    return dict(zip(("min", "q1", "median", "q3", "max"), map(float, q), strict=True))


def count_point(binary: Path, benchmark: str, n: int, state: str, machine: Mapping, *,
                count_timeout: float = 300.0, sim_timeout: float = 600.0,
                gdb_max_footprint: int | None = None, cache: dict | None = None) -> dict:
    """The work of one point (executed instructions, flops, core and memory bytes), no timing.

    Apart from ``measure_point`` so that the pipeline runs it beside the measuring jobs: on
    the full profile the counting (valgrind's cache simulation above all) took 18 of the 20
    minutes of the points, on the measuring slot. ``cache`` memoises gdb counts across states.
    Raises SkipPoint when the point would need a gdb count of a footprint above
    ``gdb_max_footprint`` (one untimed driver call learns the footprint).
    """
    kernel, _flagset = suite.split_benchmark(benchmark)
    function = suite.function_name(kernel)
    code = function_code(binary, function)
    cold = state == "cold"
    t0 = time.monotonic()
    rec: dict = {}
    if has_evex(binary, function):
        cache = cache if cache is not None else {}
        key = (str(binary), int(n))
        if gdb_max_footprint is not None:
            if ("footprint", key) not in cache:
                cache["footprint", key] = int(suite.measure_kernel(
                    binary, n, 1, cold, min_ticks=0, timeout=count_timeout)["bytes_footprint"])
            footprint = cache["footprint", key]
            if footprint > gdb_max_footprint:
                raise SkipPoint(f"AVX-512 code (valgrind cannot run it) needs a gdb count, "
                                f"skipped for a footprint of {footprint} > "
                                f"{gdb_max_footprint} bytes (roofline.points.gdb_max_footprint)")
        if key not in cache:
            blocks = extract_blocks(binary, function)
            by_block = count_blocks(binary, function, blocks,
                                    suite.driver_args(n, 1, cold, untimed=True),
                                    timeout=count_timeout)
            cache[key] = {a: by_block.get(b.address, 0)
                          for b in blocks for a in _insn_addresses(b)}
        counts = cache[key]
        rec |= {"count_source": "gdb-blocks", "mem_bytes": None, "mem_bytes_source": "",
                "mem_bytes_reason": "valgrind cannot run AVX-512 (EVEX) code: no cache "
                                    "simulation, core-side bytes only"}
    else:
        costs = callgrind_run(binary, function, suite.driver_args(n, 2, cold, untimed=True),
                              callgrind_caches(machine), sim_timeout)
        counts = {a: c.get("Ir", 0) for a, c in costs.items()}
        rec |= {"count_source": "callgrind", **memory_bytes(costs),
                "mem_bytes_source": "callgrind-sim"}
    rec |= work_totals(code, counts)
    rec["count_seconds"] = time.monotonic() - t0
    return rec


def time_point(binary: Path, n: int, state: str, *, reps: int = 10, cpu: int | None = None,
               processes: int = 1) -> dict:
    """The native cycles of one point (see the module docstring)."""
    run = suite.measure_kernel(binary, n, reps, state == "cold", cpu, processes=processes)
    cycles = [float(c) for c in run["cycles"]]
    return {"reps": reps, "clock": run["clock"], "cycles_per_tick": run["cycles_per_tick"],
            "cycles": cycles, "cycles_q": quantiles(cycles),
            "bytes_footprint": int(run["bytes_footprint"]), "processes": int(run["processes"]),
            "process_cycles_min": [float(c) for c in run["process_cycles_min"]]}


def point_of(count: Mapping, timing: Mapping) -> dict:
    """A point from its count and its timing: performance and arithmetic intensities."""
    rec = {**count, **timing}
    if rec["flops"]:
        rec["perf_q"] = quantiles([rec["flops"] / c for c in rec["cycles"]])
    rec["intensity_core"] = rec["flops"] / rec["core_bytes"] if rec["core_bytes"] else None
    mb = rec.get("mem_bytes")
    rec["intensity_mem"] = rec["flops"] / mb if mb else None
    return rec


def _insn_addresses(block) -> list[int]:
    addrs, a = [], block.address
    for h in block.hexes:
        addrs.append(a)
        a += len(h) // 2
    return addrs


def _grid(benchmarks: Mapping[str, Path], sizes: Mapping[str, Sequence[int]],
          states: Iterable[str]) -> list[tuple[str, Path, int, str]]:
    states = list(states)
    return [(bench, Path(binary), int(n), state) for bench, binary in benchmarks.items()
            for n in sizes.get(suite.split_benchmark(bench)[0], []) for state in states]


def _point_row(bench: str, n: int, state: str) -> dict:
    kernel, flagset = suite.split_benchmark(bench)
    return {"benchmark": bench, "kernel": kernel, "flagset": flagset, "n": int(n),
            "state": state}


def _failed(row: dict, exc: Exception) -> dict:
    return row | {"status": "skipped" if isinstance(exc, SkipPoint) else "failed",
                  "reason": str(exc)[:500]}


def _each_point(grid: Sequence[tuple[str, Path, int, str]], what: str,
                one: Callable[[dict, str, Path, int, str], dict],
                progress: Callable[[str], None] | None) -> pd.DataFrame:
    """``one(row, bench, binary, n, state)`` for every point of ``grid``, with progress; an
    exception is that point's row with status and reason (the run goes on)."""
    rows = []
    t0 = time.monotonic()
    for i, (bench, binary, n, state) in enumerate(grid, 1):
        row = _point_row(bench, n, state)
        try:
            row = one(row, bench, binary, n, state)
        except Exception as exc:  # noqa: BLE001 - recorded per point, run goes on
            row = _failed(row, exc)
        rows.append(row)
        if progress:
            rate = i / max(time.monotonic() - t0, 1e-9)
            progress(f"{what} {i}/{len(grid)} ({len(grid) - i} left, {rate:.2f}/s): {bench} "
                     f"n={n} {state}: {row['status']} {row.get('reason', '')[:120]}")
    return to_frame(rows)


def count_points(benchmarks: Mapping[str, Path], sizes: Mapping[str, Sequence[int]],
                 states: Iterable[str], machine: Mapping, *, count_timeout: float = 300.0,
                 sim_timeout: float = 600.0, gdb_max_footprint: int | None = None,
                 progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """``count_point`` of every (benchmark, n, state); a point that could not be counted is
    a row with status and reason (the run goes on)."""
    caches: dict[str, dict] = defaultdict(dict)

    def one(row: dict, bench: str, binary: Path, n: int, state: str) -> dict:
        return row | count_point(binary, bench, n, state, machine, count_timeout=count_timeout,
                                 sim_timeout=sim_timeout, gdb_max_footprint=gdb_max_footprint,
                                 cache=caches[bench]) | {"status": "ok", "reason": ""}

    return _each_point(_grid(benchmarks, sizes, states), "count", one, progress)


def measure_points(benchmarks: Mapping[str, Path], sizes: Mapping[str, Sequence[int]],
                   states: Iterable[str], machine: Mapping, *, reps: int = 10,
                   cpu: int | None = None, counts: pd.DataFrame | None = None,
                   count_timeout: float = 300.0, sim_timeout: float = 600.0,
                   gdb_max_footprint: int | None = None,
                   progress: Callable[[str], None] | None = None,
                   processes: int = 1) -> pd.DataFrame:
    """Every (benchmark, n, state) point: its count (``counts``, from ``count_points``;
    counted here when None) and its native timing. A point whose count failed or was skipped
    keeps that row, untimed; a failed timing is a row with status and reason."""
    if counts is None:
        counts = count_points(benchmarks, sizes, states, machine, count_timeout=count_timeout,
                              sim_timeout=sim_timeout, gdb_max_footprint=gdb_max_footprint,
                              progress=progress)
    by_point = {(r["benchmark"], int(r["n"]), r["state"]): r
                for r in from_frame(counts).to_dict("records")}

    def one(row: dict, bench: str, binary: Path, n: int, state: str) -> dict:
        count = by_point.get((bench, n, state))
        if count is None:
            return row | {"status": "failed",
                          "reason": "no count of this point (roofline_counts)"}
        if count["status"] != "ok":
            return row | {"status": count["status"], "reason": count["reason"]}
        return point_of(count, time_point(binary, n, state, reps=reps, cpu=cpu,
                                          processes=processes))

    return _each_point(_grid(benchmarks, sizes, states), "time", one, progress)


JSON_COLUMNS = ("flops_by_precision", "flops_by_kind", "cycles", "cycles_q", "perf_q",
                "process_cycles_min")


def to_frame(rows: list[dict]) -> pd.DataFrame:
    """Points as a flat table (nested values as JSON text) for points.parquet."""
    import json

    df = pd.DataFrame(rows)
    for col in JSON_COLUMNS:
        if col in df.columns:
            df[col] = [json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else None
                       for v in df[col]]
    return df


def from_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Inverse of ``to_frame``: JSON columns back to Python objects."""
    import json

    df = df.copy()
    for col in JSON_COLUMNS:
        if col in df.columns:
            df[col] = [json.loads(v) if isinstance(v, str) else None for v in df[col]]
    return df
