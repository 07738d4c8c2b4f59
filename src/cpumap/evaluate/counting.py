"""Exact basic-block occurrences of one function invocation, with gdb and flow conservation.

gdb (harness/gdb_count.py) breaks on the function's entry, then counts hits of breakpoints on
some blocks' first instructions until the invocation returns.  A breakpoint hit costs about
0.2 ms (a trap, gdb's bookkeeping and a step over the breakpoint), so instead of breaking on
every block we break only on the blocks whose counts flow conservation does not determine, and
derive the others.

This module owns the gdb side: running harness/gdb_count.py (``run_gdb``), the plain-run
time for the slowdown, ``count``/``count_blocks``/``count_many``, the ``CountResult`` and the
counts files.  Which blocks to break on and how the other counts follow (flow conservation,
trip-count loops, the exact solve, and why the derived counts are exact) is
``cpumap.evaluate.flow``, kept apart because it is pure analysis that runs nothing.
``CountError``, ``derive_counts`` and ``plan_breakpoints`` are importable from here too, so
that callers of the counter need only this module.

``all_blocks=True`` breaks on every block (the cross-check the tests run).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from cpumap.evaluate.blocks import (
    Block,
    BlockError,
    FunctionNotFound,
    extract_blocks,
    rep_strings,
)
from cpumap.evaluate.flow import CountError, derive_counts, plan_counting
from cpumap.evaluate.flow import plan_breakpoints as plan_breakpoints  # re-exported
from cpumap.store.files import write_json_atomic, write_table_atomic

GDB_SCRIPT = Path(__file__).resolve().parents[3] / "harness" / "gdb_count.py"
DEFAULT_TIMEOUT_S = 300.0
COUNTS_SCHEMA = pa.schema([
    ("benchmark", pa.string()), ("block_id", pa.int64()), ("address", pa.int64()),
    ("occurrences", pa.int64()), ("method", pa.string()),
])


# ------------------------------------------------------------------ running gdb

@dataclass
class CountResult:
    """Occurrences of every block of one invocation, and what it cost."""

    binary: str
    function: str
    args: list[str]
    blocks: list[Block]
    counts: dict[int, int]           # block id -> occurrences
    method: dict[int, str]           # block id -> "breakpoint" | "derived"
    hits: int                        # breakpoint hits taken
    seconds: float                   # wall time of the gdb process
    region_seconds: float            # entry -> return under gdb
    plain_seconds: float | None = None  # wall time of a plain run of the same command
    #: repeated string instructions: address -> block_id, text, executions, iterations and
    #: executed (Callgrind's count of the instruction; harness/gdb_count.py)
    reps: dict[int, dict[str, Any]] = field(default_factory=dict)

    def static_instructions(self) -> int:
        """Instructions executed by the blocks' static counts (a repeated string instruction
        once per execution)."""
        return int(sum(c * self.blocks[v].n_insns for v, c in self.counts.items()))

    def executed_instructions(self) -> int:
        """Instructions executed, each iteration of a repeated string instruction counted as
        Callgrind counts it."""
        return self.static_instructions() + sum(r["executed"] - r["executions"]
                                                for r in self.reps.values())

    @property
    def by_address(self) -> dict[int, int]:
        return {self.blocks[v].address: c for v, c in self.counts.items()}

    def meta(self) -> dict[str, Any]:
        hits_per_s = self.hits / self.region_seconds if self.region_seconds > 0 else None
        return {"binary": self.binary, "function": self.function, "args": self.args,
                "n_blocks": len(self.blocks),
                "breakpoints": sum(m == "breakpoint" for m in self.method.values()),
                "trip_loops": sum(m == "trip" for m in self.method.values()),
                "derived": sum(m == "derived" for m in self.method.values()),
                "breakpoint_hits": self.hits,
                "occurrences_total": int(sum(self.counts.values())),
                "instructions_static": self.static_instructions(),
                "instructions_executed": self.executed_instructions(),
                "rep_instructions": [{"address": a, **r} for a, r in sorted(self.reps.items())],
                "seconds": self.seconds, "region_seconds": self.region_seconds,
                "hits_per_second": hits_per_s, "plain_seconds": self.plain_seconds,
                "slowdown": (self.seconds / self.plain_seconds
                             if self.plain_seconds else None)}


def _kill_group(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_gdb(binary: Path | str, function: str, entry: int, addresses: Sequence[int],
            args: Sequence[str] = (), timeout: float = DEFAULT_TIMEOUT_S,
            gdb: str = "gdb", loops: Sequence[dict[str, Any]] = (),
            reps: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Hit counts (ELF address -> hits) of breakpoints on ``addresses`` for one invocation.

    The arguments travel in a JSON file named in the environment (harness/gdb_count.py says
    how they reach the program: no shell, or sh with shlex quoting when one holds whitespace).
    gdb runs in its own session, killed with its program when ``timeout`` passes.
    """
    binary = Path(binary)
    with tempfile.TemporaryDirectory(prefix="cpumap-gdb-") as tmp:
        spec = Path(tmp) / "spec.json"
        out = Path(tmp) / "out.json"
        spec.write_text(json.dumps({"function": function, "entry": int(entry),
                                    "addresses": [int(a) for a in addresses],
                                    "args": [str(a) for a in args], "out": str(out),
                                    "loops": list(loops), "reps": list(reps)}))
        cmd = [gdb, "-batch", "-nx", "-x", str(GDB_SCRIPT), str(binary.resolve())]
        env = dict(os.environ, CPUMAP_GDB_SPEC=str(spec), SHELL="/bin/sh")
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise CountError(f"counting {binary.name} ({function}) ran past {timeout:g} s "
                             "and was killed") from None
        finally:
            _kill_group(proc)  # the program, should gdb have left it behind
        seconds = time.perf_counter() - t0
        if not out.exists():
            tail = (stderr.decode(errors="replace") or stdout.decode(errors="replace"))[-2000:]
            raise CountError(f"gdb gave no result for {binary.name} ({function}), exit "
                             f"{proc.returncode}: {tail.strip()}")
        res = json.loads(out.read_text())
    if "error" in res:
        raise CountError(f"{binary.name}: {res['error']}")
    res["seconds"] = seconds
    res["counts"] = {int(a): int(c) for a, c in res["counts"].items()}
    res["loop_counts"] = {int(a): int(c) for a, c in res.get("loop_counts", {}).items()}
    res["rep_counts"] = {int(a): c for a, c in res.get("rep_counts", {}).items()}
    return res


def plain_run_seconds(binary: Path | str, args: Sequence[str] = (),
                      timeout: float = DEFAULT_TIMEOUT_S) -> float:
    """Wall time of the same command without gdb (for the slowdown)."""
    t0 = time.perf_counter()
    subprocess.run([str(binary), *map(str, args)], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=timeout,
                   check=False)
    return time.perf_counter() - t0


def count(binary: Path | str, function: str, blocks: Sequence[Block] | None = None,
          args: Sequence[str] = (), *, all_blocks: bool = False, trips: bool = True,
          timeout: float = DEFAULT_TIMEOUT_S, plain: bool = True, catalogue=None,
          gdb: str = "gdb") -> CountResult:
    """Occurrences of every block of ``function`` for its first invocation by ``binary args``.

    ``all_blocks``: a breakpoint on every block, nothing derived; ``trips=False``: no
    trip-count loops (flow conservation only).
    """
    if blocks is None:
        blocks = extract_blocks(binary, function, catalogue)
    blocks = list(blocks)
    if not blocks:
        raise BlockError(f"{function} has no blocks")
    measured, loops = plan_counting(blocks, all_blocks, trips)
    loop_specs = [{"block": blocks[v].address, "pred_last": t.pred_last,
                   "exit": blocks[t.exit].address, "reg": t.reg, "step": t.step,
                   "width": t.width} for v, t in loops.items()]
    rep_at = {r.address: (b.block_id, r) for b in blocks for r in rep_strings(b)}
    rep_specs = [{"address": r.address, "next": r.next, "width": r.width, "cond": r.cond}
                 for _, r in rep_at.values()]
    # a block that starts with a repeated instruction is counted by the rep's own breakpoints
    # (a plain one there would count its iterations: gdb steps over it one at a time)
    by_rep = {v for v in measured if blocks[v].address in rep_at}
    res = run_gdb(binary, function, blocks[0].address,
                  [blocks[v].address for v in measured if v not in by_rep],
                  args, timeout, gdb, loop_specs, rep_specs)
    hits = {v: (res["rep_counts"][blocks[v].address]["executions"] if v in by_rep
                else res["counts"][blocks[v].address]) for v in measured}
    hits |= {v: res["loop_counts"][blocks[v].address] for v in loops}
    counts = derive_counts(blocks, hits)
    method = {v: ("trip" if v in loops else "breakpoint" if v in hits else "derived")
              for v in counts}
    plain_s = plain_run_seconds(binary, args, timeout) if plain else None
    reps = {a: {"block_id": v, "text": r.text, **res["rep_counts"][a]}
            for a, (v, r) in rep_at.items()}
    return CountResult(str(binary), function, [str(a) for a in args], blocks, counts, method,
                       int(res["hits"]), float(res["seconds"]), float(res["region_seconds"]),
                       plain_s, reps)


def count_blocks(binary: Path | str, function: str, blocks: Sequence[Block] | None = None,
                 args: Sequence[str] = (), **kw: Any) -> dict[int, int]:
    """CONTRACTS interface: block start address -> occurrences for one invocation."""
    return count(binary, function, blocks, args, plain=False, **kw).by_address


def count_many(jobs: Sequence[dict[str, Any]], processes: int = 2) -> list[CountResult | str]:
    """Count several benchmarks at once (each job: keyword arguments of ``count``).

    Each count is its own gdb process; ``processes`` run at a time.  A failed job yields its
    error message instead of a result, so one hanging benchmark does not stop the others.
    """
    def one(job: dict[str, Any]) -> CountResult | str:
        try:
            return count(**job)
        except (CountError, BlockError, FunctionNotFound, OSError) as exc:
            return f"{job.get('binary')}: {exc}"

    with ThreadPoolExecutor(max_workers=max(1, processes)) as pool:
        return list(pool.map(one, jobs))


def counts_frame(result: CountResult, benchmark: str) -> pd.DataFrame:
    rows = [{"benchmark": benchmark, "block_id": v, "address": result.blocks[v].address,
             "occurrences": c, "method": result.method[v]}
            for v, c in sorted(result.counts.items())]
    return pd.DataFrame(rows, columns=COUNTS_SCHEMA.names)


def write_counts(result: CountResult, benchmark: str, path: Path | str) -> Path:
    """counts parquet + ``<path without .parquet>.json`` with the cost of counting."""
    path = Path(path)
    df = counts_frame(result, benchmark)
    write_table_atomic(pa.Table.from_pandas(df, schema=COUNTS_SCHEMA, preserve_index=False),
                       path)
    meta = result.meta() | {"benchmark": benchmark}
    write_json_atomic(meta, path.with_name(path.name.removesuffix(".parquet") + ".json"))
    return path
