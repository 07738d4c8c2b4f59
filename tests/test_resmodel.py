"""Resource model: prediction, files, table; the simulated machine."""

from __future__ import annotations

import json

import pytest

from cpumap.model import resmodel
from cpumap.model.portmap import synthetic_mapping, true_resource_model
from cpumap.model.resmodel import ResourceModel, predict
from cpumap.model.simulate import SimulatedMachine

# The resource model of the Palmed paper's example: ADDSS on {p0,p1}, BSR on {p1}
MODEL = ResourceModel(
    resources=["p01", "p1"],
    rho={"ADDSS": {"p01": 0.5}, "BSR": {"p01": 0.5, "p1": 1.0}},
    provenance={"source": "hand"},
)


def test_predict_bottleneck() -> None:
    assert predict(MODEL, {"ADDSS": 2, "BSR": 1}) == (pytest.approx(1.5), "p01")
    assert predict(MODEL, {"ADDSS": 1, "BSR": 2}) == (pytest.approx(2.0), "p1")
    assert predict(MODEL, "ADDSS*2 BSR") == (pytest.approx(1.5), "p01")
    assert predict(MODEL, {}) == (0.0, None)
    with pytest.raises(KeyError, match="XOR"):
        predict(MODEL, {"XOR": 1})


def test_save_load_round_trip_is_byte_stable(tmp_path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    resmodel.save(MODEL, a)
    back = resmodel.load(a)
    assert back.resources == MODEL.resources and back.rho == MODEL.rho
    assert back.provenance == MODEL.provenance
    resmodel.save(back, b)
    assert a.read_bytes() == b.read_bytes()
    obj = json.loads(a.read_text())
    assert obj["format"] == resmodel.FORMAT and obj["version"] == 1


def test_load_rejects_bad_files(tmp_path) -> None:
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="format"):
        resmodel.load(p)
    bad = MODEL.to_dict()
    bad["rho"]["ADDSS"] = {"nope": 1.0}
    p.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="unknown resource"):
        resmodel.load(p)


def test_table() -> None:
    t = MODEL.table()
    assert list(t.columns) == ["form", "p01", "p1", "private", "private_use", "cycles",
                               "bottleneck", "bottleneck_label"]
    row = t.set_index("form").loc["BSR"]
    assert row["p1"] == 1.0 and row["cycles"] == 1.0 and row["bottleneck"] == "p1"


def test_simulated_machine_from_files(tmp_path) -> None:
    mp = tmp_path / "ports.json"
    mp.write_text(json.dumps(synthetic_mapping(8, 20, seed=0)))
    sim = SimulatedMachine(mp)
    assert sim.forms[0] == "FORM_000" and len(sim.forms) == 20
    assert sim.machine_id.startswith("sim-ports-")
    assert sim.measure(["FORM_000", "FORM_000*2"]) == [pytest.approx(v) for v in (
        sim.exact({"FORM_000": 1}), 2 * sim.exact({"FORM_000": 1}))]
    rp = tmp_path / "res.json"
    resmodel.save(MODEL, rp)
    rsim = SimulatedMachine(rp)
    assert rsim.forms == ["ADDSS", "BSR"]
    assert rsim.measure(["ADDSS*2 BSR"]) == [pytest.approx(1.5)]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="bad.json"):
        SimulatedMachine(bad)


def test_noise_is_deterministic_per_kernel(tmp_path) -> None:
    mp = tmp_path / "ports.json"
    mp.write_text(json.dumps(synthetic_mapping(8, 20, seed=0)))
    a = SimulatedMachine(mp, noise=0.02, seed=1)
    b = SimulatedMachine(mp, noise=0.02, seed=1)
    c = SimulatedMachine(mp, noise=0.02, seed=2)
    kernels = [f"FORM_{i:03d}*{n}" for i in range(20) for n in (1, 2, 3)]
    va = a.measure(kernels)
    assert va == b.measure(kernels) == a.measure(kernels)
    assert va != c.measure(kernels)
    rel = [v / a.exact(k) - 1 for v, k in zip(va, kernels, strict=True)]
    assert max(abs(r) for r in rel) <= 0.06 + 1e-12 and max(abs(r) for r in rel) > 0
    assert len({a.machine_id, c.machine_id, SimulatedMachine(mp).machine_id}) == 3


def test_resource_labels_name_the_forms_that_saturate_a_resource_alone() -> None:
    # p01 limits ADDSS alone (2 per cycle); p1 limits BSR alone (1 per cycle): BSR's use of
    # p01 is not its bottleneck, so it does not name p01
    assert resmodel.resource_labels(MODEL) == {"p01": "ADDSS: 2 per cycle",
                                               "p1": "BSR: 1 per cycle"}
    wide = ResourceModel(
        resources=["alu", "front", "idle"],
        rho={"ADD_R64_R64": {"alu": 0.25, "front": 0.2},
             "ADD_R32_R32": {"alu": 0.25, "front": 0.2},
             "SUB_R64_R64": {"alu": 0.25, "front": 0.2},
             "MULX_R64_R64_R64": {"alu": 0.5, "front": 0.4}})
    # rates alone as a range (a two-μop form takes twice the resource); a resource no form
    # is limited by alone names its heaviest users; an unused one says so
    assert resmodel.resource_labels(wide) == {
        "alu": "ADD/MULX/SUB: 2-4 per cycle",
        "front": "shared by 4 forms, most MULX/ADD/SUB",
        "idle": "unused"}
    assert json.loads(json.dumps(wide.to_dict()))["labels"]["alu"].startswith("ADD/MULX")
    assert list(wide.table().bottleneck_label) == ["ADD/MULX/SUB: 2-4 per cycle"] * 4


def test_a_resource_only_the_512_bit_mode_uses_is_labelled_from_its_uses_there() -> None:
    """The joint refit can leave a plain resource to the wide uses alone: its label comes
    from the first state that uses it, and says so; one no table uses stays "unused"."""
    model = ResourceModel(
        resources=["p01", "p0", "idle"], rho={"ADDPD": {"p01": 0.5}, "VADDZ": {"p01": 1.0}},
        wide={"trigger": ["VADDZ"], "rho": {"ADDPD": {"p0": 1.0}},
              "next": [{"trigger": [], "rho": {"ADDPD": {"p01": 0.5}}}]})
    labels = resmodel.resource_labels(model)
    assert labels == {"p01": "ADDPD/VADDZ: 1-2 per cycle",
                      "p0": "ADDPD: 1 per cycle (beside 512-bit forms)", "idle": "unused"}


def test_resource_labels_leave_out_forms_that_use_every_resource() -> None:
    """A serialising form (its whole time on every resource: a fence) names no resource, even
    where it is the slowest user; a resource of one form's own does not count."""
    fence = {r: 30.0 for r in ("alu", "load", "vec")}
    model = ResourceModel(
        resources=["alu", "load", "vec", "chain:ADC_R64_R64"],
        rho={"ADD_R64_R64": {"alu": 0.25}, "MOV_R64_M64": {"load": 0.5},
             "VADDPD_YMM_YMM_YMM": {"vec": 0.5, "alu": 0.1}, "LFENCE": fence,
             "ADC_R64_R64": {"chain:ADC_R64_R64": 1.0}})
    assert resmodel.resource_labels(model) == {
        "alu": "ADD: 4 per cycle", "load": "MOV: 2 per cycle", "vec": "VADDPD: 2 per cycle",
        "chain:ADC_R64_R64": "ADC: 1 per cycle"}
    # a form at its largest use on only two resources still names them
    two = ResourceModel(resources=["alu", "load", "vec"],
                        rho={"POP_R64": {"alu": 0.5, "load": 0.5}})
    assert resmodel.resource_labels(two) == {"alu": "POP: 2 per cycle",
                                             "load": "POP: 2 per cycle", "vec": "unused"}


def test_predictor_answers_exactly_as_predict() -> None:
    """The bulk predictor's sums and tie rule are predict's, on a 10-port machine's exact
    resource model (many ties: forms on the same ports)."""
    import random

    truth = true_resource_model(synthetic_mapping(10, 300, seed=3))
    model = ResourceModel(resources=truth["resources"], rho=truth["rho"])
    fast = resmodel.Predictor(model)
    rng = random.Random(0)
    forms = model.forms
    for _ in range(2000):
        k = {f: rng.randint(1, 4) for f in rng.sample(forms, rng.randint(1, 6))}
        assert fast.predict(k) == predict(model, k)
    assert fast.predict({}) == (0.0, None)
    with pytest.raises(KeyError, match="NOPE"):
        fast.predict({"NOPE": 1})


def test_model_report_lists_resources_with_labels() -> None:
    from cpumap.model import jobs

    lines = jobs.resource_table(MODEL)
    assert "| p01 | ADDSS: 2 per cycle | 2 | 1 |" in lines
    assert "| p1 | BSR: 1 per cycle | 1 | 1 |" in lines
    nan = {"kernels": 0, "rms_rel_error_ipc": float("nan"), "mape_ipc": float("nan"),
           "kendall_tau": float("nan")}
    report = jobs.validation_report(nan, {}, "m", 0, model=MODEL)
    assert "## Resources" in report and "| p1 | BSR: 1 per cycle | 1 | 1 |" in report
    # a refit over its budget says it ran on a sample, and how large
    refit = {"kernels": 10, "resources": 3, "candidate_bounds": 20, "max_bounds": 9,
             "sampled": 4, "sampled_first": 2, "done": True, "bounds_used": 5, "lps": 1,
             "misfit_before": 0.1, "misfit_after": 0.05}
    report = jobs.validation_report(nan, {"joint_refit": refit}, "m", 0)
    assert ("- joint refit: 10 kernels x 2 resources = 20 candidate upper bounds, above "
            "refit_max_bounds 9: on a sample of 4 kernels (2 of them training kernels) (5 used, "
            "1 LP(s)); RMS relative misfit 10.00% -> 5.00%") in report


def test_wide_uses_replace_a_forms_uses_beside_a_trigger_form(tmp_path) -> None:
    """``wide``: in a kernel holding a trigger form (512-bit), the forms it lists take their
    wide uses; elsewhere their plain ones. Same in ``predict`` and ``Predictor``, and
    through the file."""
    model = ResourceModel(
        resources=["p015", "p05", "p1"],
        rho={"VADDX": {"p015": 1 / 3}, "VADDZ": {"p015": 0.5, "p05": 0.5},
             "IMUL": {"p1": 1.0, "p015": 1 / 3}},
        wide={"trigger": ["VADDZ"], "rho": {"VADDX": {"p05": 0.5}, "IMUL": {"p1": 1.0}}})
    fast = resmodel.Predictor(model)
    for k, cycles in (({"VADDX": 3}, 1.0), ({"VADDX": 3, "VADDZ": 1}, 2.0),
                      ({"VADDX": 3, "IMUL": 3}, 3.0), ({"IMUL": 2, "VADDZ": 2}, 2.0)):
        assert predict(model, k)[0] == pytest.approx(cycles)
        assert fast.predict(k) == predict(model, k)
    path = tmp_path / "m.json"
    resmodel.save(model, path)
    back = resmodel.load(path)
    assert back.wide == {"trigger": ["VADDZ"], "rho": model.wide["rho"]}
    assert predict(back, {"VADDX": 3, "VADDZ": 1})[0] == pytest.approx(2.0)
    obj = json.loads(path.read_text())
    obj["wide"]["rho"]["XOR"] = {"p1": 1.0}
    path.write_text(json.dumps(obj))
    with pytest.raises(ValueError, match="XOR"):
        resmodel.load(path)
