"""Exact basic-block occurrences of one function invocation, with gdb and flow conservation.

gdb (harness/gdb_count.py) breaks on the function's entry, then counts hits of breakpoints on
some blocks' first instructions until the invocation returns.  A breakpoint hit costs about
0.2 ms (a trap, gdb's bookkeeping and a step over the breakpoint), so instead of breaking on
every block we break only on the blocks whose counts flow conservation does not determine, and
derive the others.

Why the derived counts are exact.  Let x_e be the number of times control takes CFG edge e
during the invocation (edges: fall-through, direct jump targets, call -> next instruction, a
virtual edge ENTRY -> entry block and virtual edges exit blocks -> EXIT).  Because a block is
entered only at its first instruction and, once entered, leaves through exactly one out-edge
(cpumap.evaluate.blocks), every block v satisfies  count(v) = sum of x over in-edges = sum over
out-edges, and the invocation gives x(ENTRY -> entry) = 1 and sum of x into EXIT = 1.  These
equations hold for every run; a measured count adds one more.  count(v) is determined by them
exactly when its row (the in-edge indicator) lies in the row space of the equations' linear
parts -- then it takes the same value on every solution, so solving the system with exact
rational arithmetic gives its true value.  Which blocks to measure: the measured rows must
complete the span, a linear matroid, so the greedy choice in order of increasing estimated
frequency (static estimate: loops iterate 10 times, branches split evenly) gives the cheapest
set for that estimate.  The solver also checks the measured counts are consistent with the
equations and the derived ones non-negative integers, and fails loudly otherwise.

Counted loops without a breakpoint per iteration.  A block B that loops on itself (its
jcc goes back to B) has one predecessor P besides itself, which always continues into B
(P's only successor), and one exit X; if B writes some register R exactly once, by a
constant step c (add/sub $c, inc, dec, lea c(R), R) and no other instruction of B writes R,
then each entry into the loop runs B  T = (R at X - R after P) / c  times: nothing but B
runs between P's last instruction and X's first.  gdb reads R at a breakpoint on P's last
instruction (which must not write R or be a call) and at X, once per loop entry instead of
once per iteration; the sum of T over the entries is B's count ("trip" in the method column).
The division must be exact and T >= 1, or counting fails.  In the greedy choice such a
block costs freq(P) + freq(X) instead of freq(B).

Assumptions (true of the suite, checked where possible): the function's CFG is closed (no
indirect jmp, no conditional jump out of it -- otherwise every block is measured), calls
return normally (no longjmp/exit inside the counted invocation), the function is entered once
(recursion is handled by the return breakpoint, but re-entries would also be counted).

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
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from cpumap.evaluate.blocks import Block, BlockError, extract_blocks
from cpumap.store.files import write_json_atomic, write_table_atomic

GDB_SCRIPT = Path(__file__).resolve().parents[3] / "harness" / "gdb_count.py"
DEFAULT_TIMEOUT_S = 300.0
COUNTS_SCHEMA = pa.schema([
    ("benchmark", pa.string()), ("block_id", pa.int64()), ("address", pa.int64()),
    ("occurrences", pa.int64()), ("method", pa.string()),
])


class CountError(RuntimeError):
    """gdb counting failed: the program hung, crashed, never called the function, or its
    counts contradict flow conservation."""


# ------------------------------------------------------------------ flow conservation

@dataclass
class FlowSystem:
    """Edges and conservation equations of a function's CFG (module docstring)."""

    n_blocks: int
    edges: list[tuple[int, int]]  # (source, destination); ENTRY = -1, EXIT = -2
    in_edges: list[list[int]] = field(default_factory=list)

    @classmethod
    def of(cls, blocks: Sequence[Block]) -> FlowSystem:
        edges: list[tuple[int, int]] = [(-1, 0)]
        for b in blocks:
            edges += [(b.block_id, s) for s in b.successors]
            if b.exits:
                edges.append((b.block_id, -2))
        sys_ = cls(len(blocks), edges)
        sys_.in_edges = [[] for _ in blocks]
        for k, (_, d) in enumerate(edges):
            if d >= 0:
                sys_.in_edges[d].append(k)
        return sys_

    def count_row(self, v: int) -> list[Fraction]:
        row = [Fraction(0)] * len(self.edges)
        for k in self.in_edges[v]:
            row[k] = Fraction(1)
        return row

    def equations(self) -> list[tuple[list[Fraction], Fraction]]:
        """(row, right-hand side) of every conservation equation."""
        eqs = []
        for v in range(self.n_blocks):
            row = [Fraction(0)] * len(self.edges)
            for k, (s, d) in enumerate(self.edges):
                if d == v:
                    row[k] += 1
                if s == v:
                    row[k] -= 1
            eqs.append((row, Fraction(0)))
        entry = [Fraction(0)] * len(self.edges)
        entry[0] = Fraction(1)
        eqs.append((entry, Fraction(1)))
        exit_row = [Fraction(1 if d == -2 else 0) for _, d in self.edges]
        if any(exit_row):
            eqs.append((exit_row, Fraction(1)))
        return eqs


class _Span:
    """Incrementally row-reduced set of rows (exact rationals): membership and insertion."""

    def __init__(self, width: int):
        self.width = width
        self.rows: list[tuple[int, list[Fraction]]] = []  # (pivot column, row with pivot 1)

    def reduce(self, row: list[Fraction]) -> list[Fraction]:
        r = list(row)
        for piv, base in self.rows:
            if r[piv]:
                f = r[piv]
                r = [a - f * b for a, b in zip(r, base, strict=True)]
        return r

    def add(self, row: list[Fraction]) -> bool:
        r = self.reduce(row)
        piv = next((i for i, a in enumerate(r) if a), None)
        if piv is None:
            return False
        f = r[piv]
        self.rows.append((piv, [a / f for a in r]))
        return True

    def contains(self, row: list[Fraction]) -> bool:
        return not any(self.reduce(row))


def _dominators(blocks: Sequence[Block]) -> list[set[int]]:
    n = len(blocks)
    preds: list[list[int]] = [[] for _ in blocks]
    for b in blocks:
        for s in b.successors:
            preds[s].append(b.block_id)
    everything = set(range(n))
    dom = [set(everything) for _ in blocks]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for v in range(1, n):
            ps = [dom[p] for p in preds[v]]
            new = ({v} | set.intersection(*ps)) if ps else {v}
            if new != dom[v]:
                dom[v], changed = new, True
    return dom


def estimated_frequency(blocks: Sequence[Block]) -> np.ndarray:
    """Static estimate of each block's executions per invocation (for choosing breakpoints).

    Back edges (to a dominator) are taken with probability 0.9 (a loop iterates ~10 times),
    other branches split evenly; frequencies solve f = e_entry + P^T f.
    """
    n = len(blocks)
    if n == 0:
        return np.zeros(0)
    dom = _dominators(blocks)
    P = np.zeros((n, n))  # noqa: N806 (the transition matrix)
    for b in blocks:
        succ = b.successors
        if not succ:
            continue
        back = [s for s in succ if s in dom[b.block_id]]
        if back and len(back) < len(succ):
            for s in succ:
                P[b.block_id, s] = 0.9 / len(back) if s in back else 0.1 / (len(succ) - len(back))
        else:
            for s in succ:
                P[b.block_id, s] = 1.0 / len(succ)
    e = np.zeros(n)
    e[0] = 1.0
    try:
        f = np.linalg.solve(np.eye(n) - 0.999 * P.T, e)
    except np.linalg.LinAlgError:
        f = np.ones(n)
    return np.maximum(f, 0.0)


@dataclass
class TripLoop:
    """A self-loop block whose executions are counted from an induction register."""

    block: int
    pred: int        # block id of P
    pred_last: int   # address of P's last instruction (R is read there)
    exit: int        # block id of X (R is read at its first instruction)
    reg: str         # 64-bit name of R, e.g. "rax"
    step: int        # c
    width: int       # bits of the stepped register (32: arithmetic mod 2**32)


_STEP = {"add": 1, "sub": -1}


def _decode(block: Block) -> list:
    from cpumap.evaluate.blocks import _disassembler

    return list(_disassembler().disasm(bytes.fromhex("".join(block.hexes)), block.address))


def _written(insn) -> set[str]:
    from cpumap.isa import x86

    out = set()
    for r in insn.regs_access()[1]:
        name = insn.reg_name(r)
        try:
            out.add(x86.full_register(name.upper()).lower())
        except KeyError:
            out.add(name)
    return out


def _induction(insn) -> tuple[str, int, int] | None:
    """(64-bit register, step, width) when ``insn`` adds a constant to one GPR."""
    from capstone import x86 as X

    from cpumap.isa import x86

    ops = insn.operands
    mnem = insn.mnemonic.rstrip("lq") if insn.mnemonic not in ("leaq", "leal") else "lea"
    reg = None
    step = None
    if mnem in _STEP and len(ops) == 2 and ops[0].type == X.X86_OP_IMM and \
            ops[1].type == X.X86_OP_REG:
        reg, step = ops[1].reg, _STEP[mnem] * int(ops[0].imm)
    elif insn.mnemonic[:3] in ("inc", "dec") and len(ops) == 1 and ops[0].type == X.X86_OP_REG:
        reg, step = ops[0].reg, 1 if insn.mnemonic.startswith("inc") else -1
    elif mnem == "lea" and len(ops) == 2 and ops[0].type == X.X86_OP_MEM and \
            ops[1].type == X.X86_OP_REG and ops[0].mem.base == ops[1].reg and \
            ops[0].mem.index == 0 and ops[0].mem.segment == 0:
        reg, step = ops[1].reg, int(ops[0].mem.disp)
    if reg is None or not step:
        return None
    size = ops[-1].size
    if size not in (4, 8):
        return None
    try:
        full = x86.full_register(insn.reg_name(reg).upper()).lower()
    except KeyError:
        return None
    if full in ("rsp", "rip"):
        return None
    return full, step, 8 * size


def trip_loops(blocks: Sequence[Block]) -> dict[int, TripLoop]:
    """Self-loop blocks whose counts can come from an induction register (module docstring)."""
    preds: dict[int, list[int]] = {b.block_id: [] for b in blocks}
    for b in blocks:
        for t in b.successors:
            preds[t].append(b.block_id)
    out: dict[int, TripLoop] = {}
    for b in blocks:
        v = b.block_id
        others = [p for p in preds[v] if p != v]
        exits = [t for t in b.successors if t != v]
        if v == 0 or v not in b.successors or len(others) != 1 or len(exits) != 1 or \
                b.exits or b.open_end or not b.hexes:
            continue
        p = blocks[others[0]]
        if p.successors != [v] or p.exits or p.open_end or p.terminator.startswith("call"):
            continue
        try:
            insns = _decode(b)
            p_last = _decode(p)[-1]
        except Exception:  # undecodable bytes: no trip count, the block keeps a breakpoint
            continue
        writes = [_written(i) for i in insns]
        for k, ins in enumerate(insns):
            ind = _induction(ins)
            if ind is None:
                continue
            reg, step, width = ind
            if any(reg in w for j, w in enumerate(writes) if j != k) or \
                    reg in _written(p_last):
                continue
            out[v] = TripLoop(v, p.block_id, p_last.address, exits[0], reg, step, width)
            break
    return out


def plan_counting(blocks: Sequence[Block], all_blocks: bool = False,
                  trips: bool = True) -> tuple[list[int], dict[int, TripLoop]]:
    """(blocks to break on, self-loops counted by trip count) that determine every count.

    The greedy basis of ``plan_breakpoints``, where a block with a TripLoop costs the
    estimated executions of its P and X instead of its own.
    """
    if all_blocks or any(b.open_end for b in blocks):
        return [b.block_id for b in blocks], {}
    system = FlowSystem.of(blocks)
    span = _Span(len(system.edges))
    for row, _ in system.equations():
        span.add(row)
    freq = estimated_frequency(blocks)
    loops = trip_loops(blocks) if trips else {}
    cost = {v: min(freq[v], freq[loops[v].pred] + freq[loops[v].exit]) if v in loops
            else freq[v] for v in range(len(blocks))}
    bps: list[int] = []
    used: dict[int, TripLoop] = {}
    for v in sorted(range(len(blocks)), key=lambda v: (cost[v], v)):
        row = system.count_row(v)
        if not span.contains(row):
            span.add(row)
            if v in loops and cost[v] < freq[v]:
                used[v] = loops[v]
            else:
                bps.append(v)
    return sorted(bps), used


def plan_breakpoints(blocks: Sequence[Block], all_blocks: bool = False) -> list[int]:
    """Block ids to break on so that flow conservation determines every other block's count.

    Every block when ``all_blocks`` or when the CFG is open (indirect or outgoing conditional
    jumps); otherwise the greedy cheapest basis (module docstring).
    """
    if all_blocks or any(b.open_end for b in blocks):
        return [b.block_id for b in blocks]
    system = FlowSystem.of(blocks)
    span = _Span(len(system.edges))
    for row, _ in system.equations():
        span.add(row)
    freq = estimated_frequency(blocks)
    measured = []
    for v in sorted(range(len(blocks)), key=lambda v: (freq[v], v)):
        row = system.count_row(v)
        if not span.contains(row):
            span.add(row)
            measured.append(v)
    return sorted(measured)


def _solve(rows: list[list[Fraction]], rhs: list[Fraction], width: int) -> list[Fraction]:
    """One exact solution of rows @ x = rhs; CountError when the system is inconsistent."""
    m = [list(r) + [b] for r, b in zip(rows, rhs, strict=True)]
    pivots: list[int] = []
    r = 0
    for c in range(width):
        p = next((i for i in range(r, len(m)) if m[i][c]), None)
        if p is None:
            continue
        m[r], m[p] = m[p], m[r]
        f = m[r][c]
        m[r] = [a / f for a in m[r]]
        for i in range(len(m)):
            if i != r and m[i][c]:
                g = m[i][c]
                m[i] = [a - g * b for a, b in zip(m[i], m[r], strict=True)]
        pivots.append(c)
        r += 1
    for i in range(r, len(m)):
        if m[i][width]:
            raise CountError("measured counts contradict flow conservation (the CFG is "
                             "incomplete or the invocation did not run from entry to return)")
    x = [Fraction(0)] * width
    for i, c in enumerate(pivots):
        x[c] = m[i][width]
    return x


def derive_counts(blocks: Sequence[Block], measured: dict[int, int]) -> dict[int, int]:
    """Every block's count from the measured ones (block id -> count), exactly."""
    system = FlowSystem.of(blocks)
    eqs = system.equations()
    rows = [r for r, _ in eqs] + [system.count_row(v) for v in measured]
    rhs = [b for _, b in eqs] + [Fraction(int(c)) for c in measured.values()]
    span = _Span(len(system.edges))
    for row in rows:
        span.add(row)
    x = _solve(rows, rhs, len(system.edges))
    out: dict[int, int] = {}
    for v in range(len(blocks)):
        if v in measured:
            out[v] = int(measured[v])
            continue
        row = system.count_row(v)
        if not span.contains(row):
            raise CountError(f"block {v} is not determined by the measured blocks")
        val = sum((a * b for a, b in zip(row, x, strict=True)), Fraction(0))
        if val.denominator != 1 or val < 0:
            raise CountError(f"derived count of block {v} is {val}: the CFG is inconsistent")
        out[v] = int(val)
    return out


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
            gdb: str = "gdb", loops: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
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
                                    "loops": list(loops)}))
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
    res = run_gdb(binary, function, blocks[0].address, [blocks[v].address for v in measured],
                  args, timeout, gdb, loop_specs)
    hits = {v: res["counts"][blocks[v].address] for v in measured}
    hits |= {v: res["loop_counts"][blocks[v].address] for v in loops}
    counts = derive_counts(blocks, hits)
    method = {v: ("trip" if v in loops else "breakpoint" if v in hits else "derived")
              for v in counts}
    plain_s = plain_run_seconds(binary, args, timeout) if plain else None
    return CountResult(str(binary), function, [str(a) for a in args], blocks, counts, method,
                       int(res["hits"]), float(res["seconds"]), float(res["region_seconds"]),
                       plain_s)


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
        except (CountError, BlockError, OSError) as exc:
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
