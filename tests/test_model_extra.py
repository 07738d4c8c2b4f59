"""model.extra_forms: forms added to the modelled set, unknown or unmeasurable ones reported."""

from __future__ import annotations

import math

import pandas as pd

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
    from cpumap.model import jobs, resmodel

    model = resmodel.ResourceModel(resources=["alu"], rho={"ADD_R64_R64": {"alu": 0.25}})
    left = {"MUL_R64": "writes RAX/RDX implicitly (dependence chain)",
            "ADC_R64_R64": "reads and writes the flags (dependence chain)",
            "DIV_R32": "writes RAX/RDX implicitly (dependence chain)",
            "X_R64": "listed in f.txt but not in the catalogue"}
    asked = []

    def measure(kernels):
        asked.extend(kernels)
        return [{"MUL_R64": 3.0, "ADC_R64_R64": 1.0}.get(k, math.nan) for k in kernels]

    out = jobs.add_chain_forms(model, left, measure, lambda _: None)
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


def test_leave_is_predicted_as_its_parts_and_flagged():
    from cpumap.model import jobs, resmodel

    model = resmodel.ResourceModel(
        resources=["alu", "load"],
        rho={"MOV_R64_R64": {"alu": 0.25}, "POP_R64": {"load": 0.33, "alu": 0.1}})
    assert sorted(jobs.add_decomposed_forms(model)) == ["LEAVE", "LEAVE_OPC9"]
    assert model.rho["LEAVE"] == {"alu": 0.35, "load": 0.33}
    assert "MOV_R64_R64 + POP_R64" in model.approximate["LEAVE"]
    bare = resmodel.ResourceModel(resources=["alu"], rho={"MOV_R64_R64": {"alu": 0.25}})
    assert jobs.add_decomposed_forms(bare) == {} and "LEAVE" not in bare.rho


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
    report = jobs.validation_report(metrics, {}, "m", 6)
    assert "measured again in a batch of their own" in report
    _, none = jobs.run_validation(model, ["A", "B", "C"], fake, 6, seed=1)
    assert "run_to_run" not in none
