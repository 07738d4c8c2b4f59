"""Dependence chains of forms (cpumap.measure.latency) and the loop predictor's recurrence bound
(cpumap.evaluate.analyzers.loop): exact on hand-written blocks with given latencies."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cpumap.evaluate.analyzers.base import BlockInput, Result
from cpumap.evaluate.analyzers.loop import LoopAnalyzer, Precomputed, recurrence_bound
from cpumap.isa import x86
from cpumap.measure import latency


def att_lines(code: bytes) -> list[str]:
    return [x86.att(i) for i, _ in x86.instruction_hexes(code)]


def one_link(chain: latency.Chain) -> list[str]:
    """The repeating unit: one instance, or two when the chain alternates two registers or is
    closed by moves back (``1 + len(back)``)."""
    lines = att_lines(chain.code)
    unit = 1 + len(chain.back) if chain.back else (1 if lines[0] == lines[1] else 2)
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
    # the register's chain keeps the memory operand off it; the address's chain makes the
    # loaded sum an address again: `and $0` (which waits for its input) and add a register
    # holding the sandbox's address
    assert by_pair("ADD_R64_M64", catalogue) == {
        "R64#0->R64#0": ["add (%rbx), %rax"],
        "M64->R64#0 (load-use, round trip with AND_R64_I8+ADD_R64_R64)":
            ["add (%rax), %rax", "and $0, %rax", "add %rcx, %rax"]}
    # an 8-bit load cannot chase a pointer (it would load 0x00 of BLOCK_INIT): rebased
    assert by_pair("MOVZX_R64_M8", catalogue) == {
        "M8->R64#0 (load-use, round trip with AND_R64_I8+ADD_R64_R64)":
            ["movzbq (%rax), %rax", "and $0, %rax", "add %rcx, %rax"]}
    got, why = latency.chains("NOT_A_FORM", catalogue)
    assert got == [] and "not an ok form" in why


def test_chains_across_widths_fixed_registers_and_memory(catalogue):
    # a write-only output of another width alternates two registers, each at its own width
    assert by_pair("VCVTPD2PS_XMM_YMM", catalogue) == {
        "YMM#1->XMM#0": ["vcvtpd2ps %ymm0, %xmm1", "vcvtpd2ps %ymm1, %xmm0"]}
    assert by_pair("MOVSXD_R64_R32", catalogue) == {
        "R32#1->R64#0": ["movslq %eax, %rcx", "movslq %ecx, %rax"]}
    # the accumulator short form: the register the encoding fixes is read and written
    assert by_pair("ADD_AL_I8", catalogue) == {"implicit RAX": ["add $1, %al"]}
    # a read-modify-write of one address: load, add, store, forwarded to the next load
    assert by_pair("ADD_M64_I8", catalogue) == {
        "M64->M64 (through memory)": ["addq $1, (%rbx)"]}
    assert by_pair("ADD_M64_R64", catalogue) == {
        "M64->M64 (through memory)": ["add %rax, (%rbx)"]}
    # MUL's implicit RAX chain would run beside a flags round trip: none is built
    assert by_pair("MUL_R64", catalogue) == {"implicit RAX": ["mul %rcx"]}
    # a store: the forwarded reload of its address and a move back to its register
    assert by_pair("VMOVUPD_M256_YMM", catalogue) == {
        "YMM#1->M256 (store, round trip with MOV_R64_M64 forwarded+VMOVQ_XMM_R64)":
            ["vmovupd %ymm0, (%rbx)", "mov (%rbx), %rax", "vmovq %rax, %xmm0"]}
    got, why = latency.chains("MOV_M32_R32", catalogue)
    assert got == [] and "fewer than 64 bits" in why
    # a conversion from memory: its output moved back, then rebased
    assert by_pair("CVTDQ2PD_XMM_M64", catalogue) == {
        "M64->XMM#0 (load-use, round trip with VMOVQ_R64_XMM+AND_R64_I8+ADD_R64_R64)":
            ["cvtdq2pd (%rax), %xmm0", "vmovq %xmm0, %rax", "and $0, %rax", "add %rcx, %rax"]}


def test_round_trips_across_register_classes(catalogue):
    """uops.info's second instruction: the canonical moves of a class close a chain; their own
    round trip is split in half, every other form's back path named."""
    vmovq = latency.chains("VMOVQ_R64_XMM", catalogue)[0]
    assert [(c.pair, c.back, c.split, one_link(c)) for c in vmovq] == [
        ("XMM#1->R64#0 (round trip with VMOVQ_XMM_R64)", (), True,
         ["vmovq %xmm0, %rax", "vmovq %rax, %xmm0"])]
    got = {c.pair: (c.back, one_link(c)) for c in latency.chains("CVTSD2SI_R64_XMM",
                                                                  catalogue)[0]}
    assert got == {"XMM#1->R64#0 (round trip with VMOVQ_XMM_R64)":
                   (("VMOVQ_XMM_R64",), ["cvtsd2si %xmm0, %rax", "vmovq %rax, %xmm0"])}
    # a compare into the flags, back through SETB; an accumulator short form through the
    # register the encoding fixes
    got = {c.pair: (c.back, one_link(c)) for c in latency.chains("CMP_R64_R64",
                                                                  catalogue)[0]}
    assert got == {"R64#0->flags (round trip with SETB_R8)":
                   (("SETB_R8",), ["cmp %rcx, %rax", "setb %al"]),
                   "R64#1->flags (round trip with SETB_R8)":
                   (("SETB_R8",), ["cmp %rax, %rcx", "setb %al"])}
    got = {c.pair: one_link(c) for c in latency.chains("CMP_RAX_I32", catalogue)[0]}
    assert got == {"RAX#0->flags (round trip with SETB_R8)": ["cmp $1, %rax", "setb %al"]}
    # vector -> flags needs two moves back, through a general-purpose register
    got = {c.pair: (c.back, one_link(c)) for c in latency.chains("COMISD_XMM_XMM",
                                                                  catalogue)[0]}
    assert got["XMM#0->flags (round trip with SETB_R8+VMOVQ_XMM_R64)"] == (
        ("SETB_R8", "VMOVQ_XMM_R64"), ["comisd %xmm1, %xmm0", "setb %al", "vmovq %rax, %xmm0"])
    # a vector load's address into its data: a pointer chase closed by a move to the address
    got = {c.pair: (c.back, one_link(c)) for c in latency.chains("VMOVUPD_YMM_M256",
                                                                  catalogue)[0]}
    assert got == {"M256->YMM#0 (load-use, round trip with VMOVQ_R64_XMM)":
                   (("VMOVQ_R64_XMM",), ["vmovupd (%rax), %ymm0", "vmovq %xmm0, %rax"])}


class FakeMeasurer:
    """Cycles per chain block from a table of cycles per link (the simulated machine of the
    round-trip arithmetic)."""

    def __init__(self, per_link: dict[str, float]):
        self.per_link = per_link

    def measure(self, texts, stage=""):
        return {t: self.per_link[t] * latency.LINKS for t in texts if t in self.per_link}

    def errors(self, texts):
        return {t: "SIGFPE" for t in texts}


def test_round_trip_shares_are_subtracted(catalogue):
    chains = {c.form: c for n in ("VMOVQ_R64_XMM", "VMOVQ_XMM_R64", "CVTSD2SI_R64_XMM",
                                  "VMOVUPD_YMM_M256") for c in latency.chains(n, catalogue)[0]}
    per_link = {chains["VMOVQ_R64_XMM"].text: 6.0, chains["VMOVQ_XMM_R64"].text: 6.2,
                chains["CVTSD2SI_R64_XMM"].text: 10.0, chains["VMOVUPD_YMM_M256"].text: 9.0}
    rows = {(r["form"], r["status"]): r for r in latency.latency_rows(
        FakeMeasurer(per_link), catalogue, ["CVTSD2SI_R64_XMM", "VMOVUPD_YMM_M256"])}
    # the back moves' canonical round trips are measured without being asked for; each is
    # half of its own; the forms' latencies are their round trips less their back's share
    assert set(rows) == {("CVTSD2SI_R64_XMM", "ok"), ("VMOVUPD_YMM_M256", "ok")}
    assert rows[("CVTSD2SI_R64_XMM", "ok")]["round_trip"] == pytest.approx(10.0)
    assert rows[("CVTSD2SI_R64_XMM", "ok")]["latency"] == pytest.approx(10.0 - 3.1)
    assert rows[("VMOVUPD_YMM_M256", "ok")]["latency"] == pytest.approx(9.0 - 3.0)
    both = {r["form"]: r for r in latency.latency_rows(
        FakeMeasurer(per_link), catalogue, ["VMOVQ_R64_XMM", "VMOVQ_XMM_R64"])}
    assert both["VMOVQ_R64_XMM"]["latency"] + both["VMOVQ_XMM_R64"]["latency"] == \
        pytest.approx(6.1)
    # a rebased load: its round trip less the own chains of `and $0` and `add` (each its
    # latency, not half of anything)
    from cpumap.measure import roundtrip

    per_link[latency.chains("MOVZX_R64_M8", catalogue)[0][0].text] = 6.5
    per_link[roundtrip.own_chain("AND_R64_I8", catalogue).text] = 1.0
    per_link[roundtrip.own_chain("ADD_R64_R64", catalogue).text] = 1.25
    row = latency.latency_rows(FakeMeasurer(per_link), catalogue, ["MOVZX_R64_M8"])[0]
    assert row["latency"] == pytest.approx(6.5 - 2.25) and row["round_trip"] == 6.5
    assert [x86.att(i) for i, _ in x86.instruction_hexes(bytes.fromhex(
        roundtrip.own_chain("AND_R64_I8", catalogue).text.split(":")[1]))][0] == "and $0, %rax"
    # a store: its round trip less half the forwarding round trip (the reload's share) and
    # the move back's share
    per_link[latency.chains("VMOVUPD_M256_YMM", catalogue)[0][0].text] = 11.0
    per_link[roundtrip.forwarding_chain(catalogue).text] = 1.0
    row = latency.latency_rows(FakeMeasurer(per_link), catalogue, ["VMOVUPD_M256_YMM"])[0]
    assert row["latency"] == pytest.approx(11.0 - 0.5 - 3.1)
    # the canonical store's own row stays the whole forwarding round trip (the loop
    # predictor's figure)
    row = latency.latency_rows(FakeMeasurer(per_link), catalogue, ["MOV_M64_R64"])[0]
    assert row["pair"].startswith("store->load") and row["latency"] == pytest.approx(1.0)
    # a back move whose round trip failed leaves the form failed, with that reason
    del per_link[chains["VMOVQ_XMM_R64"].text]
    row = latency.latency_rows(FakeMeasurer(per_link), catalogue, ["CVTSD2SI_R64_XMM"])[0]
    assert row["status"] == "failed" and "VMOVQ_XMM_R64" in row["error"]


def test_round_trips_run_on_this_cpu(catalogue, host, tmp_path):
    """The new kinds of chain, measured as written: every one runs (a vector load's pointer
    chase finds its page mapped and BLOCK_INIT in it), and none beats physics: a round trip
    of two moves across register files, or of a compare and a SETcc, takes at least a cycle
    per instruction (a rebased load: the load, `and $0` and `add`, each a cycle at least: if
    `and $0` were a zero idiom the chain would be broken and run faster), and a
    read-modify-write at least its add's cycle; interference only
    slows a chain, so the 3 % below those floors is the clock's calibration and nothing
    else, beside the estimate's own uncertainty: where its rounds disagree, the clock moved
    between two calibration samples (Cascade Lake guest, 2026-11-29: in 2 of 100 runs of
    these chains the CMP/SETB round trip read 1.78-1.80 cycles a link, its rounds 11-13 %
    apart, the step between two licence clocks), and the estimate says so."""
    from cpumap.measure import batch, estimate, harness
    from cpumap.measure.settings import BenchSettings

    floors = {"VMOVQ_R64_XMM": 2.0, "CVTSD2SI_R64_XMM": 2.0, "CMP_R64_R64": 2.0,
              "VMOVUPD_YMM_M256": 2.0, "ADD_M64_I8": 1.0, "VCVTPD2PS_XMM_YMM": 1.0,
              "MOVZX_R64_M8": 3.0, "CVTDQ2PD_XMM_M64": 5.0, "VMOVUPD_M256_YMM": 1.0}
    chains = [c for n in floors for c in latency.chains(n, catalogue)[0]]
    bench = BenchSettings()
    prep = batch.prepare_blocks([c.code for c in chains], catalogue, host, bench,
                                tmp_path / "chains.so")
    rows = batch.measure_prepared(prep, host, bench, harness.build_harness(tmp_path / "bin"),
                                  "latency-test")
    assert (rows.status == "ok").any()
    failed = rows[rows.status != "ok"]
    assert failed.empty, failed[["kernel", "error"]].to_string()
    agg = estimate.aggregate(rows, bench.stable_tol)
    per_link = {k: (v / latency.LINKS, u) for k, v, u in
                zip(agg.kernel, agg.cycles_per_instance_est, agg.rel_uncertainty, strict=True)}
    for c in chains:
        value, unc = per_link[c.text]
        assert np.isfinite(unc) and unc >= 0.0, (c.form, c.pair, unc)
        assert value * (1.0 + unc) >= 0.97 * floors[c.form], (c.form, c.pair, value, unc)


def test_every_chain_is_a_runnable_block(catalogue):
    """Each chain of the suite's kind of forms passes blockgen's checks (what the harness will
    run), and its links are identical instances."""
    from cpumap.measure import blockgen

    names = ["ADD_R64_R64", "IMUL_R64_R64", "VADDPD_YMM_YMM_YMM", "VFMADD231PD_YMM_YMM_YMM",
             "MOV_R64_M64", "MOV_M64_R64", "VDIVPD_YMM_YMM_YMM", "SHL_R64_CL", "ADC_R64_R64",
             "VPSHUFB_YMM_YMM_YMM", "MULSD_XMM_XMM", "CMC", "VCVTPD2PS_XMM_YMM",
             "ADD_AL_I8", "ADD_M64_I8", "CMP_RAX_I32", "CVTSD2SI_R64_XMM", "COMISD_XMM_XMM",
             "VMOVUPD_YMM_M256", "VMOVQ_R64_XMM", "MOVZX_R64_M8", "CVTDQ2PD_XMM_M64",
             "CMP_R64_M64", "VMOVUPD_M256_YMM", "MOVBE_M64_R64"]
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


@pytest.mark.parametrize("lines,bound", [
    # a counter kept in memory: the read-modify-write chain of one address, 6 a link
    (["addq $1, (%rbx)"], 6.0),
    (["add %rax, (%rbx)", "add $1, %rcx"], 6.0),
    # a pointer chase through a vector register: its own load-use (6) and the move back (3)
    (["vmovupd (%rax), %ymm0", "vmovq %xmm0, %rax"], 9.0),
    # a load-op form's own address -> output chain (5, the add included), not 5 + 1
    (["add (%rax), %rax"], 5.0),
    # ... and its register chain where that is the longer one
    (["add (%rbx), %rax"], 1.0),
])
def test_recurrence_through_memory_and_vector_loads(tmp_path, catalogue, lines, bound):
    code = assemble(tmp_path, *lines)
    forms = forms_of(code, catalogue)
    got, missing = recurrence_bound(
        code, forms, {"VMOVQ_R64_XMM": 3.0, "ADD_R64_I8": 1.0, "ADD_R64_M64": 1.0},
        load_use=4.0, forwarding=1.0, loads={"VMOVUPD_YMM_M256": 6.0, "ADD_R64_M64": 5.0},
        rmw={"ADD_M64_I8": 6.0, "ADD_M64_R64": 6.0})
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
