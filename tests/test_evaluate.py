"""Lifting, metrics and the Cachegrind residency check, on small exact fixtures."""

from __future__ import annotations

import math
import subprocess
import textwrap

import pandas as pd
import pytest
from scipy.stats import kendalltau

from cpumap.evaluate import cachegrind
from cpumap.evaluate import lift as evaluate


def _blocks() -> pd.DataFrame:
    return pd.DataFrame({
        "benchmark": ["a.O2"] * 3 + ["b.O3-v3"] * 2,
        "block_id": [0, 1, 2, 0, 1],
        "n_insns": [4, 5, 3, 2, 6],
    })


def _counts() -> pd.DataFrame:
    return pd.DataFrame({
        "benchmark": ["a.O2"] * 3 + ["b.O3-v3"] * 2,
        "block_id": [0, 1, 2, 0, 1],
        "occurrences": [1, 100, 0, 1, 10],  # a.O2 block 2 never runs
    })


def _pred(analyzer: str, cycles: list[float], status: list[str], errors=None) -> pd.DataFrame:
    n = len(cycles)
    return pd.DataFrame({
        "benchmark": ["a.O2"] * 3 + ["b.O3-v3"] * 2, "block_id": [0, 1, 2, 0, 1],
        "analyzer": [analyzer] * n, "cycles": cycles, "status": status,
        "error": errors or ["" if s == "ok" else "boom" for s in status], "seconds": [0.0] * n,
    })


def test_lift_sums_occurrences_times_predictions_and_discards_on_executed_failures():
    preds = pd.concat([
        # fails only on a block that never runs: the kernel is still predicted
        _pred("x", [2.0, 3.0, math.nan, 1.0, 4.0], ["ok", "ok", "failed", "ok", "ok"]),
        # fails on an executed block of b: b is discarded for y
        _pred("y", [1.0, 2.0, 5.0, 1.0, math.nan], ["ok", "ok", "ok", "ok", "failed"]),
    ])
    lifted = evaluate.lift(_blocks(), _counts(), preds).set_index(["benchmark", "analyzer"])
    assert lifted.loc[("a.O2", "x"), "predicted_cycles"] == 2.0 + 100 * 3.0
    assert lifted.loc[("a.O2", "x"), "status"] == "ok"
    assert lifted.loc[("a.O2", "x"), "instructions"] == 4 + 100 * 5
    assert lifted.loc[("a.O2", "x"), "blocks"] == 2  # executed blocks only
    assert lifted.loc[("b.O3-v3", "x"), "predicted_cycles"] == 1.0 + 10 * 4.0
    assert lifted.loc[("b.O3-v3", "y"), "status"] == "discarded"
    assert lifted.loc[("b.O3-v3", "y"), "error"] == "block 1: boom"
    assert math.isnan(lifted.loc[("b.O3-v3", "y"), "predicted_cycles"])
    assert lifted.loc[("a.O2", "y"), "predicted_cycles"] == 1.0 + 100 * 2.0


def test_kernel_table_ipc_and_l1_filter():
    preds = _pred("x", [2.0, 3.0, 1.0, 1.0, 4.0], ["ok"] * 5)
    lifted = evaluate.lift(_blocks(), _counts(), preds)
    residency = {"a.O2": {"status": "ok", "d1_miss_rate": 0.2, "error": "",
                          "instructions": 1512, "reps": 3},
                 "b.O3-v3": {"status": "unsupported", "error": "valgrind cannot run (AVX-512)"}}
    k = evaluate.kernel_table(lifted, {"a.O2": 252.0, "b.O3-v3": 31.0}, residency, 0.15)
    k = k.set_index("benchmark")
    assert k.loc["a.O2", "ipc_measured"] == 504 / 252.0
    assert k.loc["a.O2", "ipc_predicted"] == 504 / 302.0
    assert k.loc["a.O2", "excluded"] == ("not L1-resident: 20.0 % D1 misses on a warm cache "
                                         "(> 15 %)")
    assert not k.loc["a.O2", "eligible"]
    assert k.loc["a.O2", "cachegrind_instructions"] == 504  # 1512 over 3 warm repetitions
    s = evaluate.summary(k.reset_index(), residency, 0.15)
    assert (s["instructions_checked"], s["instructions_equal_cachegrind"]) == (1, 1)
    assert s["excluded_not_l1"] == {"a.O2": 0.2}
    # residency unchecked (Valgrind cannot run it): kept
    assert k.loc["b.O3-v3", "eligible"] and k.loc["b.O3-v3", "cachegrind"] == "unsupported"
    assert k.loc["b.O3-v3", "flagset"] == "O3-v3" and k.loc["b.O3-v3", "kernel"] == "b"
    assert k.loc["b.O3-v3", "rel_error_ipc"] == pytest.approx((62 / 41 - 62 / 31) / (62 / 31))


def test_metrics_coverage_rms_mape_tau():
    rows = []
    meas = [1.0, 2.0, 3.0, 4.0]
    pred = [1.1, 1.8, 3.3, math.nan]  # the 4th is discarded
    for i, (m, p) in enumerate(zip(meas, pred, strict=True)):
        rows.append({"benchmark": f"k{i}.O2", "kernel": f"k{i}", "flagset": "O2",
                     "analyzer": "x", "status": "ok" if p == p else "discarded",
                     "ipc_measured": m, "ipc_predicted": p, "eligible": True})
    rows.append({"benchmark": "k9.O2", "kernel": "k9", "flagset": "O2", "analyzer": "x",
                 "status": "ok", "ipc_measured": 5.0, "ipc_predicted": 9.0, "eligible": False})
    m = evaluate.metrics_table(pd.DataFrame(rows), ["x"]).set_index("flagset")
    rel = [0.1, -0.1, 0.1]
    assert m.loc["all", "eligible"] == 4 and m.loc["all", "predicted"] == 3
    assert m.loc["all", "coverage"] == 0.75
    assert m.loc["all", "rms_rel_error_ipc"] == pytest.approx(math.sqrt(sum(r * r for r in rel)
                                                                        / 3))
    assert m.loc["all", "mape_ipc"] == pytest.approx(0.1)
    assert m.loc["all", "kendall_tau"] == kendalltau([1, 2, 3], [1.1, 1.8, 3.3]).statistic
    assert m.loc["O2", "predicted"] == 3


def test_strict_variant_fails_blocks_with_ignored_instructions():
    p = _pred("osaca", [1.0, 2.0, 3.0, 1.0, 1.0], ["ok"] * 5,
              ["", "ignored (no ZEN4 data): nop", "", "", ""])
    s = evaluate.strict_variant(p, "osaca")
    assert s.analyzer.unique().tolist() == ["osaca-strict"]
    assert s.status.tolist() == ["ok", "failed", "ok", "ok", "ok"]
    assert math.isnan(s.cycles.iloc[1])


def test_analyzer_status_lists_every_analyzer_with_a_reason():
    st = evaluate.analyzer_status(["model", "native", "written", "llvm-mca", "osaca"],
                                  {"llvm-mca": {"description": "d", "blocks": 3},
                                   "osaca": {"description": "o"}}, model_enabled=False,
                                  derived={"osaca-strict": "strict"})
    assert list(st) == ["model", "native", "written", "loop", "llvm-mca", "osaca",
                        "osaca-strict", "uiCA", "IACA", "Ithemal", "Gus"]
    assert st["loop"] == {"status": "not run", "reason": "not listed in evaluate.analyzers"}
    assert st["model"]["status"] == "not run" and "model.enabled is false" in st["model"]["reason"]
    assert st["native"] == {"status": "not run", "reason": "no predictions"}
    assert st["llvm-mca"]["status"] == "ran" and st["osaca-strict"]["status"] == "ran"
    assert all(st[a]["status"] == "unavailable" and st[a]["reason"]
               for a in ("uiCA", "IACA", "Ithemal", "Gus"))


def test_measured_cycles_is_the_minimum():
    assert evaluate.measured_cycles({"cycles": [300.0, 250.5, 400.0]}) == 250.5
    assert evaluate.measured_cycles({"cycles_min": 7.0, "cycles": [9.0]}) == 7.0
    assert math.isnan(evaluate.measured_cycles({"cycles": []}))


def test_unsettled_measured_cycles_are_kept_and_named(tmp_path):
    """The suite's driver processes whose two fastest minima never agreed within 1 %: the
    kernel stays in the metrics, the summary and the report name it with its spread."""
    import json

    from cpumap.evaluate.report import residency_note

    files = []
    for name, minima in (("a.O2", [252.0, 280.0, 300.0]), ("b.O3-v3", [31.0, 31.2]),
                         ("c.O2", [])):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps({"cycles_min": minima[0] if minima else 9.0,
                                         "process_cycles_min": minima}))
    spreads = evaluate.load_spreads(files)
    assert spreads["a.O2"] == pytest.approx(28 / 252) and spreads["c.O2"] == 0.0
    assert spreads["b.O3-v3"] == pytest.approx(0.2 / 31)
    preds = _pred("x", [2.0, 3.0, 1.0, 1.0, 4.0], ["ok"] * 5)
    k = evaluate.kernel_table(evaluate.lift(_blocks(), _counts(), preds),
                              evaluate.load_cycles(files), {}, 0.15, spreads)
    assert k.eligible.all() and k.cycles_spread.notna().all()
    s = evaluate.summary(k, {}, 0.15)
    assert s["unsettled"] == {"a.O2": pytest.approx(28 / 252)}
    assert "never settled for 1 benchmarks" in residency_note(s) and "a.O2 11.1 %" in \
        residency_note(s)


CG_OUT = textwrap.dedent("""\
    desc: D1 cache: 32768 B, 64 B, 8-way associative
    cmd: ./a.out --reps 3
    events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
    fl=k.c
    fn=kernel_sum
    3 100 1 1 40 5 0 10 1 0
    4 50 0 0 10 0 0 0 0 0
    fn=kernel_sum.constprop.0
    9 10 0 0 5 1 0 0 0 0
    fn=main
    12 7 0 0 1 1 1 1 1 1
    summary: 167 1 1 56 7 1 11 2 1
""")


def test_parse_cachegrind_out_sums_per_function_and_clones():
    events, totals = cachegrind.parse_cachegrind_out(CG_OUT)
    assert events == cachegrind.EVENTS
    c = cachegrind.function_counts(events, totals, "kernel_sum")
    assert (c["Ir"], c["Dr"], c["D1mr"], c["Dw"], c["D1mw"]) == (160, 55, 6, 10, 1)


SUM_C = textwrap.dedent("""\
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    __attribute__((noipa)) double kernel_sum(const double *x, long n) {
        double s = 0; for (long i = 0; i < n; i++) s += x[i]; return s; }
    int main(int argc, char **argv) {
        long n = 1000, reps = 1;
        for (int i = 1; i + 1 < argc; i++) {
            if (!strcmp(argv[i], "--n")) n = atol(argv[i + 1]);
            if (!strcmp(argv[i], "--reps")) reps = atol(argv[i + 1]); }
        double *x = malloc(n * sizeof *x);
        for (long i = 0; i < n; i++) x[i] = i;
    #ifdef EVEX
        __asm__ volatile("vpxord %%zmm1, %%zmm1, %%zmm1" ::: "xmm1");
    #endif
        volatile double s = 0;
        for (long r = 0; r < reps; r++) s += kernel_sum(x, n);
        printf("%g\\n", s); return 0; }
""")


@pytest.fixture(scope="module")
def sum_bins(tmp_path_factory):
    d = tmp_path_factory.mktemp("cg")
    (d / "sum.c").write_text(SUM_C)
    subprocess.run(["gcc", "-O2", "-o", str(d / "sum"), str(d / "sum.c")], check=True)
    subprocess.run(["gcc", "-O2", "-mavx512f", "-DEVEX", "-o", str(d / "sum512"),
                    str(d / "sum.c")], check=True)
    return d


def test_warm_miss_rate_of_a_resident_and_a_streaming_kernel(sum_bins):
    small = cachegrind.warm_miss_rate(sum_bins / "sum", "kernel_sum", ["--n", "1000"], reps=3)
    assert small["status"] == "ok"
    # 3 warm repetitions of 1000 loads (8 KB, L1-resident): no miss at all
    assert small["d1_misses"] == 0 and small["d1_accesses"] >= 3000
    big = cachegrind.warm_miss_rate(sum_bins / "sum", "kernel_sum", ["--n", "100000"], reps=2)
    # 800 KB do not fit in the 32 KiB D1: one miss per 64-byte line of 8 doubles
    assert big["d1_misses"] >= 2 * 100000 // 8
    assert 0.125 <= big["d1_miss_rate"] < 0.1251


def test_avx512_binary_is_reported_unsupported(sum_bins):
    r = cachegrind.warm_miss_rate(sum_bins / "sum512", "kernel_sum", ["--n", "10"], reps=1)
    assert r["status"] == "unsupported"
    assert r["error"].startswith("valgrind cannot run this binary (AVX-512 / EVEX code): vex "
                                 "amd64->IR: unhandled instruction bytes: 0x62")
