"""Compute ceilings: peak flops per cycle measured with generated kernels (seed 004, ch. 5).

Each variant is a multiset of catalogue forms -- one ISA level (scalar, SSE, AVX2, AVX-512) x
one precision x one operation (add, mul, FMA, add+mul, FMA+add) -- generated and measured by
the project's own Pipedream generator and harness (cpumap.measure.batch.measure_batch), so a
ceiling is a measurement like any other and its raw rows go to the database.  Flops per
kernel instance come from the forms (cpumap.roofline.flops, the function the kernel points
use), and flops per cycle = flops per instance / cycles per instance (the estimate of
cpumap.measure.estimate: the undisturbed calls' difference, with its uncertainty; the median
repetition is kept beside it).

All cores: the same batch runs at the same time on every CPU, one pinned harness each, and
the per-core rates are summed.  Rows of such a run carry ``{"roofline": {"cpu": c,
"concurrent": n}}`` in their measurement parameters (so in their params_id): running beside
another busy core changes what a measurement means.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd

from cpumap.isa.x86 import FormSpec
from cpumap.measure import asmgen, batch, estimate
from cpumap.measure.settings import BenchSettings
from cpumap.roofline.flops import flops_of_form
from cpumap.store import db

# (isa level, precision) -> {operation: form name}; mixes are built from these.
_FORMS: dict[tuple[str, str], dict[str, str]] = {
    ("scalar", "dp"): {"add": "ADDSD_XMM_XMM", "mul": "MULSD_XMM_XMM",
                       "fma": "VFMADD231SD_XMM_XMM_XMM"},
    ("scalar", "sp"): {"add": "ADDSS_XMM_XMM", "mul": "MULSS_XMM_XMM",
                       "fma": "VFMADD231SS_XMM_XMM_XMM"},
    ("sse", "dp"): {"add": "ADDPD_XMM_XMM", "mul": "MULPD_XMM_XMM",
                    "fma": "VFMADD231PD_XMM_XMM_XMM"},
    ("sse", "sp"): {"add": "ADDPS_XMM_XMM", "mul": "MULPS_XMM_XMM",
                    "fma": "VFMADD231PS_XMM_XMM_XMM"},
    ("avx2", "dp"): {"add": "VADDPD_YMM_YMM_YMM", "mul": "VMULPD_YMM_YMM_YMM",
                     "fma": "VFMADD231PD_YMM_YMM_YMM"},
    ("avx2", "sp"): {"add": "VADDPS_YMM_YMM_YMM", "mul": "VMULPS_YMM_YMM_YMM",
                     "fma": "VFMADD231PS_YMM_YMM_YMM"},
    ("avx512", "dp"): {"add": "VADDPD_ZMM_ZMM_ZMM", "mul": "VMULPD_ZMM_ZMM_ZMM",
                       "fma": "VFMADD231PD_ZMM_ZMM_ZMM"},
    ("avx512", "sp"): {"add": "VADDPS_ZMM_ZMM_ZMM", "mul": "VMULPS_ZMM_ZMM_ZMM",
                       "fma": "VFMADD231PS_ZMM_ZMM_ZMM"},
}
# operation -> multiset over the level's {add, mul, fma}
_MIXES: dict[str, dict[str, int]] = {
    "add": {"add": 1}, "mul": {"mul": 1}, "fma": {"fma": 1},
    "add+mul": {"add": 1, "mul": 1}, "fma+add": {"fma": 1, "add": 1},
}
ISA_LEVELS = ("scalar", "sse", "avx2", "avx512")
PRECISIONS = ("dp", "sp")


def variants(forms: pd.DataFrame, operations: list[str] | None = None) -> list[dict]:
    """The compute variants this CPU can run: level, precision, operation, kernel multiset.

    A variant whose forms are not measurable here (no AVX-512, say) is left out; the
    function says which through the ``skipped`` entries (status "skipped", with the reason).
    """
    ok = set(forms.loc[forms.status == "ok", "name"])
    out = []
    for level in ISA_LEVELS:
        for prec in PRECISIONS:
            names = _FORMS[(level, prec)]
            for op, mix in _MIXES.items():
                if operations is not None and op not in operations:
                    continue
                kernel = {names[k]: n for k, n in mix.items()}
                missing = sorted(n for n in kernel if n not in ok)
                out.append({"variant": f"{level}-{prec}-{op}", "level": level,
                            "precision": prec, "operation": op,
                            "kernel": asmgen.canonical(kernel),
                            "status": "skipped" if missing else "planned",
                            "reason": f"not measurable here: {', '.join(missing)}"
                            if missing else ""})
    return out


def flops_per_instance(kernel: str, specs: Mapping[str, FormSpec]) -> int:
    """Flops of one instance of a kernel (a canonical multiset text)."""
    return sum(n * flops_of_form(specs[name]).flops
               for name, n in asmgen.parse_canonical(kernel).items())


def _with_run_params(rows: pd.DataFrame, cpu: int, concurrent: int) -> pd.DataFrame:
    """Mark rows with the CPU and the number of cores measured at once (in params_id)."""
    rows = rows.copy()
    if len(rows) == 0:
        return rows
    params = json.loads(rows["params"].iloc[0]) | {"roofline": {"cpu": cpu,
                                                                "concurrent": concurrent}}
    rows["params"] = json.dumps(params, sort_keys=True)
    rows["params_id"] = db.params_id(params)
    return rows


def measure_compute(
    kernels: list[str],
    forms: pd.DataFrame,
    machine: dict,
    bench: BenchSettings,
    workdir: Path,
    harness_bin: Path,
    batch_id: str,
    cpus: list[int],
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """DB rows of the kernels on cpus[0] alone, then on every CPU of ``cpus`` at once."""
    runs: list[pd.DataFrame] = []
    one = batch.measure_batch(kernels, forms, machine, bench.replace(cpu=cpus[0]),
                                 Path(workdir) / "one", harness_bin, batch_id, progress)
    runs.append(_with_run_params(one, cpus[0], 1))
    if len(cpus) > 1:
        results: dict[int, pd.DataFrame] = {}
        errors: list[BaseException] = []

        def work(cpu: int) -> None:
            try:
                results[cpu] = batch.measure_batch(
                    kernels, forms, machine, bench.replace(cpu=cpu),
                    Path(workdir) / f"all-{cpu}", harness_bin, batch_id, progress)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(c,)) for c in cpus]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        runs += [_with_run_params(results[c], c, len(cpus)) for c in cpus]
    return db.conform(pd.concat(runs, ignore_index=True))


def default_cpus(limit: int | None = None) -> list[int]:
    """The CPUs this process may run on (all cores), sorted; at most ``limit``."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[:limit] if limit else cpus


def summarize(rows: pd.DataFrame, plan: list[dict], specs: Mapping[str, FormSpec],
              tsc_ghz: float | None = None) -> list[dict]:
    """One record per variant: flops/cycle (best and median) on one core and on all cores.

    With ``tsc_ghz`` each run's core clock is estimated as its median calibration ratio (core
    cycles per TSC tick) x the TSC frequency, and GFLOP/s = flops/cycle x that clock, per
    core, summed over cores.
    """
    ok = rows[rows.status == "ok"]
    ratios = estimate.batch_ratios(rows)
    out = []
    for v in plan:
        rec = dict(v)
        if v["status"] == "skipped":
            out.append(rec)
            continue
        kernel = v["kernel"]
        fpi = flops_per_instance(kernel, specs)
        rec["flops_per_instance"] = fpi
        sel = ok[ok.kernel == kernel]
        per_run: dict[tuple[int, int], dict] = {}
        for params, grp in sel.groupby("params"):
            run = json.loads(params).get("roofline", {})
            agg = estimate.aggregate(grp, ratios=ratios).iloc[0]
            # the estimate of cpumap.measure.estimate (the undisturbed call durations): the
            # ceiling is what the CPU does, not what the neighbours let it do
            cyc = float(agg["cycles_per_instance_est"])
            cyc_med = float(agg["cycles_per_instance_median"])
            if not (math.isfinite(cyc) and cyc > 0):
                continue  # no undisturbed difference: as a run without an ok repetition
            cpu = int(run.get("cpu", -1))
            ratio = float(agg["calib_ratio"])
            per_run[(int(run.get("concurrent", 1)), cpu)] = {
                "cpu": cpu, "cycles_per_instance": cyc,
                "uncertainty": float(agg["rel_uncertainty"]),
                "cycles_per_instance_median": cyc_med,
                # the median calls may give no positive difference on a busy host (seen on
                # Zen 4 with neighbours on the ALUs: the default run stopped here): no rate
                "flops_per_cycle": fpi / cyc,
                "flops_per_cycle_median": fpi / cyc_med if cyc_med > 0 else None,
                "calib_ratio": ratio, "reps": int(agg["reps"]),
                "core_ghz": ratio * tsc_ghz if tsc_ghz else None,
                "gflops": fpi / cyc * ratio * tsc_ghz if tsc_ghz else None,
            }
        if not per_run:
            rec |= {"status": "failed", "reason": "no ok repetition with a positive time"}
            out.append(rec)
            continue
        ones = [r for (n, _c), r in per_run.items() if n == 1]
        alls = [r for (n, _c), r in per_run.items() if n > 1]
        rec["status"] = "ok"
        if ones:
            rec["one_core"] = ones[0]
        if alls:
            rec["all_cores"] = {
                "cores": len(alls),
                "flops_per_cycle": sum(r["flops_per_cycle"] for r in alls),
                "flops_per_cycle_median": sum(r["flops_per_cycle_median"] for r in alls)
                if all(r["flops_per_cycle_median"] is not None for r in alls) else None,
                "gflops": sum(r["gflops"] for r in alls) if all(r["gflops"] for r in alls)
                else None,
                "per_core": sorted(alls, key=lambda r: r["cpu"]),
            }
        out.append(rec)
    return out


def peak_table(summary: list[dict], peaks: Mapping[str, Mapping]) -> dict:
    """Measured peaks against the theoretical ones, per precision.

    For each precision: the best measured one-core FMA-only variant against the FMA peak,
    and the best variant of any kind against the FMA + adder peak (where the table has one).
    """
    out: dict[str, dict] = {}
    for prec, theo in peaks.items():
        ok = [v for v in summary if v.get("status") == "ok" and v["precision"] == prec
              and "one_core" in v]
        rec: dict = {}
        fma = [v for v in ok if v["operation"] == "fma"]
        if fma and "fma" in theo:
            best = max(fma, key=lambda v: v["one_core"]["flops_per_cycle"])
            t = theo["fma"].as_dict()
            rec["fma"] = {"variant": best["variant"],
                          "measured_flops_per_cycle": best["one_core"]["flops_per_cycle"],
                          "theoretical": t,
                          "fraction": best["one_core"]["flops_per_cycle"]
                          / t["flops_per_cycle"]}
        if ok and "fma+add" in theo:
            best = max(ok, key=lambda v: v["one_core"]["flops_per_cycle"])
            t = theo["fma+add"].as_dict()
            rec["fma+add"] = {"variant": best["variant"],
                              "measured_flops_per_cycle": best["one_core"]["flops_per_cycle"],
                              "theoretical": t,
                              "fraction": best["one_core"]["flops_per_cycle"]
                              / t["flops_per_cycle"]}
        out[prec] = rec
    return out
