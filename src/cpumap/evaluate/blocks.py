"""Basic blocks of one function of an ELF binary (Capstone + pyelftools), and its CFG.

The function's bounds come from its symbol (``.symtab``, else ``.dynsym``): address and size.
Its bytes are disassembled linearly with Capstone (AT&T syntax).  Leaders are

* the function entry,
* every direct jump target inside the function (jmp, jcc, loop*, jrcxz; direct call targets
  inside the function too),
* the instruction after every control-flow instruction (jmp, jcc, loop, call, ret, ud2, int3,
  hlt, ...),

and a block runs from a leader to the next leader (or the function end).  So a block is
entered only at its first instruction and, once entered, runs to its end -- what makes a
breakpoint on its first instruction count its executions exactly (cpumap.evaluate.counting).

Each instruction is also decoded by iced-x86 from the same bytes and mapped to the catalogue's
form by ``(iced code, memory operand?)`` -- the key the catalogue is indexed by; addressing
mode (base/index/scale), masking and broadcast are not separate forms there, so an indexed
load maps to the same form as a based one.  Instructions the catalogue does not have get "".

Jump tables (the suite disables them with -fno-jump-tables; other binaries have them): for an
indirect jmp, gcc's two table forms are read from the binary -- ``jmp *TABLE(,%idx,8)``
(absolute entries) and ``lea TABLE(%rip), %b; movslq (%b,%idx,4), %r; add %b, %r; jmp *%r``
(entries relative to the table) -- up to the bound of a preceding ``cmp $K`` (else while the
entries land on instructions of the function), and every entry becomes a leader.  Reading too
many entries only splits blocks further, which keeps counts exact; a table that is not
recognised can leave a case entered mid-block, which is why such blocks stay *open*.

The CFG (``successors``) is what flow conservation needs: fall-through edges (after anything
but jmp/ret/traps), direct targets, and for calls the return to the next instruction.  A
function is *closed* when every edge is known; an indirect jmp or a conditional jump out of
the function (e.g. into a ``.cold`` part) makes it *open*, and counting then breaks on every
block.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import capstone
import pandas as pd
import pyarrow as pa
from elftools.elf.elffile import ELFFile

from cpumap.evaluate.symbols import FunctionNotFound, function_symbols, resolve_function
from cpumap.isa import x86
from cpumap.store.files import write_table_atomic

__all__ = ["Block", "BlockError", "FunctionNotFound", "RepString", "blocks_frame",
           "extract_blocks", "function_bounds", "rep_strings", "suite_forms", "write_blocks"]

BLOCKS_SCHEMA = pa.schema([
    ("benchmark", pa.string()), ("function", pa.string()), ("block_id", pa.int64()),
    ("address", pa.int64()), ("end", pa.int64()), ("n_insns", pa.int64()),
    ("insns", pa.list_(pa.string())), ("hexes", pa.list_(pa.string())),
    ("forms", pa.list_(pa.string())), ("terminator", pa.string()),
    ("successors", pa.list_(pa.int64())), ("exits", pa.bool_()), ("open_end", pa.bool_()),
])

_TRAPS = {"ud2", "ud1", "ud0", "int3", "hlt", "int1"}
#: string instructions that compare, and so stop early under repe/repne
_COMPARING = ("CMPSB", "CMPSW", "CMPSD", "CMPSQ", "SCASB", "SCASW", "SCASD", "SCASQ")


class BlockError(ValueError):
    """The function cannot be split (not in the binary, undecodable bytes, overlapping code)."""


@dataclass
class Block:
    """One basic block: [address, end) of the function, with its instructions.

    successors: block ids control can go to after this block (inside the function);
    exits: control can leave the function from here (ret, tail jmp);
    open_end: control goes somewhere unknown (indirect jmp, conditional jump out of the function).
    """

    block_id: int
    address: int
    end: int
    insns: list[str]
    hexes: list[str]
    forms: list[str]
    terminator: str
    successors: list[int] = field(default_factory=list)
    exits: bool = False
    open_end: bool = False

    @property
    def n_insns(self) -> int:
        return len(self.insns)


def function_bounds(binary: Path | str, function: str) -> tuple[int, int, bytes]:
    """(address, size, code bytes) of a function symbol; FunctionNotFound when absent."""
    path = Path(binary)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise BlockError(f"cannot open binary {path}: {exc}") from exc
    with handle:
        try:
            elf = ELFFile(handle)
        except Exception as exc:  # pyelftools raises its own ELFError and struct errors
            raise BlockError(f"{path} is not an ELF file: {exc}") from exc
        if elf.get_machine_arch() != "x64":
            raise BlockError(f"{path} is not an x86-64 binary ({elf.get_machine_arch()})")
        sym = function_symbols(elf).get(function)
        if sym is None:
            found = resolve_function(path, function)  # raises, naming the closest symbols
            raise FunctionNotFound(f"no function {function!r} in {path}; did you mean "
                                   f"{found.symbol!r}? ({found.note})")
        addr, size = sym
        if size <= 0:
            raise BlockError(f"function {function!r} in {path} has no size in its symbol")
        for sec in elf.iter_sections():
            lo = int(sec["sh_addr"])
            if sec["sh_type"] == "SHT_PROGBITS" and lo <= addr and addr + size <= lo + sec[
                    "sh_size"] and sec["sh_flags"] & 0x4:  # SHF_EXECINSTR
                data = sec.data()
                return addr, size, bytes(data[addr - lo: addr - lo + size])
    raise BlockError(f"function {function!r} of {path} is in no executable section")


def _elf_reader(binary: Path | str):
    """read(address, size) -> bytes of an allocated PROGBITS section, or None."""
    with open(binary, "rb") as handle:
        elf = ELFFile(handle)
        spans = [(int(sec["sh_addr"]), bytes(sec.data())) for sec in elf.iter_sections()
                 if sec["sh_type"] == "SHT_PROGBITS" and sec["sh_flags"] & 0x2]  # SHF_ALLOC

    def read(addr: int, size: int) -> bytes | None:
        for lo, data in spans:
            if lo <= addr and addr + size <= lo + len(data):
                return data[addr - lo: addr - lo + size]
        return None

    return read


def _jump_table_targets(insns: list, k: int, starts: set[int], reader) -> list[int]:
    """Targets of the indirect jmp insns[k] read from a gcc jump table (module docstring)."""
    X = capstone.x86
    op = insns[k].operands[0] if insns[k].operands else None
    tables: list[tuple[int, int, bool]] = []  # (address, entry size, relative to the table)
    if op is None:
        return []
    if op.type == X.X86_OP_MEM and op.mem.base == 0 and op.mem.index != 0 and \
            op.mem.scale == 8:
        tables.append((op.mem.disp & (2**64 - 1), 8, False))
    elif op.type == X.X86_OP_REG:
        base = None
        for j in range(k - 1, max(-1, k - 6), -1):
            ops = insns[j].operands
            if insns[j].mnemonic.startswith("movs") and len(ops) == 2 and \
                    ops[0].type == X.X86_OP_MEM and ops[0].mem.scale == 4 and \
                    ops[1].type == X.X86_OP_REG and ops[1].reg == op.reg:
                base = ops[0].mem.base
                break
        if base:
            for p in insns:
                ops = p.operands
                if p.mnemonic.startswith("lea") and len(ops) == 2 and \
                        ops[0].type == X.X86_OP_MEM and ops[0].mem.base == X.X86_REG_RIP and \
                        ops[1].type == X.X86_OP_REG and ops[1].reg == base:
                    tables.append((p.address + p.size + ops[0].mem.disp, 4, True))
    bound = None
    for j in range(k - 1, max(-1, k - 10), -1):
        ops = insns[j].operands
        if insns[j].mnemonic.startswith("cmp") and len(ops) == 2 and \
                ops[0].type == X.X86_OP_IMM and 0 <= ops[0].imm < 4096:
            bound = int(ops[0].imm) + 1
            break
    targets = []
    for table, size, relative in tables:
        for e in range(bound or 4096):
            raw = reader(table + e * size, size)
            if raw is None:
                break
            val = int.from_bytes(raw, "little", signed=relative)
            t = (table + val) & (2**64 - 1) if relative else val
            if t not in starts:
                break
            targets.append(t)
    return targets


def _disassembler() -> capstone.Cs:
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.syntax = capstone.CS_OPT_SYNTAX_ATT
    md.detail = True
    return md


def _direct_target(insn: capstone.CsInsn) -> int | None:
    ops = insn.operands
    if len(ops) == 1 and ops[0].type == capstone.x86.X86_OP_IMM:
        return int(ops[0].imm)
    return None


def _kind(insn: capstone.CsInsn) -> str:
    """'' (not control flow), 'ret', 'jmp', 'jcc', 'call', 'trap'."""
    if insn.group(capstone.CS_GRP_RET) or insn.group(capstone.CS_GRP_IRET):
        return "ret"
    if insn.group(capstone.CS_GRP_CALL):
        return "call"
    if insn.group(capstone.CS_GRP_JUMP):
        return "jmp" if insn.mnemonic in ("jmp", "jmpq", "ljmp", "notrack jmp") else "jcc"
    if insn.mnemonic in _TRAPS or insn.group(capstone.CS_GRP_INT):
        return "trap" if insn.mnemonic in _TRAPS else ""
    return ""


def _forms_of(code: bytes, address: int, catalogue) -> list[str]:
    decoded = x86.decode_all(code)
    forms = []
    for ins in decoded:
        key = x86.form_key(ins)
        forms.append(catalogue.by_key.get(key, "") if catalogue is not None else "")
    return forms


def extract_blocks(binary: Path | str, function: str, catalogue=None) -> list[Block]:
    """Split ``function`` of ``binary`` into basic blocks (module docstring), ordered by address.

    ``catalogue`` (a cpumap.isa.catalogue.Catalogue, or a path of forms.parquet) names each
    instruction's form; without it every form is "".
    """
    if catalogue is not None and not hasattr(catalogue, "by_key"):
        from cpumap.isa.catalogue import Catalogue

        catalogue = Catalogue.load(Path(catalogue))
    start, size, code = function_bounds(binary, function)
    end = start + size
    insns = list(_disassembler().disasm(code, start))
    decoded_len = sum(i.size for i in insns)
    if decoded_len != size:
        raise BlockError(f"{function}: Capstone decoded {decoded_len} of {size} bytes "
                         f"(stopped at {start + decoded_len:#x})")
    starts = {i.address for i in insns}
    leaders = {start}
    reader = None
    table_targets: dict[int, list[int]] = {}  # address of an indirect jmp -> table entries
    for k, ins in enumerate(insns):
        kind = _kind(ins)
        if not kind:
            continue
        if k + 1 < len(insns):
            leaders.add(insns[k + 1].address)
        target = _direct_target(ins) if kind in ("jmp", "jcc", "call") else None
        if kind == "jmp" and target is None:
            reader = reader or _elf_reader(binary)
            table_targets[ins.address] = _jump_table_targets(insns, k, starts, reader)
            leaders.update(table_targets[ins.address])
        if target is not None and start <= target < end:
            if target not in starts:
                raise BlockError(f"{function}: {ins.mnemonic} at {ins.address:#x} jumps into the "
                                 f"middle of an instruction ({target:#x})")
            leaders.add(target)
    order = sorted(leaders)
    index = {a: b for b, a in enumerate(order)}
    blocks: list[Block] = []
    cur: list[capstone.CsInsn] = []

    def close(group: list[capstone.CsInsn]) -> None:
        first, last = group[0], group[-1]
        raw = b"".join(bytes(i.bytes) for i in group)
        kind = _kind(last)
        blk = Block(block_id=len(blocks), address=first.address, end=last.address + last.size,
                    insns=[f"{i.mnemonic} {i.op_str}".strip() for i in group],
                    hexes=[bytes(i.bytes).hex() for i in group],
                    forms=_forms_of(raw, first.address, catalogue),
                    terminator=f"{last.mnemonic} {last.op_str}".strip() if kind else "")
        if len(blk.forms) != len(group):
            raise BlockError(f"{function}: iced and Capstone disagree on the instructions of "
                             f"the block at {first.address:#x}")
        nxt = blk.end if blk.end < end else None
        target = _direct_target(last) if kind in ("jmp", "jcc") else None
        succ: list[int] = []
        if kind in ("", "jcc", "call"):
            if nxt is not None:
                succ.append(index[nxt])
            else:
                blk.exits = True  # falls off the function's end: into whatever follows
        if kind in ("jmp", "jcc"):
            if target is None:
                # indirect: the table's entries are successors, but maybe not all of them
                succ += [index[t] for t in table_targets.get(last.address, [])]
                blk.open_end = True
            elif start <= target < end:
                succ.append(index[target])
            elif kind == "jmp":
                blk.exits = True  # tail call
            else:
                blk.open_end = True  # conditional jump out (e.g. a .cold part)
        if kind == "ret":
            blk.exits = True
        blk.successors = sorted(set(succ))
        blocks.append(blk)

    for ins in insns:
        if ins.address in index and cur:
            close(cur)
            cur = []
        cur.append(ins)
    if cur:
        close(cur)
    return blocks


def blocks_frame(blocks: list[Block], benchmark: str, function: str) -> pd.DataFrame:
    """The blocks as the CONTRACTS table (one row per block)."""
    return pd.DataFrame({
        "benchmark": [benchmark] * len(blocks), "function": [function] * len(blocks),
        "block_id": [b.block_id for b in blocks], "address": [b.address for b in blocks],
        "end": [b.end for b in blocks], "n_insns": [b.n_insns for b in blocks],
        "insns": [b.insns for b in blocks], "hexes": [b.hexes for b in blocks],
        "forms": [b.forms for b in blocks], "terminator": [b.terminator for b in blocks],
        "successors": [b.successors for b in blocks], "exits": [b.exits for b in blocks],
        "open_end": [b.open_end for b in blocks],
    })


def write_blocks(blocks: list[Block], benchmark: str, function: str, path: Path | str) -> Path:
    """Write the blocks table as Parquet, atomically, with a fixed schema."""
    df = blocks_frame(blocks, benchmark, function)
    return write_table_atomic(pa.Table.from_pandas(df, schema=BLOCKS_SCHEMA,
                                                   preserve_index=False), path)


def blocks_from_frame(df: pd.DataFrame) -> list[Block]:
    """Blocks back from a blocks table."""
    out = []
    for r in df.sort_values("block_id").itertuples(index=False):
        out.append(Block(int(r.block_id), int(r.address), int(r.end), list(r.insns),
                         list(r.hexes), list(r.forms), str(r.terminator),
                         [int(s) for s in r.successors], bool(r.exits),
                         bool(r.open_end)))
    return out


def suite_forms(tables: Iterable[pd.DataFrame | Path | str], catalogue=None) -> list[str]:
    """Distinct catalogue forms of all blocks of the given blocks tables (or their paths).

    With ``catalogue`` only forms it marks ``ok`` (measurable) are kept.  Sorted, no "".
    """
    from cpumap.store.files import read_parquet_checked

    forms: set[str] = set()
    for t in tables:
        df = t if isinstance(t, pd.DataFrame) else read_parquet_checked(t, columns=["forms"])
        for row in df["forms"]:
            forms.update(f for f in row if f)
    if catalogue is not None:
        forms = {f for f in forms if f in catalogue.by_name and catalogue.ok(f)}
    return sorted(forms)


@dataclass(frozen=True)
class RepString:
    """A repeated string instruction (``rep stos``, ``repe cmps``...): one instruction whose
    work, and cost, grows with the count register, so a block's static instruction count says
    nothing of what it executed."""

    address: int
    next: int  # the address after it: where it always goes when done
    text: str
    width: int  # 64 (RCX) or 32 (ECX, with an address-size prefix)
    cond: str  # "rep" (runs RCX times) | "repe" | "repne" (can stop early on ZF)


def rep_strings(block: Block) -> list[RepString]:
    """The repeated string instructions of a block, in order."""
    import iced_x86 as ix

    out = []
    addr = block.address
    for h, text in zip(block.hexes, block.insns, strict=True):
        ins = ix.Decoder(64, bytes.fromhex(h), ip=addr).decode()
        if ins.is_string_instruction and (ins.has_rep_prefix or ins.has_repne_prefix):
            kinds = {ins.op_kind(k) for k in range(ins.op_count)}
            width = 32 if kinds & {ix.OpKind.MEMORY_ESEDI, ix.OpKind.MEMORY_SEG_ESI} else 64
            cond = "rep"
            if ins.mnemonic in {getattr(ix.Mnemonic, m) for m in _COMPARING}:
                cond = "repne" if ins.has_repne_prefix else "repe"
            out.append(RepString(addr, addr + ins.len, text, width, cond))
        addr += len(h) // 2
    return out
