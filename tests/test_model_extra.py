"""model.extra_forms: forms added to the modelled set, unknown or unmeasurable ones reported."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cpumap.model.jobs import listed_forms as extra_forms


def test_extra_forms(tmp_path) -> None:
    forms = pd.DataFrame({"name": ["A", "B", "C"], "status": ["ok", "excluded", "ok"]})
    path = tmp_path / "suite_forms.txt"
    path.write_text("C  # from a kernel\nB\nZ\n\n")
    kept, left = extra_forms({"extra_forms": str(path)}, forms)
    assert kept == ["C"]
    assert left == {"B": f"listed in {path} but not measurable here (excluded)",
                    "Z": f"listed in {path} but not in the catalogue"}
    assert extra_forms({"extra_forms": None}, forms) == ([], {})
    assert extra_forms({}, forms) == ([], {})


def test_dependence_chain_forms_join_the_model_as_approximations():
    """MUL's and ADC's chains: each on a resource of its own, sized by its measured cycles,
    named in provenance.approximate and flagged in predictions; a form that did not
    measure stays not modelled; other left-out forms are untouched."""
    from cpumap.model import outside, resmodel

    model = resmodel.ResourceModel(resources=["alu"], rho={"ADD_R64_R64": {"alu": 0.25}})
    left = {"MUL_R64": "writes RAX/RDX implicitly (dependence chain)",
            "ADC_R64_R64": "reads and writes the flags (dependence chain)",
            "DIV_R32": "writes RAX/RDX implicitly (dependence chain)",
            "X_R64": "listed in f.txt but not in the catalogue"}
    asked = []

    def measure(kernels):
        asked.extend(kernels)
        return [{"MUL_R64": 3.0, "ADC_R64_R64": 1.0}.get(k, math.nan) for k in kernels]

    out = outside.add_chain_forms(model, left, measure, lambda _: None)
    assert asked == ["ADC_R64_R64", "DIV_R32", "MUL_R64"]
    assert sorted(out) == ["ADC_R64_R64", "MUL_R64"]
    assert model.rho["MUL_R64"] == {"chain:MUL_R64": 3.0}
    assert model.resources == ["alu", "chain:ADC_R64_R64", "chain:MUL_R64"]
    assert set(model.approximate) == {"ADC_R64_R64", "MUL_R64"}
    fast = resmodel.Predictor(model)
    # the chain runs beside the ALU work: 3 cycles per MUL, the adds hidden behind it
    assert fast.predict({"MUL_R64": 1, "ADD_R64_R64": 8}) == (3.0, "chain:MUL_R64")
    assert fast.approximate({"MUL_R64": 1, "ADD_R64_R64": 8}) == ["MUL_R64"]
    assert fast.approximate({"ADD_R64_R64": 1}) == []
    assert resmodel.resource_labels(model)["chain:MUL_R64"] == "MUL: 0.333 per cycle"


def test_partial_flags_writers_chain_unless_a_form_writing_every_flag_runs_beside():
    """ROL r64, imm8 alone 0.98 cycles a copy, 0.5 beside ADD (Cascade Lake): a link of the
    chain, its time alone; INC (writes all but CF) runs at its ports alone: no link; ADC,
    a chain form outside Palmed, a link of its measured time. A kernel holding ADD (writes
    every flag) is the resources'."""
    from cpumap.model import outside, resmodel

    model = resmodel.ResourceModel(
        resources=["alu", "shift", "chain:ADC_R64_R64"],
        rho={"ADD_R64_R64": {"alu": 0.25}, "ROL_R64_I8": {"shift": 0.5},
             "INC_R64": {"alu": 0.25}, "ADC_R64_R64": {"chain:ADC_R64_R64": 1.0},
             "VADDPD_YMM_YMM_YMM": {"shift": 0.5}})
    forms = pd.DataFrame({
        "name": ["ADD_R64_R64", "ROL_R64_I8", "INC_R64", "ADC_R64_R64", "VADDPD_YMM_YMM_YMM"],
        "writes_flags": [True, True, True, True, False],
        "breaks_flags": [True, False, False, False, False]})
    singletons = {"ADD_R64_R64": 0.25, "ROL_R64_I8": 0.98, "INC_R64": 0.255,
                  "VADDPD_YMM_YMM_YMM": 0.5}
    links = outside.add_flags_chain(model, forms, singletons, 0.02, lambda _: None)
    assert links == {"ADC_R64_R64": 1.0, "ROL_R64_I8": 0.98}
    assert model.provenance["flags_chain"]["breakers"] == ["ADD_R64_R64"]
    fast = resmodel.Predictor(model)
    for kernel, want in [
            ({"ROL_R64_I8": 4}, (3.92, "chain:flags")),
            ({"ROL_R64_I8": 2, "INC_R64": 4, "ADC_R64_R64": 1}, (2.96, "chain:flags")),
            ({"ROL_R64_I8": 4, "ADD_R64_R64": 1}, (2.0, "shift")),
            ({"ROL_R64_I8": 1, "VADDPD_YMM_YMM_YMM": 2}, (1.5, "shift")),
            ({"INC_R64": 4}, (1.0, "alu"))]:
        for got in (resmodel.predict(model, kernel), fast.predict(kernel)):
            assert math.isclose(got[0], want[0]) and got[1] == want[1], (kernel, got)
    assert fast.labels["chain:flags"].startswith("flags chain of ADC/ROL")
    # the report and mapping.tsv name it where it limits a form alone (ROL; ADC ties with its
    # chain resource, which wins the tie)
    from cpumap.model import jobs

    lines = jobs.resource_table(model)
    assert any(x.startswith("| chain:flags | flags chain of ADC/ROL") and x.endswith("| 2 | 1 |")
               for x in lines), lines
    table = model.table().set_index("form")
    assert table.at["ROL_R64_I8", "bottleneck"] == "chain:flags"
    assert table.at["ROL_R64_I8", "cycles"] == pytest.approx(0.98)
    assert table.at["ROL_R64_I8", "bottleneck_label"].startswith("flags chain")
    nan = {"kernels": 0, "rms_rel_error_ipc": math.nan, "mape_ipc": math.nan,
           "kendall_tau": math.nan}
    report = jobs.validation_report(nan, {"flags_chain": links}, "m", 0, model=model)
    assert "| chain:flags |" in report
    assert "the sum of these forms' times, in cycles): ADC_R64_R64 1.000, ROL_R64_I8 0.980" \
        in report
    # the model file keeps the chain
    again = resmodel.ResourceModel.from_dict(model.to_dict())
    assert resmodel.predict(again, {"ROL_R64_I8": 4})[1] == "chain:flags"


def test_leave_is_predicted_as_its_parts_and_flagged():
    from cpumap.model import outside, resmodel

    model = resmodel.ResourceModel(
        resources=["alu", "load"],
        rho={"MOV_R64_R64": {"alu": 0.25}, "POP_R64": {"load": 0.33, "alu": 0.1}})
    assert sorted(outside.add_decomposed_forms(model)) == ["LEAVE", "LEAVE_OPC9"]
    assert model.rho["LEAVE"] == {"alu": 0.35, "load": 0.33}
    assert "MOV_R64_R64 + POP_R64" in model.approximate["LEAVE"]
    bare = resmodel.ResourceModel(resources=["alu"], rho={"MOV_R64_R64": {"alu": 0.25}})
    assert outside.add_decomposed_forms(bare) == {} and "LEAVE" not in bare.rho


def test_validation_measures_a_sample_again_for_the_run_to_run_floor():
    """The first ``repeat`` held-out kernels are measured a second time; the report gives the
    RMS relative IPC difference of the two measurements as the floor under the model's
    error (a fake measurer: the second measurement is 2 % slower on every other kernel)."""
    from cpumap.model import jobs, resmodel

    model = resmodel.ResourceModel(resources=["P0", "P1"],
                                   rho={"A": {"P0": 1.0}, "B": {"P1": 0.5}, "C": {"P0": 0.5}})

    class Fake:
        def __init__(self):
            self.again_calls: list[list[str]] = []

        def measure(self, kernels, stage):
            return {k: resmodel.predict(model, _parse(k))[0] for k in kernels}

        def again(self, kernels, stage):
            self.again_calls.append(list(kernels))
            first = self.measure(kernels, stage)
            return {k: v * (1.02 if i % 2 else 1.0) for i, (k, v) in enumerate(first.items())}

    def _parse(text):
        from cpumap.measure.asmgen import parse_canonical
        return parse_canonical(text)

    fake = Fake()
    table, metrics = jobs.run_validation(model, ["A", "B", "C"], fake, 6, seed=1, repeat=4)
    assert fake.again_calls == [list(table.kernel[:4])]
    floor = metrics["run_to_run"]
    expect = math.sqrt((2 * (1 / 1.02 - 1) ** 2) / 4)
    assert floor["kernels"] == 4 and math.isclose(floor["rms_rel_diff_ipc"], expect)
    assert metrics["rms_rel_error_ipc"] == 0.0  # the model is the fake's truth
    # the ranking floor: tau between the two measurements, and the model's on the same four
    from scipy.stats import kendalltau
    first = table.head(4)
    second = [c * (1.02 if i % 2 else 1.0) for i, c in enumerate(first.cycles_measured)]
    want = kendalltau(first.n_insns / first.cycles_measured, first.n_insns / second).statistic
    assert math.isclose(floor["kendall_tau"], want)
    assert floor["model"]["rms_rel_error_ipc"] == 0.0 and floor["model"]["kendall_tau"] == 1.0
    report = jobs.validation_report(metrics, {}, "m", 6)
    assert "measured again in a batch of their own" in report
    assert f"rank them with Kendall's tau {want:.4f}" in report
    _, none = jobs.run_validation(model, ["A", "B", "C"], fake, 6, seed=1)
    assert "run_to_run" not in none


def test_validation_metrics_carry_bootstrap_intervals():
    """RMS error and Kendall's tau come with 95 % bootstrap intervals over the kernels: exact
    predictions give a zero-width interval; one kernel 50 % off among 40 exact ones gives an
    RMS interval from 0 (resamples without it) to above the point figure (with it twice)."""
    from cpumap.model import jobs, validation

    meas = [1.0 + 0.1 * i for i in range(41)]
    exact = validation.metrics(pd.DataFrame({"ipc_measured": meas, "ipc_predicted": meas}))
    assert exact["rms_rel_error_ipc_ci"] == [0.0, 0.0]
    assert exact["kendall_tau_ci"] == pytest.approx([1.0, 1.0])
    off = pd.DataFrame({"ipc_measured": meas, "ipc_predicted": [1.5, *meas[1:]]})
    m = validation.metrics(off)
    assert m["rms_rel_error_ipc"] == pytest.approx(0.5 / math.sqrt(41))
    lo, hi = m["rms_rel_error_ipc_ci"]
    assert lo == 0.0 and hi > m["rms_rel_error_ipc"]
    lo, hi = m["kendall_tau_ci"]
    assert lo < m["kendall_tau"] <= hi <= 1.0
    assert validation.metrics(off) == m  # a fixed seed: the same interval every run
    report = jobs.validation_report(m, {}, "m", 41)
    assert f"(95 % bootstrap interval 0.0000-{m['rms_rel_error_ipc_ci'][1]:.4f})" in report


def test_validation_reports_kernels_mixing_512_bit_and_narrower_vector_forms(catalogue_df):
    """A held-out kernel with a zmm form beside an xmm or ymm form is reported apart (beside
    the whole set): on Intel cores the narrow forms lose port 1 while 512-bit μops are in
    flight, which no resource model of multisets can say."""
    from cpumap.isa import transition
    from cpumap.measure.asmgen import canonical, parse_canonical
    from cpumap.model import jobs, resmodel
    widths = transition.vector_lengths(catalogue_df)
    assert widths["VADDPD_ZMM_ZMM_ZMM"] == 512 and widths["VPSHUFD_XMM_XMM_I8"] == 128
    # the vector length: the widest vector register or memory operand
    assert widths["VCVTPD2PS_XMM_M256"] == 256 and "ADD_R64_R64" not in widths
    carriers = transition.carriers(catalogue_df)  # the 512-bit probe's: registers only
    assert "VADDPD_ZMM_ZMM_ZMM" in carriers and "VMOVUPD_ZMM_M512" not in carriers
    assert "VADDPD_YMM_YMM_YMM" not in carriers
    # a register move may be renamed away: no 512-bit μop in flight
    assert "VMOVAPD_ZMM_ZMM" in widths and "VMOVAPD_ZMM_ZMM" not in carriers
    assert transition.mixes_512(["VADDPD_ZMM_ZMM_ZMM", "VPSHUFD_XMM_XMM_I8"], widths)
    assert transition.mixes_512(["VADDPD_ZMM_ZMM_ZMM", "VADDPD_YMM_YMM_YMM"], widths)
    assert not transition.mixes_512(["VADDPD_ZMM_ZMM_ZMM", "ADD_R64_R64"], widths)
    assert not transition.mixes_512(["VADDPD_YMM_YMM_YMM", "VPSHUFD_XMM_XMM_I8"], widths)

    forms = ["VADDPD_ZMM_ZMM_ZMM", "VPSHUFD_XMM_XMM_I8", "ADD_R64_R64"]
    model = resmodel.ResourceModel(resources=["P0", "P5"], rho={
        "VADDPD_ZMM_ZMM_ZMM": {"P0": 1.0}, "VPSHUFD_XMM_XMM_I8": {"P5": 0.5},
        "ADD_R64_R64": {"P0": 0.25, "P5": 0.25}})

    class Fake:
        """Measures what the model predicts, 2x slower for a zmm form beside an xmm one."""
        def __init__(self):
            self.forms = catalogue_df

        def measure(self, kernels, stage):
            out = {}
            for text in kernels:
                k = parse_canonical(text)
                cycles = resmodel.predict(model, k)[0]
                out[canonical(k)] = cycles * (2.0 if transition.mixes_512(k, widths) else 1.0)
            return out

    table, metrics = jobs.run_validation(model, forms, Fake(), 7, seed=3)
    wide = metrics["mixing_512_bit"]
    assert wide["with"]["kernels"] == int(table.mixes_512.sum()) >= 1
    assert wide["without"]["kernels"] == len(table) - wide["with"]["kernels"]
    assert math.isclose(wide["with"]["rms_rel_error_ipc"], 1.0)  # predicted IPC twice
    assert wide["without"]["rms_rel_error_ipc"] == 0.0
    assert "512-bit vector form beside narrower" in jobs.validation_report(metrics, {}, "m", 7)


def test_validation_reports_kernels_mixing_legacy_sse_and_avx_forms(catalogue_df):
    """A held-out kernel with a legacy-SSE form beside a 256-bit AVX form is reported apart
    too (``mixes_sse_avx``): on the Cascade Lake guest the AVX forms leave the upper halves
    dirty and the SSE forms merge into them, which no resource says (``MOVSD_XMM_M64*4
    VCVTDQ2PD_YMM_XMM*2`` 2.92 cycles measured, 2.06 predicted). A 512-bit form beside
    an xmm one is the other report's, and a scalar form neither's."""
    from cpumap.isa import transition
    from cpumap.measure.asmgen import canonical, parse_canonical
    from cpumap.measure.settings import BenchSettings
    from cpumap.model import jobs, resmodel
    fams = transition.families(catalogue_df)
    assert fams["ADDPD_XMM_XMM"] == transition.SSE
    assert fams["VSHUFPD_YMM_YMM_YMM_I8"] == transition.AVX
    assert "VADDPD_XMM_XMM_XMM" not in fams and "ADD_R64_R64" not in fams
    forms = ["ADDPD_XMM_XMM", "VSHUFPD_YMM_YMM_YMM_I8", "ADD_R64_R64"]
    model = resmodel.ResourceModel(resources=["P0", "P5"], rho={
        "ADDPD_XMM_XMM": {"P0": 0.5}, "VSHUFPD_YMM_YMM_YMM_I8": {"P5": 1.0},
        "ADD_R64_R64": {"P0": 0.25, "P5": 0.25}})

    class Fake:
        """Measures what the model predicts, 1.5x slower for both families together; the
        first kernel's rounds 10 % apart, the others' agreeing."""
        bench = BenchSettings()

        def __init__(self):
            self.forms = catalogue_df

        def uncertainty(self, kernels):
            return {k: 0.1 if i == 0 else 0.0 for i, k in enumerate(kernels)}

        def measure(self, kernels, stage):
            return {canonical(k): resmodel.predict(model, k)[0]
                    * (1.5 if transition.mixes(k, fams) else 1.0)
                    for k in map(parse_canonical, kernels)}

    table, metrics = jobs.run_validation(model, forms, Fake(), 7, seed=3)
    mixed = metrics["mixing_sse_avx"]
    assert mixed["with"]["kernels"] == int(table.mixes_sse_avx.sum()) >= 1
    assert mixed["without"]["kernels"] == len(table) - mixed["with"]["kernels"]
    assert math.isclose(mixed["with"]["rms_rel_error_ipc"], 0.5)  # predicted IPC 1.5 x
    assert mixed["without"]["rms_rel_error_ipc"] == 0.0
    assert "mixing_512_bit" not in metrics and not table.mixes_512.any()
    report = jobs.validation_report(metrics, {}, "m", 7)
    assert "legacy-SSE form beside a 256-bit" in report
    # the ground truth's own uncertainty, per kernel, and the less certain ones counted, kept
    assert table.measured_uncertainty.tolist() == [0.1] + [0.0] * 6
    assert metrics["measured_unstable"] == 1 and metrics["kernels"] == 7
    assert "measured; 1 of them less certain than the measuring tolerance" in report


def test_forms_whose_kernels_are_chains_are_left_out_with_their_reason(catalogue_df):
    """The catalogue's own operand facts decide: a fixed register read and written
    (the accumulator forms, XCHG with EAX) chains every kernel, as do implicit registers
    written and the flags read and written; reading a fixed register (CMP EAX,imm32) or
    pushing (RSP, renamed by the stack engine) does not."""
    from cpumap.model import outside

    names = ["ADD_AL_I8", "XOR_RAX_I32", "XCHG_R32_EAX", "CMP_EAX_I32", "ADD_R64_I8",
             "MUL_R64", "ADC_R64_R64", "SHL_R64_CL", "PUSH_R64"]
    kept, left = outside.modelable(catalogue_df, names)
    assert kept == ["CMP_EAX_I32", "ADD_R64_I8", "PUSH_R64"]
    assert left == {
        "ADD_AL_I8": "reads and writes AL, a fixed operand (dependence chain)",
        "XOR_RAX_I32": "reads and writes RAX, a fixed operand (dependence chain)",
        "XCHG_R32_EAX": "reads and writes EAX, a fixed operand (dependence chain)",
        "MUL_R64": "writes RAX/RDX implicitly (dependence chain)",
        "ADC_R64_R64": "reads and writes the flags (dependence chain)",
        "SHL_R64_CL": "shift or rotate by CL: keeps the flags on a zero count (dependence chain)",
    }


def test_training_kernels_are_drawn_like_held_out_ones_and_never_held_out():
    """The joint refit's random kernels: as many as asked, distinct, 2-5 forms of
    multiplicity 1-4, none that the caller's ``skip`` refuses, the same every run, another
    draw than the held-out kernels; and the held-out kernels never include one of them.
    With a 512-bit mode as many again for the wide refit, each holding a 512-bit form,
    refused by ``skip`` with the wide stage's rules (``modes`` false) only; the plain ones
    then hold none and are the same as without the mode."""
    from cpumap.measure.asmgen import parse_canonical
    from cpumap.model import validation
    from cpumap.model.palmed import PalmedConfig
    from cpumap.model.palmed.training import training_kernels

    forms = [f"F{i}" for i in range(6)]
    cfg = PalmedConfig(training_kernels=120)
    no_f0 = lambda k, modes: "F0" in k or (modes and "F5" in k)  # noqa: E731
    drawn, none = training_kernels(forms, cfg, no_f0)
    assert (drawn, none) == training_kernels(forms, cfg, no_f0) and len(set(drawn)) == 120
    assert none == []
    for text in drawn:
        k = parse_canonical(text)
        assert 2 <= len(k) <= 5 and not {"F0", "F5"} & set(k)
        assert all(1 <= n <= 4 for n in k.values())
    assert training_kernels(forms, PalmedConfig(), no_f0) == ([], [])  # the default: none
    many = [f"F{i}" for i in range(12)]
    plain, wide = training_kernels(many, cfg, no_f0, wide={"F4", "F5"})
    assert plain == training_kernels([f for f in many if f not in ("F4", "F5")], cfg, no_f0)[0]
    assert len(set(wide)) == 120 and not set(wide) & set(plain)
    for text in wide:
        k = parse_canonical(text)
        assert 2 <= len(k) <= 5 and "F0" not in k and {"F4", "F5"} & set(k)
    assert any("F5" in parse_canonical(t) for t in wide)  # the plain stages' rule is not theirs
    held = validation.random_kernels(forms, 300, seed=1)
    assert set(held) & set(drawn)  # 6 forms: the two draws meet...
    kept = validation.random_kernels(forms, 300, seed=1, exclude=set(drawn))
    assert len(kept) == 300 and not set(kept) & set(drawn)  # ...and held out means not fitted


def test_report_lists_the_training_kernels_among_the_stages():
    """The model report's stage table has a row for the training kernels, between the mapping
    kernels and the refinement, and one for the wide ones before the wide stage (the order
    the fit takes them in)."""
    from cpumap.model import jobs

    metrics = {"kernels": 3, "rms_rel_error_ipc": 0.1, "mape_ipc": 0.1, "kendall_tau": 0.9}
    report = jobs.validation_report(
        metrics, {"kernels": {"mapping": 5, "training": 7, "refine": 2, "wide-training": 4,
                              "wide": 3}}, "m", 3)
    rows = [line for line in report.splitlines() if line.startswith("| ") and "kernels" not in
            line and "---" not in line]
    assert [r.split(" | ")[0] for r in rows[:5]] == [
        "| mapping", "| training", "| refine", "| wide-training", "| wide"]
    assert "| training | 7 |" in report and "| wide-training | 4 |" in report


def test_the_issue_width_bounds_kernels_of_forms_that_take_few_ports():
    """NOP and an eliminated move run 6 a cycle alone, and no measured kernel ran more by
    over tol: the issue width is 6 (the first of the fastest forms alone by name), so
    NOP*2 + MOV*3 takes 5/6 cycle (its resources say 0.5), named ``issue``; a kernel its
    ports limit keeps their bound. Where a measured mix ran faster than any form alone by
    more than tol (ports, not a front end, limit the fastest form), no bound."""
    from cpumap.model import jobs, outside, resmodel

    def model_of() -> resmodel.ResourceModel:
        return resmodel.ResourceModel(
            resources=["alu", "fe"],
            rho={"NOP": {"fe": 0.1}, "MOV_R64_R64": {"fe": 0.1}, "ADD_R64_R64": {"alu": 0.25}})

    singletons = {"NOP": 1 / 6, "MOV_R64_R64": 1 / 6, "ADD_R64_R64": 0.25}
    meas = {"NOP*12": 2.0, "MOV_R64_R64*12": 2.0, "ADD_R64_R64*8": 2.0,
            "ADD_R64_R64*4 NOP*2": 1.0, "MOV_R64_R64*6 NOP*6": 2.01, "NOP*3": math.nan}
    model = model_of()
    record = outside.add_issue_width(model, meas, singletons, 0.05, lambda _: None)
    assert record == {"width": 6.0, "form": "MOV_R64_R64", "fastest_kernel": "NOP*12",
                      "fastest_rate": 6.0, "over": 0}
    fast = resmodel.Predictor(model)
    for kernel, want in [({"NOP": 2, "MOV_R64_R64": 3}, (5 / 6, "issue")),
                         ({"ADD_R64_R64": 8, "NOP": 1}, (2.0, "alu"))]:
        for got in (resmodel.predict(model, kernel), fast.predict(kernel)):
            assert math.isclose(got[0], want[0]) and got[1] == want[1], (kernel, got)
    assert fast.labels["issue"].startswith("issue width: at most 6 instructions per cycle")
    assert any(x.startswith("| issue | issue width") for x in jobs.resource_table(model))
    again = resmodel.ResourceModel.from_dict(model.to_dict())
    assert resmodel.predict(again, {"NOP": 12}) == (2.0, "issue")
    # a mix at 8 a cycle, its forms at 6 and 4 alone: the ports limit NOP, not the front end
    model = model_of()
    assert outside.add_issue_width(model, meas | {"ADD_R64_R64*4 NOP*12": 2.0}, singletons,
                                   0.05, lambda _: None) == {}
    assert model.issue_width == 0.0
    assert resmodel.predict(model, {"NOP": 2, "MOV_R64_R64": 3}) == (0.5, "fe")
