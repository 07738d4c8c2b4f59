"""Floating-point operations and memory bytes of one instruction, derived from iced-x86.

One function answers "how many flops does this instruction do" for both uses: the compute
ceilings (generated kernels of catalogue forms) and the kernel points (instructions decoded
from the real kernels' basic blocks), so that the two sides of a roofline count alike.

Counting rule (the one of Intel's FP_ARITH_INST_RETIRED events, which the roofline literature
and likwid use): each element an arithmetic instruction computes is one operation -- add,
sub, mul, div, sqrt, min, max, the approximations rcp/rsqrt, add-sub and horizontal add/sub
(one per result element) -- and a fused multiply-add counts 2.  Element count and precision
come from iced's memory-size of the instruction's code (``PACKED256_FLOAT64`` -> 4 doubles),
which is defined for the register form too, because iced's codes cover both operand kinds.
Masked EVEX forms are counted at full width (the mask is a run-time value): ``masked`` says
so, and such counts are an upper bound.  Dot products (dpps/dppd: the immediate selects the
lanes) and everything else are not counted (0 flops, ``kind`` ""); comparisons, conversions,
moves, shuffles and logic are not arithmetic.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass

import iced_x86 as ix

from cpumap.isa import x86

_ELEMENT = {ix.MemorySize.FLOAT64: "dp", ix.MemorySize.FLOAT32: "sp",
            ix.MemorySize.FLOAT16: "hp", ix.MemorySize.BFLOAT16: "bf16"}
_ELEMENT_BITS = {"dp": 64, "sp": 32, "hp": 16, "bf16": 16}

# Mnemonic (without the V prefix) -> (kind, flops per element).  Order matters: first match.
_RULES: list[tuple[re.Pattern[str], str, int]] = [
    (re.compile(r"^F(N)?M(ADD|SUB)(SUB|ADD)?\d{3}[PS][SDH]$"), "fma", 2),
    (re.compile(r"^F(N)?M(ADDSUB|SUBADD)\d{3}P[SDH]$"), "fma", 2),
    (re.compile(r"^(ADD|SUB)[PS][SDH]$"), "add", 1),
    (re.compile(r"^ADDSUBP[SD]$"), "add", 1),
    (re.compile(r"^H(ADD|SUB)P[SD]$"), "add", 1),
    (re.compile(r"^MUL[PS][SDH]$"), "mul", 1),
    (re.compile(r"^DIV[PS][SDH]$"), "div", 1),
    (re.compile(r"^SQRT[PS][SDH]$"), "sqrt", 1),
    (re.compile(r"^(MIN|MAX)[PS][SDH]$"), "minmax", 1),
    (re.compile(r"^(RCP|RSQRT)(14|28)?[PS][SDH]$"), "approx", 1),
]


@dataclass(frozen=True)
class FlopInfo:
    """Floating-point work of one execution of one instruction.

    flops: operations (FMA = 2 per element); kind: fma, add, mul, div, sqrt, minmax, approx
    or "" (not FP arithmetic); precision: dp, sp, hp, bf16 or ""; elements: lanes computed;
    vector_bits: width of the computation (64 for a scalar double); masked: the EVEX form
    takes an opmask, so ``flops`` is an upper bound.
    """

    flops: int
    kind: str
    precision: str
    elements: int
    vector_bits: int
    masked: bool = False


NONE = FlopInfo(0, "", "", 0, 0)


@functools.cache
def flops_of_code(code: int | str) -> FlopInfo:
    """Flops of one execution of iced ``Code`` ``code`` (its number or its name)."""
    num = x86.CODE_BY_NAME[code] if isinstance(code, str) else int(code)
    instr = ix.Instruction.create(num)
    mnemonic = x86.MNEMONIC_NAMES[instr.mnemonic]
    base = mnemonic[1:] if mnemonic.startswith("V") else mnemonic
    rule = next(((k, n) for pat, k, n in _RULES if pat.match(base)), None)
    if rule is None:
        return NONE
    kind, per = rule
    info = ix.MemorySizeInfo(instr.memory_size)
    precision = _ELEMENT.get(info.element_type, "")
    if not precision:
        return NONE
    elements = int(info.element_count)  # hadd/hsub: one add per result element, as well
    return FlopInfo(per * elements, kind, precision, elements,
                    elements * _ELEMENT_BITS[precision])


def flops_of_form(spec: x86.FormSpec) -> FlopInfo:
    """Flops of one instance of a catalogue form (its iced code decides)."""
    info = flops_of_code(spec.code)
    if info.flops and any(o.cls == "K" for o in spec.operands):
        return dataclasses.replace(info, masked=True)
    return info


def decode(hex_bytes: str) -> ix.Instruction:
    """The one instruction encoded by ``hex_bytes`` (as in the blocks parquet ``hexes``)."""
    data = bytes.fromhex(hex_bytes)
    instrs = x86.decode_all(data)
    if len(instrs) != 1 or instrs[0].len != len(data):
        raise ValueError(f"{hex_bytes!r} is not exactly one instruction")
    return instrs[0]


@dataclass(frozen=True)
class InsnWork:
    """What one execution of one instruction does: flops and core-side memory bytes."""

    flops: FlopInfo
    read_bytes: int
    write_bytes: int


_INFO = ix.InstructionInfoFactory()
_READS = {ix.OpAccess.READ, ix.OpAccess.COND_READ, ix.OpAccess.READ_WRITE,
          ix.OpAccess.READ_COND_WRITE}
_WRITES = {ix.OpAccess.WRITE, ix.OpAccess.COND_WRITE, ix.OpAccess.READ_WRITE,
           ix.OpAccess.READ_COND_WRITE}


@functools.lru_cache(maxsize=65536)
def work_of_hex(hex_bytes: str) -> InsnWork:
    """Flops and core-side bytes read/written by one execution of an encoded instruction.

    Bytes are the sizes of the memory operands the instruction accesses (iced's used-memory
    list: explicit operands, and implicit ones such as push/pop/call/ret on the stack).  Masked
    and gather/scatter accesses count their full size (upper bound), prefetches and LEA none.
    """
    instr = decode(hex_bytes)
    reads = writes = 0
    for mem in _INFO.info(instr).used_memory():
        size = ix.MemorySizeInfo(mem.memory_size).size
        if mem.access in _READS:
            reads += size
        if mem.access in _WRITES:
            writes += size
    info = flops_of_code(instr.code)
    if info.flops and instr.op_mask != ix.Register.NONE:
        info = dataclasses.replace(info, masked=True)
    return InsnWork(info, reads, writes)
