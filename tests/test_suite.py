"""The real-kernel suite: builds, driver CLI, closed CFGs, exact counts on real kernels."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cpumap.evaluate import blocks, counting, suite

KERNELS = suite.kernels()


def test_at_least_twelve_kernels_and_three_flagsets():
    assert len(KERNELS) >= 12
    assert {"O2", "O3-native", "O3-v3"} <= set(suite.FLAGSETS)
    assert suite.split_benchmark("gemm_naive.O3-native") == ("gemm_naive", "O3-native")
    with pytest.raises(ValueError):
        suite.split_benchmark("nodot")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every kernel with every flag set (about 0.2 s each)."""
    out = tmp_path_factory.mktemp("suite")
    return {f"{k}.{f}": suite.build_benchmark(k, f, out / f"{k}.{f}")
            for k in KERNELS for f in suite.FLAGSETS}


def test_build_records_compiler_and_flags(built):
    meta = json.loads((built["daxpy.O3-v3"].parent / "daxpy.O3-v3.json").read_text())
    assert meta["flags"] == ["-O3", "-march=x86-64-v3"]
    assert meta["compiler"].startswith("gcc")
    assert meta["function"] == "kernel_daxpy"
    assert "-fno-tree-loop-distribute-patterns" in meta["commands"][0]


def test_driver_contract_and_identical_checksums(built):
    for k in KERNELS:
        sums = set()
        for f in suite.FLAGSETS:
            # min_ticks=0: exactly 3 calls, so every flag set's checksum covers the same work
            out = suite.measure_kernel(built[f"{k}.{f}"], reps=3, min_ticks=0)
            assert out["kernel"] == k and out["reps"] == 3 and len(out["ticks"]) == 3
            assert out["inner"] == 1
            assert out["clock"] in ("papi", "tsc-calibrated")
            assert (out["cycles_per_tick"] is None) == (out["clock"] == "papi")
            assert 0 < out["bytes_footprint"] <= 32 * 1024, "default size is L1-resident"
            assert out["cycles_min"] == min(out["cycles"]) > 0
            sums.add(out["checksum"])
        # no -ffast-math: every flag set computes the same numbers
        assert len(sums) == 1, (k, sums)


def test_min_ticks_times_back_to_back_calls_and_reports_per_call(built):
    """A warm repetition of a short kernel times R calls (>= min_ticks ticks); cycles are per
    call, so they agree with timing single calls, minus the TSC's coarse steps. Each is the
    fastest of 3 processes: a whole process can run slow on this host (seen: 1.7x), and a
    neighbour's burst can outlast all of them (seen: 1.45x), so both kinds are sampled in
    turn, up to 4 times, and compared by their fastest samples. A neighbour that holds the
    ALU for minutes slows a window of 50,000 ticks more than the luckiest single call (seen
    on the Emerald Rapids-class guest beside a model fit: 824 against 608 cycles, 1.36x
    after 4 tries), so the bound is the host's stated worst, 70 % slow: what the test is
    for, a per-call figure not divided by the right number of calls, is off by a factor of
    ``inner`` (about 60 here), far outside it either way."""
    one_min = many_min = float("inf")
    for _ in range(4):
        one = suite.measure_kernel(built["triad.O2"], reps=5, min_ticks=0, processes=3)
        many = suite.measure_kernel(built["triad.O2"], reps=5, min_ticks=50_000, processes=3)
        assert one["inner"] == 1 and many["inner"] > 1
        assert min(many["ticks"]) >= 50_000 * 0.5  # a repetition lasts about min_ticks or more
        per_call_ticks = min(many["ticks"]) / many["inner"]
        if many["clock"] != "papi":
            assert many["cycles_min"] == pytest.approx(
                per_call_ticks * many["cycles_per_tick"], rel=1e-3)
        one_min = min(one_min, one["cycles_min"])
        many_min = min(many_min, many["cycles_min"])
        # single calls are quantised to the TSC step, not slower by more than a step or two
        # plus the per-call loop; many calls are never slower per call than the fastest single
        # one by more than the host's interference
        if many_min <= one_min * 1.25:
            break
    assert one_min * 0.5 <= many_min <= one_min * 1.7


def test_cycles_record_keeps_the_fastest_of_several_processes(built):
    """A whole process can run slow on a shared host; the record is the fastest process's,
    every process's minimum listed beside it."""
    rec = suite.cycles_record("daxpy.O3-v3", built["daxpy.O3-v3"], reps=2, min_ticks=20_000,
                              processes=3)
    assert rec["available"] and rec["processes"] == 3 and len(rec["process_cycles_min"]) == 3
    assert rec["cycles_min"] == min(rec["process_cycles_min"]) == min(rec["cycles"]) > 0
    assert rec["reps"] == 2 and rec["args"][rec["args"].index("--reps") + 1] == "2"


def test_driver_n_scales_and_bad_arguments_exit_2(built):
    small = suite.measure_kernel(built["triad.O2"], n=100, reps=1)
    big = suite.measure_kernel(built["triad.O2"], n=100_000, reps=1)
    assert small["n"] == 100 and small["bytes_footprint"] == 3 * 8 * 100
    assert big["bytes_footprint"] == 3 * 8 * 100_000
    for bad in (["--n", "0"], ["--reps", "x"], ["--what"]):
        proc = subprocess.run([str(built["triad.O2"]), *bad], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stdout == ""
    cold = suite.measure_kernel(built["dot.O2"], reps=2, cold=True, cpu=0)
    assert cold["reps"] == 2


def test_an_untimed_run_says_so_and_computes_the_same(built):
    """``--untimed`` (the runs that only count, under Valgrind or gdb): no clock, no cycles,
    the same kernel work (checksum) as a timed run."""
    args = suite.driver_args(1000, 2, untimed=True)
    assert args[-1] == "--untimed"
    proc = subprocess.run([str(built["dot.O2"]), *args], capture_output=True, text=True,
                          check=True)
    out = json.loads(proc.stdout)
    timed = suite.measure_kernel(built["dot.O2"], n=1000, reps=2)
    assert out["clock"] == "untimed" and out["cycles_per_tick"] is None
    assert out["cycles"] == [] and out["reps"] == 2 and len(out["ticks"]) == 2
    assert out["checksum"] == timed["checksum"]


def test_kernels_are_single_closed_functions_without_calls(built):
    for bench, exe in built.items():
        k, _ = suite.split_benchmark(bench)
        bl = blocks.extract_blocks(exe, suite.function_name(k))
        assert not any(b.open_end for b in bl), bench
        assert not any(b.terminator.startswith("call") for b in bl), bench
        assert sum(b.exits for b in bl) >= 1


@pytest.mark.parametrize("bench", ["daxpy.O2", "histogram.O2", "gemm_blocked.O3-native",
                                   "cond_reduce.O3-v3"])
def test_real_kernel_counts_derived_equal_full(built, bench):
    k, _ = suite.split_benchmark(bench)
    fn = suite.function_name(k)
    bl = blocks.extract_blocks(built[bench], fn)
    args = suite.benchmark_args(bench, n_map={k: 64} if k != "gemm_blocked" else {k: 8})
    res = counting.count(built[bench], fn, bl, args, plain=False)
    full = counting.count(built[bench], fn, bl, args, all_blocks=True, plain=False)
    assert res.counts == full.counts
    if bench == "daxpy.O2":  # scalar loop: the block with the multiply runs n times
        body = [b for b in bl if any(i.startswith("mulsd") for i in b.insns)]
        assert [res.counts[b.block_id] for b in body] == [64]


def test_user_binary_without_driver(tmp_path):
    from cfg_util import build

    exe = build(tmp_path, ["nested.c"], ["-O2"], "nested")
    user = {"name": "mine", "binary": str(exe), "function": "kernel_nested",
            "args": ["3", "4"]}
    assert suite.benchmark_function("mine", user) == "kernel_nested"
    assert suite.benchmark_args("mine", user) == ["3", "4"]
    rec = suite.cycles_record("mine", exe, user)
    assert rec["available"] is False and "driver" in rec["reason"]


def _fake_driver(tmp_path, minima: list[float]):
    """An executable that prints the driver's JSON line, its fastest repetition the next of
    ``minima`` on every run (a process's life on a shared host, scripted)."""
    state = tmp_path / "runs"
    state.write_text("0")
    script = tmp_path / "driver"
    script.write_text(f"""#!{sys.executable}
import json, pathlib
p = pathlib.Path({str(state)!r})
k = int(p.read_text()); p.write_text(str(k + 1))
m = {minima!r}[k]
print(json.dumps({{"kernel": "k", "n": 1, "reps": 2, "clock": "tsc-calibrated",
                  "cycles_per_tick": 1.0, "ticks": [m, m * 1.1], "cycles": [m, m * 1.1],
                  "bytes_footprint": 8, "checksum": 0.0}}))
""")
    script.chmod(0o755)
    return script


def test_more_processes_until_the_two_fastest_agree(tmp_path, monkeypatch):
    """Three processes slowed by one long burst disagree: more run until two agree; a kernel
    whose processes never agree is flagged, its fastest still kept."""
    monkeypatch.setattr(suite, "PROCESS_PAUSE_S", 0.0)
    burst = _fake_driver(tmp_path, [856.0, 1059.0, 1146.0, 539.0, 540.0, 900.0])
    rec = suite.run_driver(burst, [], 10, processes=3, max_processes=8)
    assert rec["processes"] == 5 and rec["settled"] and rec["cycles_min"] == 539.0
    assert rec["process_cycles_min"] == [856.0, 1059.0, 1146.0, 539.0, 540.0]
    quiet = _fake_driver(tmp_path, [539.0, 539.5, 700.0, 100.0])
    rec = suite.run_driver(quiet, [], 10, processes=3, max_processes=8)
    assert rec["processes"] == 3 and rec["settled"]  # no extra process when two agree
    never = _fake_driver(tmp_path, [900.0, 1000.0, 1100.0, 1200.0])
    rec = suite.run_driver(never, [], 10, processes=3, max_processes=4)
    assert rec["processes"] == 4 and not rec["settled"] and rec["cycles_min"] == 900.0
    one = _fake_driver(tmp_path, [700.0, 100.0])
    assert suite.run_driver(one, [], 10)["processes"] == 1  # processes=1: as before
