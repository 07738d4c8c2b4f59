"""Dependence chains of forms (cpumap.measure.latency) and the loop predictor's recurrence bound
(cpumap.evaluate.analyzers.loop): exact on hand-written blocks with given latencies."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest

from cpumap.evaluate.analyzers.base import BlockInput, Result
from cpumap.evaluate.analyzers.loop import LoopAnalyzer, Precomputed, recurrence_bound
from cpumap.isa import x86
from cpumap.measure import latency


def att_lines(code: bytes) -> list[str]:
    return [x86.att(i) for i, _ in x86.instruction_hexes(code)]


def one_link(chain: latency.Chain) -> list[str]:
    """The repeating unit: one instance, or two when the chain alternates two registers."""
    lines = att_lines(chain.code)
    unit = 1 if lines[0] == lines[1] else 2
    assert lines == lines[:unit] * (len(lines) // unit)
    return lines[:unit]


def by_pair(name, catalogue) -> dict[str, list[str]]:
    got, why = latency.chains(name, catalogue)
    assert not why, why
    return {c.pair: one_link(c) for c in got}


def test_chains_of_common_forms(catalogue):
    assert by_pair("ADD_R64_R64", catalogue) == {"R64#0->R64#0": ["add %rcx, %rax"]}
    assert by_pair("IMUL_R64_R64", catalogue) == {"R64#0->R64#0": ["imul %rcx, %rax"]}
    # three-operand: each source in turn, the other never the chain's register (no idiom)
    # a write-only output alternates two registers (never a register moved onto itself)
    assert by_pair("VADDPD_YMM_YMM_YMM", catalogue) == {
        "YMM#1->YMM#0": ["vaddpd %ymm2, %ymm0, %ymm1", "vaddpd %ymm2, %ymm1, %ymm0"],
        "YMM#2->YMM#0": ["vaddpd %ymm0, %ymm2, %ymm1", "vaddpd %ymm1, %ymm2, %ymm0"]}
    assert by_pair("MOV_R64_R64", catalogue) == {
        "R64#1->R64#0": ["mov %rax, %rcx", "mov %rcx, %rax"]}
    assert by_pair("VFMADD231PD_YMM_YMM_YMM", catalogue) == {
        "YMM#0->YMM#0": ["vfmadd231pd %ymm2, %ymm1, %ymm0"]}
    # a register the encoding fixes is not the chain's: xchg %rax, %rax would be a nop
    assert by_pair("XCHG_R64_RAX", catalogue) == {"R64#0->R64#0": ["xchg %rax, %rcx"]}
    # a pointer chase: the loaded value is the address (every mapped page holds BLOCK_INIT)
    assert by_pair("MOV_R64_M64", catalogue) == {"M64->R64#0 (load-use)": ["mov (%rax), %rax"]}
    assert by_pair("MOV_M64_R64", catalogue) == {
        "store->load (forwarding round trip with MOV_R64_M64)":
            ["mov %rax, (%rbx)", "mov (%rbx), %rax"]}
    assert by_pair("MUL_R64", catalogue) == {"implicit RAX": ["mul %rcx"]}
    assert by_pair("CMC", catalogue) == {"flags->flags": ["cmc"]}
    assert by_pair("LEA_R64_M", catalogue) == {"address->R64#0": ["lea 8(%rax), %rax"]}
    # the memory operand stays off the chain: the register's latency, not the load's
    assert by_pair("ADD_R64_M64", catalogue) == {"R64#0->R64#0": ["add (%rbx), %rax"]}
    # an 8-bit load cannot chase a pointer (it would load 0x00 of BLOCK_INIT)
    assert latency.chains("MOVZX_R64_M8", catalogue)[0] == []
    got, why = latency.chains("VMOVQ_R64_XMM", catalogue)
    assert got == [] and "second instruction" in why
    got, why = latency.chains("NOT_A_FORM", catalogue)
    assert got == [] and "not an ok form" in why


def test_every_chain_is_a_runnable_block(catalogue):
    """Each chain of the suite's kind of forms passes blockgen's checks (what the harness will
    run), and its links are identical instances."""
    from cpumap.measure import blockgen

    names = ["ADD_R64_R64", "IMUL_R64_R64", "VADDPD_YMM_YMM_YMM", "VFMADD231PD_YMM_YMM_YMM",
             "MOV_R64_M64", "MOV_M64_R64", "VDIVPD_YMM_YMM_YMM", "SHL_R64_CL", "ADC_R64_R64",
             "VPSHUFB_YMM_YMM_YMM", "MULSD_XMM_XMM", "CMC"]
    for name in names:
        got, why = latency.chains(name, catalogue)
        assert got, (name, why)
        for c in got:
            prepared = blockgen.prepare(c.code, catalogue)
            assert not prepared.error, (name, c.pair, prepared.error)
            assert len(att_lines(c.code)) % c.links == 0
            one_link(c)


def assemble(tmp_path: Path, *lines: str) -> bytes:
    src, obj, raw = tmp_path / "b.s", tmp_path / "b.o", tmp_path / "b.bin"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run(["as", "-o", str(obj), str(src)], check=True)
    subprocess.run(["objcopy", "-O", "binary", "-j", ".text", str(obj), str(raw)], check=True)
    return raw.read_bytes()


def forms_of(code: bytes, catalogue) -> tuple[str, ...]:
    return tuple(catalogue.by_key.get(x86.form_key(i), "") for i, _ in
                 x86.instruction_hexes(code))


LAT = {"ADDSD_XMM_M64": 3.0, "MOVSD_M64_XMM": 1.0,
       "ADDPD_XMM_XMM": 3.0, "MULPD_XMM_M128": 3.0, "MULSD_XMM_XMM": 3.0, "ADD_RAX_I32": 1.0,
       "ADD_R64_I8": 1.0, "IMUL_R64_R64": 3.0, "MOV_R64_M64": 4.0, "MOV_M64_R64": 1.0,
       "XOR_R32_R32": 1.0, "CMP_R64_R64": 1.0, "UNPCKLPD_XMM_XMM": 1.0}


@pytest.mark.parametrize("lines,bound", [
    # the gemm inner loop of tests/fixtures/analyze/poly.c: the addpd accumulator, 3 cycles
    (["movsd (%rdx), %xmm0", "add $0x140, %rax", "add $8, %rdx", "mulsd %xmm2, %xmm0",
      "unpcklpd %xmm0, %xmm0", "mulpd -0x140(%rax), %xmm0", "addpd %xmm0, %xmm1",
      "cmp %rcx, %rax"], 3.0),
    # an imul then add on one register: 3 + 1
    (["imul %rcx, %rax", "add $1, %rax"], 4.0),
    # a pointer chase: the load-use latency
    (["mov (%rax), %rax"], 4.0),
    # store, reload, add: the forwarding round trip (7, the reload included) + add (1)
    (["mov %rax, (%rbx)", "mov (%rbx), %rax", "add $1, %rax"], 8.0),
    # zeroed every iteration: nothing is carried but the counter
    (["xor %eax, %eax", "imul %rcx, %rax", "add $1, %rdx"], 1.0),
    # daxpy: y[i] stored, y[i+1] loaded next iteration: the same expression, another address
    (["movsd (%rdx,%rax,8), %xmm0", "mulsd %xmm1, %xmm0", "addsd (%rcx,%rax,8), %xmm0",
      "movsd %xmm0, (%rcx,%rax,8)", "add $1, %rax", "cmp %rax, %rsi"], 1.0),
    # an accumulator kept in memory: reload after the store (7), then addsd (3)
    (["addsd (%rbx), %xmm0", "movsd %xmm0, (%rbx)"], 10.0),
])
def test_recurrence_bound_exact(tmp_path, catalogue, lines, bound):
    code = assemble(tmp_path, *lines)
    forms = forms_of(code, catalogue)
    got, missing = recurrence_bound(code, forms, LAT, load_use=4.0, forwarding=7.0)
    assert got == pytest.approx(bound)
    assert missing == []


def test_loop_analyzer_takes_the_larger_bound_and_flags_missing(tmp_path, catalogue):
    code = assemble(tmp_path, "imul %rcx, %rax", "add $1, %rax", "add $1, %rdx")
    forms = forms_of(code, catalogue)
    blocks = [BlockInput("k", 0, tuple(att_lines(code)), forms, 4, code=code),
              BlockInput("k", 1, tuple(att_lines(code)), forms, 4, code=code)]
    table = pd.DataFrame([
        {"form": forms[0], "pair": "R64#0->R64#0", "latency": 3.0, "status": "ok"},
        {"form": "MOV_R64_M64", "pair": "M64->R64#0 (load-use)", "latency": 4.0,
         "status": "ok"},
        {"form": "MOV_M64_R64", "pair": "store->load (forwarding round trip with "
                                        "MOV_R64_M64)", "latency": 7.0, "status": "ok"}])
    thr = Precomputed("native", pd.DataFrame([
        {"benchmark": "k", "block_id": 0, "cycles": 1.5, "status": "ok", "error": ""},
        {"benchmark": "k", "block_id": 1, "cycles": 9.0, "status": "ok", "error": ""}]))
    got = LoopAnalyzer(table, thr).predict(blocks)
    # block 0: imul (3, measured) + add (1, not measured: taken as 1 and noted) > 1.5
    assert got[("k", 0)].cycles == pytest.approx(4.0)
    assert "approximate" in got[("k", 0)].error and forms[1] in got[("k", 0)].error
    assert got[("k", 1)].cycles == pytest.approx(9.0)  # the throughput bound is larger
    failing = Precomputed("native", pd.DataFrame(
        [{"benchmark": "k", "block_id": 0, "cycles": float("nan"), "status": "failed",
          "error": "form X excluded"}]))
    res = LoopAnalyzer(table, failing).predict(blocks[:1])[("k", 0)]
    assert res.status == "failed" and "form X excluded" in res.error
    assert isinstance(res, Result)


def test_first_ok_falls_back_and_says_so(tmp_path, catalogue):
    from cpumap.evaluate.analyzers.loop import FirstOk

    b = BlockInput("k", 0, ("leave",), ("LEAVE",), 1, code=b"\xc9")
    native = Precomputed("native", pd.DataFrame([{"benchmark": "k", "block_id": 0,
                                                  "cycles": float("nan"), "status": "failed",
                                                  "error": "form LEAVE excluded"}]))
    written = Precomputed("written", pd.DataFrame([{"benchmark": "k", "block_id": 0,
                                                    "cycles": 2.5, "status": "ok",
                                                    "error": ""}]))
    got = FirstOk([native, written]).predict([b])[("k", 0)]
    assert got.cycles == 2.5 and "from written (native: form LEAVE excluded)" in got.error
    none = FirstOk([native]).predict([b])[("k", 0)]
    assert none.status == "failed" and "native: form LEAVE excluded" in none.error
