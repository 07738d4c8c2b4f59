"""The dirty-upper state (``cpumap.model.palmed.dirty``) on a simulated core that has it."""

from __future__ import annotations

import numpy as np

from cpumap.isa import transition
from cpumap.measure.asmgen import parse_canonical
from cpumap.model import palmed, resmodel
from cpumap.model.mode_lines import dirty_line
from cpumap.model.palmed.build import Build
from cpumap.model.palmed.dirty import roles, twin
from cpumap.model.portmap import dirty_upper_mapping
from cpumap.model.simulate import SimulatedMachine

CARRIERS = ["VADDPD_YMM", "VCVTDQ2PD_YMM", "VSHUFPD_YMM"]
PLAIN_STAGES = ("pairs", "core", "saturating", "mapping", "training", "refine")


def _kernels(forms: list[str], count: int, seed: int) -> list[dict[str, int]]:
    rng = np.random.default_rng(seed)
    return [{forms[int(p)]: int(rng.integers(1, 5))
             for p in rng.choice(len(forms), size=int(rng.integers(1, 6)), replace=False)}
            for _ in range(count)]


def _errors(model: resmodel.ResourceModel, sim: SimulatedMachine, kernels: list) -> np.ndarray:
    return np.array([resmodel.predict(model, k)[0] / sim.exact(k) - 1 for k in kernels])


def test_roles_and_twins() -> None:
    """The AVX forms are the triggers unless a 512-bit state took them; legacy SSE the
    narrow ones; a 256-bit form's twin is its 128-bit VEX form."""
    fams = {"ADDPD_XMM_XMM": "sse", "VADDPD_YMM_YMM_YMM": "avx", "VADDPD_ZMM_ZMM_ZMM": "avx"}
    assert roles(fams) == {"ADDPD_XMM_XMM": 128, "VADDPD_YMM_YMM_YMM": 512,
                           "VADDPD_ZMM_ZMM_ZMM": 512}
    assert roles(fams, {"VADDPD_ZMM_ZMM_ZMM"}) == {"ADDPD_XMM_XMM": 128,
                                                   "VADDPD_YMM_YMM_YMM": 512}
    assert twin("VADDPD_YMM_YMM_YMM") == "VADDPD_XMM_XMM_XMM"


def test_dirty_upper_state_gets_uses_of_its_own(tmp_path) -> None:
    """Beside a 256-bit form, three legacy-SSE forms take a merge μop on the FP pipes, which
    none of them shows alone (it goes to other ports than theirs): the probe sees it against
    the carriers' 128-bit twins, the plain stages keep those three apart from the AVX forms
    and the state gives them their uses beside AVX: plain and mixed kernels exact, where the
    plain uses alone are 20 % off on the mixed ones. ADDPD_XMM, which takes no merge μop, is
    calm and mixes with AVX in the plain stages. The state survives the pipeline's state
    file."""
    m, fams = dirty_upper_mapping()
    sim = SimulatedMachine(mapping=m)
    cfg = palmed.PalmedConfig(tol=1e-6)
    b = Build.start(sim.forms, sim.measure, cfg, dirty=(fams, CARRIERS))
    rec = b.dirty
    # VSHUFPD_YMM has no twin among the forms; MOVSD, SHUFPD and CVTDQ2PD slower, ADDPD not
    assert rec["observed"] and rec["carriers"] == 2 and rec["probes"] == 4
    assert rec["probes_slower"] == 3 and rec["carrier"] == "VADDPD_YMM"
    assert rec["states"][0]["trigger"] == sorted(f for f in sim.forms if "YMM" in f)
    state = tmp_path / "state.json"
    b.save(state)
    again = Build.load(state, sim.measure, cfg)
    assert again.dirty == rec and again.dirty_widths == b.dirty_widths
    model, stats = b.fit(sim.measure)
    assert model.wide["trigger"] == rec["states"][0]["trigger"]
    # calm, ADDPD_XMM stays with the plain stages and keeps its plain uses in the state
    assert rec["calm"] == ["ADDPD_XMM"]
    assert set(model.wide["rho"]) == {f for f, fam in fams.items() if fam == "sse"} - {
        "ADDPD_XMM"}
    assert stats["dirty_upper"]["kernels"] == stats["kernels"]["wide-dirty"] > 0
    kernels = _kernels(sim.forms, 600, seed=3)
    mixed = [k for k in kernels if transition.mixes(k, fams)]
    plain = [k for k in kernels if not transition.mixes(k, fams)]
    assert len(mixed) >= 100 and len(plain) >= 100
    assert np.abs(_errors(model, sim, plain)).max() < 1e-5
    assert np.abs(_errors(model, sim, mixed)).max() < 1e-4
    alone = resmodel.ResourceModel(model.resources, model.rho)
    assert np.sqrt(np.mean(_errors(alone, sim, mixed) ** 2)) > 0.2
    apart = {f: fam for f, fam in fams.items() if f != "ADDPD_XMM"}
    plain_kernels = [parse_canonical(t) for st in PLAIN_STAGES for t in b.asked.get(st, [])]
    assert not any(transition.mixes(k, apart) for k in plain_kernels)
    assert any(transition.mixes(k, fams) and "ADDPD_XMM" in k for k in plain_kernels)
    assert "seen (3 probes slower" in dirty_line(stats["dirty_upper"])


def test_no_dirty_state_where_sse_runs_alike() -> None:
    """The same core without the merge μop: the probe sees nothing, the plain stages mix the
    families and the model has no state."""
    m, fams = dirty_upper_mapping()
    del m["wide"]
    sim = SimulatedMachine(mapping=m)
    b = Build.start(sim.forms, sim.measure, palmed.PalmedConfig(tol=1e-6),
                    dirty=(fams, CARRIERS))
    assert not b.dirty["observed"] and b.dirty["probes_slower"] == 0
    assert b.dirty["probe_max_slowdown"] == 1.0
    model, stats = b.fit(sim.measure)
    assert not model.wide and "wide-dirty" not in stats["kernels"]
    assert any(transition.mixes(parse_canonical(t), fams) for t in b.asked["pairs"])
    assert dirty_line(stats["dirty_upper"]).startswith("not seen (no probe slower")
    mixed = [k for k in _kernels(sim.forms, 400, seed=5) if transition.mixes(k, fams)]
    assert np.abs(_errors(model, sim, mixed)).max() < 1e-5
