"""Analyzers on blocks of a hand-written kernel, and the subprocess wrapper's failure handling."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from evaluate_fixtures import fixture_blocks
from native_util import assert_near

from cpumap.evaluate import analyzers as A
from cpumap.measure import harness
from cpumap.model import resmodel


@pytest.fixture(scope="module")
def blocks(catalogue, tmp_path_factory) -> pd.DataFrame:
    return fixture_blocks(catalogue, tmp_path_factory.mktemp("blocks"))


@pytest.fixture(scope="module")
def inputs(blocks) -> list[A.BlockInput]:
    return A.block_inputs(blocks, drop_terminator=True)


def test_inputs_are_rendered_from_bytes_without_terminator(blocks, inputs):
    assert [list(b.insns) for b in inputs] == [
        ["xor %eax, %eax", "vxorps %xmm0, %xmm0, %xmm0", "test %rsi, %rsi"],
        ["vaddss (%rdi,%rax,4), %xmm0, %xmm0", "vmulss %xmm1, %xmm2, %xmm3", "add $1, %rax",
         "cmp %rsi, %rax"],
        [],
        ["mov %rsi, %rcx", "rep stos %al, (%rdi)", "imul %rbx, %rdx"],
    ]
    assert [b.n_insns for b in inputs] == [4, 5, 1, 4]  # the terminator still counts
    assert inputs[1].forms == ("VADDSS_XMM_XMM_M32", "VMULSS_XMM_XMM_XMM", "ADD_R64_I8",
                               "CMP_R64_R64")
    assert inputs[3].forms[1] == ""  # string instruction: not a catalogue form
    kept = A.block_inputs(blocks, drop_terminator=False)
    assert kept[1].insns[-1] == "jne 0xb" and kept[2].insns == ("ret",)


def test_rip_relative_operands_stay_relative():
    # vmovsd 0x1000(%rip), %xmm1 decoded at 0x401040
    assert A.render_att(["c5fb100d00100000"], 0x401040) == ["vmovsd 0x1000(%rip), %xmm1"]
    with pytest.raises(ValueError, match="not one instruction"):
        A.render_att(["4883"], 0)


def test_a_block_that_cannot_be_rendered_fails_for_every_analyzer(blocks):
    bad = blocks.iloc[[1]].copy()
    bad["hexes"] = [["4883"]]  # truncated instruction
    (b,) = A.block_inputs(bad)
    assert b.error == "cannot render the block: bytes 4883 at 0xb are not one instruction"
    res = A.predict_blocks(A.LlvmMca(), [b])
    assert res[b.key].status == "failed" and res[b.key].error == b.error


def test_llvm_mca_steady_state_cycles(inputs):
    mca = A.LlvmMca(cpu="znver4", iterations=100)
    res = mca.predict(inputs)
    # loop block: vaddss carries xmm0 from one iteration to the next (latency 3 on Zen 4)
    assert res[("fix.O2", 1)].cycles == 3.0
    assert res[("fix.O2", 0)].cycles == 0.5
    assert res[("fix.O2", 2)].cycles == 0.0 and res[("fix.O2", 2)].status == "ok"  # empty
    assert mca.stats.calls == 1 and mca.stats.failed_calls == 0


def test_osaca_predicts_and_names_unknown_instructions(inputs):
    res = A.Osaca(arch="ZEN4").predict(inputs)
    assert res[("fix.O2", 1)].cycles == 3.0
    # OSACA 0.7.1's ZEN4 data has no entry for xor r32, r32
    assert res[("fix.O2", 0)].status == "failed"
    assert "no ZEN4 throughput data for: xor %eax, %eax" in res[("fix.O2", 0)].error
    lax = A.Osaca(arch="ZEN4", ignore_unknown=True).predict(inputs[:1])
    # --ignore-unknown: xor costs nothing; vxorps and test go to different ports
    assert lax[("fix.O2", 0)].cycles == 0.25
    assert lax[("fix.O2", 0)].error == "ignored (no ZEN4 data): xor %eax, %eax"


FAKE_MCA = textwrap.dedent("""\
    import json, os, signal, sys, time
    path = sys.argv[-1]
    iters = int([a for a in sys.argv if a.startswith("-iterations=")][0].split("=")[1])
    regions, cur = [], None
    for n, line in enumerate(open(path).read().splitlines(), 1):
        if line.startswith("# LLVM-MCA-BEGIN"):
            cur = [line.split()[-1], []]
        elif line.startswith("# LLVM-MCA-END"):
            regions.append(cur)
        else:
            if "CRASH" in line:
                os.kill(os.getpid(), signal.SIGSEGV)
            if "HANG" in line:
                time.sleep(60)
            if "BAD" in line:
                print(f"{path}:{n}:1: error: invalid instruction mnemonic 'BAD'",
                      file=sys.stderr)
                sys.exit(1)
            cur[1].append(line)
    out = [{"Name": name, "SummaryView": {"TotalCycles": 2 * iters * len(ins) + 7}}
           for name, ins in regions]
    print(json.dumps({"CodeRegions": out}))
""")


def _blocks(*bodies: list[str]) -> list[A.BlockInput]:
    return [A.BlockInput("b.O2", i, tuple(body), ("",) * len(body), len(body) + 1)
            for i, body in enumerate(bodies)]


def test_crashing_hanging_and_rejected_blocks_fail_alone(tmp_path):
    fake = tmp_path / "fake_mca.py"
    fake.write_text(FAKE_MCA)
    blocks = _blocks(["a", "b"], ["CRASH"], ["c"], ["HANG", "d"], ["e", "BAD"], ["f", "g", "h"])
    mca = A.LlvmMca(command=[sys.executable, str(fake)], timeout_s=2.0, iterations=10)
    res = mca.predict(blocks)
    assert {k[1]: r.cycles for k, r in res.items() if r.status == "ok"} == {0: 4.0, 2: 2.0,
                                                                            5: 6.0}
    assert res[("b.O2", 1)].error.startswith("llvm-mca: crashed (SIGSEGV)")
    assert res[("b.O2", 3)].error.startswith("llvm-mca: timed out after 2.")
    assert res[("b.O2", 4)].error == "llvm-mca: invalid instruction mnemonic 'BAD'"
    assert all(math.isnan(res[("b.O2", i)].cycles) for i in (1, 3, 4))


FAKE_OSACA = textwrap.dedent("""\
    import json, os, signal, sys, time
    for item in json.load(sys.stdin):
        if "CRASH" in item["insns"]:
            os.kill(os.getpid(), signal.SIGKILL)
        if "HANG" in item["insns"]:
            time.sleep(60)
        print(json.dumps({"key": item["key"], "status": "ok",
                          "cycles": float(len(item["insns"])), "error": "", "seconds": 0.0}),
              flush=True)
""")


def test_osaca_worker_crash_and_hang_blame_the_block_in_flight(tmp_path):
    fake = tmp_path / "fake_osaca.py"
    fake.write_text(FAKE_OSACA)
    blocks = _blocks(["a"], ["CRASH"], ["b", "c"], ["HANG"], ["d", "e", "f"])
    osaca = A.Osaca("ZEN4", command=[sys.executable, str(fake)], timeout_s=0.5, startup_s=1.0)
    res = osaca.predict(blocks)
    assert {k[1]: r.cycles for k, r in res.items() if r.status == "ok"} == {0: 1.0, 2: 2.0,
                                                                            4: 3.0}
    assert res[("b.O2", 1)].error.startswith("osaca: crashed (SIGKILL)")
    assert res[("b.O2", 3)].error == "osaca: timed out (no answer within 0.5 s)"


def test_run_tool_reports_missing_program():
    r = A.run_tool(["/nonexistent/llvm-mca"], 1.0)
    assert r.status == "error" and "cannot start" in r.stderr


def test_model_analyzer(inputs):
    model = resmodel.ResourceModel(
        resources=["ALU", "FP", "LD"],
        rho={"XOR_R32_R32": {"ALU": 0.25}, "VXORPS_XMM_XMM_XMM": {"FP": 0.25},
             "TEST_R64_R64": {"ALU": 0.25}, "VADDSS_XMM_XMM_M32": {"FP": 0.5, "LD": 0.5},
             "VMULSS_XMM_XMM_XMM": {"FP": 0.5}, "ADD_R64_I8": {"ALU": 0.25}})
    res = A.ModelAnalyzer(model).predict(inputs)
    assert res[("fix.O2", 0)].cycles == 0.5
    assert res[("fix.O2", 1)].error == "form(s) not in the model: CMP_R64_R64"
    assert res[("fix.O2", 2)].cycles == 0.0
    assert res[("odd.O2", 0)].error == "no catalogue form for: rep stos %al, (%rdi)"
    # a form the catalogue excludes is left out with a note; one it measures is a hole
    forms = pd.DataFrame({"name": ["CMP_R64_R64", "XOR_R32_R32"], "status": ["excluded", "ok"],
                          "reason": ["a test's reason", ""]})
    model.provenance["approximate"] = {"TEST_R64_R64": "a dependence chain"}
    res = A.ModelAnalyzer(model, forms).predict(inputs)
    assert res[("fix.O2", 1)].status == "ok" and res[("fix.O2", 1)].cycles == 1.0
    assert res[("fix.O2", 1)].error.startswith(
        "approximate: CMP_R64_R64 left out (excluded: a test's reason)")
    assert res[("fix.O2", 0)].cycles == 0.5
    assert res[("fix.O2", 0)].error == "approximate: TEST_R64_R64 approximate (a dependence chain)"


class FakeMeasurer:
    """Answers like cpumap.measure.backend.Measurer: cycles of each kernel, failed ones left out."""

    def __init__(self, db_dir: Path):
        self.db_dir, self.machine_id = db_dir, "fake"
        self.calls: list[tuple[list[str], str]] = []

    def measure(self, kernels, stage):
        self.calls.append((list(kernels), stage))
        return {k: 0.25 * len(k.split()) for k in kernels}

    def errors(self, kernels):
        return {}


def test_native_analyzer_measures_each_distinct_multiset_once(inputs, catalogue_df, tmp_path):
    m = FakeMeasurer(tmp_path)
    twice = [*inputs, A.BlockInput("fix.O3", 7, inputs[1].insns, inputs[1].forms, 5)]
    res = A.NativeAnalyzer(m, catalogue_df).predict(twice)
    assert len(m.calls) == 1 and len(m.calls[0][0]) == 2
    assert res[("fix.O2", 1)].cycles == res[("fix.O3", 7)].cycles
    assert res[("fix.O2", 2)].cycles == 0.0
    assert res[("odd.O2", 0)].error == "no catalogue form for: rep stos %al, (%rdi)"


def test_written_analyzer_measures_the_blocks_own_code(catalogue_df, host, tmp_path):
    """The block as written, through the Measurer and the database: the add+imul chain at its
    4-cycle latency (tests/test_blockgen.py has the physics), a block with a form the
    catalogue excludes failed with the reason, not measured; asked again, answered from the
    database. The chain's value is judged within its own stated uncertainty as well: where
    its rounds disagree the clock moved between two calibration samples (the Cascade Lake
    guest's clock follows what shares the core: tests/test_latency.py)."""
    from cpumap.measure.backend import Measurer
    from cpumap.measure.settings import BenchSettings

    chain = A.BlockInput("b.O2", 0, ("add %rax,%rbx", "imul %rbx,%rbx"),
                         ("ADD_R64_R64", "IMUL_R64_R64"), 2,
                         code=bytes.fromhex("4801c3480fafdb"))
    cpuid = A.BlockInput("b.O2", 1, ("cpuid",), ("CPUID",), 1, code=bytes.fromhex("0fa2"))
    m = Measurer(host, catalogue_df, BenchSettings(), tmp_path / "db", tmp_path / "work",
                 harness_bin=harness.build_harness(tmp_path / "bin"))
    only_branch = A.BlockInput("b.O2", 2, (), (), 1)  # its terminator dropped: nothing left
    written = A.WrittenAnalyzer(m, catalogue_df)
    res = written.predict([chain, cpuid, only_branch])
    kernel = written.kernel(chain)[0]
    assert_near(res[chain.key].cycles, m.uncertainty([kernel])[kernel], 4.0, 0.05, kernel)
    assert res[only_branch.key].status == "ok" and res[only_branch.key].cycles == 0.0
    assert res[cpuid.key].status == "failed" and "form CPUID excluded" in res[cpuid.key].error
    assert m.measured_now == 1
    # the measured batch's assembly and shared object are gone, its rows are in the DB
    assert not [p for p in (tmp_path / "work").rglob("*") if p.is_file()]
    again = Measurer(host, catalogue_df, BenchSettings(), tmp_path / "db", tmp_path / "work")
    res2 = A.WrittenAnalyzer(again, catalogue_df).predict([chain])
    assert again.measured_now == 0 and res2[chain.key].cycles == res[chain.key].cycles


def test_predictions_frame_columns(inputs):
    res = {inputs[0].key: A.Result(cycles=1.5, seconds=0.1)}
    df = A.predictions_frame("llvm-mca", inputs[:2], res)
    assert list(df.columns) == A.PREDICTION_COLUMNS
    assert df.status.tolist() == ["ok", "failed"]
    assert df.cycles.iloc[0] == 1.5 and math.isnan(df.cycles.iloc[1])


def test_analyzer_targets_follow_the_host():
    """auto: llvm-mca's -mcpu and OSACA's --arch from the machine description (fixtures of a
    Zen 3 and a Zen 4 guest, whichever host runs the test); an explicit value wins; a host
    neither knows gets the documented fallback with a warning that names it."""
    from cpumap.evaluate.analyzers import targets as T
    zen3 = {"machine_id": "amd-zen3-f19-m1-x", "vendor": "amd", "uarch": {"name": "zen3"}}
    zen4 = {"machine_id": "amd-zen4-f19-m11-x", "vendor": "amd", "uarch": {"name": "zen4"}}
    odd = {"machine_id": "intel-x-f6-m99-x", "vendor": "intel", "uarch": {"name": None}}
    assert T.llvm_mca_cpu("auto", zen3) == T.Target("znver3", "host")
    assert T.llvm_mca_cpu("auto", zen4) == T.Target("znver4", "host")
    assert T.osaca_arch("auto", zen3) == T.Target("ZEN3", "host")
    assert T.osaca_arch("auto", zen4) == T.Target("ZEN4", "host")
    assert T.llvm_mca_cpu("znver2", zen4) == T.Target("znver2", "config")
    assert T.osaca_arch("SKX", zen3) == T.Target("SKX", "config")
    fb = T.llvm_mca_cpu("auto", odd)
    assert fb.value == "native" and fb.how == "fallback" and "intel-x-f6-m99-x" in fb.warning
    fb = T.osaca_arch("auto", odd)
    assert fb.value == "SPR" and fb.how == "fallback" and "evaluate.osaca.arch" in fb.warning
    # every OSACA target it picks has a machine file in the installed OSACA
    import osaca
    data = Path(osaca.__file__).parent / "data"
    for arch in {*T.OSACA_ARCH.values(), *T.OSACA_FALLBACK.values()}:
        assert (data / f"{arch.lower()}.yml").is_file(), arch


def test_host_microarchitecture_has_targets():
    """The machine this test runs on is one our CPUID table and LLVM know (Zen 3, 4 and 5 and
    the Intel guests here): llvm-mca simulates the host. OSACA 0.7 has no Zen 5 model: there
    auto takes the vendor's newest with a warning naming the host's microarchitecture."""
    from cpumap.evaluate.analyzers import targets as T
    from cpumap.host import machine as M
    desc = M.describe()
    name, vendor = T._uarch(desc)  # the name the tables are looked up by
    assert T.llvm_mca_cpu("auto", desc).how == "host", desc.get("uarch")
    osaca = T.osaca_arch("auto", desc)
    if name in T.OSACA_ARCH:
        assert (osaca.how, osaca.value) == ("host", T.OSACA_ARCH[name]), desc.get("uarch")
    else:
        assert osaca.how == "fallback" and osaca.value == T.OSACA_FALLBACK[vendor]
        assert repr(name) in osaca.warning, osaca.warning


def test_report_names_each_external_analyzers_target():
    from cpumap.evaluate import lift
    from cpumap.evaluate.report import _target_note
    metas = {"llvm-mca": {"description": "d", "blocks": 3, "failed_blocks": 0, "seconds": 1.0,
                          "target": {"value": "znver3", "how": "host", "warning": ""}}}
    status = lift.analyzer_status(["llvm-mca"], metas, model_enabled=True)
    assert status["llvm-mca"]["target"]["value"] == "znver3"
    assert _target_note(status["llvm-mca"]["target"]) == ", target znver3 (the host's)"
    assert _target_note(None) == ""


def test_identical_blocks_are_predicted_once():
    """A corpus holds the same block in many applications: one prediction serves them all."""
    seen: list[list] = []

    class Counting:
        def predict(self, blocks):
            seen.append([b.key for b in blocks])
            return {b.key: A.Result(cycles=float(len(b.insns))) for b in blocks}

    same = [A.BlockInput(app, 0, ("add %rbx, %rax",), ("ADD_R64_R64",), 1,
                         code=bytes.fromhex("4801d8")) for app in ("a", "b", "c")]
    other = A.BlockInput("a", 1, ("nop", "nop"), ("NOP", "NOP"), 2, code=b"\x90\x90")
    bad = A.BlockInput("b", 1, (), (), 1, "cannot render the block")
    res = A.predict_blocks(Counting(), [*same, other, bad])
    assert seen == [[("a", 0), ("a", 1)]]
    assert [res[b.key].cycles for b in same] == [1.0, 1.0, 1.0] and res[other.key].cycles == 2
    assert res[bad.key].status == "failed"


def test_run_batched_reports_progress(monkeypatch):
    from cpumap.evaluate.analyzers import base

    monkeypatch.setattr(base, "PROGRESS_S", 0.0)
    blocks = [A.BlockInput("b", i, ("nop",), ("NOP",), 1) for i in range(5)]
    lines: list[str] = []
    stats = base.BatchStats(log=lines.append)
    got = A.run_batched(blocks, lambda batch: {b.key: A.Result(cycles=1.0) for b in batch},
                        batch_size=2, stats=stats)
    assert len(got) == 5 and stats.calls == 3
    assert lines[0] == "0/5 blocks, 5 left, 0.0 blocks/s"
    # the last batch first (the work list is a stack)
    assert [line.split(",")[0] for line in lines] == ["0/5 blocks", "1/5 blocks", "3/5 blocks"]
