"""x86-64 instruction forms on top of iced-x86.

An *instruction form* is one iced ``Code`` with the register-or-memory operand (if any) resolved
to either a register or a memory operand. Everything the generator needs to instantiate a form
(operand kinds, register classes, which operands are read or written, implicit registers) is
derived here from iced's tables, so that no instruction knowledge is typed in by hand.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field

import iced_x86 as ix
from iced_x86 import (
    Code,
    Decoder,
    Encoder,
    Formatter,
    FormatterSyntax,
    Instruction,
    InstructionInfoFactory,
    MemoryOperand,
    MemorySizeInfo,
    OpAccess,
    OpCodeInfo,
    OpKind,
    Register,
    RegisterInfo,
    RflagsBits,
)


def _names(cls: type) -> dict[int, str]:
    return {v: k for k, v in vars(cls).items() if not k.startswith("_") and isinstance(v, int)}


CODE_NAMES = _names(Code)
CODE_BY_NAME = {v: k for k, v in CODE_NAMES.items()}
OPKIND_NAMES = _names(ix.OpCodeOperandKind)
REG_NAMES = _names(Register)
REG_BY_NAME = {v: k for k, v in REG_NAMES.items()}
MNEMONIC_NAMES = _names(ix.Mnemonic)
CPUID_NAMES = _names(ix.CpuidFeature)
ENCODING_NAMES = _names(ix.EncodingKind)
FLOW_NAMES = _names(ix.FlowControl)

#: Register that holds the arena base (its read half) in generated kernels.
MEM_BASE = "R14"
#: Register that holds the base of the arena's write half. A separate base register matters:
#: with loads and stores on one base register, Zen 4's memory-dependence prediction makes a
#: load + store pair cost ~11 cycles instead of 1, although the addresses never overlap.
WRITE_BASE = "R13"
#: Register that holds the loop counter in generated kernels; never allocated to operands.
LOOP_COUNTER = "R15"

# GPR order used by the allocator; RSP, the arena bases and the loop counter are never handed out.
GPR64 = ["RAX", "RCX", "RDX", "RBX", "RSI", "RDI", "RBP", "R8", "R9", "R10", "R11", "R12"]
_GPR_WIDTH_NAMES = {
    64: GPR64,
    32: ["EAX", "ECX", "EDX", "EBX", "ESI", "EDI", "EBP"] + [f"R{i}D" for i in range(8, 13)],
    16: ["AX", "CX", "DX", "BX", "SI", "DI", "BP"] + [f"R{i}W" for i in range(8, 13)],
    8: ["AL", "CL", "DL", "BL", "SIL", "DIL", "BPL"] + [f"R{i}L" for i in range(8, 13)],
}
_VEC_PREFIX = {128: "XMM", 256: "YMM", 512: "ZMM"}

# Operand kinds of iced's op-code tables, mapped to (kind, register class, width in bits).
# *_OR_MEM kinds are split into a register form and a memory form by the caller.
_REG_KINDS: dict[str, tuple[str, int]] = {}
for _w in (8, 16, 32, 64):
    for _suffix in ("REG", "OPCODE", "RM", "VVVV", "OR_MEM"):
        _REG_KINDS[f"R{_w}_{_suffix}"] = ("GPR", _w)
for _w, _p in _VEC_PREFIX.items():
    for _suffix in ("REG", "RM", "VVVV", "IS4", "IS5", "OR_MEM"):
        _REG_KINDS[f"{_p}_{_suffix}"] = ("VEC", _w)
for _suffix in ("REG", "RM", "OR_MEM"):
    _REG_KINDS[f"MM_{_suffix}"] = ("MMX", 64)
for _suffix in ("REG", "RM", "VVVV", "OR_MEM"):
    _REG_KINDS[f"K_{_suffix}"] = ("K", 64)

_IMM_KINDS = {
    "IMM8": 8, "IMM8SEX16": 8, "IMM8SEX32": 8, "IMM8SEX64": 8, "IMM16": 16, "IMM32": 32,
    "IMM32SEX64": 32, "IMM64": 64, "IMM4_M2Z": 8,
}
_FIXED_KINDS = {"AL", "AX", "EAX", "RAX", "CL"}

#: Why string forms are excluded (they are measured as whole `rep` blocks instead).
STRING_REASON = "string instruction (implicit RSI/RDI/RCX)"

# Operand kinds that make a form unmeasurable by construction, with the reason recorded.
UNSUPPORTED_KINDS = {
    "ST0": "x87 register stack", "STI_OPCODE": "x87 register stack",
    "SEG_REG": "segment register operand", "FS": "segment register operand",
    "GS": "segment register operand", "DX": "port I/O",
    "MEM_OFFS": "absolute (moffs) memory address",
    "ES_RDI": STRING_REASON,
    "SEG_RSI": STRING_REASON,
    "SEG_RDI": STRING_REASON,
    "SEG_RBX_AL": "implicit memory addressing through RBX",
    "MEM_VSIB32X": "gather/scatter (VSIB index vectors not generated yet)",
    "MEM_VSIB32Y": "gather/scatter (VSIB index vectors not generated yet)",
    "MEM_VSIB32Z": "gather/scatter (VSIB index vectors not generated yet)",
    "MEM_VSIB64X": "gather/scatter (VSIB index vectors not generated yet)",
    "MEM_VSIB64Y": "gather/scatter (VSIB index vectors not generated yet)",
    "MEM_VSIB64Z": "gather/scatter (VSIB index vectors not generated yet)",
    "SIBMEM": "AMX tile memory operand", "TMM_REG": "AMX tile register",
    "TMM_RM": "AMX tile register", "TMM_VVVV": "AMX tile register",
    "BND_REG": "MPX bound register", "BND_OR_MEM_MPX": "MPX bound register",
    "MEM_MPX": "MPX memory operand", "R64_OR_MEM_MPX": "MPX memory operand",
    "MEM_MIB": "MPX memory operand", "KP1_REG": "register pair operand",
    "ZMMP3_VVVV": "register quadruple operand", "XMMP3_VVVV": "register quadruple operand",
    "R32_REG_MEM": "register-or-memory operand fixed by mod bits",
    "R64_REG_MEM": "register-or-memory operand fixed by mod bits",
    "BR16_1": "control flow (branch target)", "BR16_2": "control flow (branch target)",
    "BR32_1": "control flow (branch target)", "BR32_4": "control flow (branch target)",
    "BR64_1": "control flow (branch target)", "BR64_4": "control flow (branch target)",
    "XBEGIN_2": "control flow (branch target)", "XBEGIN_4": "control flow (branch target)",
    "BRDISP_2": "control flow (branch target)", "BRDISP_4": "control flow (branch target)",
}

_ACCESS = {
    OpAccess.READ: "r", OpAccess.COND_READ: "r", OpAccess.WRITE: "w", OpAccess.COND_WRITE: "rw",
    OpAccess.READ_WRITE: "rw", OpAccess.READ_COND_WRITE: "rw", OpAccess.NONE: "n",
    OpAccess.NO_MEM_ACCESS: "n",
}


@dataclass(frozen=True)
class Operand:
    """One explicit operand of a form, in iced (Intel) operand order."""

    kind: str  # "reg", "mem", "imm", "fixed" (a register the encoding fixes, e.g. CL)
    cls: str  # register class for reg: GPR, VEC, MMX, K; register name for fixed; "" otherwise
    width: int  # bits: register width, memory access size (0 if none), immediate width
    access: str = "r"  # r, w, rw or n (not accessed: immediates, LEA's address)
    label: str = ""  # name component: R64, YMM, M256, I8, CL, 1


@dataclass(frozen=True)
class FormSpec:
    """Everything needed to instantiate and encode one instruction form."""

    code: str  # iced Code name
    mem: bool  # True: the register-or-memory operand is memory
    operands: tuple[Operand, ...]
    implicit: tuple[tuple[str, str], ...] = ()  # (full register name, access) not in operands
    reads_flags: bool = False
    writes_flags: bool = False
    encoding: str = "LEGACY"
    vex_limited: bool = False  # vector registers limited to 0-15 (not EVEX)
    extras: dict = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> str:
        d = asdict(self)
        d.pop("extras")
        return json.dumps(d, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> FormSpec:
        d = json.loads(text)
        d["operands"] = tuple(Operand(**o) for o in d["operands"])
        d["implicit"] = tuple(tuple(x) for x in d["implicit"])
        return FormSpec(**d)

    @property
    def base_name(self) -> str:
        mnem = MNEMONIC_NAMES[Instruction.create(CODE_BY_NAME[self.code]).mnemonic]
        return "_".join([mnem] + [o.label for o in self.operands])


class FormError(ValueError):
    """A form that cannot be described or instantiated; the message says why."""


def reg_name(cls: str, width: int, index: int) -> str:
    """Register name of class ``cls``/``width`` at allocator index ``index``."""
    if cls == "GPR":
        return _GPR_WIDTH_NAMES[width][index]
    if cls == "VEC":
        return f"{_VEC_PREFIX[width]}{index}"
    if cls == "MMX":
        return f"MM{index}"
    if cls == "K":
        return f"K{index}"
    raise FormError(f"unknown register class {cls}")


def class_size(cls: str, evex: bool) -> int:
    """How many allocatable registers a class has."""
    return {"GPR": len(GPR64), "VEC": 32 if evex else 16, "MMX": 8, "K": 8}[cls]


def full_register(name: str) -> str:
    return REG_NAMES[RegisterInfo(REG_BY_NAME[name]).full_register]


def _mem_label(code: int) -> tuple[int, str]:
    size = MemorySizeInfo(OpCodeInfo(code).memory_size).size
    return size * 8, (f"M{size * 8}" if size else "M")


def describe_operands(code: int) -> list[list[tuple[str, str, int, str]]]:
    """Return the operand patterns of a code: one list per variant (register / memory).

    Each operand is (kind, cls, width, label). Raises FormError for unsupported operands.
    """
    oc = OpCodeInfo(code)
    kinds = [OPKIND_NAMES[oc.op_kind(i)] for i in range(oc.op_count)]
    has_rm = any(k.endswith("OR_MEM") for k in kinds)
    variants = [False, True] if has_rm else [any(k == "MEM" for k in kinds)]
    out = []
    for mem in variants:
        ops = []
        for k in kinds:
            if k in UNSUPPORTED_KINDS:
                raise FormError(UNSUPPORTED_KINDS[k])
            if k.endswith("OR_MEM") and mem:
                width, label = _mem_label(code)
                ops.append(("mem", "", width, label))
            elif k == "MEM":
                width, label = _mem_label(code)
                ops.append(("mem", "", width, label))
            elif k in _REG_KINDS:
                cls, width = _REG_KINDS[k]
                label = {"GPR": f"R{width}", "VEC": _VEC_PREFIX.get(width, ""), "MMX": "MM",
                         "K": "K"}[cls]
                ops.append(("reg", cls, width, label))
            elif k in _IMM_KINDS:
                ops.append(("imm", "", _IMM_KINDS[k], f"I{_IMM_KINDS[k]}"))
            elif k == "IMM8_CONST_1":
                ops.append(("imm1", "", 8, "1"))
            elif k in _FIXED_KINDS:
                ops.append(("fixed", k, RegisterInfo(REG_BY_NAME[k]).size * 8, k))
            else:
                raise FormError(f"operand kind {k} not supported")
        out.append(ops)
    return out


def _placeholder_args(ops: list[tuple[str, str, int, str]]) -> list:
    """Concrete, distinct operands used to instantiate a form for analysis."""
    counters: dict[str, int] = {}
    args: list = []
    for kind, cls, width, _label in ops:
        if kind == "reg":
            i = counters.get(cls, 0)
            counters[cls] = i + 1
            # Count down from the last register so that placeholders never coincide with the
            # registers instructions use implicitly (RAX, RDX, RCX, XMM0, K0).
            idx = class_size(cls, False) - 1 - i
            args.append(REG_BY_NAME[reg_name(cls, width, idx)])
        elif kind == "mem":
            args.append(MemoryOperand(REG_BY_NAME[MEM_BASE], displ=64))
        elif kind == "imm":
            args.append(1)
        elif kind == "imm1":
            args.append(1)
        elif kind == "fixed":
            args.append(REG_BY_NAME[cls])
    return args


def create(code: int, args: list) -> Instruction:
    """Instantiate ``code`` with operands (Register ints, MemoryOperand, ints, None=implicit)."""
    sig = []
    values = []
    for a in args:
        if a is None:
            continue
        if isinstance(a, MemoryOperand):
            sig.append("mem")
        elif isinstance(a, tuple):  # ("imm", value)
            sig.append("i64" if a[1] > 0x7FFFFFFF else "i32")
            a = a[1]
        elif isinstance(a, int) and a in REG_NAMES and not isinstance(a, bool):
            sig.append("reg")
        else:
            sig.append("i32")
        values.append(a)
    name = "create" + ("_" + "_".join(sig) if sig else "")
    fn = getattr(Instruction, name, None)
    if fn is None:
        raise FormError(f"no iced constructor {name}")
    try:
        return fn(code, *values)
    except Exception as exc:  # iced raises ValueError with a terse message
        raise FormError(f"iced cannot create: {exc}") from exc


def _args_for(ops, regs) -> list:
    """Merge operand descriptions and chosen registers into iced constructor arguments."""
    out = []
    for (kind, _cls, _w, _l), r in zip(ops, regs, strict=True):
        if kind in ("imm", "imm1"):
            out.append(("imm", r))
        else:
            out.append(r)
    return out


def analyse(code: int, mem: bool, ops: list[tuple[str, str, int, str]]) -> FormSpec:
    """Build the FormSpec of one variant: operand access and implicit registers, from iced."""
    oc = OpCodeInfo(code)
    encoding = ENCODING_NAMES[oc.encoding]
    vex_limited = encoding != "EVEX"
    placeholders = _placeholder_args(ops)
    args = _args_for(ops, placeholders)
    instr = create(code, args)
    info = InstructionInfoFactory().info(instr)
    operands = []
    explicit_regs = set()
    for i, (kind, cls, width, label) in enumerate(ops):
        acc = _ACCESS.get(info.op_access(i), "rw")
        if kind in ("imm", "imm1"):
            acc = "n"
        if kind == "reg" or kind == "fixed":
            explicit_regs.add(full_register(REG_NAMES[instr.op_register(i)]))
        operands.append(Operand(kind if kind != "imm1" else "imm1", cls, width, acc, label))
    implicit: dict[str, str] = {}
    for u in info.used_registers():
        name = REG_NAMES[u.register]
        full = full_register(name) if name not in ("RIP", "EIP") else name
        if full in explicit_regs or full == MEM_BASE:
            continue
        acc = _ACCESS.get(u.access, "rw")
        prev = implicit.get(full)
        implicit[full] = acc if prev in (None, acc) else "rw"
    implicit_mem = any(REG_NAMES.get(m.base) != MEM_BASE or m.index != Register.NONE
                       for m in info.used_memory())
    return FormSpec(
        code=CODE_NAMES[code], mem=mem, operands=tuple(operands),
        implicit=tuple(sorted(implicit.items())),
        reads_flags=bool(instr.rflags_read), writes_flags=bool(instr.rflags_written),
        encoding=encoding, vex_limited=vex_limited,
        extras={
            "cpuid": [CPUID_NAMES[f] for f in instr.cpuid_features()],
            "flow": FLOW_NAMES[instr.flow_control],
            "mnemonic": MNEMONIC_NAMES[instr.mnemonic],
            "stack": bool(instr.is_stack_instruction),
            "string": bool(instr.is_string_instruction),
            "instr": instr,
            "implicit_mem": implicit_mem,
            "breaks_flags": breaks_flags(instr),
        },
    )


#: The six status flags: a form writing all of them and reading none starts the flags afresh.
STATUS_FLAGS = (RflagsBits.OF | RflagsBits.SF | RflagsBits.ZF | RflagsBits.AF | RflagsBits.CF
                | RflagsBits.PF)


def breaks_flags(instr: Instruction) -> bool:
    """Whether an instruction writes every status flag and reads none: its flags output owes
    nothing to the flags before it, so it ends any chain through the flags. A form that writes
    part of them (``ROL r64, imm8``: CF and OF) may have to merge its result with the flags
    before it, and then copies of it wait for one another unless such a form runs between
    them (0.98 cycles a copy alone on Cascade Lake, 0.50 beside ADD). Undefined flags count
    as written: the hardware writes something, iced-x86 only says the value is unspecified."""
    if MNEMONIC_NAMES[instr.mnemonic] in _SHIFTS and any(
            instr.op_kind(i) == OpKind.REGISTER and instr.op_register(i) == Register.CL
            for i in range(instr.op_count)):
        return False  # a count of 0 in CL leaves the flags as they were: they are read
    return (instr.rflags_modified & STATUS_FLAGS == STATUS_FLAGS
            and not instr.rflags_read & STATUS_FLAGS)


_SHIFTS = frozenset({"SHL", "SHR", "SAL", "SAR", "ROL", "ROR", "RCL", "RCR", "SHLD", "SHRD"})


def shifts_by_cl(name: str) -> bool:
    """Whether a catalogue form shifts or rotates by CL: a count of 0 leaves the flags as
    they were, so its flags output depends on its flags input although iced-x86 lists no
    flags read (``breaks_flags``; the model keeps such forms out of Palmed as chains)."""
    return name.split("_", 1)[0] in _SHIFTS and name.endswith("_CL")


def instantiate(spec: FormSpec, regs: list[str | None], displ: int, imm: int = 1,
                base: str = MEM_BASE) -> Instruction:
    """Concrete instruction of a form: registers by name per operand (None for non-registers)."""
    code = CODE_BY_NAME[spec.code]
    args: list = []
    for op, r in zip(spec.operands, regs, strict=True):
        if op.kind == "reg":
            args.append(REG_BY_NAME[r])
        elif op.kind == "mem":
            args.append(MemoryOperand(REG_BY_NAME[base], displ=displ))
        elif op.kind == "imm":
            args.append(("imm", imm))
        elif op.kind == "imm1":
            args.append(("imm", 1))
        else:  # fixed register
            args.append(REG_BY_NAME[op.cls])
    return create(code, args)


@functools.lru_cache(maxsize=1)
def _gas() -> Formatter:
    f = Formatter(FormatterSyntax.GAS)
    f.space_after_operand_separator = True
    return f


def att(instr: Instruction) -> str:
    """AT&T (GNU as) text of an instruction."""
    return _gas().format(instr)


def att_template(instr: Instruction, spec: FormSpec) -> str:
    """AT&T text with operands replaced by their kinds, e.g. ``vaddpd <ymm>, <ymm>, <ymm>``."""
    f = _gas()
    parts = []
    for fi in range(f.operand_count(instr)):
        ii = f.get_instruction_operand(instr, fi)
        if ii is None or ii < 0 or ii >= len(spec.operands):
            parts.append(f.format_operand(instr, fi))
            continue
        op = spec.operands[ii]
        if op.kind == "reg":
            parts.append(f"<{op.label.lower()}>")
        elif op.kind == "mem":
            parts.append(f"<{op.label.lower()}>")
        elif op.kind == "imm":
            parts.append(f"$<{op.label.lower()}>")
        else:
            parts.append(f.format_operand(instr, fi))
    mnem = f.format_mnemonic(instr)
    return (mnem + " " + ", ".join(parts)).strip()


def encode(instr: Instruction) -> bytes:
    enc = Encoder(64)
    try:
        enc.encode(instr, 0)
    except ValueError as exc:
        raise FormError(f"iced cannot encode: {exc}") from exc
    return bytes(enc.take_buffer())


def decode_all(data: bytes) -> list[Instruction]:
    return list(Decoder(64, data))


def instruction_hexes(data: bytes) -> list[tuple[Instruction, str]]:
    """Each decoded instruction of ``data`` with its own bytes (hex)."""
    return [(ins, data[ins.ip:ins.ip + ins.len].hex()) for ins in decode_all(data)]


def form_key(instr: Instruction) -> tuple[str, bool]:
    """The (code, memory-variant) key of a decoded instruction, as used by the catalogue."""
    has_mem = any(instr.op_kind(i) == ix.OpKind.MEMORY for i in range(instr.op_count))
    return CODE_NAMES[instr.code], has_mem
