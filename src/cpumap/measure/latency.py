"""Latencies of instruction forms, uops.info style: one dependence chain per (input -> output).

A *chain* is a block of ``LINKS`` instances of one form in which every instance reads, through
the operand pair measured, what the previous one wrote; the block is measured as written
(:mod:`cpumap.measure.blockgen`: the harness's n/2n loops, registers at ``BLOCK_INIT``, pages
mapped on first touch), so its cycles per link are the latency of that pair: a chain has no
parallelism to hide it, and the other inputs are registers no instance writes. Rows go to the
database like every measurement (kernel text ``BLOCK:<hex>``).

Pairs, for a form of the catalogue (instances built by the generator's own
``x86.instantiate`` from the form's operands, never from text):

* ``Rk->Rk``: an operand read and written (the destination of two-operand forms);
* ``Ri->Rk``: a register read and a register written of the same class (three-operand VEX
  forms), the other sources on registers no instance writes (never the same register as the
  chain's, which would make ``vpxor %ymm0, %ymm0, %ymm0`` a zero idiom);
* ``implicit``: a register the form reads and writes implicitly (MUL's RAX), its explicit
  operands kept off the chain;
* ``flags->flags``: a form that reads and writes the flags and has no register chain (CMC,
  ADC with a memory destination...);
* ``mem->Rk (load-use)``: a plain load (MOV, MOVZX, MOVSX from memory into a 32/64-bit
  register) whose address register is its destination: a pointer chase, the fill of every
  mapped page being ``BLOCK_INIT`` itself;
* ``store->load``: a 64-bit store followed by the reload of the same address, the round trip
  through store-to-load forwarding.

A form with none of these (cross-class moves and conversions, whose chains need a second
instruction of known latency) gets a reason instead; ``latency_rows`` reports it as such.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cpumap.isa import x86
from cpumap.measure import blockgen

__all__ = ["LINKS", "MEMORY_FORMS", "Chain", "chains", "latency_rows"]

#: Instances per chain block (the harness unrolls the block itself).
LINKS = 4
#: The forms whose chains give the loop predictor its memory latencies: load-use and the
#: store-forwarding round trip.
MEMORY_FORMS = ("MOV_R64_M64", "MOV_M64_R64")
#: Plain loads whose destination can be their own address (a pointer chase).
_LOADS = {"MOV", "MOVZX", "MOVSX", "MOVSXD"}


@dataclass(frozen=True)
class Chain:
    """One measurable dependence chain of a form."""

    form: str
    pair: str
    code: bytes
    links: int

    @property
    def text(self) -> str:
        return blockgen.block_text(self.code)


def _free(cls: str, width: int, banned: set[str], evex: bool) -> list[str]:
    """Registers of ``cls`` usable by a chain: not implicit in the form, not RSP or R15
    (the harness's loop counter candidates are chosen from what the block leaves)."""
    n = x86.class_size(cls, evex)
    names = []
    for i in range(n):
        name = x86.reg_name(cls, width, i)
        if x86.full_register(name) not in banned:
            names.append(i)
    return names


def _build(spec: x86.FormSpec, chain_ops: set[int], swap: bool = False) -> list | None:
    """Register names per operand: the chain operands on one register (or, ``swap``, a
    write-only output on a second register, the next instance reading it: ``mov %rax, %rcx;
    mov %rcx, %rax`` rather than a register moved to itself), every other register operand on
    a register of its own; None when a class runs out."""
    banned = {r for r, _a in spec.implicit} | {"RSP"}
    banned |= {x86.full_register(o.cls) for o in spec.operands if o.kind == "fixed"}
    evex = not spec.vex_limited
    chain_cls = {spec.operands[i].cls for i in chain_ops}
    pools = {c: _free(c, 64 if c == "GPR" else 128, banned, evex)
             for c in {o.cls for o in spec.operands if o.kind == "reg"}}
    regs: list[str | None] = []
    taken: dict[str, int] = {c: ((2 if swap else 1) if c in chain_cls else 0) for c in pools}
    for k, op in enumerate(spec.operands):
        if op.kind != "reg":
            regs.append(None)
            continue
        pool = pools[op.cls]
        if k in chain_ops:
            if len(pool) < 2:
                return None
            idx = pool[1] if swap and "r" not in op.access else pool[0]
        else:
            if taken[op.cls] >= len(pool):
                return None
            idx = pool[taken[op.cls]]
            taken[op.cls] += 1
        regs.append(x86.reg_name(op.cls, op.width, idx))
    return regs


def _swapped(regs: list, chain_ops: set[int]) -> list:
    """The second instance of a swapped chain: the chain operands' registers exchanged."""
    names = {regs[k] for k in chain_ops}
    out = list(regs)
    for k in chain_ops:
        other = next(n for n in names if n != regs[k])
        out[k] = other
    return out


def _block(spec: x86.FormSpec, regs: list, base: str = "RBX") -> bytes:
    instr = x86.instantiate(spec, regs, 0, base=base)
    return x86.encode(instr) * LINKS


def _label(spec: x86.FormSpec, k: int) -> str:
    return f"{spec.operands[k].label}#{k}"


def chains(name: str, cat) -> tuple[list[Chain], str]:
    """The chains of form ``name`` of the catalogue ``cat`` (module docstring), or none and
    why."""
    if name not in cat.by_name or cat.by_name[name].status != "ok":
        return [], f"{name} is not an ok form of the catalogue"
    spec, mnemonic = cat.spec(name), cat.by_name[name].mnemonic
    ops = spec.operands
    regs_ops = [k for k, o in enumerate(ops) if o.kind == "reg"]
    writes = [k for k in regs_ops if "w" in ops[k].access]
    reads = [k for k in regs_ops if "r" in ops[k].access]
    mem = [k for k, o in enumerate(ops) if o.kind == "mem"]
    base = "RBX" if not any(r == "RBX" for r, _a in spec.implicit) else "RSI"
    out: list[Chain] = []
    for w in writes:
        for r in reads:
            if ops[r].cls != ops[w].cls or (r != w and ops[w].access == "rw"):
                continue
            swap = r != w  # a write-only output: alternate two registers
            regs = _build(spec, {r, w}, swap)
            if regs is None or base.lower() in {str(x).lower() for x in regs if x}:
                continue
            pair = f"{_label(spec, r)}->{_label(spec, w)}"
            try:
                if swap:
                    two = (x86.encode(x86.instantiate(spec, regs, 0, base=base))
                           + x86.encode(x86.instantiate(spec, _swapped(regs, {r, w}), 0,
                                                        base=base)))
                    code = two * (LINKS // 2)
                else:
                    code = _block(spec, regs, base)
                out.append(Chain(name, pair, code, LINKS))
            except x86.FormError:
                continue
    implicit_rw = sorted({r for r, a in spec.implicit if "r" in a and "w" in a}
                         | ({r for r, a in spec.implicit if a == "r"}
                            & {r for r, a in spec.implicit if a == "w"}))
    if not out and implicit_rw:
        regs = _build(spec, set())
        if regs is not None:
            out.append(Chain(name, f"implicit {'/'.join(implicit_rw)}",
                             _block(spec, regs, base), LINKS))
    if not out and spec.reads_flags and spec.writes_flags:
        regs = _build(spec, set())
        if regs is not None:
            out.append(Chain(name, "flags->flags", _block(spec, regs, base), LINKS))
    if mem and mnemonic == "LEA" and len(writes) == 1:
        w = writes[0]
        dst = x86.reg_name("GPR", ops[w].width, 0)
        regs = [dst if k == w else None for k in range(len(ops))]
        instr = x86.instantiate(spec, regs, 8, base=x86.full_register(dst))
        out.append(Chain(name, f"address->{_label(spec, w)}", x86.encode(instr) * LINKS, LINKS))
    # a pointer chase needs the whole address loaded: 32- or 64-bit loads (a 16-bit load of
    # BLOCK_INIT is 0x4000, below the lowest address a page can be mapped at)
    if mem and mnemonic in _LOADS and len(writes) == 1 and ops[writes[0]].cls == "GPR" \
            and ops[writes[0]].width >= 32 and ops[mem[0]].width >= 32 \
            and "w" not in ops[mem[0]].access:
        w = writes[0]
        dst = x86.reg_name("GPR", ops[w].width, 0)
        full = x86.full_register(dst)
        regs = [dst if k == w else None for k in range(len(ops))]
        instr = x86.instantiate(spec, regs, 0, base=full)
        out.append(Chain(name, f"{ops[mem[0]].label}->{_label(spec, w)} (load-use)",
                         x86.encode(instr) * LINKS, LINKS))
    if name == "MOV_M64_R64":
        store = x86.encode(x86.instantiate(spec, [None, "RAX"], 0, base="RBX"))
        if "MOV_R64_M64" in cat.by_name:
            load = x86.encode(x86.instantiate(cat.spec("MOV_R64_M64"), ["RAX", None], 0,
                                              base="RBX"))
            out.append(Chain(name, "store->load (forwarding round trip with MOV_R64_M64)",
                             (store + load) * LINKS, LINKS))
    if out:
        return out, ""
    return [], "no chain of one form: no register read and written in the same class " \
               "(needs a second instruction of known latency)"


def latency_rows(measurer, cat, names: Iterable[str], stage: str = "latency") -> list[dict]:
    """Every chain of the forms measured; one row per chain, or one row with the reason for a
    form without a chain; a chain whose measurement failed is a failed row."""
    todo: list[Chain] = []
    rows: list[dict] = []
    for name in sorted(set(names)):
        got, why = chains(name, cat)
        if why:
            rows.append({"form": name, "pair": "", "latency": float("nan"), "status": "none",
                         "error": why, "kernel": ""})
        todo += got
    measured = measurer.measure([c.text for c in todo], stage=stage) if todo else {}
    errors = measurer.errors([c.text for c in todo if c.text not in measured])
    for c in todo:
        cyc = measured.get(c.text)
        ok = cyc is not None
        rows.append({"form": c.form, "pair": c.pair,
                     "latency": float(cyc) / c.links if ok else float("nan"),
                     "status": "ok" if ok else "failed",
                     "error": "" if ok else errors.get(c.text, "no ok repetition"),
                     "kernel": c.text})
    return rows
