"""Dependence-chain blocks and the registers their instances use.

Shared by :mod:`cpumap.measure.latency` (chains of one form) and
:mod:`cpumap.measure.roundtrip` (chains closed by a second instruction): both place the
chain's operands on registers of their own and every other operand on a register no instance
writes, so that nothing but the pair measured links one instance to the next.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpumap.isa import x86
from cpumap.measure import blockgen

#: Instances per chain block (the harness unrolls the block itself).
LINKS = 4


@dataclass(frozen=True)
class Chain:
    """One measurable dependence chain of a form.

    ``back``: the forms of the second instruction(s) that close a chain across register
    classes (uops.info's method); empty for a chain of the form alone. ``split``: the chain is
    the canonical round trip of a class and its ``back`` form, whose latency is half of it.
    """

    form: str
    pair: str
    code: bytes
    links: int
    back: tuple[str, ...] = ()
    split: bool = False

    @property
    def text(self) -> str:
        return blockgen.block_text(self.code)


def banned_registers(spec: x86.FormSpec) -> set[str]:
    """Full registers a chain must leave alone: the form's implicit and fixed registers and
    RSP."""
    banned = {r for r, _a in spec.implicit} | {"RSP"}
    banned |= {x86.full_register(o.cls) for o in spec.operands if o.kind == "fixed"}
    return banned


def implicit_rw(spec: x86.FormSpec) -> set[str]:
    """Implicit registers the form both reads and writes (MUL's RAX): a chain of their own
    runs through every instance."""
    reads = {r for r, a in spec.implicit if "r" in a}
    writes = {r for r, a in spec.implicit if "w" in a}
    return reads & writes


def in_use(regs: list) -> set[str]:
    """The full registers a ``build_regs`` assignment names."""
    return {x86.full_register(x) for x in regs if x}


def free_indices(cls: str, banned: set[str], evex: bool) -> list[int]:
    """Allocator indices of the registers of ``cls`` a chain may use."""
    return [i for i in range(x86.class_size(cls, evex))
            if x86.full_register(x86.reg_name(cls, 64 if cls == "GPR" else 128, i))
            not in banned]


def build_regs(spec: x86.FormSpec, chain_ops: set[int], swap: bool = False) -> list | None:
    """Register names per operand: the chain operands on the first free register of their
    class (or, ``swap``, a write-only output on the second, the next instance reading it:
    ``mov %rax, %rcx; mov %rcx, %rax`` rather than a register moved to itself), every other
    register operand on a register of its own; None when a class runs out."""
    banned = banned_registers(spec)
    evex = not spec.vex_limited
    chain_cls = {spec.operands[i].cls for i in chain_ops}
    pools = {c: free_indices(c, banned, evex)
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


def reg_index(name: str, cls: str, width: int) -> int:
    """The allocator index of register ``name`` of ``cls``/``width``."""
    for i in range(x86.class_size(cls, True)):
        if x86.reg_name(cls, width, i) == name:
            return i
    raise x86.FormError(f"{name} is not a {width}-bit register of class {cls}")


def swapped(spec: x86.FormSpec, regs: list, chain_ops: set[int]) -> list:
    """The second instance of a swapped chain: the chain operands' registers exchanged, each
    operand keeping its own width (``vcvtpd2ps %ymm0, %xmm1`` then ``vcvtpd2ps %ymm1,
    %xmm0``)."""
    ops = spec.operands
    index = {k: reg_index(regs[k], ops[k].cls, ops[k].width) for k in chain_ops}
    out = list(regs)
    for k in chain_ops:
        other = next(i for i in set(index.values()) if i != index[k])
        out[k] = x86.reg_name(ops[k].cls, ops[k].width, other)
    return out


def label(spec: x86.FormSpec, k: int) -> str:
    return f"{spec.operands[k].label}#{k}"


def repeated(spec: x86.FormSpec, regs: list, base: str = "RBX", displ: int = 0) -> bytes:
    """``LINKS`` identical instances."""
    return x86.encode(x86.instantiate(spec, regs, displ, base=base)) * LINKS
