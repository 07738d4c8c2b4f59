"""cpumap.measure.estimate: the CPU's value from repetitions a noisy neighbour disturbed.

The rows are synthetic but shaped like the harness's: f1 runs ``inst`` instances plus a call
overhead, f2 twice the instances; ticks are quantized in 26-tick steps as this guest's TSC
is; a disturbed call is slower by 30-70 % (what the shared host does to integer kernels), a
clean one is exact. The estimate must be the clean value, whatever the share of disturbed
calls, as long as some calls are clean.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from test_db import make_rows

from cpumap.measure import estimate, robust

RATIO = 1.42  # core cycles per TSC tick
STEP = 26  # TSC ticks per step


def _ticks(cycles: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Cycles to TSC ticks as the guest's TSC reports them: 26-tick steps, random phase."""
    t = cycles / RATIO
    return (np.floor(t / STEP + rng.random(t.shape)) * STEP).astype("int64")


def noisy_rows(cpi: float, n: int, disturbed: float, seed: int = 0, inst: int = 20_000,
               overhead: float = 300.0, batch: str = "b0", kernel: str = "A") -> pd.DataFrame:
    """n repetitions of a kernel of ``cpi`` cycles per instance; a share ``disturbed`` of the
    calls (each call independently) runs 30-70 % slow."""
    rng = np.random.default_rng(seed)
    rows = make_rows(batch, {kernel: [cpi] * n})
    slow1 = np.where(rng.random(n) < disturbed, 1.3 + 0.4 * rng.random(n), 1.0)
    slow2 = np.where(rng.random(n) < disturbed, 1.3 + 0.4 * rng.random(n), 1.0)
    c1 = (overhead + cpi * inst) * slow1
    c2 = (overhead + 2 * cpi * inst) * slow2
    rows["instances"] = inst
    rows["ticks1"] = _ticks(c1, rng)
    rows["ticks2"] = _ticks(c2, rng)
    rows["calib_ratio"] = RATIO
    rows["cycles"] = (rows.ticks2 - rows.ticks1) * RATIO
    rows["cycles_per_instance"] = rows.cycles / inst
    return rows


def one(rows: pd.DataFrame) -> pd.Series:
    agg = estimate.aggregate(rows)
    assert list(agg.columns) == estimate.AGG_COLUMNS and len(agg) == 1
    return agg.iloc[0]


@pytest.mark.parametrize("cpi", [0.25, 1.0, 4.0])
@pytest.mark.parametrize("disturbed", [0.0, 0.5, 0.9])
def test_estimate_is_the_clean_value_whatever_the_share_disturbed(cpi, disturbed):
    row = one(noisy_rows(cpi, 256, disturbed, seed=int(cpi * 10 + disturbed * 100)))
    # 26-tick steps on a call of 20,000 instances: 0.1-0.7 % of f2 - f1; the cluster mean
    # averages them
    assert row.cycles_per_instance_est == pytest.approx(cpi, rel=0.004)
    assert not row.loops_disagree
    if disturbed >= 0.5:
        # the typical call shows the neighbour; the estimate does not
        assert row.noise > 0.1
    if disturbed >= 0.9:
        assert row.cycles_per_instance_median > 1.2 * cpi


def test_median_and_min_of_differences_are_what_the_estimate_avoids():
    """With half the calls slowed, the median repetition is far off and the smallest
    repetition difference (a slowed f1 beside a clean f2) is far too small: only estimating
    each call kind on its own gets the CPU's value."""
    rows = noisy_rows(1.0, 256, 0.5, seed=3)
    assert rows.cycles_per_instance.median() > 1.1
    assert rows.cycles_per_instance.min() < 0.8
    assert one(rows).cycles_per_instance_est == pytest.approx(1.0, rel=0.004)


def test_an_interrupted_f1_does_not_pull_the_estimate_down():
    rows = noisy_rows(1.0, 32, 0.0, seed=1)
    rows.loc[5, "ticks1"] += 50_000  # one f1 call interrupted (VM exit, timer tick)
    rows.loc[5, "cycles_per_instance"] = (rows.ticks2[5] - rows.ticks1[5]) * RATIO / 20_000
    assert rows.cycles_per_instance.min() < 0
    row = one(rows)
    assert row.cycles_per_instance_est == pytest.approx(1.0, rel=0.004)
    assert not row.unstable


def test_loops_at_two_speeds_give_the_faster_loop():
    """Measured on Zen 4 (ADD m64,r64 x 4 + 10 vector ALU ops): the U-copy loop at 4.0 cycles
    per instance, the 2U-copy loop at 5.4, so f2 - f1 = 6.8, the speed of neither loop."""
    rows = noisy_rows(4.0, 32, 0.0, overhead=0.0)
    rows["ticks2"] = (5.4 * 2 * 20_000 / RATIO) + 0 * rows.ticks2
    row = one(rows)
    assert row.cycles_per_instance_est == pytest.approx(4.0, rel=0.002)
    assert row.loops_disagree
    assert row.nonlinearity == pytest.approx(6.8 / 5.4 - 1, abs=0.01)
    # an implied overhead (2 f1 - f2) within LOOPS_AGREE of f1: the difference stands (it
    # cancels the call's fixed cost)
    assert robust.per_instance(1.002, 2.0) == (pytest.approx(0.998), False)
    assert robust.per_instance(1.01, 2.0) == (1.0, True)
    assert robust.per_instance(1.0, 2.7) == (1.0, True)


def test_uncertainty_says_when_the_first_half_never_ran_clean():
    """All calls of the first half disturbed, the second half clean: the estimate of all
    repetitions is right, but it moved by more than stable_tol when the second half came in:
    flagged unstable, with the spread as its uncertainty."""
    rows = noisy_rows(1.0, 64, 0.0, seed=5)
    first = rows.index < 32
    rows.loc[first, "ticks1"] = (rows.ticks1[first] * 1.4).astype("int64")
    rows.loc[first, "ticks2"] = (rows.ticks2[first] * 1.4).astype("int64")
    row = one(rows)
    assert row.cycles_per_instance_est == pytest.approx(1.0, rel=0.004)
    assert row.unstable and row.rel_uncertainty > 0.3
    clean = one(noisy_rows(1.0, 64, 0.3, seed=6))
    assert not clean.unstable and clean.rel_uncertainty < estimate.STABLE_TOL


def test_calibration_ratio_from_disturbed_chains():
    """n and 2n dependent-add chains, some slowed: adds over the difference of robust lows."""
    rng = np.random.default_rng(0)
    adds = 20_000
    cal1 = _ticks(np.full(40, adds * 1.0) * np.where(rng.random(40) < 0.3, 1.05, 1.0), rng)
    cal2 = _ticks(np.full(40, 2 * adds * 1.0) * np.where(rng.random(40) < 0.3, 1.05, 1.0), rng)
    assert robust.calib_ratio(cal1, cal2, adds) == pytest.approx(RATIO, rel=0.003)
    assert np.isnan(robust.calib_ratio(cal2, cal1, adds))


@pytest.mark.parametrize("slowed", ["n", "2n"])
def test_calibration_ratio_when_every_sample_of_one_chain_is_slowed(slowed):
    """Four samples (a small batch), every one of one chain 7 % slow, the other chain clean:
    the difference of the fastest samples is then 7-12 % off (CI, 2026-11-24: a latency-1
    add chain measured at 0.91 cycles per add); the physical bounds (a latency-1 add per
    cycle at most, a fixed cost of at most CALIB_OVERHEAD) keep it within that fraction."""
    rng = np.random.default_rng(1)
    adds, overhead = 20_000, 50.0
    slow1, slow2 = (1.07, 1.0) if slowed == "n" else (1.0, 1.07)
    cal1 = _ticks(np.full(4, adds + overhead) * slow1, rng)
    cal2 = _ticks(np.full(4, 2 * adds + overhead) * slow2, rng)
    naive = adds / (cal2.min() - cal1.min())
    assert abs(naive / RATIO - 1) > 0.07  # what the difference alone says
    assert robust.calib_ratio(cal1, cal2, adds) == pytest.approx(
        RATIO, rel=robust.CALIB_OVERHEAD)


def test_robust_low_averages_the_timer_steps_and_ignores_the_tail():
    x = np.array([1000, 1026, 1000, 1026, 1026, 1400, 1700, 2000])
    assert robust.robust_low(x, step=26) == pytest.approx(1015.6)
    assert robust.robust_low(x) == 1000  # no step given: 0.3 % of 1000 is 3 ticks
    assert np.isnan(robust.robust_low(np.array([])))


def test_one_sample_faster_than_all_others_does_not_set_the_value():
    """A lone fast call (a clock spike inside a run converted at the slower clock around it)
    is not the kernel; two that agree are."""
    x = np.array([900, 1000, 1026, 1000, 1400, 2000])
    assert robust.robust_low(x, step=26) == pytest.approx(1008.67, rel=1e-4)
    assert robust.robust_low(np.append(x, 901), step=26) == 900.5
    assert robust.robust_low(np.array([900.0])) == 900  # alone, it is all there is


def test_simulated_rows_are_their_own_value():
    rows = make_rows("b0", {"A": [2.5]})
    rows[["ticks1", "ticks2"]] = 0
    row = one(rows)
    assert row.cycles_per_instance_est == 2.5 and row.rel_uncertainty == 0.0


def test_monitor_rows_are_kept_apart():
    kernel = noisy_rows(1.0, 32, 0.0)
    mon = pd.concat([noisy_rows(0.25, 32, 0.6, seed=s, batch=f"b{s}", kernel="ADD")
                     .assign(role="monitor", timestamp=pd.Timestamp(f"2026-11-24T05:0{s}Z"))
                     for s in (1, 2)])
    rows = pd.concat([kernel, mon], ignore_index=True)
    agg = estimate.aggregate(rows)
    assert agg.kernel.tolist() == ["A"]
    table = estimate.monitor_table(rows)
    assert table.batch_id.tolist() == ["b1", "b2"]
    assert np.allclose(table.cycles_per_instance_est, 0.25, rtol=0.005)
    assert (table.noise > 0.1).all()


def test_rounds_replicate_the_best_value():
    """Three rounds seconds apart: one ran inside a burst (every call 30 % slow); the other
    two reached the CPU's value and agree: the estimate is that value, certain. When only one
    round reached its value, the uncertainty says how far the next round was."""
    parts = [noisy_rows(1.0, 16, 0.0, seed=s).assign(round=s) for s in range(3)]
    for col in ("ticks1", "ticks2"):
        parts[0][col] = (parts[0][col] * 1.3).astype("int64")
    row = one(pd.concat(parts, ignore_index=True))
    assert row.cycles_per_instance_est == pytest.approx(1.0, rel=0.004)
    assert not row.unstable and row.rel_uncertainty < estimate.STABLE_TOL
    for col in ("ticks1", "ticks2"):
        parts[1][col] = (parts[1][col] * 1.2).astype("int64")
    row = one(pd.concat(parts, ignore_index=True))
    assert row.cycles_per_instance_est == pytest.approx(1.0, rel=0.004)
    assert row.unstable and row.rel_uncertainty == pytest.approx(0.2, rel=0.05)


def test_palmed_leaves_out_uncertain_kernels_but_not_singletons(tmp_path):
    """The Measurer behind Palmed answers a kernel only if its uncertainty is within the
    model's tolerance; a singleton is answered whatever its uncertainty (its form would
    otherwise drop out of the model)."""
    from test_db import PARAMS

    from cpumap.measure.backend import Measurer
    from cpumap.store import db

    def uncertain(kernel: str, batch: str) -> pd.DataFrame:
        parts = [noisy_rows(1.0, 16, 0.0, seed=s, kernel=kernel, batch=batch).assign(round=s)
                 for s in range(2)]
        for col in ("ticks1", "ticks2"):
            parts[1][col] = (parts[1][col] * 1.2).astype("int64")
        return pd.concat(parts, ignore_index=True)

    rows = pd.concat([uncertain("A", "b0"), uncertain("A B", "b1"),
                      noisy_rows(2.0, 16, 0.0, kernel="C", batch="b2")], ignore_index=True)
    for b, g in rows.groupby("batch_id"):
        db.append(tmp_path, g.reset_index(drop=True), str(b))
    m = Measurer({"machine_id": rows.machine_id[0]}, pd.DataFrame(), PARAMS, tmp_path,
                 tmp_path / "work", measure=False, max_uncertainty=0.05)
    m.params_id, m.version = db.params_id(PARAMS), "1"
    known = m.known()
    assert known == {"A": pytest.approx(1.0, rel=0.004), "C": pytest.approx(2.0, rel=0.004)}
    assert m.too_uncertain == {"A B"}


def test_database_aggregated_part_by_part_equals_all_at_once(tmp_path, monkeypatch):
    """The Measurer reads a database one part at a time (aggregate_db): the table is the one
    aggregating every row at once gives, for a kernel measured in two parts (its rows pooled),
    kernels of one part, a failed kernel (tried, not estimated), calibration samples (the
    batches' shared clock ratio), the host monitor's kernel in two batches, and rows of
    another machine or harness left out; read again from the estimates kept for each part
    (reading only the parts that share a kernel other than the monitor's), after one of
    those files was damaged, and after a part was
    written again; the noise record (monitor_db) and why a kernel failed (Measurer.errors)
    from the same database."""
    from test_db import PARAMS, make_rows

    from cpumap.measure.backend import aggregate_db
    from cpumap.measure.dbestimates import monitor_db
    from cpumap.store import db

    def calibrated(rows: pd.DataFrame, ratio: float) -> pd.DataFrame:
        rows = rows.copy()
        every = rows.index % 4 == 0
        rows["cal_adds"] = np.where(every, 50_000.0, np.nan)
        rows["cal1"] = np.where(every, np.round(50_000 / ratio) + 13 * (rows.index % 3), np.nan)
        rows["cal2"] = np.where(every, np.round(100_000 / ratio) + 7 * (rows.index % 5),
                                np.nan)
        return rows

    parts = {
        "b0": calibrated(pd.concat([noisy_rows(1.0, 24, 0.3, seed=1, batch="b0"),
                                    noisy_rows(0.5, 24, 0.5, seed=2, batch="b0",
                                               kernel="B")], ignore_index=True), 1.42),
        "b1": calibrated(pd.concat([noisy_rows(1.0, 24, 0.6, seed=3, batch="b1"),
                                    make_rows("b1", {"F": [1.0]}, status="failed")],
                                   ignore_index=True), 1.425),
        "b2": calibrated(noisy_rows(2.0, 16, 0.0, seed=4, batch="b2", kernel="C"), 1.43),
        "b3": noisy_rows(3.0, 16, 0.0, seed=5, batch="b3", kernel="D").assign(
            harness_version="2"),
        "b4": noisy_rows(3.0, 16, 0.0, seed=6, batch="b4", kernel="E").assign(
            machine_id="amd-other-f19-m11-00000000"),
    }
    # the host monitor's kernel M in two batches, as in every batch, and measured as a
    # kernel in a third
    for b, seed, role in (("b0", 7, "monitor"), ("b2", 8, "monitor"), ("b1", 9, "kernel")):
        parts[b] = pd.concat([parts[b], noisy_rows(0.25, 12, 0.2, seed=seed, batch=b,
                                                   kernel="M").assign(role=role)],
                             ignore_index=True)
    for b, rows in parts.items():
        db.append(tmp_path, rows, b)
    machine, pid = parts["b0"].machine_id[0], db.params_id(PARAMS)
    every = pd.concat([parts[b] for b in ("b0", "b1", "b2")], ignore_index=True)
    whole = estimate.aggregate(db.conform(every), estimate.STABLE_TOL)
    assert estimate.batch_ratios(db.conform(every))  # the calibration samples were used

    def check(expected: pd.DataFrame) -> None:
        agg, tried, _ = aggregate_db(tmp_path, machine, pid, "1", estimate.STABLE_TOL)
        pd.testing.assert_frame_equal(
            agg.sort_values("kernel").reset_index(drop=True),
            expected.sort_values("kernel").reset_index(drop=True), check_dtype=False)
        assert sorted(agg.kernel) == ["A", "B", "C", "M"] and tried == {"A", "B", "C", "F", "M"}

    check(whole)
    # why a kernel failed, as its rows say (read four columns a part at a time)
    from cpumap.measure.backend import Measurer
    m = Measurer({"machine_id": machine}, pd.DataFrame(), PARAMS, tmp_path, tmp_path / "w")
    assert m.errors(["F", "A", "Z"]) == {"F": "SIGILL"}
    # the noise record of the same database (every parameter set and harness of the machine)
    mine = db.conform(pd.concat([parts[b] for b in ("b0", "b1", "b2", "b3")],
                                ignore_index=True))
    noise = estimate.monitor_table(mine, estimate.STABLE_TOL, estimate.batch_ratios(mine))
    assert len(noise) == 2
    for _ in range(2):  # from the rows, then from the kept files
        pd.testing.assert_frame_equal(monitor_db(tmp_path, machine, estimate.STABLE_TOL),
                                      noise, check_dtype=False)
    # read again, from the files kept for each part (db/.estimates): the same table; only
    # the parts holding rows of a kernel measured in another part are read, for those rows
    # (A in b0 and b1, M in b1), not b2, whose shared kernel is only its monitor's there
    kept = sorted(p.name for p in (tmp_path / ".estimates").iterdir())
    assert kept and len(db.part_paths(tmp_path)) == 5
    reads: list[str] = []
    real = db.read_part
    monkeypatch.setattr(db, "read_part",
                        lambda path, *a, **k: reads.append(path.stem) or real(path, *a, **k))
    check(whole)
    assert sorted(reads) == ["part-b0", "part-b1"]
    # a kept file that cannot be read is made again; a part written again is read again
    next((tmp_path / ".estimates").glob("part-b2.estimates.*")).write_bytes(b"not parquet")
    reads.clear()
    check(whole)
    assert sorted(reads) == ["part-b0", "part-b1", "part-b2"]
    # so are the monitor's kept rows (b2's shared kernel): read in full once, then not
    next((tmp_path / ".estimates").glob("part-b2.monitor.*")).write_bytes(b"not parquet")
    for opened in (["part-b0", "part-b1", "part-b2"], ["part-b0", "part-b1"]):
        reads.clear()
        check(whole)
        assert sorted(reads) == opened
    faster = parts["b2"].assign(ticks1=(parts["b2"].ticks1 * 0.9).round().astype("int64"),
                                ticks2=(parts["b2"].ticks2 * 0.9).round().astype("int64"))
    db.append(tmp_path, faster, "b2", replace=True)
    every = pd.concat([parts["b0"], parts["b1"], faster], ignore_index=True)
    check(estimate.aggregate(db.conform(every), estimate.STABLE_TOL))
    assert sorted(p.name for p in (tmp_path / ".estimates").iterdir()) != kept


def test_calibration_core_keeps_every_batch_ratio_exactly():
    """The Measurer keeps only the calibration rows a clock ratio can use (each batch's
    near-fastest chains and its earliest row): ``batch_ratios`` gives the same values, to the
    bit, from a fraction of the rows. Batch "z" starts first (one slow row at minute 0, the
    rest at minute 10) and "a" at minute 5: dropping z's first row would put "a" first and
    pool z with it."""
    rng = np.random.default_rng(3)
    frames = []
    for b, ratio, minutes in (("z", 1.420, [0] + [10] * 199), ("a", 1.425, [5] * 200),
                              ("c", 1.300, [20] * 200)):
        n = len(minutes)
        slow = np.where(rng.random((2, n)) < 0.6, 1.3 + 0.4 * rng.random((2, n)), 1.0)
        slow[:, 0] = 1.5
        frames.append(pd.DataFrame({
            "machine_id": "m", "params_id": "p", "batch_id": b, "cal_adds": 50_000.0,
            "cal1": np.round(50_000 / ratio * slow[0]) + rng.integers(0, 200, n),
            "cal2": np.round(100_000 / ratio * slow[1]) + rng.integers(0, 200, n),
            "timestamp": pd.Timestamp("2026-01-02T03:00:00Z")
            + pd.to_timedelta(minutes, unit="min")}))
    cal = pd.concat(frames, ignore_index=True)
    core = estimate.calibration_core(cal)
    full, kept = estimate.batch_ratios(cal), estimate.batch_ratios(core)
    assert kept == full and len(full) == 3
    assert len(core) < len(cal) / 4
    # the order matters here: without z's first row the ratios differ
    later = estimate.batch_ratios(core[core.timestamp > cal.timestamp.min()])
    assert later[("z", "p")] != full[("z", "p")]


def test_a_repetition_is_converted_at_the_clock_it_ran_at():
    """Rows whose ``local_ratio`` is slower than the batch's pooled ratio by more than
    CLOCK_AGREE are converted at it (an Intel licence clock: 0.96 against 1.24 cycles per tick);
    within CLOCK_AGREE, or faster, the pooled ratio stands (more samples, the same clock). Not
    for a kernel whose run proven at the batch's clock (both samples, ``run_ratio_low``) took
    no more ticks than its runs the samples put slower: D ran at 1.24 throughout while the
    samples of its other runs read 0.96 (chains a neighbour slowed), and converted at 0.96 it
    would read 0.387, under what it is. E's proven run was slowed by a neighbour (40 % more
    ticks than at 1.24) and its other runs took fewer ticks than that: their clock stands."""
    rows = []
    for kernel, ran_at, local in (("A", 0.96, 0.96), ("B", 1.24, 1.235), ("C", 1.24, 1.30),
                                  ("D", 1.24, 0.96), ("E", 0.96, 0.96)):
        r = make_rows("b0", {kernel: [0.5] * 16})
        ticks = np.round(0.5 * 20_000 / ran_at)
        first = r.index < 4  # the kernel's first run
        if kernel == "E":  # proven at 1.24 but slowed by a neighbour
            ticks = np.where(first, np.round(1.4 * 0.5 * 20_000 / 1.24), ticks)
        r["instances"], r["ticks1"], r["ticks2"] = 20_000, ticks + 500, 2 * ticks + 500
        r["local_ratio"] = np.where(first & (kernel == "E"), 1.24, local)
        # A's runs after its first: the clock already slow; D's and E's first run proven
        r["run_ratio_low"] = np.where(first & (kernel in "DE"), 1.24, min(local, 1.2))
        rows.append(r)
    rows = pd.concat(rows, ignore_index=True)
    every = rows.index % 4 == 0  # the batch's fastest chains: 1.24 cycles per tick
    rows["cal_adds"] = np.where(every, 50_000.0, np.nan)
    rows["cal1"] = np.where(every, np.round(50_000 / 1.24), np.nan)
    rows["cal2"] = np.where(every, np.round(100_000 / 1.24), np.nan)
    agg = estimate.aggregate(rows).set_index("kernel").cycles_per_instance_est
    assert agg["A"] == pytest.approx(0.5, rel=1e-3)
    plain = estimate.aggregate(rows.drop(columns="local_ratio")).set_index("kernel")
    assert plain.cycles_per_instance_est["A"] == pytest.approx(0.5 * 1.24 / 0.96, rel=1e-3)
    assert agg["B"] == plain.cycles_per_instance_est["B"] == pytest.approx(0.5, rel=1e-3)
    assert agg["C"] == plain.cycles_per_instance_est["C"]
    assert agg["D"] == plain.cycles_per_instance_est["D"] == pytest.approx(0.5, rel=1e-3)
    unproven = estimate.aggregate(rows.drop(columns="run_ratio_low")).set_index("kernel")
    assert unproven.cycles_per_instance_est["D"] == pytest.approx(0.5 * 0.96 / 1.24, rel=1e-3)
    assert unproven.cycles_per_instance_est["A"] == agg["A"]
    assert agg["E"] == pytest.approx(0.5, rel=1e-3)
    assert plain.cycles_per_instance_est["E"] == pytest.approx(0.5 * 1.24 / 0.96, rel=1e-3)


def test_a_value_only_one_licence_round_reached_is_not_taken():
    """Three rounds at the 2.4 GHz licence clock (0.96 cycles per tick, the batch's 1.24).
    In round 0 of kernel A the clock rose to 3.1 GHz between the samples, both of which read
    2.4: converted at 0.96 it reads 1.24/0.96 too fast, and the two other rounds agree on the
    CPU's value: that value stands, certain. B's round 0 is faster than any clock explains
    (the CPU itself ran it faster): it stands, with the spread as its uncertainty. The same
    rounds converted at the batch's clock keep the fastest round: no clock makes a kernel
    read faster than it is there."""
    parts = []
    for kernel, fast in (("A", 1.24 / 0.96), ("B", 1.8)):
        for rnd in range(3):
            r = make_rows("b0", {kernel: [2.0] * 16})
            ticks = np.round(2.0 * 20_000 / 0.96 / (fast if rnd == 0 else 1.0))
            r["instances"], r["ticks1"], r["ticks2"] = 20_000, ticks + 500, 2 * ticks + 500
            r["local_ratio"], r["run_ratio_low"], r["round"] = 0.96, 0.95, rnd
            parts.append(r)
    rows = pd.concat(parts, ignore_index=True)
    every = rows.index % 16 == 0
    rows["cal_adds"] = np.where(every, 50_000.0, np.nan)
    rows["cal1"] = np.where(every, np.round(50_000 / 1.24), np.nan)
    rows["cal2"] = np.where(every, np.round(100_000 / 1.24), np.nan)
    agg = estimate.aggregate(rows).set_index("kernel")
    assert agg.cycles_per_instance_est["A"] == pytest.approx(2.0, rel=1e-3)
    assert not agg.unstable["A"]
    assert agg.cycles_per_instance_est["B"] == pytest.approx(2.0 / 1.8, rel=1e-3)
    assert agg.unstable["B"] and agg.rel_uncertainty["B"] == pytest.approx(0.8, rel=0.01)
    batch = estimate.aggregate(rows.drop(columns="local_ratio")).set_index("kernel")
    # round 0 at 1.24: 2.0; the two others, converted at 1.24, 2.0 * 1.24 / 0.96
    assert batch.cycles_per_instance_est["A"] == pytest.approx(2.0, rel=1e-3)
    assert batch.unstable["A"]


def test_repeat_batches_stay_apart_and_are_read_back(tmp_path):
    """A second measurement on purpose (stage 'repeat-...') is not pooled into the kernel's
    estimate, and Measurer.again answers from it without measuring when it is there (a
    rebuild from the database)."""
    from test_db import PARAMS

    from cpumap.measure.backend import Measurer
    from cpumap.store import db

    first = noisy_rows(1.0, 16, 0.0, seed=1, batch="validation-s1-aaaa")
    second = noisy_rows(0.9, 16, 0.0, seed=2, batch="repeat-validation-s1-bbbb")
    db.append(tmp_path, first, "validation-s1-aaaa")
    db.append(tmp_path, second, "repeat-validation-s1-bbbb")
    m = Measurer({"machine_id": first.machine_id[0]}, pd.DataFrame(), PARAMS, tmp_path,
                 tmp_path / "work", measure=False)
    m.params_id, m.version = db.params_id(PARAMS), "1"
    assert m.known() == {"A": pytest.approx(1.0, rel=0.004)}
    assert m.again(["A"], "repeat-validation-s1") == {"A": pytest.approx(0.9, rel=0.004)}
    assert m.again(["A"], "repeat-other") == {}  # nothing of that stage, measuring off
    with pytest.raises(ValueError, match="repeat"):
        m.again(["A"], "validation-s1")


def test_a_batch_keeps_its_estimates_as_later_batches_come(tmp_path, monkeypatch):
    """A batch's clock ratio pools the samples of the earlier batches that agree with it
    (within CLOCK_AGREE), never the later ones: the estimate the Measurer returns as it
    measures a batch is the one the database gives after more batches came, and the earlier
    batches' estimates stay as they were (a rebuild from the database gives the same model)."""
    from test_db import PARAMS, make_rows

    from cpumap.measure.backend import Measurer, aggregate_db
    from cpumap.store import db

    def batch(name: str, kernel: str, cpi: float, ratio: float, minute: int,
              chains: float | None = None) -> pd.DataFrame:
        """Rows of a batch run at clock ``ratio``, its calibration chains at ``chains``."""
        rows = make_rows(name, {kernel: [cpi] * 16})
        ticks = np.round(cpi * 200_000 / ratio)
        ratio = chains or ratio
        rows["ticks1"], rows["ticks2"] = ticks, 2 * ticks
        every = rows.index % 4 == 0
        rows["cal_adds"] = np.where(every, 50_000.0, np.nan)
        rows["cal1"] = np.where(every, np.round(50_000 / ratio) + 3 * (rows.index % 3), np.nan)
        rows["cal2"] = np.where(every, np.round(100_000 / ratio) + 5 * (rows.index % 2), np.nan)
        rows["timestamp"] = pd.Timestamp("2026-01-02T03:00:00Z") + pd.Timedelta(minutes=minute)
        return rows

    # b1's chains slowed by a neighbour (its own ratio 0.7 % low): pooled with b0's; b2,
    # measured after, is faster still, and within CLOCK_AGREE of both
    b0, b1 = batch("b0", "A", 1.0, 1.43, 0), batch("b1", "C", 2.0, 1.43, 1, chains=1.42)
    b2 = batch("b2", "D", 3.0, 1.435, 2)
    db.append(tmp_path, b0, "b0")
    key = (b0.machine_id[0], db.params_id(PARAMS), "1", estimate.STABLE_TOL)
    agg = aggregate_db(tmp_path, *key)[0]
    before = dict(zip(agg.kernel, agg.cycles_per_instance_est, strict=True))
    m = Measurer({"machine_id": b0.machine_id[0]}, pd.DataFrame(), PARAMS, tmp_path,
                 tmp_path / "work")
    m.params_id, m.version = db.params_id(PARAMS), "1"

    def measure_new(todo: list[str], stage: str, prepared=None) -> pd.DataFrame:
        assert todo == ["C"] and prepared is None  # one batch: nothing prepared ahead
        db.append(tmp_path, b1, "b1")
        return db.conform(b1)

    monkeypatch.setattr(m, "_measure_new", measure_new)
    got = m.measure(["A", "C"], "stage")
    assert got["A"] == before["A"]
    # pooled with b0: the neighbour's 0.7 % is gone (its own ratio says 2.0 x 1.42/1.43)
    own = estimate.aggregate(db.conform(b1), estimate.STABLE_TOL).cycles_per_instance_est[0]
    assert got["C"] == pytest.approx(2.0, rel=1e-3) and own == pytest.approx(1.986, rel=1e-3)
    db.append(tmp_path, b2, "b2")
    agg = aggregate_db(tmp_path, *key)[0]
    after = dict(zip(agg.kernel, agg.cycles_per_instance_est, strict=True))
    assert after["A"] == got["A"] and after["C"] == got["C"]  # exactly: b2 came later
    assert after["D"] == pytest.approx(3.0, rel=1e-3)


def test_a_large_request_is_measured_and_stored_in_several_batches(tmp_path, monkeypatch):
    """More kernels than MEASURE_CHUNK go to consecutive batches, each stored as it ends (the
    memory of one batch's rows stays bounded), with the estimates one batch gives."""
    import json

    from cpumap.measure import backend
    from cpumap.measure.settings import BenchSettings
    from cpumap.model.portmap import synthetic_mapping
    from cpumap.model.simulate import SimulatedMachine
    from cpumap.store import db

    path = tmp_path / "sim.json"
    path.write_text(json.dumps(synthetic_mapping(5, 6, seed=0)))
    sim = SimulatedMachine(path, noise=0.02, seed=3)
    kernels = [f"{f}*{n}" if n > 1 else f for f in sim.forms for n in (1, 2)][:5]

    def measurer(where: str) -> backend.Measurer:
        return backend.Measurer({"machine_id": "sim"}, pd.DataFrame(), BenchSettings(),
                                tmp_path / where, tmp_path / "work", sim=sim)

    whole = measurer("one").measure(kernels, stage="s")
    monkeypatch.setattr(backend, "MEASURE_CHUNK", 2)
    chunked = measurer("three")
    assert chunked.measure(kernels, stage="s") == whole and len(whole) == 5
    assert len(db.part_paths(tmp_path / "three")) == 3 and chunked.measured_now == 5
    assert len(db.part_paths(tmp_path / "one")) == 1
    assert measurer("three").measure(kernels, stage="s") == whole  # from the database


def test_each_kernels_clocks_are_listed_sorted_once():
    """The aggregate's ``clock`` column: every clock a kernel's rows ran under, sorted and
    once each ("" for none); computed from the distinct pairs, not by a call per kernel."""
    gid = np.array([0, 0, 1, 1, 1, 2, 3, 3])
    clock = pd.Series(["tsc", "tsc", "tsc", "papi", None, None, "papi", "papi"])
    assert estimate._clocks(clock, gid, 5).tolist() == ["tsc", "papi,tsc", "", "papi", ""]


def _files_of_a_prepared_batch(kernels, forms, machine, bench, so_path):
    """What the worker leaves of a batch it prepared (module level: sent to the worker)."""
    so_path.parent.mkdir(parents=True, exist_ok=True)
    so_path.write_bytes(b"\0" * 1024)


def test_a_batch_that_raises_leaves_no_batch_prepared_ahead_on_disk(tmp_path, monkeypatch):
    """A long request whose batch raises while measured: the next batch, compiled ahead in
    the worker, is removed (a 5,000-kernel batch's directory is a few hundred MB), the
    failing batch's own directory is kept (for its error), and the error reaches the caller."""
    from cpumap.measure import backend, batch
    from cpumap.measure.settings import BenchSettings

    def measure_new(self, todo, stage, prepared=None):
        assert (tmp_path / "work" / m._batch_id(todo, "stage")).is_dir()  # prepared ahead
        raise RuntimeError(f"harness died on {todo[0]}")

    monkeypatch.setattr(backend, "MEASURE_CHUNK", 2)
    monkeypatch.setattr(batch, "prepare_batch", _files_of_a_prepared_batch)
    monkeypatch.setattr(backend.Measurer, "_measure_new", measure_new)
    m = backend.Measurer({"machine_id": "m"}, pd.DataFrame(), BenchSettings(), tmp_path / "db",
                         tmp_path / "work")
    m.prepare_ahead = True
    kernels = ["ADD_R64_R64", "SUB_R64_R64", "XOR_R64_R64", "AND_R64_R64", "OR_R64_R64"]
    with pytest.raises(RuntimeError, match="harness died on ADD_R64_R64"):
        m.measure(kernels, "stage")
    time.sleep(0.5)  # nothing left running to write the next batch after the error came
    first = m._batch_id(kernels[:2], "stage")
    assert [p.name for p in (tmp_path / "work").iterdir()] == [first]
