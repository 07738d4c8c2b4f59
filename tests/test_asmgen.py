"""Generator rules (DESIGN §5), checked on the bytes it emits, decoded back with iced-x86."""

from __future__ import annotations

import re

import pytest
from iced_x86 import InstructionInfoFactory, Mnemonic, OpAccess, OpKind

from cpumap.isa import x86
from cpumap.measure import asmgen
from cpumap.measure.asmgen import GenParams

PARAMS = GenParams(unroll_size=64, total_insn=1000, arena_bytes=4096)
WRITES = {OpAccess.WRITE, OpAccess.READ_WRITE, OpAccess.COND_WRITE, OpAccess.READ_COND_WRITE}
READS = {OpAccess.READ, OpAccess.READ_WRITE, OpAccess.COND_READ, OpAccess.READ_COND_WRITE}


def body(asm: str, kernel: int = 0, fn: str = "f1"):
    """Decoded instructions of one function's loop body."""
    m = re.search(rf"cpumap_k{kernel}_{fn}_loop:\n(.*?)\n    dec %r15", asm, re.S)
    data = b"".join(bytes(int(b, 16) for b in line.split("#")[0].split()[1].split(","))
                    for line in m.group(1).splitlines())
    return x86.decode_all(data)


def explicit_regs(ins, info):
    """(full register, access) of explicit register operands."""
    out = []
    for i in range(ins.op_count):
        if ins.op_kind(i) == OpKind.REGISTER:
            out.append((x86.full_register(x86.REG_NAMES[ins.op_register(i)]), info.op_access(i)))
    return out


KERNELS = [
    {"ADD_R64_R64": 1},
    {"ADDPD_XMM_XMM": 1},
    {"VFMADD231PD_ZMM_ZMM_ZMM": 1},
    {"IMUL_R64_R64": 2, "VADDPD_YMM_YMM_YMM": 1, "MOV_R64_M64": 1},
    {"MUL_R64": 1, "SHL_R64_CL": 1, "ADD_R32_R32": 3},
    {"ADD_M64_R64": 1, "VMOVUPD_M256_YMM": 1, "VMOVUPD_YMM_M256": 2},
]


@pytest.mark.parametrize("kernel", KERNELS, ids=asmgen.canonical)
def test_register_pools(catalogue, host, kernel):
    specs = {n: catalogue.spec(n) for n in kernel}
    alloc = asmgen.plan_pools(list(specs.values()))
    asm, metas = asmgen.generate_batch([kernel], specs, PARAMS, set(host["isa_flags"]))
    instrs = body(asm)
    assert len(instrs) == metas[0].unroll * metas[0].n_insns
    read_pool = {x86.full_register(x86.reg_name(c, 64 if c != "VEC" else 512, i))
                 for c, idx in alloc.read.items() for i in idx}
    writes = asmgen.class_writes(kernel, specs)
    pool_size = {c: asmgen.rotation(len(v), writes[c]) for c, v in alloc.write.items()}
    factory = InstructionInfoFactory()
    last_write: dict[str, int] = {}
    writes_of_class: dict[str, int] = {}
    for pos, ins in enumerate(instrs):
        regs = explicit_regs(ins, factory.info(ins))
        for reg, acc in regs:
            cls = "VEC" if reg.startswith("ZMM") else "K" if reg.startswith("K") else \
                "MMX" if reg.startswith("MM") else "GPR"
            if acc in READS and reg in last_write:
                # writes of this class since the last write of reg, counting that write
                distance = writes_of_class[cls] - last_write[reg]
                assert distance >= pool_size[cls], (pos, reg, distance)
        for reg, acc in regs:
            if acc in WRITES:
                assert reg not in read_pool, f"read-pool register {reg} written at {pos}"
                cls = "VEC" if reg.startswith("ZMM") else "K" if reg.startswith("K") else \
                    "MMX" if reg.startswith("MM") else "GPR"
                writes_of_class[cls] = writes_of_class.get(cls, 0) + 1
                last_write[reg] = writes_of_class[cls] - 1
        for reg, _acc in regs:
            assert reg not in (x86.MEM_BASE, x86.WRITE_BASE, x86.LOOP_COUNTER, "RSP")
            for imp, _a in specs[next(iter(specs))].implicit:
                if all(imp in dict(s.implicit) for s in specs.values()):
                    assert reg != imp


def test_rotation_shares_no_factor_with_the_kernels_writes():
    assert asmgen.rotation(15, 1) == 15
    assert asmgen.rotation(15, 6) == 13  # 15 and 14 share 3 and 2 with 6
    assert asmgen.rotation(16, 4) == 15
    assert asmgen.rotation(10, 210) == 10  # none down to half the pool: all of it
    assert asmgen.rotation(1, 2) == 1


def test_each_form_writes_every_register_of_the_rotation(catalogue, host):
    """``ADDPD xmm*4 PMULLD xmm*2``: six writes an instance; over 15 registers in one round
    robin PMULLD's instances wrote 5 of them and their read-write destinations chained them
    (4.11 cycles measured against 2.66 for the VEX forms). Over 13, every form meets all."""
    kernel = {"ADDPD_XMM_XMM": 4, "PMULLD_XMM_XMM": 2}
    specs = {n: catalogue.spec(n) for n in kernel}
    asm, _ = asmgen.generate_batch([kernel], specs, PARAMS, set(host["isa_flags"]))
    factory = InstructionInfoFactory()
    written: dict[Mnemonic, set[str]] = {}
    for ins in body(asm):
        for reg, acc in explicit_regs(ins, factory.info(ins)):
            if acc in WRITES:
                written.setdefault(ins.mnemonic, set()).add(reg)
    assert {m: len(r) for m, r in written.items()} == {Mnemonic.ADDPD: 13, Mnemonic.PMULLD: 13}


@pytest.mark.parametrize("kernel", KERNELS, ids=asmgen.canonical)
def test_memory_operands_stay_in_their_half(catalogue, host, kernel):
    specs = {n: catalogue.spec(n) for n in kernel}
    asm, _ = asmgen.generate_batch([kernel], specs, PARAMS, set(host["isa_flags"]))
    half = PARAMS.arena_bytes // 2
    factory = InstructionInfoFactory()
    for fn in ("f1", "f2"):
        for ins in body(asm, 0, fn):
            for mem in factory.info(ins).used_memory():
                size = max(1, x86.MemorySizeInfo(mem.memory_size).size)
                # the write half has its own base register, which points at arena + half
                base = x86.REG_NAMES[mem.base]
                lo = mem.displacement + (half if base == x86.WRITE_BASE else 0)
                hi = lo + size
                if mem.access in WRITES:
                    assert base == x86.WRITE_BASE
                    assert half <= lo and hi <= 2 * half
                else:
                    assert base == x86.MEM_BASE
                    assert 0 <= lo and hi <= half


def test_unroll_and_iterations(catalogue, host):
    specs = {"ADD_R64_R64": catalogue.spec("ADD_R64_R64"),
             "MOV_R64_M64": catalogue.spec("MOV_R64_M64")}
    kernel = {"ADD_R64_R64": 2, "MOV_R64_M64": 1}
    asm, (meta,) = asmgen.generate_batch([kernel], specs, PARAMS, set(host["isa_flags"]))
    assert meta.n_insns == 3
    assert meta.unroll * 3 >= PARAMS.unroll_size > (meta.unroll - 1) * 3
    assert meta.unroll * 3 * meta.iters >= PARAMS.total_insn
    assert len(body(asm, 0, "f2")) == 2 * len(body(asm, 0, "f1"))
    assert meta.instances == meta.unroll * meta.iters
    assert meta.insns2 - meta.insns1 == meta.iters * meta.unroll * 3


def test_interleave_spreads_forms():
    assert asmgen.interleave({"A": 2, "B": 1}) in (["A", "B", "A"], ["A", "A", "B"])
    seq = asmgen.interleave({"A": 3, "B": 3})
    assert sorted(seq) == ["A"] * 3 + ["B"] * 3
    assert all(seq[i] != seq[i + 1] for i in range(5))


def test_kernel_syntax():
    assert asmgen.parse_kernel_terms(["ADD_R64_R64*2", "vaddpd %ymm0, %ymm1, %ymm2"]) == [
        ("ADD_R64_R64", 2), ("vaddpd %ymm0, %ymm1, %ymm2", 1)]
    assert asmgen.canonical({"B": 1, "A": 2}) == "A*2 B"
    assert asmgen.parse_canonical("A*2 B") == {"A": 2, "B": 1}
    with pytest.raises(asmgen.KernelError):
        asmgen.parse_kernel_terms(["ADD*0"])


def test_read_modify_writes_never_load_what_stores_wrote(catalogue, host):
    """A kernel with stores and read-modify-writes: disjoint byte ranges for the two kinds
    (sharing slots, ADD m64,r64 + MOVSD m64,xmm took 5.35 cycles a pair instead of 2)."""
    kernel = {"ADD_M64_R64": 3, "MOVSD_M64_XMM": 2, "VMOVUPD_M256_YMM": 1}
    specs = {n: catalogue.spec(n) for n in kernel}
    asm, _ = asmgen.generate_batch([kernel], specs, PARAMS, set(host["isa_flags"]))
    factory = InstructionInfoFactory()
    touched: dict[str, set[int]] = {"store": set(), "rmw": set()}
    for fn in ("f1", "f2"):
        for ins in body(asm, 0, fn):
            for mem in factory.info(ins).used_memory():
                size = max(1, x86.MemorySizeInfo(mem.memory_size).size)
                kind = "rmw" if ins.mnemonic == Mnemonic.ADD else "store"
                touched[kind] |= set(range(mem.displacement, mem.displacement + size))
    assert touched["store"] and touched["rmw"]
    assert not touched["store"] & touched["rmw"]
    assert max(touched["rmw"]) < PARAMS.arena_bytes // 2


@pytest.mark.parametrize("names,pre,post", [
    (["ADD"], [], []),
    (["PUSH"] * 3, [], ["    lea 24(%rsp), %rsp"]),
    (["POP"] * 2, ["    lea -16(%rsp), %rsp"], []),
    (["POP", "PUSH", "POP"], ["    lea -8(%rsp), %rsp"], []),
    (["PUSH", "ADD", "POP", "POP"], ["    lea -8(%rsp), %rsp"], []),
    (["POP", "PUSH", "PUSH"], ["    lea -8(%rsp), %rsp"], ["    lea 16(%rsp), %rsp"]),
])
def test_stack_frame_keeps_pops_below_the_callers_frame(names, pre, post):
    stack = {"PUSH": -8, "POP": 8, "ADD": 0}
    assert asmgen.stack_frame(names, stack) == (pre, post)


def test_pushes_and_pops_leave_rsp_where_it_was(catalogue, host):
    """Walk each function's loop body as the CPU would: no pop ever reads at or above the
    caller's RSP, and RSP is back where it was at the end of every iteration."""
    names = ["PUSH_R64", "POP_R64", "PUSH_I32", "POP_M64", "ADD_R64_R64"]
    specs = {n: catalogue.spec(n) for n in names}
    kernel = {"PUSH_R64": 1, "POP_R64": 3, "PUSH_I32": 1, "POP_M64": 1, "ADD_R64_R64": 1}
    asm, (meta,) = asmgen.generate_batch([kernel], specs, PARAMS, set(host["isa_flags"]))
    assert meta.insns2 - meta.insns1 == meta.iters * meta.unroll * 7  # the lea's cancel
    for fn in ("f1", "f2"):
        lines = re.search(rf"cpumap_k0_{fn}_loop:\n(.*?)\n    dec %r15", asm, re.S).group(1)
        rsp = 0
        pops = 0
        for line in lines.splitlines():
            lea = re.fullmatch(r"    lea (-?\d+)\(%rsp\), %rsp", line)
            if lea:
                rsp += int(lea.group(1))
                continue
            data = bytes(int(b, 16) for b in line.split("#")[0].split()[1].split(","))
            (ins,) = x86.decode_all(data)
            d = ins.stack_pointer_increment
            if d > 0:
                pops += 1
                assert rsp + d <= 0, line  # reads below the caller's RSP only
            rsp += d
        assert rsp == 0 and pops == meta.unroll * 4 * (1 if fn == "f1" else 2)
