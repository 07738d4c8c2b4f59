"""Pipedream-style benchmark generation: multisets of forms -> one batch shared object.

Shape of every kernel (seeds 000/002)::

    for NUM_MEASURES:            # the harness repeats f1/f2 calls
        start
        for NUM_ITER:            # the loop in f1 / f2
            kernel x U           # f1; f2 has 2U copies
        stop

U is the smallest count with U * |kernel| >= UNROLL_SIZE, NUM_ITER the smallest with
U * |kernel| * NUM_ITER >= TOTAL_INSN. The harness times f1 and f2 for the same NUM_ITER: their
difference is exactly U * NUM_ITER kernel instances, so call, loop and timer overheads cancel
(nanoBench's n/2n trick).

Registers: per class, a read pool as large as the most read registers of that class any one
instruction needs, and a write pool with the rest; written (and read-written) operands take the
write pool round robin, so a register is written again only after every other register of the
pool. Registers used implicitly by a form of the kernel (RAX/RDX of MUL, CL of shifts, ...) are in
neither pool. Memory: the arena is split in a read half and a write half; every memory operand is
``disp(%r14)`` (reads) or ``disp(%r13)`` (writes: a base register of its own) with a fixed
base and displacements rotating over 64-byte slots of its half (and over
size-aligned offsets inside the slot, to spread accesses over the L1 banks). When a kernel has
both plain stores and read-modify-writes, each kind rotates over its own half of the write
half, so no read-modify-write loads what a store of another form wrote.

Instructions are emitted as the bytes iced-x86 encodes (with the AT&T text as a comment) so that
the assembler cannot silently pick another encoding than the form being measured.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import subprocess
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cpumap.isa import x86
from cpumap.isa.x86 import FormSpec

ABI_VERSION = 1
#: How kernels are laid out (registers, memory slots): part of every measurement's identity.
#: 2: read-modify-write memory operands get slots of their own when the kernel also stores
#: (Emitter.operands_for); rows measured with layout 1 are not reused. 3: the offset inside
#: the line rotates per access size, not with the slot (mixed widths collided in the banks).
#: 4: the written registers rotate over a pool coprime with the kernel's writes (a form's
#: instances came back to the same few registers, see ``rotation``).
LAYOUT_VERSION = 4
SLOT_BYTES = 64
# Value every arena byte pattern and GPR starts with: non-zero bytes (no division by zero),
# normal floats in every lane width (no denormal assists), see CONTRACTS / the harness.
FILL_PATTERN = 0x3FF1111111111111


class KernelError(ValueError):
    """A kernel that cannot be generated (bad syntax, unknown form, too few registers)."""


@dataclass(frozen=True)
class GenParams:
    """Generator parameters; part of every measurement's identity (params_id)."""

    unroll_size: int = 200
    total_insn: int = 200_000
    arena_bytes: int = 4096

    def as_dict(self) -> dict:
        return {"unroll_size": self.unroll_size, "total_insn": self.total_insn,
                "arena_bytes": self.arena_bytes, "abi": ABI_VERSION, "layout": LAYOUT_VERSION}


_TERM = re.compile(r"^(?P<form>.+?)(?:\s*\*\s*(?P<n>\d+))?$")


def parse_kernel_terms(terms: list[str]) -> list[tuple[str, int]]:
    """Split ``INSTR[*N]`` terms into (instruction text, multiplicity)."""
    out = []
    for t in terms:
        m = _TERM.match(t.strip())
        if not m or not m.group("form").strip():
            raise KernelError(f"cannot parse kernel term {t!r} (expected INSTR or INSTR*N)")
        n = int(m.group("n") or 1)
        if n < 1 or n > 1000:
            raise KernelError(f"multiplicity of {t!r} must be between 1 and 1000")
        out.append((m.group("form").strip(), n))
    return out


def canonical(kernel: Mapping[str, int]) -> str:
    """Canonical text of a multiset: names sorted, ``NAME*N`` for N > 1."""
    return " ".join(n if c == 1 else f"{n}*{c}" for n, c in sorted(kernel.items()) if c > 0)


def parse_canonical(text: str) -> dict[str, int]:
    """The multiset of a kernel's text (a new dict: the caller may change it)."""
    return dict(_parsed(text))


@functools.lru_cache(maxsize=1 << 18)
def _parsed(text: str) -> tuple[tuple[str, int], ...]:
    """Why cached: the model's stages parse the same kernel texts again and again (a
    10-port/300-form simulated fit: 857,000 parses, 13 s of its 170)."""
    k: Counter[str] = Counter()
    for name, n in parse_kernel_terms(text.split()):
        k[name] += n
    return tuple(k.items())


#: Kernel texts of basic blocks measured as written (cpumap.measure.blockgen): ``BLOCK:<hex>``.
BLOCK_PREFIX = "BLOCK:"


def kernel_key(text: str) -> str:
    """The canonical text of a kernel: a multiset's :func:`canonical` form, or a block measured
    as written (``BLOCK:<hex>``) as it is."""
    return text if text.startswith(BLOCK_PREFIX) else canonical(parse_canonical(text))


def kernel_id(canon: str) -> str:
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


def interleave(kernel: Mapping[str, int]) -> list[str]:
    """One copy of the kernel with every form's instances spread evenly (deterministic)."""
    total = sum(kernel.values())
    names = sorted(kernel)
    rank = {n: -i for i, n in enumerate(names)}
    share = {n: kernel[n] / total for n in names}
    credit = dict.fromkeys(names, 0.0)
    out = []
    for _ in range(total):
        for n in names:
            credit[n] += share[n]
        best = max(names, key=lambda n: (credit[n], rank[n]))
        credit[best] -= 1.0
        out.append(best)
    return out


@dataclass
class Allocation:
    """Register pools of one kernel (per class), and the registers reserved away from them."""

    read: dict[str, list[int]] = field(default_factory=dict)
    write: dict[str, list[int]] = field(default_factory=dict)
    reserved: set[str] = field(default_factory=set)


def _reg_operands(spec: FormSpec):
    return [o for o in spec.operands if o.kind == "reg"]


def rotation(pool: int, writes: int) -> int:
    """How many registers of a write pool of ``pool`` the round robin turns over, for a
    kernel that writes ``writes`` registers of the class per instance: the largest number,
    down to half the pool, that shares no factor with ``writes`` (the whole pool if none).

    Why: a form's writes sit at fixed places of each kernel instance, so with g the greatest
    common divisor of the two counts its instances only ever meet pool / g registers per
    place. A read-write destination chains its instances through its register:
    ``ADDPD xmm*4 PMULLD xmm*2`` (6 writes, 15 registers) gave PMULLD 5 registers, and it
    measured 4.12 cycles, its chains' latency, against 2.66 for the same kernel of VEX forms
    (write-only destinations), and 3.01 over 13 registers (Emerald Rapids-class guest,
    2026-11-29; ``tests/test_harness.py::test_legacy_sse_mixes_overlap_as_their_vex_twins_do``).
    """
    for n in range(pool, max(1, pool - pool // 2) - 1, -1):
        if math.gcd(n, max(1, writes)) == 1:
            return n
    return pool


def plan_pools(specs: list[FormSpec]) -> Allocation:
    """Split each register class into read and write pools for a kernel's forms."""
    alloc = Allocation()
    for s in specs:
        alloc.reserved.update(r for r, _acc in s.implicit)
    classes = {o.cls for s in specs for o in _reg_operands(s)}
    for cls in sorted(classes):
        users = [s for s in specs if any(o.cls == cls for o in _reg_operands(s))]
        evex = cls == "VEC" and all(not s.vex_limited for s in users)
        cand = []
        for idx in range(x86.class_size(cls, evex)):
            full = x86.full_register(x86.reg_name(cls, 64 if cls == "GPR" else
                                                  (512 if cls == "VEC" else 64), idx))
            if full not in alloc.reserved:
                cand.append(idx)
        n_read = max(sum(1 for o in _reg_operands(s) if o.cls == cls and o.access in ("r", "n"))
                     for s in users)
        n_write_min = max(sum(1 for o in _reg_operands(s) if o.cls == cls and "w" in o.access)
                          for s in users)
        if len(cand) - n_read < max(1, n_write_min):
            raise KernelError(f"not enough {cls} registers for this kernel "
                              f"({len(cand)} free, {n_read} read)")
        alloc.read[cls] = cand[:n_read]
        alloc.write[cls] = cand[n_read:]
    return alloc


@dataclass
class Emitter:
    """Stateful instance generator: round-robin registers and memory slots across a body.

    ``cache`` (instance -> assembly line) and ``stack`` may be shared by the emitters of one
    batch: a line depends on the form and its operands only, and the kernels of a batch
    repeat the same forms (their saturating kernels) with the same registers and slots. Each
    kernel encoding its own lines again took most of a batch's generation (5,000 kernels:
    about 7 s against 2 s for the assembler)."""

    specs: Mapping[str, FormSpec]
    alloc: Allocation
    arena_bytes: int
    rr_reg: Counter = field(default_factory=Counter)
    rr_mem: Counter = field(default_factory=Counter)
    #: (side, access size) -> accesses so far: the offset inside the line rotates per size
    rr_inline: Counter = field(default_factory=Counter)
    cache: dict = field(default_factory=dict)
    #: the kernel has both plain stores and read-modify-writes of memory (see operands_for)
    split_rmw: bool = False
    #: form -> how far one instance moves RSP (pushes: -8, pops: +8; most forms: 0)
    stack: dict = field(default_factory=dict)
    #: form -> (its registers with the fixed ones filled in, the operands that rotate):
    #: the read registers of a form are the same on every instance of one kernel
    templates: dict = field(default_factory=dict)
    #: register class -> registers the kernel writes per instance (``rotation``)
    writes: Counter = field(default_factory=Counter)

    def _template(self, name: str) -> tuple[list[str | None], list[tuple]]:
        found = self.templates.get(name)
        if found is not None:
            return found
        regs: list[str | None] = []
        rotating: list[tuple] = []
        reads: dict[str, int] = {}
        slots = max(1, (self.arena_bytes // 2) // SLOT_BYTES)
        for i, op in enumerate(self.specs[name].operands):
            regs.append(None)
            if op.kind == "reg" and "w" in op.access:
                pool = self.alloc.write[op.cls]
                pool = pool[:rotation(len(pool), self.writes[op.cls])]
                rotating.append((i, op.cls, [x86.reg_name(op.cls, op.width, j) for j in pool]))
            elif op.kind == "reg":
                k = reads.get(op.cls, 0)
                regs[i] = x86.reg_name(op.cls, op.width, self.alloc.read[op.cls][k])
                reads[op.cls] = k + 1
            elif op.kind == "mem":
                rotating.append((i, None, ("w" in op.access, op.access, max(1, op.width // 8),
                                           slots)))
        self.templates[name] = regs, rotating
        return regs, rotating

    def operands_for(self, name: str) -> tuple[tuple[str | None, ...], int, str]:
        fixed, rotating = self._template(name)
        regs = list(fixed)
        displ = 0
        base = x86.MEM_BASE
        for i, cls, what in rotating:
            if cls is not None:  # a written register: round robin over the class's pool
                n = self.rr_reg[cls]
                regs[i] = what[n % len(what)]
                self.rr_reg[cls] = n + 1
                continue
            writes, access, size, slots = what
            side = "w" if writes else "r"
            region = 0
            n_slots = slots
            if self.split_rmw and side == "w":
                # stores in the first half of the write half, read-modify-writes in the
                # second: a read-modify-write never loads what a store of another form
                # just wrote (measured on Zen 4: ADD m64,r64 + MOVSD m64,xmm 5.35 cycles
                # a pair when they shared slots, 1.0 each alone)
                side = access
                n_slots = max(1, slots // 2)
                region = (n_slots * SLOT_BYTES) if side == "rw" else 0
            slot = self.rr_mem[side] % n_slots
            self.rr_mem[side] += 1
            # Rotate the offset inside the 64-byte line by the access size as well: L1
            # banks are selected by the low address bits, and same-offset accesses to
            # different lines conflict (measured: 2.5 instead of 3 loads/cycle on Zen 4).
            # Each size rotates on its own count: with the slot's, forms alternating in a
            # kernel kept one offset each (``MOV r64, m64`` x 2 and ``VMOVUPD ymm, m256`` x 2
            # put every 256-bit load at offset 32): 1.57 cycles on the Emerald Rapids-class
            # guest, 1.33 (3 loads a cycle, as either alone) with a count per size.
            turn = self.rr_inline[side, size]
            self.rr_inline[side, size] = turn + 1
            inline = (turn * size) % SLOT_BYTES if size < SLOT_BYTES else 0
            displ = region + slot * SLOT_BYTES + inline
            base = x86.WRITE_BASE if side != "r" else x86.MEM_BASE
        return tuple(regs), displ, base

    def emit(self, name: str) -> str:
        """Assembly line of the next instance of form ``name``: its bytes, AT&T as comment."""
        regs, displ, base = self.operands_for(name)
        key = (name, regs, displ, base)
        line = self.cache.get(key)
        if line is None:
            instr = x86.instantiate(self.specs[name], list(regs), displ, base=base)
            line = ("    .byte " + ",".join(f"{b:#04x}" for b in x86.encode(instr))
                    + f"  # {x86.att(instr)}")
            self.cache[key] = line
            self.stack[name] = int(instr.stack_pointer_increment)
        return line


def stack_frame(names: list[str], stack: Mapping[str, int]) -> tuple[list[str], list[str]]:
    """Instructions before and after a loop body of pushes and pops that keep it safe.

    Pops read at RSP and move it up: run from the caller's RSP they would read, and the pushes
    after them overwrite, the live frames above it (return address, saved registers). So the
    body starts ``A`` bytes lower, A the highest point any pop reaches, and ends with RSP back
    where it was. Two ``lea`` per loop iteration, in f1 and f2 alike: the n/2n difference
    takes them out (they are not counted as kernel instances). Empty for bodies without stack
    forms.
    """
    depth = top = 0
    for name in names:
        d = stack.get(name, 0)
        if d > 0:  # a pop reads [RSP, RSP + d) before moving RSP up
            top = max(top, depth + d)
        depth += d
    if top == 0 and depth == 0:
        return [], []
    pre = [f"    lea {-top}(%rsp), %rsp"] if top else []
    post = [f"    lea {top - depth}(%rsp), %rsp"] if top - depth else []
    return pre, post


@dataclass
class KernelMeta:
    index: int
    kernel: str  # canonical text
    kernel_id: str
    n_insns: int  # instructions per kernel instance
    unroll: int  # U
    iters: int
    insns1: int
    insns2: int
    instances: int


def _uses(specs: list[FormSpec], cls: str) -> bool:
    return any(o.cls == cls for s in specs for o in _reg_operands(s)) or any(
        r.startswith({"VEC": ("XMM", "YMM", "ZMM"), "MMX": ("MM",), "K": ("K",)}[cls])
        for s in specs for r, _a in s.implicit)


#: The start of every measured function: the callee-saved registers, MXCSR saved and set to
#: FTZ|DAZ (no denormal assists); and its end (``FRAME_LEAVE``) restoring them.
FRAME_ENTER = ("push %rbx", "push %rbp", "push %r12", "push %r13", "push %r14", "push %r15",
               "sub $8, %rsp", "stmxcsr (%rsp)", "mov (%rsp), %eax", "or $0x8040, %eax",
               "mov %eax, 4(%rsp)", "ldmxcsr 4(%rsp)")
FRAME_LEAVE = ("ldmxcsr (%rsp)", "add $8, %rsp", "pop %r15", "pop %r14", "pop %r13", "pop %r12",
               "pop %rbp", "pop %rbx", "ret")


def vector_init(base: str, host_flags: set[str]) -> list[str]:
    """Every vector register of the host loaded from ``base`` (the arena's fill pattern)."""
    if "avx512f" in host_flags:
        return [f"vmovdqu64 ({base}), %zmm{i}" for i in range(32)]
    if "avx" in host_flags:
        return [f"vmovdqu ({base}), %ymm{i}" for i in range(16)]
    return [f"movdqu ({base}), %xmm{i}" for i in range(16)]


def _function(label: str, body: list[str], specs: list[FormSpec],
              host_flags: set[str], arena_bytes: int) -> tuple[list[str], int]:
    """Assembly of one measured function; returns lines and its instruction count w/o body."""
    pro = [*FRAME_ENTER, "mov %rsi, %r14", f"lea {arena_bytes // 2}(%rsi), %r13",
           "mov %rdi, %r15"]
    if _uses(specs, "K") and "avx512f" in host_flags:
        pro += ["mov $-1, %eax"] + [f"kmovw %eax, %k{i}" for i in range(8)]
    if _uses(specs, "VEC"):
        pro += vector_init("%r14", host_flags)
    if _uses(specs, "VEC") and "avx" in host_flags and any(
            s.encoding == "LEGACY" and any(o.cls == "VEC" for o in s.operands) for s in specs):
        # Legacy SSE writes merge into the upper lanes: with dirty upper state every SSE
        # instruction depends on its destination's previous value (measured: ADDPD 1.0
        # instead of 0.5 cycles on Zen 4). A clean upper state is what compiled SSE code sees.
        pro.append("vzeroupper")
    if _uses(specs, "MMX"):
        pro += [f"movq (%r14), %mm{i}" for i in range(8)]
    # Dividend registers: DIV keeps RDX below the divisor, so RDX:RAX / d never overflows
    # (AX = 0x0011 for the 8-bit form). Signed IDIV can still overflow from such values after
    # a few iterations; RDX:RAX = 0 is its only safe fixed point (0 / d = 0 remainder 0), so a
    # kernel with IDIV starts from it (data-dependent dividers may be faster on 0: noted).
    idiv = any(s.extras.get("mnemonic", "") == "IDIV" or s.code.startswith("IDIV_")
               for s in specs)
    init = {"RAX": 0, "RDX": 0} if idiv else {"RAX": 0x3FF1111111110011, "RDX": 0}
    for r in x86.GPR64:
        value = init.get(r, FILL_PATTERN)
        pro.append(f"movabs ${value:#x}, %{r.lower()}")
    epi = []
    if "avx" in host_flags:
        epi.append("vzeroupper")
    if _uses(specs, "MMX"):
        epi.append("emms")
    epi += ["cld", *FRAME_LEAVE]
    lines = ["    .p2align 6", f"{label}:"] + [f"    {x}" for x in pro]
    lines += ["    .p2align 6", f"{label}_loop:"] + body
    lines += ["    dec %r15", f"    jnz {label}_loop"] + [f"    {x}" for x in epi]
    return lines, len(pro) + len(epi)


def generate_batch(
    kernels: list[Mapping[str, int]],
    specs: Mapping[str, FormSpec],
    params: GenParams,
    host_flags: set[str],
) -> tuple[str, list[KernelMeta]]:
    """Assembly text of one batch shared object (ABI of CONTRACTS) and per-kernel metadata."""
    out = ["# generated by cpumap.measure.asmgen; do not edit", "    .text"]
    metas: list[KernelMeta] = []
    # the batch's instances, shared by its kernels (``Emitter``)
    instances: dict = {}
    stack: dict = {}
    for i, kernel in enumerate(kernels):
        missing = [n for n in kernel if n not in specs]
        if missing:
            raise KernelError(f"unknown form(s) {', '.join(missing)}")
        canon = canonical(kernel)
        copy = interleave(kernel)
        m = len(copy)
        unroll = max(1, math.ceil(params.unroll_size / m))
        iters = max(1, math.ceil(params.total_insn / (unroll * m)))
        kspecs = [specs[n] for n in kernel]
        alloc = plan_pools(kspecs)
        counts = []
        # f1's body is the first half of f2's: both start from the same allocator state
        mem_writes = {op.access for sp in kspecs for op in sp.operands
                      if op.kind == "mem" and "w" in op.access}
        em = Emitter(specs, alloc, params.arena_bytes, cache=instances, stack=stack,
                     split_rmw={"w", "rw"} <= mem_writes, writes=class_writes(kernel, specs))
        body2 = [em.emit(name) for _ in range(2 * unroll) for name in copy]
        names2 = [name for _ in range(2 * unroll) for name in copy]
        for fn, n in (("f1", unroll * m), ("f2", 2 * unroll * m)):
            pre, post = stack_frame(names2[:n], em.stack)
            body = pre + body2[:n] + post
            lines, fixed = _function(f"cpumap_k{i}_{fn}", body, kspecs, host_flags,
                                     params.arena_bytes)
            out += lines
            counts.append(fixed + iters * (len(body) + 2))
        meta = KernelMeta(i, canon, kernel_id(canon), m, unroll, iters, counts[0], counts[1],
                          unroll * iters)
        metas.append(meta)
    return "\n".join(out + batch_table(metas, params.arena_bytes)), metas


def class_writes(kernel: Mapping[str, int], specs: Mapping[str, FormSpec]) -> Counter:
    """Register class -> registers one instance of the kernel writes (``rotation``)."""
    out: Counter = Counter()
    for f, c in kernel.items():
        for o in _reg_operands(specs[f]):
            if "w" in o.access:
                out[o.cls] += c
    return out


def batch_table(metas: list[KernelMeta], arena_bytes: int) -> list[str]:
    """The end of a batch's assembly: the kernel ids, the ABI's symbols and the kernel table
    (one entry per kernel: id, f1, f2, iterations, instruction counts, instances)."""
    out = ["    .section .rodata"]
    out += [f".Lid{m.index}: .asciz \"{m.kernel_id}\"" for m in metas]
    out += ['    .section .data.rel.ro,"aw"', "    .balign 8"]
    for sym, val in (("cpumap_abi_version", ABI_VERSION), ("cpumap_nkernels", len(metas)),
                     ("cpumap_arena_bytes", arena_bytes)):
        out += [f"    .globl {sym}", f"    .type {sym}, @object", f"    .size {sym}, 8",
                f"{sym}: .quad {val}"]
    out += ["    .globl cpumap_kernels", "    .type cpumap_kernels, @object",
            f"    .size cpumap_kernels, {64 * len(metas)}", "cpumap_kernels:"]
    out += [f"    .quad .Lid{m.index}, cpumap_k{m.index}_f1, cpumap_k{m.index}_f2, {m.iters}, "
            f"{m.insns1}, {m.insns2}, {m.instances}, 0" for m in metas]
    return out + ['    .section .note.GNU-stack,"",@progbits', ""]


def compile_batch(asm: str, out_so: Path) -> Path:
    """Assemble and link one batch into a shared object (atomically replaced). The assembly
    source is kept beside it only when it fails to assemble (the error names it): a
    5,000-kernel batch's source is about 190 MB, and the Palmed batches compiled by jobs of
    their own (rule palmed_compile) would have left one per batch."""
    out_so = Path(out_so)
    out_so.parent.mkdir(parents=True, exist_ok=True)
    src = out_so.with_suffix(".s")
    src.write_text(asm)
    tmp = out_so.with_name(out_so.name + ".tmp")
    proc = subprocess.run(
        ["gcc", "-shared", "-nostdlib", "-Wl,-z,noexecstack", "-o", str(tmp), str(src)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise KernelError(f"assembling {src} failed: {proc.stderr[-2000:]}")
    tmp.replace(out_so)
    src.unlink()
    return out_so
