"""Flow conservation on a function's CFG: which blocks gdb must count, and every count from those.

This module owns the pure analysis behind ``cpumap.evaluate.counting``: the edges and
conservation equations of a CFG (``FlowSystem``), the static frequency estimate, self-loops
counted by trip count (``trip_loops``), the choice of blocks to measure (``plan_counting``,
``plan_breakpoints``) and the exact rational solve that derives every other count
(``derive_counts``), with ``CountError`` for counts that contradict the equations.  Nothing
here runs a program: it works on ``cpumap.evaluate.blocks`` blocks alone, so it is kept apart
from the gdb side (``cpumap.evaluate.counting``), which imports from here, never the reverse.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from cpumap.evaluate.blocks import Block


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

