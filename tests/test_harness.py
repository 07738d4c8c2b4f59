"""The measuring core on the real CPU: physics of a latency-1 add chain, and survival of
kernels that fault, hang or kill the harness (hand-written batches in fixtures/harness/)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
from native_util import MAX_UNCERTAINTY

from cpumap.measure import clocklevels, harness, robust

FIXTURES = Path(__file__).parent / "fixtures" / "harness"
ADDS_PER_INSTANCE_DIFF = 100 * 20000  # addchain.s: U = 100 adds per iteration, 20000 iterations


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> dict[str, Path]:
    """The harness binary and every fixture batch, built once (gcc -shared -nostdlib)."""
    out = tmp_path_factory.mktemp("harness")
    built = {"bin": harness.build_harness(out / "bin")}
    for src in sorted(FIXTURES.glob("*.s")):
        so = out / f"{src.stem}.so"
        subprocess.run(["gcc", "-shared", "-nostdlib", f"-Wa,-I,{FIXTURES}",  # batch.inc
                        "-o", str(so), str(src)], check=True)
        built[src.stem] = so
    return built


def _rows_by_kernel(res: harness.BatchResult) -> dict[int, list[dict]]:
    by: dict[int, list[dict]] = {}
    for row in res.rows:
        by.setdefault(row["index"], []).append(row)
    return by


#: A run of repetitions whose calibration samples before and after agree within this ran at
#: one clock (``_per_add``).
STEADY = 0.03


def _per_add(rows: list[dict]) -> float:
    """Cycles per add of one kernel's f2 - f1, by the pipeline's estimator: each call kind's
    undisturbed duration from its repetitions (cpumap.measure.estimate), never a repetition's
    own difference; each run of repetitions at the clock of the samples around it
    (``clocklevels.local_ratios``; a process's calibrations before and after its
    kernels may read another clock than its repetitions ran at on an Intel core: the
    call-length check read the chain at 1.148 cycles an add, the ratio of the Cascade Lake
    guest's 3.1 and 2.7 GHz clocks, with the process's calibration). Only the runs whose two
    samples agree within STEADY: NaN where there is none.

    Why: the Cascade Lake guest's clock moves with what shares the core, between 3.1 and
    2.4 GHz, unseen between two samples (2026-11-29, 30 processes of this batch: 4 had
    samples 13-30 % apart, and in one the two-chain kernel's samples read 0.95, 0.95 and then
    1.23 cycles a tick: its repetitions before the last sample, converted at 0.95, read 0.448
    cycles an add, faster than two chains of latency-1 adds run; an hour later the samples
    of 16 processes of 18 were more than 3 % apart somewhere). The physics is judged where
    the clock is known."""
    # the faster sample around each run, and the lower one
    ratio, low = clocklevels.local_ratios(len(rows), clocklevels.clock_samples(rows), None,
                                          np.asarray, clocklevels.clock_floors(rows))
    held = low >= (1.0 - STEADY) * ratio
    if not held.any():
        return math.nan
    c1 = np.array([r["ticks1"] for r in rows])[held] * ratio[held]
    c2 = np.array([r["ticks2"] for r in rows])[held] * ratio[held]
    step = robust.ROBUST_STEP_TICKS * float(np.median(ratio[held]))
    cycles, _ = robust.kernel_estimate(c1, c2, step, robust.CALL_OVERHEAD_MAX)
    return cycles / (rows[0].get("iters", 20000) * 100)


def _typical_per_add(res: harness.BatchResult) -> float:
    """The one-chain kernel's median repetition, cycles per add."""
    vals = sorted(res.cycles(r) / ADDS_PER_INSTANCE_DIFF for r in res.rows if r["index"] == 0)
    return vals[len(vals) // 2]


def _check_clock(res: harness.BatchResult) -> None:
    assert (res.clock, res.insn_source) in {("papi", "counted"), ("tsc-calibrated", "derived")}


def test_build_reuses_binary_and_version_is_a_hash(build, tmp_path):
    first = build["bin"]
    mtime = first.stat().st_mtime_ns
    assert harness.build_harness(first.parent) == first
    assert first.stat().st_mtime_ns == mtime  # newer than the source: not rebuilt
    assert len(harness.HARNESS_VERSION) == 12
    int(harness.HARNESS_VERSION, 16)


def test_add_chain_runs_at_one_cycle_per_add(build):
    # Rounds of 3 harness processes, judged by the runs of repetitions whose clock held
    # (``_per_add``): a process counts where both kernels have one. On a shared host a whole
    # process sometimes runs slow (suite.run_driver), and the typical-repetition check below
    # takes the fastest process. The one-chain check takes the median counted process: one
    # process's TSC calibration can be several percent low (Zen 3 guest, 2026-11-25: in 3 of
    # 57 runs of this test the fastest of the 3 processes put the add chain at 0.93-0.94
    # cycles per add), and the fastest-looking process is the one most likely to be.
    # The two-chain kernel needs two integer ALUs every cycle, which is what this host's
    # neighbours take, for seconds to minutes (Cascade Lake guest, 2026-11-28: 0.51-0.52 per
    # add in most processes, 0.54-0.60 in a few; 2026-11-29: 0.555-0.559 in all four right
    # processes of six rounds): it is judged by the fastest counted process whose one-chain
    # kernel reads right (its calibration is then right too), and while there are fewer than
    # 3 counted processes or that one is over 0.55, 3 more processes run, up to 6 rounds.
    # What the bound of 0.6 rules out is chains that do not overlap (1.0) or overlap by half
    # (0.75). Interference only slows a chain down, but the clock may rise and fall again
    # between two samples that agree (2026-11-29: two chains at 0.416 cycles an add in one
    # process of 18): the floor holds for the median of at least 6 counted processes.
    runs: list[harness.BatchResult] = []
    counted: list[harness.BatchResult] = []
    per_add: list[tuple[float, float]] = []  # each counted process's (one chain, two chains)
    for _ in range(6):
        new = [harness.run_batch(build["addchain"], 2, reps=9, warmup=2, cpu=None,
                                 timeout_s=5, harness_bin=build["bin"]) for _ in range(3)]
        assert all(r.failures == {} and r.restarts == 0 for r in new)
        runs += new
        for res in new:
            by = _rows_by_kernel(res)
            one, two = _per_add(by[0]), _per_add(by[1])
            if math.isfinite(one) and math.isfinite(two):
                counted.append(res)
                per_add.append((one, two))
        right = [two for one, two in per_add if one == pytest.approx(1.0, abs=0.05)]
        if len(per_add) >= 6 and right and min(right) <= 0.55:
            break
    assert len(counted) >= 6, f"the clock moved in every run of {len(runs) - len(counted)} " \
                              f"of {len(runs)} processes"
    median = sorted(range(len(counted)), key=lambda i: per_add[i][0])[len(counted) // 2]
    res = counted[median]
    _check_clock(res)
    by = _rows_by_kernel(res)
    assert sorted(by) == [0, 1] and all(len(rows) == 9 for rows in by.values())
    assert [r["rep"] for r in by[0]] == list(range(9))
    if res.clock == "tsc-calibrated":
        # Core clock faster than the TSC on this kind of machine; sanity range only.
        assert 0.2 < res.calib_before < 5 and 0.2 < res.calib_after < 5
        assert all(r["cycles1"] == -1 == r["cycles2"] for r in res.rows)
        assert by[0][0]["insns1"] == 20000 * 102 + 1 and by[0][0]["insns2"] == 20000 * 202 + 1
    # Latency-bound: one chain -> 1 cycle per add; two interleaved chains -> 0.5.
    assert per_add[median][0] == pytest.approx(1.0, abs=0.05)
    assert right and min(right) <= 0.6
    # two chains of latency 1: 2 adds a cycle at most
    assert sorted(two for _, two in per_add)[len(per_add) // 2] >= 0.45
    # The typical repetition is in the right neighbourhood too.
    assert 0.8 < min(map(_typical_per_add, runs)) < 1.3


def test_faulting_kernels_fail_and_the_rest_are_measured(build):
    res = harness.run_batch(build["faults"], 13, reps=3, warmup=1, cpu=None, timeout_s=2,
                            harness_bin=build["bin"])
    _check_clock(res)
    assert res.failures == {1: "SIGILL", 3: "SIGSEGV", 5: "SIGFPE", 7: "SIGTRAP",
                            9: "SIGILL", 11: "SIGSEGV"}
    assert res.restarts == 0  # the harness recovered by itself
    by = _rows_by_kernel(res)
    # Kernel 10 checks MXCSR, the x87 stack and DF after kernel 9 died with them dirty.
    assert sorted(by) == [0, 2, 4, 6, 8, 10, 12]
    assert all([r["rep"] for r in rows] == [0, 1, 2] for rows in by.values())
    assert all(r["ticks1"] > 0 and r["ticks2"] > 0 for r in res.rows)


def test_endless_kernel_times_out(build):
    res = harness.run_batch(build["hang"], 3, reps=3, warmup=1, cpu=None, timeout_s=0.5,
                            harness_bin=build["bin"])
    assert res.failures == {1: "timeout"} and res.restarts == 0
    by = _rows_by_kernel(res)
    assert sorted(by) == [0, 2] and all(len(rows) == 3 for rows in by.values())


def test_supervisor_survives_kernels_that_kill_the_harness(build):
    seen: list[int] = []
    res = harness.run_batch(build["crash"], 7, reps=2, warmup=1, cpu=None, timeout_s=0.3,
                            harness_bin=build["bin"], progress=seen.append,
                            watchdog_margin_s=0.5)
    _check_clock(res)
    assert res.failures[1] == "harness crashed: killed by SIGKILL"
    assert res.failures[3] == "harness crashed: exit status 7"
    assert res.failures[5].startswith("hang: no output for")  # blocked SIGALRM: watchdog
    assert sorted(res.failures) == [1, 3, 5] and res.restarts == 3
    by = _rows_by_kernel(res)
    assert sorted(by) == [0, 2, 4, 6] and all(len(rows) == 2 for rows in by.values())
    assert seen == list(range(1, 8))
    assert all(r["calib_ratio"] > 0 for r in res.rows)


def test_long_kernel_lists_go_to_several_processes(build, monkeypatch):
    """A scattered list longer than one process takes (the 128 KiB argument limit) is measured
    in order by consecutive harness processes, across a fault and a crash."""
    monkeypatch.setattr(harness, "MAX_LISTED_KERNELS", 2)
    cmds: list[list[str]] = []
    run_segment = harness._run_segment

    def recording(cmd, *args, **kwargs):
        cmds.append(cmd)
        return run_segment(cmd, *args, **kwargs)

    monkeypatch.setattr(harness, "_run_segment", recording)
    res = harness.run_batch(build["faults"], 13, reps=2, warmup=1, cpu=None, timeout_s=2,
                            harness_bin=build["bin"], indices=[12, 8, 0, 2, 4, 1])
    assert [c[c.index("--kernels") + 1] for c in cmds] == ["12,8", "0,2", "4,1"]
    assert res.failures == {1: "SIGILL"} and res.restarts == 0
    assert list(dict.fromkeys(r["index"] for r in res.rows)) == [12, 8, 0, 2, 4]
    assert all(len(rows) == 2 for rows in _rows_by_kernel(res).values())

    cmds.clear()
    res = harness.run_batch(build["crash"], 7, reps=2, warmup=1, cpu=None, timeout_s=0.3,
                            harness_bin=build["bin"], indices=[6, 3, 0, 2],
                            watchdog_margin_s=0.5)
    assert [c[c.index("--kernels") + 1] for c in cmds] == ["6,3", "0,2"]
    assert res.failures == {3: "harness crashed: exit status 7"} and res.restarts == 1
    assert list(dict.fromkeys(r["index"] for r in res.rows)) == [6, 0, 2]


def test_subrange_and_cli_errors(build):
    bench = str(build["bin"])
    out = subprocess.run([bench, "--so", str(build["addchain"]), "--reps", "1", "--warmup", "0",
                          "--start", "1", "--count", "1", "--clock", "tsc"],
                         capture_output=True, text=True, check=True).stdout
    kinds = [line.split("\t")[0] for line in out.splitlines()]
    assert kinds == ["clock", "calib", "iters", "row", "end", "calib", "done"]
    assert out.splitlines()[0] == "clock\ttsc-calibrated\tderived"
    assert out.splitlines()[2].split("\t")[1:] == ["1", "20000"]  # iterations, unscaled
    assert out.splitlines()[3].split("\t")[1:3] == ["1", "c0de0002"]
    # the first repetition carries a calibration sample (n and 2n chains of 20,000 adds)
    assert all(int(v) > 0 for v in out.splitlines()[3].split("\t")[10:12])
    # one repetition cannot be judged stable (no first half to compare with)
    # then the closing calibration sample, after the last repetition
    end = out.splitlines()[4].split("\t")[1:]
    assert end[:4] == ["1", "1", "0", "20000"] and all(int(v) > 0 for v in end[4:6])
    assert out.splitlines()[-1] == "done\t1\t0"
    usage = subprocess.run([bench, "--so", "x.so", "--reps", "0", "--warmup", "0"],
                           capture_output=True, text=True)
    assert usage.returncode == 2 and "--reps" in usage.stderr
    missing = subprocess.run([bench, "--so", "/nonexistent.so", "--reps", "1", "--warmup", "0"],
                             capture_output=True, text=True)
    assert missing.returncode == 3
    with pytest.raises(harness.HarnessError, match="failed before measuring"):
        harness.run_batch(Path("/nonexistent.so"), 1, reps=1, warmup=0, cpu=None, timeout_s=1,
                          harness_bin=build["bin"])


def test_parse_errors_name_the_line(tmp_path):
    fake = tmp_path / "fake_bench"
    fake.write_text("#!/bin/sh\nprintf 'clock\\ttsc-calibrated\\tderived\\nrow\\tbogus\\n'\n")
    fake.chmod(0o755)
    with pytest.raises(harness.HarnessError, match=r"line 2 'row\\tbogus'"):
        harness.run_batch(Path("x.so"), 1, reps=1, warmup=0, cpu=None, timeout_s=1,
                          harness_bin=fake)


def test_impossible_counter_value_fails_its_kernel_not_the_batch(tmp_path):
    """A kernel that wrote into the harness's memory (seen: BTC with a register bit offset left
    ticks1 = 0xaaaaaaaa0000661e): that kernel fails with the value named, the next one stands."""
    fake = tmp_path / "fake_bench"
    lines = ["clock\ttsc-calibrated\tderived", "calib\tbefore\t1.5\t1000\t1500",
             "row\t0\ta\t0\t12297829379609749022\t3000\t-1\t-1\t10\t20\t-1\t-1",
             "end\t0\t1\t1\t20000",
             "row\t1\tb\t0\t1000\t3000\t-1\t-1\t10\t20\t-1\t-1", "end\t1\t1\t1\t20000",
             "calib\tafter\t1.5\t1000\t1500", "done\t2\t0"]
    fake.write_text("#!/bin/sh\nprintf '" + "\\n".join(lines) + "\\n'\n")
    fake.chmod(0o755)
    res = harness.run_batch(Path("x.so"), 2, reps=1, warmup=0, cpu=None, timeout_s=1,
                            harness_bin=fake)
    assert res.failures == {0: "impossible ticks1 0xaaaaaaaa0000661e: the kernel wrote into "
                                "the harness's memory"}
    assert [r["index"] for r in res.rows] == [1] and res.rows[0]["ticks2"] == 3000


def test_a_kernel_measured_twice_keeps_each_runs_iterations(tmp_path):
    """The monitors run at both ends of a long round (``batch._order``: the order names them
    twice), each run with the iterations its own first call scaled: each run's rows carry
    its own. Before, the last run's count went on every row of the kernel: on a busy Sapphire
    Rapids-class guest a first run scaled to 3 iterations per call (its timing call
    disturbed) was read as 408, and the add monitor came out at 0.0015 cycles (2026-12-02)."""
    fake = tmp_path / "fake_bench"
    lines = ["clock\ttsc-calibrated\tderived", "calib\tbefore\t1.0\t1000\t1000",
             "iters\t0\t3", "row\t0\ta\t0\t200\t300\t-1\t-1\t-1\t-1\t-1\t-1",
             "end\t0\t1\t1\t20000",
             "iters\t1\t50", "row\t1\tb\t0\t1000\t2000\t-1\t-1\t-1\t-1\t-1\t-1",
             "end\t1\t1\t1\t20000",
             "iters\t0\t408", "row\t0\ta\t0\t16400\t32700\t-1\t-1\t-1\t-1\t-1\t-1",
             "end\t0\t1\t1\t20000",
             "calib\tafter\t1.0\t1000\t1000", "done\t3\t0"]
    fake.write_text("#!/bin/sh\nprintf '" + "\\n".join(lines) + "\\n'\n")
    fake.chmod(0o755)
    res = harness.run_batch(Path("x.so"), 2, reps=1, warmup=0, cpu=None, timeout_s=1,
                            harness_bin=fake, indices=[0, 1, 0])
    assert [(r["index"], r["iters"]) for r in res.rows] == [(0, 3), (1, 50), (0, 408)]
    assert [r["run"] for r in res.rows] == [0, 1, 2]


def test_row_cycles():
    row = {"ticks1": 100, "ticks2": 300, "cycles1": 150, "cycles2": 420}
    assert harness.row_cycles(row, "tsc-calibrated", 1.5) == 300.0
    assert harness.row_cycles(row, "papi", float("nan")) == 270.0
    res = harness.BatchResult("tsc-calibrated", "derived", 1.4, 1.6, rows=[row])
    assert harness.calib_ratio(res) == pytest.approx(1.5)
    assert res.cycles(row) == pytest.approx(300.0)


def test_call_length_scales_iterations_and_keeps_per_add_cost(build):
    """--call-us: the iterations of a call are scaled to its target length (here far fewer
    than the table's 20,000); the cost per add does not change (judged in a process whose
    clock held, ``_per_add``: up to 6 tries)."""
    for _ in range(6):
        res = harness.run_batch(build["addchain"], 1, reps=5, warmup=1, cpu=None,
                                timeout_s=2, harness_bin=build["bin"], call_us=100)
        if math.isfinite(_per_add(res.rows)):
            break
    iters = {r["iters"] for r in res.rows}
    assert len(iters) == 1 and 1 <= iters.pop() < 20000
    assert _per_add(res.rows) == pytest.approx(1.0, abs=0.05)
    assert all(r["insns1"] == -1 for r in res.rows)  # static counts no longer apply


def test_repetitions_stop_at_a_checkpoint_or_a_limit(build):
    """Adaptive repetitions: at least --reps, then each doubling until the estimate of all
    repetitions and of their first half agree; a calibration sample every --calib-every
    repetitions. Whether a kernel settles depends on the host; what it reports must be
    consistent with the rule either way."""
    res = harness.run_batch(build["addchain"], 2, reps=4, max_reps=64, stable_tol=0.005,
                            warmup=1, cpu=None, timeout_s=5, harness_bin=build["bin"],
                            call_us=200, calib_every=3)
    for rows in _rows_by_kernel(res).values():
        n, stable = len(rows), rows[0]["stable"]
        assert 4 <= n <= 64 and all(r["stable"] == stable for r in rows)
        assert n in (4, 8, 16, 32, 64) if stable else n == 64
        assert [r["rep"] % 3 == 0 for r in rows] == [r["cal1"] > 0 for r in rows]
        assert all(r["cal_adds"] == 20000 for r in rows)
        assert 0.2 < rows[0]["calib_ratio"] < 5
    # a budget ends the repetitions (after the minimum), and the kernel is not called stable
    short = harness.run_batch(build["addchain"], 1, reps=2, max_reps=4096, stable_tol=1e-6,
                              budget_ms=5, warmup=0, cpu=None, timeout_s=5,
                              harness_bin=build["bin"], call_us=1000)
    assert 2 <= len(short.rows) < 4096
    assert all(r["stable"] is False for r in short.rows) or len(short.rows) in (2, 4, 8)


def _sample(ratio: float, adds: int = 50_000) -> dict:
    """A calibration sample's fields at core cycles per tick ``ratio`` (1 add per cycle)."""
    return {"cal1": round(adds / ratio), "cal2": round(2 * adds / ratio), "cal_adds": adds}


def test_each_run_of_repetitions_takes_the_faster_clock_around_it():
    """``local_ratio``: the larger of the samples before and after a run of repetitions (the
    kernel's closing sample, else the next kernel's first sample), each
    sample read as its clock level (what most samples near it read); a sample with no level
    near it sets nothing, for the runs on either side of it (NaN: the batch's ratio)."""
    slow, fast = 0.95, 1.24
    # a sample 1 % under its level reads the level; 0.80: no level near it
    clocks = [slow, slow, slow * 0.99, fast, fast, fast, 0.80, slow]
    rows = [row for k, c in enumerate(clocks)
            for row in ({"index": k, "rep": 0} | _sample(c),
                        {"index": k, "rep": 1, "cal_adds": 50_000})]
    end = _sample(slow)  # the last kernel's closing sample: slow, the process's closing fast
    rows[-1] |= {"end1": end["cal1"], "end2": end["cal2"]}
    samples = clocklevels.clock_samples(rows)
    # the levels come from the whole batch: here three rounds of the same samples
    levels = clocklevels.clock_levels(np.tile(np.concatenate(samples), 3))
    local, low = clocklevels.local_ratios(len(rows), samples, fast, levels,
                                          clocklevels.clock_floors(rows))
    got = local.tolist()[::2]
    assert got[:6] == pytest.approx([slow, slow, fast, fast, fast, np.nan], rel=1e-4,
                                    nan_ok=True)  # kernel 2: the clock rose after it
    assert np.isnan(got[6]) and got[7] == pytest.approx(slow, rel=1e-4)
    assert local.tolist()[1::2] == pytest.approx(got, nan_ok=True)
    # run_ratio_low: the lower of the two samples as they read, not as levels
    low = low.tolist()
    assert low[::2] == pytest.approx([slow, slow * 0.99, slow * 0.99, fast, fast, 0.80, 0.80,
                                      slow], rel=1e-4)
    assert low[1::2] == low[::2]


def test_a_run_is_never_converted_under_the_clock_its_own_samples_prove():
    """A sample's level is the densest ratio near it, but never under what its own chains
    prove (a chain of k latency-1 adds takes at least k cycles): the busy Sapphire
    Rapids-class guest's samples lay in bands wider than the level's reach of a crisp
    ratio, and runs converted at the band's densest ratio read the add monitor 0.1975
    cycles, under the 0.2 five ALUs allow. A slowed sample still reads its level, and a
    sample with no level near it still sets no clock."""
    dense, proven = 1.00, 1.012
    clocks = [dense] * 6 + [proven, dense * 0.99, 0.80, dense]
    rows = [{"index": k, "rep": 0} | _sample(c) for k, c in enumerate(clocks)]
    samples, floors = clocklevels.clock_samples(rows), clocklevels.clock_floors(rows)
    levels = clocklevels.clock_levels(np.concatenate(samples))
    unproven = (np.full(len(rows), np.nan),) * 2  # the densest ratio alone, as before
    old, _ = clocklevels.local_ratios(len(rows), samples, None, levels, unproven)
    local, _ = clocklevels.local_ratios(len(rows), samples, None, levels, floors)
    # each run takes the faster of its own sample and the next kernel's first one
    assert old[6] == pytest.approx(dense, rel=1e-4)  # the densest ratio, under the proof
    assert local[5:7].tolist() == pytest.approx([proven, proven], rel=1e-4)
    assert local[:5].tolist() == pytest.approx([dense] * 5, rel=1e-4)
    assert np.isnan(local[7:9]).all() and np.isnan(local[9])  # 0.80: no level near it
    # the proof itself: the larger of the n and 2n chains' adds per tick
    assert floors[0][6] == pytest.approx(proven, rel=1e-4) and np.isnan(floors[1]).all()


def test_a_licence_clock_a_neighbour_blurred_reads_the_top_of_its_samples():
    """Samples of a licence clock that a neighbour slowed by different amounts have no crisp
    level: they read the median of the fastest group of four within LEVEL_BLUR, from
    LEVEL_REACH under them to LEVEL_REACH_UP over them. A sample a few percent under the
    fastest level (a neighbour's slowdown, not a licence) and one with no group near it set
    no clock, and with no crisp level in the batch nothing is a licence clock."""
    fast = [1.24 * (1 + 1e-5 * k) for k in range(20)]  # crisp: within 0.03 %
    group = [0.957, 0.958, 0.959, 0.960]  # 0.1 % apart: no crisp level, one blurred group
    slowed = [0.93, 0.935, 0.94, 0.97]  # 0.97: read while the clock rose
    alone = [1.19, 1.10]
    got = clocklevels.clock_levels(fast + group + slowed + alone)
    assert got(np.array(group + slowed)) == pytest.approx([0.9585] * 8)
    assert np.isnan(got(np.array(alone))).all()
    assert got(np.array([1.235]))[0] == pytest.approx(1.24 * (1 + 19e-5))
    # 0.90 reaches up to 0.936 only: the group is out of its reach
    assert np.isnan(clocklevels.clock_levels(fast + group + [0.90])(np.array([0.90]))).all()
    assert np.isnan(clocklevels.clock_levels(group + slowed)(np.array(group))).all()


def test_a_vector_form_after_a_heavy_one_runs_at_its_own_clock(catalogue_df, host, tmp_path):
    """ADDPD xmm takes 0.5 cycles on every host cpumap runs on (two FP add pipes), measured
    right after a heavy FMA kernel in one batch. An Intel core keeps the heavy kernel's slower
    licence clock for milliseconds: at the batch's fastest clock ADDPD read 0.6455 cycles on
    the Cascade Lake guest (2026-11-28), at the clock it ran at 0.4996. Under 0.5 by no more
    than the clock levels' resolution; over it by what a neighbour can add (one held it 13 %
    slow through all three rounds), well short of the 29 % of the wrong clock."""
    from cpumap.measure.backend import Measurer
    from cpumap.measure.settings import BenchSettings

    heavy = ("VFMADD231PD_ZMM_ZMM_ZMM" if "avx512f" in host["isa_flags"]
             else "VFMADD231PD_YMM_YMM_YMM")
    m = Measurer(host, catalogue_df, BenchSettings(), tmp_path / "db", tmp_path / "work",
                 harness_bin=harness.build_harness(tmp_path / "bin"))
    got = m.measure([f"{heavy}*4", "ADDPD_XMM_XMM"], "license")
    # the estimate's own uncertainty beside: the clock may move unseen between two samples
    unc = m.uncertainty(["ADDPD_XMM_XMM"])["ADDPD_XMM_XMM"]
    assert 0.0 <= unc < MAX_UNCERTAINTY
    assert 0.5 * (0.96 - unc) <= got["ADDPD_XMM_XMM"] <= 0.5 * (1.15 + unc)


def test_legacy_sse_mixes_overlap_as_their_vex_twins_do(catalogue_df, host, tmp_path):
    """``ADDPD xmm*4 PMULLD xmm*2`` issues the same μops as its VEX twin ``VADDPD*4 VPMULLD*2``
    (8 on the vector ports: 2.66 cycles on the Emerald Rapids-class guest), but the legacy
    forms read their destination, so the kernel's registers chain its instances. Each form on
    a few registers of its own chained PMULLD's 10-cycle latency: 4.12 cycles (1.55 x the
    twin); over every register of the rotation (``asmgen.rotation``) 3.01 (1.13 x), the chains
    through the shared registers near the ports' bound. Measured in the same batch; the bound
    sits between the two."""
    from cpumap.measure.backend import Measurer
    from cpumap.measure.settings import BenchSettings

    legacy, vex = "ADDPD_XMM_XMM*4 PMULLD_XMM_XMM*2", "VADDPD_XMM_XMM_XMM*4 VPMULLD_XMM_XMM_XMM*2"
    m = Measurer(host, catalogue_df, BenchSettings(), tmp_path / "db", tmp_path / "work",
                 harness_bin=harness.build_harness(tmp_path / "bin"))
    got = m.measure([legacy, vex], "sse-chains")
    unc = m.uncertainty([legacy, vex])
    assert max(unc.values()) < MAX_UNCERTAINTY
    assert got[legacy] <= got[vex] * (1.3 + unc[legacy] + unc[vex])


def test_a_long_request_measures_each_batch_compiled_ahead_in_a_worker(catalogue_df, host,
                                                                       tmp_path):
    """With ``prepare_ahead`` (fit_model's two cores) the next batch of a long request is
    generated and compiled in a worker process while one is measured; a worker that cannot
    prepare it (here: a function it cannot be sent) leaves it to be prepared as before. Both
    ways every batch is measured and stored, and ADDPD xmm reads its 0.5 cycles (two FP add
    pipes on every host cpumap runs on). Run from a script, as a pipeline job runs: a worker
    that imported its parent's main module again would run the script once more."""
    import json
    import sys

    catalogue_df.to_parquet(tmp_path / "forms.parquet")
    (tmp_path / "host.json").write_text(json.dumps(host))
    script = tmp_path / "job.py"
    script.write_text(f"""
import json, sys
from pathlib import Path
import pandas as pd
from cpumap.measure import backend, batch, harness
from cpumap.measure.settings import BenchSettings
from cpumap.store import db
print("main module ran", flush=True)
tmp = Path({str(tmp_path)!r})
backend.MEASURE_CHUNK = 2
bin_ = harness.build_harness(tmp / "bin")
kernels = ["ADDPD_XMM_XMM", "MULPD_XMM_XMM", "ADDPD_XMM_XMM*2 MULPD_XMM_XMM", "SUB_R64_R64"]
out = {{}}
for where in ("worker", "inline"):
    if where == "inline":
        original = batch.prepare_batch
        batch.prepare_batch = lambda *a, **k: original(*a, **k)  # no worker can import it
    said = []
    m = backend.Measurer(json.loads((tmp / "host.json").read_text()),
                         pd.read_parquet(tmp / "forms.parquet"), BenchSettings(),
                         tmp / where / "db", tmp / where / "work", harness_bin=bin_,
                         log=said.append)
    m.prepare_ahead = True
    got = m.measure(kernels, "ahead")
    out[where] = {{"got": got, "said": said, "parts": len(db.part_paths(tmp / where / "db")),
                  "now": m.measured_now, "unc": m.uncertainty(["ADDPD_XMM_XMM"])}}
print(json.dumps(out))
""")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600, check=True)
    assert run.stdout.count("main module ran") == 1
    out = json.loads(run.stdout.splitlines()[-1])
    kernels = ["ADDPD_XMM_XMM", "MULPD_XMM_XMM", "ADDPD_XMM_XMM*2 MULPD_XMM_XMM",
               "SUB_R64_R64"]
    for where, said_here, said_not in (("worker", "compiled in a worker process",
                                        "could not prepare"),
                                       ("inline", "could not prepare it", "in a worker process")):
        got, said = out[where]["got"], out[where]["said"]
        assert sorted(got) == sorted(kernels) and all(v > 0 for v in got.values())
        assert out[where]["parts"] == 2 and out[where]["now"] == 4
        assert sum(said_here in s for s in said) == 2
        assert not any(said_not in s for s in said)
        unc = out[where]["unc"]["ADDPD_XMM_XMM"]
        assert 0.5 * (0.96 - unc) <= got["ADDPD_XMM_XMM"] <= 0.5 * (1.15 + unc)
    assert sum(": generated and compiled" in s for s in out["inline"]["said"]) == 2
