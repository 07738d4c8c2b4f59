"""The SSE/AVX transition: families of forms, switches of a loop body, the probe, and what the
model, its validation, predictions and the evaluation do where the host pays per switch.

This host may be a Zen 4 (no penalty: measured by the pipeline's probe) or a Zen 3 (a micro-
fault per switch); the code paths of the host it is not are tested here with measurements
made up to the shape each has (Zen 3: parts summed plus ~170 cycles per switch, Zen 4: parts
overlapped), on the real catalogue's forms.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cpumap.evaluate import coverage
from cpumap.evaluate.analyzers import BlockInput
from cpumap.evaluate.analyzers.internal import ModelAnalyzer
from cpumap.isa import transition
from cpumap.measure import asmgen
from cpumap.measure import transition as probe
from cpumap.model import palmed, resmodel, validation
from cpumap.model.palmed.build import Build, build_model
from cpumap.model.portmap import synthetic_mapping
from cpumap.model.simulate import SimulatedMachine

SSE, AVX = "ADDPD_XMM_XMM", "VSHUFPD_YMM_YMM_YMM_I8"
ADDPD = "660f58c1"          # addpd %xmm1, %xmm0
VSHUFPD = "c5f5c6c201"      # vshufpd $1, %ymm2, %ymm1, %ymm0
VADDPD128 = "c5f158c2"      # vaddpd %xmm2, %xmm1, %xmm0 (VEX.128: zeroes the upper halves)
SWITCH = 170.0              # cycles per switch, the order of Zen 3's (344 for two switches)


def test_families_from_the_catalogue(catalogue_df):
    fams = transition.families(catalogue_df)
    assert fams[SSE] == fams["MOVAPD_XMM_XMM"] == transition.SSE
    assert fams[AVX] == fams["VADDPD_ZMM_ZMM_ZMM"] == transition.AVX  # EVEX.512 too
    for neither in ("VADDPD_XMM_XMM_XMM", "ADD_R64_R64", "VZEROUPPER"):
        assert neither not in fams
    # the vector length counts, not only the registers: VEX.256 with an xmm destination (200
    # cycles per switch beside ADDPD on a Sapphire Rapids guest); a mask destination never paid
    assert fams["VCVTPD2PS_XMM_M256"] == fams["VCVTPD2PS_XMM_YMM"] == transition.AVX
    assert "VCVTPD2PS_XMM_M128" not in fams
    assert "VFPCLASSPD_K_M256_I8" not in fams


def test_plain_forms_have_register_operands_only(catalogue_df):
    plain = transition.plain_forms(catalogue_df)
    assert {"ADD_R64_R64", "ADD_R64_I8", "VADDPD_ZMM_ZMM_ZMM", SSE} <= plain
    # a memory operand, or an implicit register (RSP of PUSH, RDX:RAX of MUL)
    for other in ("ADD_R64_M64", "ADD_M64_R64", "PUSH_R64", "MUL_R64"):
        assert other in set(catalogue_df["name"]) and other not in plain


def test_switches_of_a_loop_body():
    fams = {"S": transition.SSE, "A": transition.AVX}
    assert transition.switches(["S", "S", "A", "S"], fams) == 2  # S->A, A->S
    assert transition.switches(["S", "A", "S", "A"], fams) == 4  # and A->S round the loop
    assert transition.switches(["S", "G", "S"], fams) == 0  # G: in neither family
    assert transition.switches([], fams) == 0
    assert transition.mixes(["S", "G", "A"], fams) and not transition.mixes(["S", "G"], fams)


def _host_like(zen3: bool):
    """Cycles of the probe's kernels on a host with (Zen 3) or without (Zen 4) the penalty."""
    alone = {SSE: 0.5, AVX: 0.5}
    fams = {SSE: transition.SSE, AVX: transition.AVX}

    def measure(kernels: list[str]) -> dict[str, float]:
        out = {}
        for text in kernels:
            k = asmgen.parse_canonical(text)
            parts = sum(n * alone[f] for f, n in k.items())
            if zen3:
                out[text] = parts + SWITCH * transition.switches(asmgen.interleave(k), fams)
            else:
                out[text] = max(n * alone[f] for f, n in k.items())  # two pipes in parallel
        return out

    return measure


def test_probe_measures_the_penalty_per_switch(catalogue_df):
    rec = probe.probe(catalogue_df, _host_like(zen3=True))
    assert rec["probed"] and rec["penalty"]
    assert (rec["sse_form"], rec["avx_form"]) == (SSE, AVX)
    assert rec["cycles_per_switch"] == pytest.approx(SWITCH)
    assert [m["switches"] for m in rec["mixes"]] == [2, 6, 2]
    assert "penalty 170.0 cycles per switch" in probe.summary(rec)
    rec = probe.probe(catalogue_df, _host_like(zen3=False))
    assert rec["probed"] and not rec["penalty"] and rec["cycles_per_switch"] == 0.0
    assert "no penalty" in probe.summary(rec)


def test_probe_says_why_it_could_not(catalogue_df):
    no_avx = catalogue_df.assign(status=catalogue_df.status.where(
        catalogue_df.encoding == "LEGACY", "excluded"))
    rec = probe.probe(no_avx, _host_like(zen3=True))
    assert not rec["probed"] and not rec["penalty"] and "256-bit AVX" in rec["reason"]
    rec = probe.probe(catalogue_df, lambda kernels: {})  # every kernel failed
    assert not rec["probed"] and "failed to measure" in rec["reason"]


@pytest.fixture(scope="module")
def penalised():
    """A simulated machine on which two families of forms pay SWITCH cycles per switch."""
    sim = SimulatedMachine(mapping=synthetic_mapping(6, 30, seed=2))
    apart = {f: transition.SSE for f in sim.forms[:6]} | {
        f: transition.AVX for f in sim.forms[6:12]}
    asked: list[str] = []

    def measure(kernels: list[str]) -> list[float]:
        asked.extend(kernels)
        return [v + SWITCH * transition.switches(asmgen.interleave(asmgen.parse_canonical(t)),
                                                  apart)
                for t, v in zip(kernels, sim.measure(kernels), strict=True)]

    return sim, apart, asked, measure


def test_palmed_never_mixes_the_families(penalised):
    sim, apart, asked, measure = penalised
    model, stats = build_model(sim.forms, measure, config=palmed.PalmedConfig(tol=1e-6),
                               apart=apart)
    assert asked and not any(transition.mixes(asmgen.parse_canonical(k), apart) for k in asked)
    assert stats["kernels_kept_apart"] > 0
    assert set(model.rho) == set(sim.forms)
    # kernels of one family (plus the rest) are predicted as the machine runs them
    kernels = [k for k in (asmgen.parse_canonical(t) for t in
                           validation.random_kernels(sim.forms, 300, seed=4, apart=apart))]
    assert len(kernels) == 300 and not any(transition.mixes(k, apart) for k in kernels)
    worst = max(abs(resmodel.predict(model, k)[0] / sim.exact(k) - 1) for k in kernels)
    assert worst < 0.02


def test_the_families_kept_apart_survive_the_state_file(penalised, tmp_path):
    sim, apart, _asked, measure = penalised
    b = Build.start(sim.forms, measure, palmed.PalmedConfig(tol=1e-6), apart=apart)
    b.pairs(measure)
    b.save(tmp_path / "pairs.json")
    again = Build.load(tmp_path / "pairs.json", measure, palmed.PalmedConfig(tol=1e-6))
    assert again.apart == b.apart == apart
    assert sorted(again.avoided) == sorted(b.avoided) and b.avoided
    assert not any(transition.mixes(asmgen.parse_canonical(k), apart)
                   for k in again.pair_kernels())


def _model(penalty: bool) -> resmodel.ResourceModel:
    rec = {"penalty": penalty, "cycles_per_switch": SWITCH if penalty else 0.0,
           "families": {SSE: transition.SSE, AVX: transition.AVX} if penalty else {}}
    return resmodel.ResourceModel(resources=["fp"], rho={SSE: {"fp": 0.5}, AVX: {"fp": 0.5}},
                                  provenance={"sse_avx_transition": rec})


def test_switching_cost_in_the_generators_order_or_the_blocks():
    kernel = {SSE: 4, AVX: 1}
    assert resmodel.switching(_model(True), kernel) == (2, 2 * SWITCH)
    assert resmodel.switching(_model(True), kernel, [SSE, AVX, SSE, AVX, SSE]) == (4,
                                                                                 4 * SWITCH)
    assert resmodel.switching(_model(False), kernel) == (0, 0.0)
    # the model analyzer: the block's own order, and a note saying so
    blocks = [BlockInput("k", 0, ("addpd", "vshufpd", "addpd"), (SSE, AVX, SSE), 3),
              BlockInput("k", 1, ("addpd", "addpd"), (SSE, SSE), 2)]
    got = ModelAnalyzer(_model(True)).predict(blocks)
    assert got[("k", 0)].cycles == pytest.approx(1.5 + 2 * SWITCH)
    assert "2 SSE/AVX switches" in got[("k", 0)].error
    assert got[("k", 1)].cycles == pytest.approx(1.0) and got[("k", 1)].error == ""
    assert ModelAnalyzer(_model(False)).predict(blocks)[("k", 0)].cycles == pytest.approx(1.5)


def test_predict_adds_the_measured_switches_and_says_so(tmp_path):
    from test_cli import run

    path = tmp_path / "model.json"
    resmodel.save(_model(True), path)
    out = json.loads(run(tmp_path, "predict", "--json", "--model", str(path),
                         f"{SSE}*4", AVX).stdout)
    assert out["sse_avx_transition"] is True and out["sse_avx_switches"] == 2
    assert out["throughput_bound"] == pytest.approx(2.5)
    assert out["cycles"] == pytest.approx(2.5 + 2 * SWITCH)
    resmodel.save(_model(False), path)
    out = json.loads(run(tmp_path, "predict", "--json", "--model", str(path),
                         f"{SSE}*4", AVX).stdout)
    assert out["sse_avx_transition"] is False and out["cycles"] == pytest.approx(2.5)


def test_mixing_blocks_counted_in_the_corpus_and_the_suite(tmp_path, catalogue):
    src = tmp_path / "app.csv"
    src.write_text(f"{ADDPD}{VSHUFPD},0.25\n{ADDPD}{VADDPD128},0.5\n{VSHUFPD},0.25\n")
    (cov,) = coverage.corpus_coverage({"app": src}, catalogue, set())
    assert (cov.mixing_blocks, cov.mixing_weight) == (1, 0.25)
    blocks = pd.DataFrame([
        {"benchmark": "k", "block_id": 0, "hexes": [ADDPD, VSHUFPD], "terminator": ""},
        {"benchmark": "k", "block_id": 1, "hexes": [ADDPD, VADDPD128], "terminator": ""}])
    counts = pd.DataFrame([{"benchmark": "k", "block_id": 0, "occurrences": 10},
                           {"benchmark": "k", "block_id": 1, "occurrences": 30}])
    (cov,) = coverage.suite_coverage(blocks, counts, (), catalogue)
    assert (cov.mixing_blocks, cov.mixing_weight, cov.total) == (1, 20, 80)
