"""Basic blocks measured as written (BHive's method, seed 003), in the harness's n/2n loops.

The ground truth of "how long does this block take": the block's own bytes, with the register
dependences and loop-carried chains the compiler wrote, repeated U times per loop iteration
in f1 and 2U times in f2 (so the difference is U x iterations blocks, as for generated
kernels). Unlike a multiset kernel (:mod:`cpumap.measure.asmgen`) nothing is renamed, so the
block runs on whatever its registers hold; as BHive does, every general-purpose register
but RSP starts each call at ``BLOCK_INIT`` and the harness maps every page the block touches
on first fault onto one physical page (``--map-pages``), so loads through arbitrary base
registers run, and hit L1. RSP is set to ``STACK_INIT`` (mapped the same way) at the top of
every loop iteration, so pushes, pops, LEAVE and RSP arithmetic run as written without
walking the stack away (the reset costs the same in f1 and f2 and cancels); vector registers
hold the arena's fill pattern (normal floats).

A block is refused, with the reason, where running it as written here would measure
something else or harm the harness: bytes that do not decode, an instruction whose form the
catalogue lacks or excludes (the catalogue's reason: stack-pointer writes, privileged forms,
VM exits...; stack forms the generator cannot measure alone, PUSH, POP and LEAVE, are
measured as written), control flow inside the block, RIP-relative memory (a compiler's
constants: the address would be in our code and data, and a value loaded from there, used
as a pointer, could write anywhere in the harness; seen: a whole-corpus batch whose harness
crashed on exit), %fs/%gs-relative memory (our thread-local storage: stack canaries, errno),
or no general-purpose register left for the loop counter.
Blocks that fault for other reasons (a divide error, a protection fault, more pages
than allowed) or hang are the harness's failures, recorded per block: one never stops its
batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import iced_x86 as ix

from cpumap.isa import x86
from cpumap.measure.asmgen import (
    BLOCK_PREFIX,
    FRAME_ENTER,
    FRAME_LEAVE,
    GenParams,
    KernelMeta,
    batch_table,
    kernel_id,
    vector_init,
)

#: Every general-purpose register but RSP, at each call's start (BHive's value): an address in
#: user space whose pages are mapped on first touch.
BLOCK_INIT = 0x2324000
#: RSP at the top of every loop iteration: pages mapped on first touch, as the others.
STACK_INIT = 0x2424000
#: Forms the catalogue excludes because they move RSP, which run as written here (RSP is
#: reset every iteration): their mnemonics.
STACK_AS_WRITTEN = frozenset({"PUSH", "POP", "LEAVE"})
#: Pages one block may have mapped for it (BHive maps them all onto one physical page too):
#: 64 MiB of addresses, room for a few streams walked over one call (the harness's calls
#: last tens of microseconds: a block striding 32 bytes a cycle walks about 6 MB).
MAP_PAGES = 16384
#: Loop-counter candidates, preferred first (the block must use none of it).
_COUNTERS = ("R15", "R14", "R13", "R12", "R11", "R10", "R9", "R8", "RBP", "RBX", "RDI", "RSI",
             "RDX", "RCX", "RAX")
_GPRS = ("RAX", "RCX", "RDX", "RBX", "RBP", "RSI", "RDI", "R8", "R9", "R10", "R11", "R12",
         "R13", "R14", "R15")


def block_text(code: bytes) -> str:
    """The kernel text of a block measured as written: ``BLOCK:<hex>`` (its DB identity)."""
    return BLOCK_PREFIX + code.hex()


def is_block(text: str) -> bool:
    return text.startswith(BLOCK_PREFIX)


def n_insns(text: str) -> int:
    """Instructions of the block of a ``BLOCK:<hex>`` text (0 where the bytes do not decode)."""
    try:
        insns = x86.decode_all(bytes.fromhex(text[len(BLOCK_PREFIX):]))
    except ValueError:
        return 0
    return sum(1 for i in insns if i.code != ix.Code.INVALID)


@dataclass(frozen=True)
class Block:
    """A block ready to run as written, or the reason it cannot be."""

    code: bytes
    hexes: tuple[str, ...] = ()
    att: tuple[str, ...] = ()
    forms: tuple[str, ...] = ()
    counter: str = ""
    error: str = ""

    @property
    def text(self) -> str:
        return block_text(self.code)


def prepare(code: bytes, catalogue) -> Block:
    """Decode ``code`` and check it can run as written (see the module docstring)."""
    decoded = x86.instruction_hexes(code)
    insns = [ins for ins, _ in decoded]
    if not insns or any(i.code == ix.Code.INVALID for i in insns):
        return Block(code, error="bytes that do not decode as x86-64 instructions")
    att = tuple(x86.att(i) for i in insns)
    forms, used = [], set()
    factory = ix.InstructionInfoFactory()
    for ins, text in zip(insns, att, strict=True):
        if ins.flow_control != ix.FlowControl.NEXT:
            return Block(code, att=att, error=f"{text}: control flow inside the block")
        name = catalogue.by_key.get(x86.form_key(ins), "")
        if not name:
            return Block(code, att=att, error=f"{text}: {x86.CODE_NAMES[ins.code]} is not in "
                                              "the catalogue")
        row = catalogue.by_name[name]
        if row.status != "ok" and row.mnemonic not in STACK_AS_WRITTEN:
            return Block(code, att=att, error=f"{text}: form {name} excluded ({row.reason})")
        if ins.is_ip_rel_memory_operand:
            return Block(code, att=att, error=f"{text}: RIP-relative memory (it would address "
                                              "the harness's code and data, not the block's)")
        if ins.segment_prefix in (ix.Register.FS, ix.Register.GS):
            return Block(code, att=att, error=f"{text}: %fs/%gs-relative memory (the "
                                              "harness's thread-local storage)")
        for u in factory.info(ins).used_registers():
            if not ix.RegisterExt.is_gpr(u.register):
                continue
            used.add(x86.REG_NAMES[ix.RegisterExt.full_register(u.register)])
        forms.append(name)
    free = [r for r in _COUNTERS if r not in used]
    if not free:
        return Block(code, att=att, forms=tuple(forms),
                     error="uses every general-purpose register (none left for the loop "
                           "counter)")
    return Block(code, tuple(h for _, h in decoded), att, tuple(forms), free[0])


def _function(label: str, block: Block, copies: int, params: GenParams,
              host_flags: set[str]) -> tuple[list[str], int]:
    """One measured function: ``copies`` of the block per loop iteration; (lines, the
    instructions it runs besides the copies, once per call)."""
    counter = block.counter.lower()
    pro = [*FRAME_ENTER, "mov %rsp, cpumap_saved_rsp(%rip)", *vector_init("%rsi", host_flags)]
    if "avx" in host_flags:
        pro.append("vzeroupper")  # the clean upper state compiled code starts from
    pro.append(f"mov %rdi, %{counter}")
    pro += [f"movabs ${BLOCK_INIT:#x}, %{r.lower()}" for r in _GPRS if r != block.counter]
    epi = ["mov cpumap_saved_rsp(%rip), %rsp"]
    if "avx" in host_flags:
        epi.append("vzeroupper")
    epi += ["emms", "cld", *FRAME_LEAVE]
    body = []
    for _ in range(copies):
        body += [f"    .byte {', '.join(f'0x{h[i:i + 2]}' for i in range(0, len(h), 2))}"
                 f"  # {a}" for h, a in zip(block.hexes, block.att, strict=True)]
    lines = ["    .p2align 6", f"{label}:"] + [f"    {x}" for x in pro]
    lines += ["    .p2align 6", f"{label}_loop:", f"    mov ${STACK_INIT:#x}, %rsp"] + body
    lines += [f"    dec %{counter}", f"    jnz {label}_loop"] + [f"    {x}" for x in epi]
    return lines, len(pro) + len(epi)


def generate_batch(blocks: Sequence[Block], params: GenParams, host_flags: set[str]
                   ) -> tuple[str, list[KernelMeta]]:
    """Assembly of one batch shared object (the harness's ABI, as
    :func:`cpumap.measure.asmgen.generate_batch`) of blocks that ``prepare`` accepted."""
    bad = [b.text for b in blocks if b.error]
    if bad:
        raise ValueError(f"blocks that cannot run as written: {', '.join(bad[:3])}")
    out = ["# generated by cpumap.measure.blockgen; do not edit", "    .text"]
    metas: list[KernelMeta] = []
    for i, block in enumerate(blocks):
        m = len(block.hexes)
        unroll = max(1, math.ceil(params.unroll_size / m))
        iters = max(1, math.ceil(params.total_insn / (unroll * m)))
        counts = []
        for fn, copies in (("f1", unroll), ("f2", 2 * unroll)):
            lines, fixed = _function(f"cpumap_k{i}_{fn}", block, copies, params, host_flags)
            out += lines
            counts.append(fixed + iters * (copies * m + 3))
        meta = KernelMeta(i, block.text, kernel_id(block.text), m, unroll, iters, counts[0],
                          counts[1], unroll * iters)
        metas.append(meta)
    out += ["    .data", "    .balign 8", "cpumap_saved_rsp: .quad 0"]
    return "\n".join(out + batch_table(metas, params.arena_bytes)), metas
