"""Lifting block predictions to whole kernels, and the accuracy metrics (DESIGN §9, seed 003).

For a benchmark (one kernel compiled with one flag set) and an analyzer::

    predicted cycles = sum over blocks b of occurrences(b) x prediction(b)

A benchmark is discarded for an analyzer that failed on any of its *executed* blocks (blocks
with occurrences > 0; a block that never runs contributes nothing to the sum whatever its
prediction, so its failure is recorded in the per-block table but does not discard the
kernel). Kernels are compared through IPC, as in the seed and in our model validation:

    executed instructions = sum over b of occurrences(b) x instructions(b)   (terminator included)
    measured IPC  = executed instructions / measured cycles of the whole kernel
    predicted IPC = executed instructions / predicted cycles

Per analyzer, over all benchmarks and per flag set: coverage (benchmarks predicted / benchmarks
eligible), RMS relative error of IPC, MAPE of IPC, Kendall's tau of the IPC ranking (scipy).
Eligible benchmarks have a measured time and are L1-resident: more than ``miss_threshold``
D1 misses on a warm cache (Cachegrind) excludes a benchmark; one Cachegrind cannot run is kept
and marked unchecked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from cpumap.evaluate.suite import PROCESS_AGREE, process_spread
from cpumap.model import validation

__all__ = [
    "kernel_table",
    "lift",
    "measured_cycles",
    "metrics_table",
    "split_benchmark",
    "suite_forms",
]


def split_benchmark(benchmark: str) -> tuple[str, str]:
    """(kernel, flag set) of a benchmark id ``<kernel>.<flagset>``; a user benchmark (an id
    without a dot, suite.user) has the flag set "user"."""
    kernel, _, flagset = benchmark.partition(".")
    return kernel, flagset or "user"


def measured_cycles(obj: Mapping) -> float:
    """Whole-kernel cycles of one run of the kernel from evaluate/cycles/<benchmark>.json.

    The minimum over repetitions, as in the seed (warm cache, least perturbed run): an explicit
    ``cycles_min`` if the file has one, else the minimum of the ``cycles`` list.
    """
    for key in ("cycles_min", "min_cycles"):
        if obj.get(key) is not None:
            return float(obj[key])
    cyc = [float(c) for c in obj.get("cycles", []) if c is not None and float(c) > 0]
    return min(cyc) if cyc else math.nan


def suite_forms(blocks: pd.DataFrame) -> list[str]:
    """Distinct catalogue forms of all blocks (the model stage fits these), sorted."""
    return sorted({str(f) for forms in blocks["forms"] for f in forms if f})


def lift(blocks: pd.DataFrame, counts: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """One row per (benchmark, analyzer) present in ``predictions``.

    Columns: benchmark, analyzer, blocks (executed blocks), failed_blocks (executed blocks the
    analyzer failed on), status (ok | discarded), error (the first failure), predicted_cycles,
    instructions (executed).
    """
    occ = counts[["benchmark", "block_id", "occurrences"]]
    b = blocks[["benchmark", "block_id", "n_insns"]].merge(occ, on=["benchmark", "block_id"],
                                                           how="left")
    b["occurrences"] = b["occurrences"].fillna(0).astype("int64")
    executed = b[b.occurrences > 0]
    instr = (executed.occurrences * executed.n_insns).groupby(executed.benchmark).sum()
    rows = []
    for (bench, analyzer), pred in predictions.groupby(["benchmark", "analyzer"], sort=True):
        ex = executed[executed.benchmark == bench].merge(
            pred[["block_id", "cycles", "status", "error"]], on="block_id", how="left")
        ex["status"] = ex["status"].fillna("failed")
        ex["error"] = ex["error"].fillna("no prediction for the block")
        bad = ex[ex.status != "ok"]
        row = {"benchmark": bench, "analyzer": analyzer, "blocks": int(len(ex)),
               "failed_blocks": int(len(bad)), "instructions": int(instr.get(bench, 0))}
        if len(bad):
            first = bad.iloc[0]
            row |= {"status": "discarded", "predicted_cycles": math.nan,
                    "error": f"block {int(first.block_id)}: {first.error}"}
        else:
            row |= {"status": "ok", "error": "",
                    "predicted_cycles": float((ex.occurrences * ex.cycles).sum())}
        rows.append(row)
    cols = ["benchmark", "analyzer", "blocks", "failed_blocks", "status", "error",
            "predicted_cycles", "instructions"]
    return pd.DataFrame(rows, columns=cols)


def kernel_table(lifted: pd.DataFrame, cycles: Mapping[str, float],
                 residency: Mapping[str, Mapping], miss_threshold: float = 0.15,
                 spreads: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Per (benchmark, analyzer): measured and predicted cycles and IPC, eligibility.

    ``cycles``: measured whole-kernel cycles per benchmark; ``residency``: Cachegrind result per
    benchmark (see :func:`cpumap.evaluate.cachegrind.warm_miss_rate`); ``spreads``: how far
    apart the two fastest driver processes were (:func:`load_spreads`), kept beside the
    cycles as ``cycles_spread``: a kernel whose processes never agreed is still used, and the
    report says which.
    """
    t = lifted.copy()
    kf = t.benchmark.map(split_benchmark)
    t.insert(1, "kernel", kf.str[0])
    t.insert(2, "flagset", kf.str[1])
    t["measured_cycles"] = t.benchmark.map(lambda b: float(cycles.get(b, math.nan)))
    t["cycles_spread"] = t.benchmark.map(lambda b: float((spreads or {}).get(b, math.nan)))
    t["ipc_measured"] = t.instructions / t.measured_cycles
    t["ipc_predicted"] = np.where(t.predicted_cycles > 0,
                                  t.instructions / t.predicted_cycles.where(
                                      t.predicted_cycles > 0), math.nan)

    def res(b: str, key: str, default):
        return (residency.get(b) or {}).get(key, default)

    t["d1_miss_rate"] = t.benchmark.map(lambda b: float(res(b, "d1_miss_rate", math.nan)))
    # Cachegrind also counts the kernel function's instructions: an independent check of the
    # executed instructions derived from the gdb block counts
    t["cachegrind_instructions"] = t.benchmark.map(
        lambda b: res(b, "instructions", math.nan) / res(b, "reps", 1)
        if res(b, "status", "") == "ok" else math.nan)
    t["cachegrind"] = t.benchmark.map(lambda b: str(res(b, "status", "not run")))
    t["cachegrind_error"] = t.benchmark.map(lambda b: str(res(b, "error", "")))
    excluded = []
    for r in t.itertuples(index=False):
        if not (r.measured_cycles > 0):
            excluded.append("no measured cycles")
        elif r.cachegrind == "ok" and r.d1_miss_rate > miss_threshold:
            excluded.append(f"not L1-resident: {100 * r.d1_miss_rate:.1f} % D1 misses on a warm "
                            f"cache (> {100 * miss_threshold:.0f} %)")
        else:
            excluded.append("")
    t["excluded"] = excluded
    t["eligible"] = t.excluded == ""
    t["rel_error_ipc"] = (t.ipc_predicted - t.ipc_measured) / t.ipc_measured
    return t


def _metrics(group: pd.DataFrame) -> dict:
    eligible = group[group.eligible]
    ok = eligible[eligible.status == "ok"]
    m = validation.metrics(ok)
    n_el = int(len(eligible))
    return {"eligible": n_el, "predicted": m["kernels"],
            "coverage": m["kernels"] / n_el if n_el else math.nan,
            "rms_rel_error_ipc": m["rms_rel_error_ipc"], "mape_ipc": m["mape_ipc"],
            "kendall_tau": m["kendall_tau"]}


def metrics_table(kernels: pd.DataFrame, analyzers: list[str] | None = None) -> pd.DataFrame:
    """Per analyzer, over all flag sets ("all") and per flag set: coverage, RMS, MAPE, tau."""
    rows = []
    names = analyzers or sorted(kernels.analyzer.unique())
    flagsets = sorted(kernels.flagset.unique())
    for a in names:
        ka = kernels[kernels.analyzer == a]
        if ka.empty:
            continue
        rows.append({"analyzer": a, "flagset": "all"} | _metrics(ka))
        for fs in flagsets:
            rows.append({"analyzer": a, "flagset": fs} | _metrics(ka[ka.flagset == fs]))
    cols = ["analyzer", "flagset", "eligible", "predicted", "coverage", "rms_rel_error_ipc",
            "mape_ipc", "kendall_tau"]
    return pd.DataFrame(rows, columns=cols)


def load_cycles(paths: list[str | Path]) -> dict[str, float]:
    """Measured cycles per benchmark from evaluate/cycles/<benchmark>.json files."""
    return {b: measured_cycles(obj) for b, obj in _cycle_files(paths)}


def load_spreads(paths: list[str | Path]) -> dict[str, float]:
    """How far apart the two fastest driver processes' minima were, relative, per benchmark
    (cpumap.evaluate.suite.run_driver; 0 for one process or an older file without them)."""
    return {b: process_spread(obj.get("process_cycles_min") or [])
            for b, obj in _cycle_files(paths)}


def _cycle_files(paths: list[str | Path]):
    for p in paths:
        yield Path(p).name.removesuffix(".json"), json.loads(Path(p).read_text())


def analyzer_status(configured: list[str], metas: Mapping[str, Mapping],
                    model_enabled: bool,
                    derived: Mapping[str, str] | None = None) -> dict[str, dict]:
    """Every analyzer of the report, in order: ran (with its description and block counts),
    not run (and why), or unavailable on this machine (and why). ``derived``: name ->
    description of variants computed from another analyzer's run (``osaca-strict``), listed
    right after it."""
    from cpumap.evaluate.analyzers import ANALYZERS, UNAVAILABLE

    out: dict[str, dict] = {}
    for a in ANALYZERS:
        if a in metas:
            m = metas[a]
            out[a] = {"status": "ran", "description": m.get("description", ""),
                      "blocks": m.get("blocks"), "failed_blocks": m.get("failed_blocks"),
                      "seconds": m.get("seconds")}
            if m.get("target"):  # llvm-mca's -mcpu, OSACA's --arch, and how it was chosen
                out[a]["target"] = dict(m["target"])
            for d, desc in (derived or {}).items():
                if d.startswith(a + "-"):
                    out[d] = {"status": "ran", "description": desc}
        elif a == "model" and not model_enabled:
            out[a] = {"status": "not run", "reason": "model.enabled is false in this "
                      "configuration (no model.json: Palmed is not yet fast or noise-robust "
                      "enough for the default run on hardware)"}
        elif a not in configured:
            out[a] = {"status": "not run", "reason": "not listed in evaluate.analyzers"}
        else:
            out[a] = {"status": "not run", "reason": "no predictions"}
    for a, reason in UNAVAILABLE.items():
        out[a] = {"status": "unavailable", "reason": reason}
    return out


def summary(kernels: pd.DataFrame, residency: Mapping[str, Mapping],
            miss_threshold: float) -> dict:
    """Benchmarks, measured, and the L1-residency filter's outcome (figures for the report)."""
    base = kernels.drop_duplicates("benchmark")
    cg = base.cachegrind.value_counts().to_dict() if len(base) else {}
    over = base[base.excluded.str.startswith("not L1-resident")]
    unchecked = base[base.cachegrind != "ok"]
    return {
        "benchmarks": int(len(base)),
        "measured": int((base.measured_cycles > 0).sum()) if len(base) else 0,
        "eligible": int(base.eligible.sum()) if len(base) else 0,
        "miss_threshold": miss_threshold,
        "cachegrind": {str(k): int(v) for k, v in cg.items()},
        "excluded_not_l1": {r.benchmark: float(r.d1_miss_rate) for r in over.itertuples()},
        "residency_unchecked": {r.benchmark: str(r.cachegrind_error or r.cachegrind)[:200]
                                for r in unchecked.itertuples()},
        "instructions_checked": int(base.cachegrind_instructions.notna().sum()),
        "instructions_equal_cachegrind": int((base.cachegrind_instructions
                                              == base.instructions).sum()),
        "unsettled": {r.benchmark: float(r.cycles_spread) for r in base.itertuples()
                      if r.cycles_spread > PROCESS_AGREE},
        "d1_miss_rate_max_checked": float(base.loc[base.cachegrind == "ok", "d1_miss_rate"].max())
        if (base.cachegrind == "ok").any() else math.nan,
    }


#: Suffix of the strict variant of an analyzer whose ok answers may carry a note of what it
#: ignored (OSACA's --ignore-unknown): in the variant such blocks count as failures.
STRICT_SUFFIX = "-strict"


def strict_variant(predictions: pd.DataFrame, analyzer: str) -> pd.DataFrame:
    """Predictions of ``analyzer`` in which blocks answered with a note (something ignored)
    fail, renamed ``<analyzer>-strict``: the analyzer as it would do without ignoring."""
    p = predictions[predictions.analyzer == analyzer].copy()
    noted = (p.status == "ok") & (p.error != "")
    p.loc[noted, "status"] = "failed"
    p.loc[noted, "cycles"] = math.nan
    p["analyzer"] = analyzer + STRICT_SUFFIX
    return p
