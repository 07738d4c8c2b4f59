"""``loop``: a dependency-aware predictor of a block run as a loop body (issue 15).

Palmed's resource model, and our measurement of a block's multiset, predict the throughput of
instructions that do not wait for each other. A real loop body carries dependences from one
iteration to the next (an accumulator, a pointer, a flag), and a chain of them bounds the
loop from below whatever the resources. The prediction is

    cycles per iteration = max(throughput bound, recurrence bound)

* **throughput bound**: another analyzer's cycles for the block (the pipeline gives ``native``,
  the block's multiset measured, and where the generator cannot build the multiset, the block
  measured as written, ``written``, whose figure includes its own chains);
* **recurrence bound**: the body is run, on paper, ``ITERATIONS`` times in order with only
  dependences as constraints (unlimited resources): each instruction starts when its inputs
  are ready and its outputs are ready its measured latency later; the bound is the steady
  slope, the cycles of the last ``ITERATIONS/2`` iterations over ``ITERATIONS/2``. That slope
  is the longest loop-carried dependence cycle per iteration (its mean latency per
  iteration), found without enumerating cycles.

Dependences through registers (full registers: writing EAX writes RAX; a vector register's
lanes are one), the flags (one unit), and memory: a load from the address expression of an
earlier store is ready the store-forwarding round trip after the stored value (the chain
``store; reload`` measured per link: from the data's readiness to the reload's result).
Address registers of a load feed its output through the form's own measured chain from
address to output (a load-op form's operation included) where it has one; else through the
64-bit load's load-use, after which a load-op form's operation (its latency measured with
the memory operand off the chain) starts when both its registers and the loaded value are
ready; a read-modify-write of memory stores its result the
form's measured chain through memory after its load could have had the value forwarded (the
chain of one address is the round trip of that latency). Zero idioms (``xor %eax, %eax``,
``vpxor %ymm1, %ymm1, %ymm1``...) read nothing.

Latencies are the measured chains of :mod:`cpumap.measure.latency` (the largest of a form's
register pairs, round trips across register classes by their share); a form without one
counts 1 cycle and the block's result says so (approximate).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import iced_x86 as ix
import pandas as pd

from cpumap.evaluate.analyzers.base import BlockInput, Result, failed
from cpumap.measure.latency import THROUGH_MEMORY

ITERATIONS = 32
_ZERO_IDIOMS = {"XOR", "SUB", "PXOR", "XORPS", "XORPD", "VPXOR", "VXORPS", "VXORPD", "VPXORD",
                "VPXORQ", "PSUBB", "PSUBW", "PSUBD", "PSUBQ", "VPSUBB", "VPSUBW", "VPSUBD",
                "VPSUBQ", "PCMPGTB", "PCMPGTW", "PCMPGTD", "PCMPGTQ", "VPCMPGTB", "VPCMPGTW",
                "VPCMPGTD", "VPCMPGTQ", "PCMPEQB", "PCMPEQW", "PCMPEQD", "PCMPEQQ", "VPCMPEQB",
                "VPCMPEQW", "VPCMPEQD", "VPCMPEQQ"}
_READS = {ix.OpAccess.READ, ix.OpAccess.COND_READ, ix.OpAccess.READ_WRITE,
          ix.OpAccess.READ_COND_WRITE}
_WRITES = {ix.OpAccess.WRITE, ix.OpAccess.COND_WRITE, ix.OpAccess.READ_WRITE,
           ix.OpAccess.READ_COND_WRITE}
_MNEMONIC = {v: k for k, v in vars(ix.Mnemonic).items() if isinstance(v, int)}


def _full(reg: int) -> int:
    """The whole register (EAX -> RAX; XMMn -> ZMMn: a vector's lanes are one register here)."""
    return ix.RegisterExt.full_register(reg)


def _kind(pair: str) -> str:
    if "load-use" in pair:
        return "load"
    return "rmw" if THROUGH_MEMORY in pair else "reg"


def form_latencies(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Kind -> form -> the largest latency of its measured chains of that kind (rows of
    ``latency_rows``): ``reg`` (through registers and flags), ``load`` (address to loaded
    value) and ``rmw`` (a read-modify-write through memory)."""
    ok = table[table.status == "ok"]
    out: dict[str, dict[str, float]] = {"reg": {}, "load": {}, "rmw": {}}
    kinds = ok.pair.astype(str).map(_kind)
    for (kind, form), v in ok.groupby([kinds, "form"]).latency.max().items():
        out[str(kind)][str(form)] = float(v)
    return out


def recurrence_bound(code: bytes, forms: tuple[str, ...], lat: Mapping[str, float],
                     load_use: float, forwarding: float, loads: Mapping[str, float] | None = None,
                     rmw: Mapping[str, float] | None = None) -> tuple[float, list[str]]:
    """(cycles per iteration of the longest loop-carried chain, forms without a latency).

    ``lat``: register latencies per form; ``loads``: load-use per load form (default
    ``load_use``); ``rmw``: chains through memory per read-modify-write form."""
    loads, rmw = loads or {}, rmw or {}
    decoder = ix.Decoder(64, code)
    insns = list(decoder)
    if len(insns) != len(forms):
        raise ValueError("the block's instructions and forms differ in number")
    factory = ix.InstructionInfoFactory()
    steps = []
    missing = []
    for ins, form in zip(insns, forms, strict=True):
        info = factory.info(ins)
        regs = info.used_registers()
        srcs = {_full(u.register) for u in regs if u.access in _READS}
        dsts = {_full(u.register) for u in regs if u.access in _WRITES}
        addr = set()
        mem_r, mem_w = [], []
        for m in info.used_memory():
            # the address expression; the values of its registers are told apart below by
            # how many times each was written (the same text after `add $8, %rdx` is another
            # address: no dependence through memory)
            key = (m.segment, _full(m.base) if m.base != ix.Register.NONE else None,
                   _full(m.index) if m.index != ix.Register.NONE else None, m.scale,
                   m.displacement)
            for r in (m.base, m.index):
                if r != ix.Register.NONE:
                    addr.add(_full(r))
            if m.access in _READS:
                mem_r.append(key)
            if m.access in _WRITES:
                mem_w.append(key)
        srcs -= addr  # address registers are read through the load below
        name = _MNEMONIC.get(ins.mnemonic, "")
        if name in _ZERO_IDIOMS and ins.op_count >= 2 and all(
                ins.op_kind(k) == ix.OpKind.REGISTER for k in range(ins.op_count)) and len(
                {ins.op_register(k) for k in range(1 if ins.op_count == 3 else 0,
                                                    ins.op_count)}) == 1:
            srcs = set()
        if ins.rflags_read:
            srcs.add("FLAGS")
        if ins.rflags_written or ins.rflags_cleared or ins.rflags_set or ins.rflags_modified:
            dsts.add("FLAGS")
        if form in lat:
            latency = lat[form]
        elif mem_r and mem_w and form in rmw:
            latency = max(rmw[form] - forwarding, 0.0)
        elif mem_r and not srcs:
            latency = 0.0  # a plain load: its value is ready a load-use after its address
        else:
            latency = 1.0
            # not measured: noted below when something reads what it writes
            missing.append((len(steps), form or ix.Formatter(ix.FormatterSyntax.GAS).format(ins)))
        steps.append((srcs, dsts, addr, mem_r, mem_w, latency, loads.get(form)))
    flags_read = any("FLAGS" in st[0] for st in steps)
    # a form whose latency nobody waits for (a compare whose flags only the dropped branch
    # read, a store, a nop) needs none
    missing = [name for k, name in missing
               if steps[k][1] - {"FLAGS"} or ("FLAGS" in steps[k][1] and flags_read)]
    ready: dict = {}
    stored: dict = {}
    version: dict = {}  # register -> writes so far: an address is its expression and these

    def where(key):
        return key + (version.get(key[1], 0), version.get(key[2], 0))

    ends = []
    for _ in range(ITERATIONS):
        end = 0.0
        for srcs, dsts, addr, mem_r, mem_w, latency, own in steps:
            t = max((ready.get(r, 0.0) for r in srcs), default=0.0)
            t_addr = max((ready.get(r, 0.0) for r in addr), default=0.0)
            if mem_r and own is not None:
                # the form's own chain from its address to its output (the operation of a
                # load-op form included); a value just stored comes through forwarding, then
                # the operation
                t_val = t_addr + own
                for key in mem_r:
                    if where(key) in stored:
                        t_val = max(t_val, stored[where(key)] + forwarding + latency)
                finish = max(t_val, t + latency) if srcs else t_val
            elif mem_r:
                # the loaded value: its address, then the 64-bit load's load-use; a value just
                # stored at the same address comes through forwarding
                t_load = t_addr + load_use
                for key in mem_r:
                    if where(key) in stored:
                        t_load = max(t_load, stored[where(key)] + forwarding)
                # a plain load (no register input): the value is the load's; a load-op form:
                # its operation (the latency measured with the memory operand off the chain)
                # starts when both the registers and the loaded value are there
                finish = t_load if not srcs and not mem_w else max(t, t_load) + latency
            else:
                finish = max(t, t_addr) + latency
            for key in mem_w:  # the stored value: a register's, or a read-modify-write's result
                stored[where(key)] = finish if mem_r else t
            for r in dsts:
                ready[r] = finish
                version[r] = version.get(r, 0) + 1
            end = max(end, finish)
        ends.append(end)
    half = ITERATIONS // 2
    return (ends[-1] - ends[half - 1]) / (ITERATIONS - half), sorted(set(missing))


class Precomputed:
    """Another analyzer's answers, read back from its predictions table (the pipeline runs
    ``native`` once; ``loop`` takes its throughput bounds from there)."""

    def __init__(self, name: str, predictions: pd.DataFrame):
        self.name = name
        self.rows = {(str(r.benchmark), int(r.block_id)): Result(
            cycles=float(r.cycles), status=str(r.status), error=str(r.error or ""))
            for r in predictions.itertuples(index=False)}

    def predict(self, blocks: list[BlockInput]) -> dict[tuple[str, int], Result]:
        return {b.key: self.rows.get(b.key, failed(f"no {self.name} prediction"))
                for b in blocks}


class FirstOk:
    """The first of several analyzers that answers a block (the loop analyzer's throughput
    bound: the block's multiset measured, else the block measured as written, which the
    generator cannot refuse for want of registers or for a LEAVE)."""

    def __init__(self, analyzers: list):
        self.analyzers = analyzers
        self.name = " or ".join(a.name for a in analyzers)

    def predict(self, blocks: list[BlockInput]) -> dict[tuple[str, int], Result]:
        out: dict[tuple[str, int], Result] = {}
        whys: dict[tuple[str, int], list[str]] = {}
        for a in self.analyzers:
            todo = [b for b in blocks if b.key not in out]
            if not todo:
                break
            for key, r in a.predict(todo).items():
                if r.status == "ok":
                    note = [f"from {a.name} ({'; '.join(whys[key])})"] if key in whys else []
                    out[key] = Result(cycles=r.cycles, seconds=r.seconds,
                                      error="; ".join(note + ([r.error] if r.error else [])))
                else:
                    whys.setdefault(key, []).append(f"{a.name}: {r.error}")
        for b in blocks:
            if b.key not in out:
                out[b.key] = failed("; ".join(whys.get(b.key, ["no answer"])))
        return out


class LoopAnalyzer:
    """max(throughput bound of ``throughput``, recurrence bound with measured latencies)."""

    name = "loop"

    def __init__(self, latencies: pd.DataFrame, throughput, load_form: str = "MOV_R64_M64",
                 store_form: str = "MOV_M64_R64"):
        kinds = form_latencies(latencies)
        self.lat, self.loads, self.rmw = kinds["reg"], kinds["load"], kinds["rmw"]
        self.throughput = throughput
        pairs = latencies[latencies.status == "ok"]
        lu = pairs[(pairs.form == load_form) & pairs.pair.str.contains("load-use")]
        st = pairs[(pairs.form == store_form) & pairs.pair.str.startswith("store->load")]
        self.load_use = float(lu.latency.iloc[0]) if len(lu) else float("nan")
        self.forwarding = float(st.latency.iloc[0]) if len(st) else float("nan")

    def describe(self) -> str:
        return (f"max(throughput bound: {self.throughput.name}; recurrence bound: longest "
                f"loop-carried chain with {len(self.lat)} measured form latencies, load-use "
                f"{self.load_use:.2f}, store forwarding {self.forwarding:.2f} cycles)")

    def predict(self, blocks: list[BlockInput]) -> dict[tuple[str, int], Result]:
        thr = self.throughput.predict(blocks)
        out: dict[tuple[str, int], Result] = {}
        for b in blocks:
            t0 = time.monotonic()
            base = thr.get(b.key) or failed("no throughput bound")
            if base.status != "ok":
                out[b.key] = failed(f"no throughput bound: {base.error}")
                continue
            if not b.code:
                out[b.key] = Result(cycles=base.cycles)
                continue
            rec, missing = recurrence_bound(b.code, b.forms, self.lat, self.load_use,
                                            self.forwarding, self.loads, self.rmw)
            notes = [base.error] if base.error else []
            if missing:
                notes.append("approximate: no measured latency for " + ", ".join(missing[:4])
                             + " (1 cycle taken)")
            out[b.key] = Result(cycles=max(base.cycles, rec), seconds=time.monotonic() - t0,
                                error="; ".join(notes) if notes else "")
        return out
