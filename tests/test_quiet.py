"""Quiet rounds: the monitors against the machine's reference, and the batch measured again
until one round is quiet (cpumap.measure.quiet, cpumap.measure.batch._rounds). Exact, on
scripted harness results: no native timing."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_estimate import noisy_rows

from cpumap.measure import asmgen, batch, estimate, harness, quiet
from cpumap.measure.rows import calibration_rows, rows_from_rounds
from cpumap.measure.settings import BenchSettings

ADD, MOV = quiet.MONITOR_KERNELS
RATIO = 1.42


def monitor_rounds(cpis: dict[str, list[float]]) -> pd.DataFrame:
    """Monitor rows of one batch: per monitor kernel, its value in each round."""
    parts = []
    for k, values in cpis.items():
        for rnd, cpi in enumerate(values):
            parts.append(noisy_rows(cpi, 32, 0.0, seed=rnd, kernel=k)
                         .assign(role="monitor", round=rnd))
    return pd.concat(parts, ignore_index=True)


def test_a_round_is_quiet_when_every_monitor_is_near_its_reference():
    rows = monitor_rounds({ADD: [0.25, 0.25, 0.25], MOV: [0.3467, 0.3333, 0.3450]})
    per_round = quiet.round_estimates(rows)
    assert sorted(per_round.columns) == ["est", "kernel", "round"] and len(per_round) == 6
    calm, worst = quiet.quiet_rounds(per_round)
    assert calm == {1}  # rounds 0 and 2: the loads 4.0 % and 3.5 % slow
    assert worst[MOV] == pytest.approx(0.04, abs=0.003) and worst[ADD] < 0.004
    # every round slowed alike agrees with itself: only the machine's reference shows it
    slow = monitor_rounds({ADD: [0.25] * 3, MOV: [0.3467] * 3})
    assert quiet.quiet_rounds(quiet.round_estimates(slow))[0] == {0, 1, 2}
    calm, worst = quiet.quiet_rounds(quiet.round_estimates(slow), {MOV: 0.3333, ADD: 0.25})
    assert calm == set() and worst[MOV] == pytest.approx(0.04, abs=0.003)
    # a reference above the batch's own best changes nothing
    assert quiet.quiet_rounds(per_round, {MOV: 0.40})[0] == {1}
    # no monitor timed: nothing to judge by, every round counts
    none = per_round.assign(est=np.nan)
    assert quiet.quiet_rounds(none)[0] == {0, 1, 2}


def test_the_reference_keeps_recent_settled_values_and_takes_their_lower_quartile(tmp_path):
    path = quiet.reference_path(tmp_path / "db")
    assert path == tmp_path / "monitor" / "reference.json"
    pid = monitor_rounds({ADD: [0.25]}).params_id.iat[0]
    assert quiet.load_reference(path, pid) == {}
    quiet.update_reference(path, monitor_rounds({ADD: [0.25] * 3, MOV: [0.3333] * 3}))
    assert quiet.load_reference(path, "other-parameters") == {}
    ref = quiet.load_reference(path, pid)
    assert ref[ADD] == pytest.approx(0.25, rel=0.004)
    assert ref[MOV] == pytest.approx(0.3333, rel=0.004)
    # one value low by luck does not set the reference: the second lowest does
    quiet.update_reference(path, monitor_rounds({MOV: [0.3200] * 3}))
    assert quiet.load_reference(path, pid)[MOV] == pytest.approx(0.3333, rel=0.004)
    # a monitor whose rounds disagree (unsettled) adds nothing
    quiet.update_reference(path, monitor_rounds({ADD: [0.20, 0.25, 0.30]}))
    assert len(json.loads(path.read_text())[f"{ADD}|{pid}"]) == 1
    # the list is bounded
    for _ in range(quiet.REFERENCE_KEEP + 3):
        quiet.update_reference(path, monitor_rounds({MOV: [0.3333] * 2}))
    assert len(json.loads(path.read_text())[f"{MOV}|{pid}"]) == quiet.REFERENCE_KEEP
    # of many values, the lower quartile: a quiet host's values scatter both ways by the
    # calibration's luck, and the lowest few of 32 sit below the CPU
    assert quiet._reference_of([0.3320, 0.3322, 0.3324] + [0.3333] * 20 + [0.3400] * 9) \
        == 0.3333
    assert quiet._reference_of([0.33, 0.34, 0.35, 0.36, 0.37]) == 0.34
    assert quiet._reference_of([0.33]) == 0.33
    # a damaged file is no reference (it only ever adds rounds), and is replaced whole
    path.write_text("{not json")
    assert quiet.load_reference(path, pid) == {}
    quiet.update_reference(path, monitor_rounds({ADD: [0.25] * 2}))
    assert set(json.loads(path.read_text())) == {f"{ADD}|{pid}"}
    # the kernels of a batch only when asked (`cpumap measure`), the monitors always
    rows = pd.concat([monitor_rounds({ADD: [0.25] * 2}),
                      monitor_rounds({"IMUL": [1.0] * 2}).assign(role="kernel")])
    quiet.update_reference(path, rows)
    assert "IMUL" not in quiet.load_reference(path, pid)
    quiet.update_reference(path, rows, kernels=True)
    assert quiet.load_reference(path, pid)["IMUL"] == pytest.approx(1.0, rel=0.004)


def scripted_harness(monkeypatch, slow_rounds: int, slowed: tuple[int, ...] = (1, 2)):
    """A harness whose first ``slow_rounds`` rounds run the kernels ``slowed`` 4 % slow (a
    neighbour on the load pipes for seconds); the calls of a round are otherwise exact."""
    calls: list[list[int]] = []
    cpi = {0: 0.25, 1: 0.3333, 2: 1.0}

    def run_batch(so, n, *, indices, progress=None, **kw):
        rnd = len(calls)
        calls.append(list(indices))
        slow = 1.04 if rnd < slow_rounds else 1.0
        rows = []
        for i in indices:
            inst = 20_000
            c = cpi[i] * (slow if i in slowed else 1.0)
            for rep in range(16):
                t1 = round((300 + c * inst) / RATIO)
                t2 = round((300 + 2 * c * inst) / RATIO)
                rows.append({"index": i, "rep": rep, "iters": 1000, "ticks1": t1, "ticks2": t2,
                             "cycles1": 0, "cycles2": 0, "calib_ratio": RATIO})
        return harness.BatchResult("tsc-calibrated", "derived", RATIO, RATIO, rows)

    monkeypatch.setattr(harness, "run_batch", run_batch)
    metas = [asmgen.KernelMeta(i, k, asmgen.kernel_id(k), 1, 20, 1000, 1, 2, 20_000)
             for i, k in enumerate([ADD, MOV, "IMUL_R64_R64"])]
    return calls, metas


def run_rounds(metas, reference, settle_s: float = 20.0, patient: bool = False
               ) -> tuple[list[str], pd.DataFrame, pd.Series]:
    """The batch's rounds on the scripted harness: progress lines, rows, and the measured
    kernel's aggregate."""
    bench = BenchSettings(rounds=3, max_rounds=8, round_gap_ms=0, settle_s=settle_s)
    said: list[str] = []
    results = batch._rounds("x.so", 3, [0, 1, 2], metas, bench, "papi_bench", "b", (0, 1),
                            said.append, reference=reference, patient=patient)
    rows = pd.DataFrame(rows_from_rounds(results, metas, "m", "b", {},
                                               pd.Timestamp(0, tz="UTC"), (0, 1)))
    return said, rows, estimate.aggregate(rows).set_index("kernel").loc["IMUL_R64_R64"]


@pytest.mark.parametrize("reference", [False, True])
def test_the_whole_batch_is_measured_again_until_a_round_is_quiet(monkeypatch, reference):
    calls, metas = scripted_harness(monkeypatch, slow_rounds=3)
    said, rows, got = run_rounds(metas, {ADD: 0.25, MOV: 0.3333} if reference else None)
    assert set(rows.loc[rows.kernel.isin([ADD, MOV]), "role"]) == {"monitor"}
    if not reference:
        # three slow rounds agree with each other: settled, and 4 % slow
        assert calls == [[0, 1, 2]] * 3
        assert got.cycles_per_instance_est == pytest.approx(1.04, rel=0.002)
    else:
        # no quiet round after three: the whole batch again; the fourth is quiet, and one
        # more round (monitors and the unsettled kernel) confirms the kernel's value
        assert calls == [[0, 1, 2]] * 5
        assert any("no quiet round yet (MOV_R64_M64 +4.0 %)" in s for s in said)
        assert got.cycles_per_instance_est == pytest.approx(1.0, rel=0.002)
        assert not got.unstable


def test_a_round_longer_than_the_monitors_speak_for_is_not_judged(monkeypatch):
    """A full-profile batch's round lasts seconds; its monitors ran in its first milliseconds
    and say nothing of the rest: no round is measured again for them."""
    calls, metas = scripted_harness(monkeypatch, slow_rounds=3)
    monkeypatch.setattr(quiet, "JUDGED_ROUND_S", -1.0)
    bench = BenchSettings(rounds=3, max_rounds=8, round_gap_ms=0)
    batch._rounds("x.so", 3, [0, 1, 2], metas, bench, "papi_bench", "b", (0, 1), lambda _m: None,
                  reference={ADD: 0.25, MOV: 0.3333})
    assert calls == [[0, 1, 2]] * 3


@pytest.mark.parametrize("known", [False, True])
def test_a_kernel_slower_than_its_reference_is_measured_again(monkeypatch, known):
    """`cpumap measure` keeps each kernel's settled values: three rounds of a kernel that
    agree at 4 % above the value this machine settled on before, with quiet monitors, are
    measured again (the kernel, with the monitors) until it comes back."""
    calls, metas = scripted_harness(monkeypatch, slow_rounds=3, slowed=(2,))
    said, _, got = run_rounds(
        metas, {ADD: 0.25, MOV: 0.3333} | ({"IMUL_R64_R64": 1.0} if known else {}))
    if not known:
        assert calls == [[0, 1, 2]] * 3
        assert got.cycles_per_instance_est == pytest.approx(1.04, rel=0.002)
    else:
        assert calls == [[0, 1, 2]] * 5
        assert any("slower than this machine's reference (IMUL_R64_R64 +4.0 %)" in m
                   for m in said)
        assert got.cycles_per_instance_est == pytest.approx(1.0, rel=0.002)


def test_monitors_keep_the_kernels_where_they_were():
    """The integer-add monitor leads the batch as it always did; the others go last, so
    that the kernels' code lies where it lay before them."""
    assert batch.monitor_indices(5, 2) == (0, 4)
    assert batch.monitor_indices(5, 1) == (0,)
    assert batch.monitor_indices(5, 0) == ()


@pytest.mark.parametrize("settle_s", [0.0, 20.0])
def test_a_spell_longer_than_max_rounds_is_waited_out_within_the_time_budget(monkeypatch,
                                                                             settle_s):
    """Ten slow rounds, the kernel 4 % above its reference: eight rounds do not see the end
    of it; the time budget does (the eleventh round is quiet, a twelfth confirms it). With no
    budget the batch stops at max_rounds and keeps its slow, flagged value."""
    calls, metas = scripted_harness(monkeypatch, slow_rounds=10, slowed=(2,))
    _, _, got = run_rounds(metas, {ADD: 0.25, MOV: 0.3333, "IMUL_R64_R64": 1.0}, settle_s)
    if settle_s:
        assert calls == [[0, 1, 2]] * 12
        assert got.cycles_per_instance_est == pytest.approx(1.0, rel=0.002)
        assert not got.unstable
    else:
        assert calls == [[0, 1, 2]] * 8
        assert got.cycles_per_instance_est == pytest.approx(1.04, rel=0.002)


@pytest.mark.parametrize("patient", [False, True])
def test_a_kernel_only_unstable_waits_only_when_patient(monkeypatch, patient):
    """A kernel whose rounds disagree, with quiet monitors and no reference of its own: a
    pipeline batch stops at max_rounds and flags it unstable (it may be the kernel's own
    behaviour); `cpumap measure` (patient: one kernel a user asked for, maybe measured for
    the first time) spends its time budget, and here the eleventh round matches the first."""
    calls: list[list[int]] = []
    _, metas = scripted_harness(monkeypatch, slow_rounds=0)
    inner = harness.run_batch

    def disagreeing(so, n, *, indices, progress=None, **kw):
        calls.append(list(indices))
        res = inner(so, n, indices=indices, progress=progress, **kw)
        k = len(calls) - 1  # IMUL: round 0 at 1.0, rounds 1-9 3 % slower each, then 1.0
        f = 1.0 + 0.03 * k if k < 10 else 1.0
        for r in res.rows:
            if r["index"] == 2:
                r["ticks1"] = round((300 + f * 20_000) / RATIO)
                r["ticks2"] = round((300 + 2 * f * 20_000) / RATIO)
        return res

    monkeypatch.setattr(harness, "run_batch", disagreeing)
    _, _, got = run_rounds(metas, {ADD: 0.25, MOV: 0.3333}, settle_s=20.0, patient=patient)
    assert len(calls) == (11 if patient else 8)
    assert bool(got.unstable) is not patient
    assert got.cycles_per_instance_est == pytest.approx(1.0, rel=0.002)


def test_judging_some_kernels_builds_their_rows_at_the_whole_batch_clock():
    """After the first rounds only the kernels the last round measured are judged
    (batch._unsettled's ``only``): their rows are those of the whole batch, and the batch's
    clock still comes from every kernel's calibration samples."""
    rng = np.random.default_rng(3)
    metas = [asmgen.KernelMeta(i, k, asmgen.kernel_id(k), 1, 20, 1000, 1, 2, 20_000)
             for i, k in enumerate([ADD, MOV, "IMUL_R64_R64", "ADD_R64_M64"])]
    results = []
    for rnd, todo in enumerate([[0, 1, 2, 3]] * 3 + [[0, 1, 2]]):
        rows = []
        for i in todo:
            for rep in range(8):
                # the samples of kernel 3 (settled after round 3) read the fastest clock
                cal1 = 20_000 + (0 if i == 3 else int(rng.integers(5, 400)))
                rows.append({"index": i, "rep": rep, "iters": 1000, "stable": True,
                             "ticks1": 5_000 + int(rng.integers(0, 50)), "cycles1": -1,
                             "ticks2": 9_000 + int(rng.integers(0, 50)), "cycles2": -1,
                             "cal1": cal1, "cal2": 2 * cal1 - 50, "cal_adds": 28_000})
        res = harness.BatchResult("tsc-calibrated", "derived", RATIO, RATIO, rows)
        if rnd == 3:
            res.failures = {2: "SIGSEGV"}
        results.append(res)
    now = pd.Timestamp(0, tz="UTC")
    whole = rows_from_rounds(results, metas, "m", "b", {}, now, (0,))
    some = rows_from_rounds(results, metas, "m", "b", {}, now, (0,), keep={0, 1, 2})
    assert len(whole) == 4 * 8 * 3 + 2 * 8 + 1 - 3 * 8  # kernel 2 failed: one row
    expect = whole[whole.kernel != "ADD_R64_M64"].reset_index(drop=True)
    pd.testing.assert_frame_equal(some, expect)
    # the batch ratio from the samples alone is the one from every row, kernel 3's included
    ok = whole[whole.status == "ok"]
    cal = calibration_rows(results, "m", "b", {}, now)
    assert len(cal) == len(ok)
    got, want = estimate.batch_ratios(cal), estimate.batch_ratios(ok)
    assert got == pytest.approx(want, rel=1e-12)
    assert want != pytest.approx(estimate.batch_ratios(some[some.status == "ok"]), rel=1e-6)


@pytest.mark.parametrize("ends", ["both", "start"])
def test_a_long_round_is_judged_on_the_monitors_at_both_of_its_ends(monkeypatch, ends):
    """A round longer than the monitors speak for measures them again at its end. A spell
    over whole rounds (the monitors 4 % slow at both ends of the first three) measures the
    whole batch again until a round is quiet; one that ended within each round (slow at the
    start, quiet at the end) is no reason to."""
    calls: list[list[int]] = []
    cpi = {0: 0.25, 1: 0.3333, 2: 1.0}

    def run_batch(so, n, *, indices, progress=None, **kw):
        rnd = len(calls)
        calls.append(list(indices))
        rows = []
        for pos, i in enumerate(indices):
            at_end = pos >= len(indices) - 2
            slow = 1.04 if rnd < 3 and i in (1, 2) and (ends == "both" or not at_end) else 1.0
            c, inst = cpi[i] * slow, 20_000
            for rep in range(16):
                rows.append({"index": i, "rep": rep, "iters": 1000,
                             "ticks1": round((300 + c * inst) / RATIO),
                             "ticks2": round((300 + 2 * c * inst) / RATIO),
                             "cycles1": 0, "cycles2": 0, "calib_ratio": RATIO})
        return harness.BatchResult("tsc-calibrated", "derived", RATIO, RATIO, rows)

    monkeypatch.setattr(harness, "run_batch", run_batch)
    monkeypatch.setattr(quiet, "JUDGED_ROUND_S", -1.0)
    monkeypatch.setattr(quiet, "TRAILING_MIN_KERNELS", 1)
    metas = [asmgen.KernelMeta(i, k, asmgen.kernel_id(k), 1, 20, 1000, 1, 2, 20_000)
             for i, k in enumerate([ADD, MOV, "IMUL_R64_R64"])]
    said, rows, got = run_rounds(metas, {ADD: 0.25, MOV: 0.3333})
    assert all(c[-2:] == [0, 1] for c in calls)  # the monitors close every round
    if ends == "both":
        assert len(calls) == 5
        assert any("no quiet round yet (MOV_R64_M64 +4.0 %)" in s for s in said)
    else:
        assert len(calls) == 3
    # the kernel measured at the start of every round: 4 % slow in each when the spell
    # ended inside the rounds (what rounds cannot tell apart), right once a round was quiet
    assert got.cycles_per_instance_est == pytest.approx(1.0 if ends == "both" else 1.04,
                                                        rel=0.002)
