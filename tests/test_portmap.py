"""Port mappings: validation, exact optimal schedules, the synthetic generator."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from cpumap.model import portmap
from cpumap.model.portmap import MappingError, PortMapping, schedule_cycles, synthetic_mapping

PALMED_EXAMPLE = {
    "kind": "Mapping3",
    "arch": {"insns": ["ADDSS", "BSR"], "ports": ["p0", "p1"]},
    "assignment": {"ADDSS": [["p0", "p1"]], "BSR": [["p1"]]},
}

THREE = {
    "kind": "Mapping3",
    "arch": {"insns": ["A", "B", "C", "D"], "ports": ["p0", "p1", "p2"]},
    # A: one μop on p0/p1; B: one on p1/p2; C: p2 only; D: two μops, p0 and p0/p1/p2
    "assignment": {"A": [["p0", "p1"]], "B": [["p1", "p2"]], "C": [["p2"]],
                   "D": [["p0"], ["p0", "p1", "p2"]]},
}


def test_palmed_paper_example() -> None:
    # 3 μops all allowed on {p0, p1}: 1.5 cycles; the BSR μop must use p1 and fits.
    assert schedule_cycles(PALMED_EXAMPLE, {"ADDSS": 2, "BSR": 1}) == pytest.approx(1.5)
    # two BSR need p1 twice: 2 cycles, ADDSS goes to p0
    assert schedule_cycles(PALMED_EXAMPLE, {"ADDSS": 1, "BSR": 2}) == pytest.approx(2.0)
    assert schedule_cycles(PALMED_EXAMPLE, {"ADDSS": 1}) == pytest.approx(0.5)
    assert schedule_cycles(PALMED_EXAMPLE, {"BSR": 3}) == pytest.approx(3.0)
    assert schedule_cycles(PALMED_EXAMPLE, {}) == 0.0


@pytest.mark.parametrize(("kernel", "cycles"), [
    ({"A": 1}, 0.5),                     # {p0,p1}
    ({"C": 1}, 1.0),                     # p2 only
    ({"A": 1, "B": 1}, 2 / 3),           # 2 μops inside {p0,p1,p2}
    ({"A": 2, "C": 2}, 2.0),             # the two C μops can only use p2
    ({"D": 1}, 1.0),                     # the p0 μop
    ({"D": 1, "A": 2}, 1.5),             # {p0,p1}: 1 + 2 = 3 μops on 2 ports
    ({"D": 2, "B": 1, "C": 1}, 2.0),     # p0: 2 μops
    ({"A": 3, "B": 3}, 2.0),             # 6 μops on 3 ports
])
def test_hand_computed_schedules(kernel: dict[str, int], cycles: float) -> None:
    assert schedule_cycles(THREE, kernel) == pytest.approx(cycles)
    # the LP gives the same optimum as the subset formula
    pm = PortMapping(THREE)
    assert pm._lp_cycles(tuple(sorted(kernel.items()))) == pytest.approx(cycles, abs=1e-9)


def test_subset_formula_matches_lp_on_synthetic() -> None:
    pm = PortMapping(synthetic_mapping(8, 60, seed=3))
    rng = np.random.default_rng(0)
    for _ in range(100):
        pick = rng.choice(len(pm.forms), size=int(rng.integers(1, 6)), replace=False)
        k = {pm.forms[int(i)]: int(rng.integers(1, 5)) for i in pick}
        assert pm.cycles(k) == pytest.approx(pm._lp_cycles(tuple(sorted(k.items()))), abs=1e-7)


def test_schedule_is_fast() -> None:
    pm = PortMapping(synthetic_mapping(10, 300, seed=0))
    rng = np.random.default_rng(1)
    kernels = []
    for _ in range(3000):
        pick = rng.choice(len(pm.forms), size=int(rng.integers(1, 6)), replace=False)
        kernels.append({pm.forms[int(i)]: int(rng.integers(1, 5)) for i in pick})
    t0 = time.perf_counter()
    for k in kernels:
        pm.cycles(k)
    assert time.perf_counter() - t0 < 1.5  # thousands of kernels per second


def test_true_resource_model_predicts_schedule() -> None:
    m = synthetic_mapping(8, 40, seed=1)
    truth = portmap.true_resource_model(m)
    rng = np.random.default_rng(2)
    forms = m["arch"]["insns"]
    for _ in range(50):
        pick = rng.choice(len(forms), size=3, replace=False)
        k = {forms[int(i)]: int(rng.integers(1, 4)) for i in pick}
        pred = max(sum(n * truth["rho"][f].get(r, 0.0) for f, n in k.items())
                   for r in truth["resources"])
        assert pred == pytest.approx(schedule_cycles(m, k))


def test_synthetic_mapping_is_realistic_and_deterministic() -> None:
    m = synthetic_mapping(8, 100, seed=0)
    assert m == synthetic_mapping(8, 100, seed=0)
    assert m != synthetic_mapping(8, 100, seed=1)
    portmap.validate_mapping(m)
    assert len(m["arch"]["ports"]) >= 8 and len(m["arch"]["insns"]) >= 100
    uops = m["assignment"].values()
    assert sum(len(u) > 1 for u in uops) >= 20          # multi-μop forms
    assert sum(any(len(p) > 1 for p in u) for u in uops) >= 20  # multi-port μops
    assert all(1 <= len(p) <= 6 for u in uops for p in u)
    assert m["arch"]["insns"][0] == "FORM_000"


@pytest.mark.parametrize(("mutate", "key"), [
    (lambda m: m.update(kind="Mapping2"), "kind"),
    (lambda m: m["arch"].update(ports=[]), "arch.ports"),
    (lambda m: m["assignment"].pop("BSR"), "assignment.BSR"),
    (lambda m: m["assignment"].update(BSR=[["p9"]]), "assignment.BSR[0]"),
    (lambda m: m["assignment"].update(XOR=[["p0"]]), "assignment.XOR"),
    (lambda m: m["assignment"].update(BSR=[]), "assignment.BSR"),
])
def test_validation_names_file_and_key(tmp_path, mutate, key) -> None:
    m = json.loads(json.dumps(PALMED_EXAMPLE))
    mutate(m)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(m))
    with pytest.raises(MappingError) as exc:
        portmap.load_mapping(path)
    assert str(path) in str(exc.value) and key in str(exc.value)


def test_load_mapping_round_trip(tmp_path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(PALMED_EXAMPLE))
    assert portmap.load_mapping(path) == PALMED_EXAMPLE
    path.write_text("{not json")
    with pytest.raises(MappingError, match="not valid JSON"):
        portmap.load_mapping(path)


def test_wide_forms_switch_the_kernel_to_their_assignment() -> None:
    """A kernel holding a form of ``wide.forms`` is scheduled with ``wide.assignment``: the
    narrow add leaves p1 (Intel's port 1 beside 512-bit μops), the scalar IMUL keeps it."""
    m = {"kind": "Mapping3",
         "arch": {"insns": ["VADDX", "VADDZ", "IMUL"], "ports": ["p0", "p1", "p5"]},
         "assignment": {"VADDX": [["p0", "p1", "p5"]], "VADDZ": [["p0", "p5"]],
                        "IMUL": [["p1"]]},
         "wide": {"forms": ["VADDZ"], "assignment": {"VADDX": [["p0", "p5"]]}}}
    pm = portmap.PortMapping(m)
    assert pm.cycles({"VADDX": 3}) == pytest.approx(1.0)
    assert pm.cycles({"VADDX": 3, "VADDZ": 1}) == pytest.approx(2.0)
    assert pm.cycles({"VADDX": 4, "IMUL": 1}) == pytest.approx(5 / 3)
    assert pm.cycles({"VADDX": 4, "IMUL": 1, "VADDZ": 1}) == pytest.approx(2.5)
    bad = json.loads(json.dumps(m))
    bad["wide"]["forms"] = ["VADDW"]
    with pytest.raises(MappingError, match="wide.*VADDW"):
        portmap.validate_mapping(bad)
    bad = json.loads(json.dumps(m))
    bad["wide"]["assignment"]["VADDX"] = [["p9"]]
    with pytest.raises(MappingError, match=r"wide: assignment.VADDX\[0\]"):
        portmap.validate_mapping(bad)
