"""The roofline stages, as the workflow scripts and the CLI call them.

compute: measure the compute variants (DB rows) and summarise them against the theoretical
peaks -> roofline/compute.json.  sweep: the bandwidth sweep's raw rows -> roofline/
sweep.parquet.  ceilings: both, the clock and the plateaus -> roofline/ceilings.json.  Every
number of ceilings.json is derived from the DB rows and the sweep rows, so it can be rebuilt
without measuring (``make_ceilings``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from cpumap.isa.x86 import FormSpec
from cpumap.measure.settings import BenchSettings
from cpumap.roofline import ceilings, peak, sweep
from cpumap.store import db, files

DEFAULTS: dict = {
    "operations": ["add", "mul", "fma", "add+mul", "fma+add"],
    "cpus": None,
    "compute_bench": {"min_reps": 32},
    "sweep": {"kinds": list(sweep.KINDS), "per_level": 3, "per_octave": 0, "max_factor": 8.0,
              "max_bytes": None, "reps": 3, "rounds": 3, "min_ms": 0.05, "quiet_reps": 3,
              "max_reps": 64, "point_ms": 5.0, "max_point_ms": 0.0, "min_step": 0.08},
}


def merged(cfg: Mapping | None) -> dict:
    """The roofline configuration with defaults filled in (one level of nesting)."""
    out = json.loads(json.dumps(DEFAULTS))
    for key, val in (cfg or {}).items():
        if isinstance(val, Mapping) and isinstance(out.get(key), dict):
            out[key] |= dict(val)
        else:
            out[key] = val
    return out


def _specs(forms: pd.DataFrame) -> dict[str, FormSpec]:
    ok = forms[forms.status == "ok"]
    return {n: FormSpec.from_json(s) for n, s in zip(ok.name, ok.spec, strict=True)}


def tsc_ghz(machine: Mapping) -> float | None:
    mhz = (machine.get("tsc") or {}).get("mhz")
    return float(mhz) / 1000 if mhz else None


def run_compute(forms: pd.DataFrame, machine: dict, bench: BenchSettings, cfg: Mapping,
                workdir: Path, harness_bin: Path, part: Path,
                progress: Callable[[str], None] | None = None) -> dict:
    """Measure every compute variant, store the rows as DB part ``part``; return the summary."""
    cfg = merged(cfg)
    plan = ceilings.variants(forms, cfg["operations"])
    kernels = [v["kernel"] for v in plan if v["status"] == "planned"]
    cpus = cfg["cpus"] or ceilings.default_cpus()
    batch_id = part.name.removeprefix("part-").removesuffix(".parquet")
    rows = ceilings.measure_compute(kernels, forms, machine, bench.replace(**cfg["compute_bench"]),
                                    workdir, harness_bin, batch_id, list(cpus), progress)
    db.append(part.parent, rows, batch_id)
    return summarize_compute(rows, forms, machine, plan)


def summarize_compute(rows: pd.DataFrame, forms: pd.DataFrame, machine: Mapping,
                      plan: list[dict]) -> dict:
    """compute.json: per-variant results, theoretical peaks and the measured/theoretical table."""
    specs = _specs(forms)
    summary = ceilings.summarize(rows, plan, specs, tsc_ghz(machine))
    uarch = (machine.get("uarch") or {}).get("name") or ""
    try:
        theo = peak.theoretical_peaks(uarch, specs.items())
        theo_err = ""
    except KeyError as exc:
        theo, theo_err = {}, str(exc)
    ok = rows[rows.status == "ok"]
    return {
        "variants": summary,
        "theoretical": {p: {k: v.as_dict() for k, v in d.items()} for p, d in theo.items()},
        "theoretical_error": theo_err,
        "peaks": ceilings.peak_table(summary, theo),
        "clock": sorted(set(ok["clock"])),
        # the clocks the variants ran at (an Intel core's 512-bit code runs at a slower licence
        # clock than the rows' batch ratio says: measurement.md, the clock)
        "calib_ratio_median": float(np.median(ran)) if (ran := [
            v["one_core"]["calib_ratio"] for v in summary if "one_core" in v]) else (
            float(ok["calib_ratio"].median()) if len(ok) else None),
        "batch_id": sorted(set(rows["batch_id"])),
    }


def sweep_plan(machine: Mapping, cfg: Mapping) -> tuple[list[int], dict[str, list[int]]]:
    """(working-set sizes, scopes name -> CPUs) of the sweep."""
    cfg = merged(cfg)
    levels = sweep.cache_levels(machine)
    cpus = list(cfg["cpus"] or ceilings.default_cpus())
    sc = cfg["sweep"]
    sizes = sweep.sweep_sizes(levels, per_level=int(sc["per_level"]),
                              per_octave=int(sc["per_octave"]),
                              max_factor=float(sc["max_factor"]), threads=len(cpus),
                              max_bytes=sc.get("max_bytes"))
    scopes = {"one_core": cpus[:1]}
    if len(cpus) > 1:
        scopes["all_cores"] = cpus
    return sizes, scopes


def run_sweep(binary: Path, machine: Mapping, cfg: Mapping,
              progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    cfg = merged(cfg)
    sizes, scopes = sweep_plan(machine, cfg)
    sc = cfg["sweep"]
    df = sweep.sweep_frame(binary, sc["kinds"], sizes, scopes, reps=int(sc["reps"]),
                           rounds=int(sc["rounds"]), min_ms=float(sc["min_ms"]),
                           quiet_reps=int(sc["quiet_reps"]), max_reps=int(sc["max_reps"]),
                           point_ms=float(sc["point_ms"]),
                           max_point_ms=float(sc["max_point_ms"]), progress=progress)
    df["machine_id"] = machine["machine_id"]
    df["timestamp"] = pd.Timestamp(datetime.now(UTC)).floor("us")
    return df


def bandwidth_section(sweep_rows: pd.DataFrame, machine: Mapping, cfg: Mapping) -> dict:
    """{scope: {kind: {levels, check, sweep}}} with the sweep data behind each plateau."""
    cfg = merged(cfg)
    levels = sweep.cache_levels(machine)
    best = sweep.best_per_size(sweep_rows)
    out: dict[str, dict] = {}
    for rec in sweep.analyse(best, levels, float(cfg["sweep"]["min_step"])):
        curve = best[(best.scope == rec["scope"]) & (best.kind == rec["kind"])]
        levels_out = [{"label": p["label"], "bytes_per_cycle": p["bytes_per_cycle"],
                       "gbs": p["gbs"], "sizes": p["sizes"], "values": p["values"],
                       "capacity": p["capacity"], "agreement": p["agreement"],
                       "boundary_bytes": p["boundary_bytes"]} for p in rec["plateaus"]]
        out.setdefault(rec["scope"], {})[rec["kind"]] = {
            "threads": rec["threads"], "levels": levels_out, "check": rec["check"],
            "sweep": curve.drop(columns=["scope", "kind"]).to_dict(orient="records"),
        }
    return out


def level_order_check(bw: Mapping) -> dict:
    """The acceptance ordering L1 > L2 > L3 > DRAM on the read curves, per scope."""
    out = {}
    for scope, kinds in bw.items():
        read = kinds.get("read")
        if not read:
            continue
        by = {lv["label"]: lv["bytes_per_cycle"] for lv in read["levels"]}
        chain = [x for x in ("L1", "L2", "L3", "DRAM") if x in by]
        out[scope] = {"order": chain, "values": [by[x] for x in chain],
                      "strictly_decreasing": all(by[a] > by[b]
                                                 for a, b in zip(chain, chain[1:], strict=False))
                      and len(chain) == 4}
    return out


def make_ceilings(compute: Mapping, sweep_rows: pd.DataFrame | None, machine: Mapping,
                  cfg: Mapping) -> dict:
    """ceilings.json from compute.json and the sweep rows (no measuring; None: no sweep)."""
    have_sweep = sweep_rows is not None and len(sweep_rows) > 0
    bw = bandwidth_section(sweep_rows, machine, cfg) if have_sweep else {}
    ghz = tsc_ghz(machine)
    ratio_c = compute.get("calib_ratio_median")
    ratio_s = float(np.median(sweep_rows["calib_ratio"])) if have_sweep else None
    clock = {
        "kind": ",".join(compute.get("clock") or []) or "tsc-calibrated",
        "cycles": "TSC ticks x core cycles per tick, calibrated on a dependent add chain "
                  "(1 cycle per add) in the measuring process (harness/cpumap_clock.h)",
        "tsc_mhz": float(machine.get("tsc", {}).get("mhz") or 0) or None,
        "calib_ratio_compute": ratio_c, "calib_ratio_sweep": ratio_s,
        "core_ghz_estimate": ratio_c * ghz if ratio_c and ghz else None,
        "core_ghz_estimate_sweep": ratio_s * ghz if ratio_s and ghz else None,
    }
    return {
        "format": "cpumap-roofline-ceilings", "version": 1,
        "machine_id": machine["machine_id"],
        "uarch": (machine.get("uarch") or {}).get("name"),
        "clock": clock,
        "compute": compute,
        "bandwidth": bw,
        "bandwidth_order": level_order_check(bw),
        # bw_sweep's read kernel uses 256-bit loads
        "l1_read_limit": peak.l1_read_limit((machine.get("uarch") or {}).get("name") or "", 256),
        "bytes_convention": "core-side bytes named by the kernels' loads and stores "
                            "(STREAM convention: copy 2 x, triad 3 x the array); write-allocate "
                            "line fills not counted; sizes are working sets per thread",
        "sweep_config": merged(cfg)["sweep"],
        "caches": sweep.cache_levels(machine),
    }


def write_json(obj, path: Path) -> None:
    files.write_text_atomic(json.dumps(obj, indent=1, sort_keys=True, default=_default) + "\n",
                         path)


def _default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, pd.Timestamp):
        return o.isoformat()
    raise TypeError(f"not JSON serialisable: {type(o)}")


def checks(ceil: Mapping, points: pd.DataFrame | None) -> list[dict]:
    """The issue's acceptance checks, computed from the results (text, value, ok)."""
    out = []
    dp = ceil["compute"].get("peaks", {}).get("dp", {}).get("fma")
    if dp:
        out.append({"name": "dp_peak", "value": dp["fraction"], "ok": dp["fraction"] >= 0.9,
                    "text": f"one-core double-precision FMA peak: measured "
                            f"{dp['measured_flops_per_cycle']:.2f} flop/cycle = "
                            f"{dp['fraction']:.1%} of the theoretical "
                            f"{dp['theoretical']['flops_per_cycle']:g} "
                            f"({dp['theoretical']['form']}, {dp['theoretical']['uarch']} table)"
                            " (>= 90 %)"})
    limit = ceil.get("l1_read_limit")
    levels = ceil.get("bandwidth", {}).get("one_core", {}).get("read", {}).get("levels", [])
    l1 = next((lv["bytes_per_cycle"] for lv in levels if lv["label"] == "L1"), None)
    if limit and l1:
        frac = l1 / limit["bytes_per_cycle"]
        out.append({"name": "l1_read", "value": frac, "ok": frac >= 0.95,
                    "text": f"one-core L1 read plateau: {l1:.1f} B/cycle = {frac:.1%} of the "
                            f"{limit['bytes_per_cycle']:g} that {limit['loads_per_cycle']} "
                            f"{limit['load_bits']}-bit loads per cycle allow "
                            f"({limit['uarch']} table) (>= 95 %)"})
    for scope, rec in ceil.get("bandwidth_order", {}).items():
        out.append({"name": f"order_{scope}", "value": rec["values"],
                    "ok": rec["strictly_decreasing"],
                    "text": f"read plateaus, {scope.replace('_', ' ')}: "
                            + " > ".join(f"{a} {v:.1f}" for a, v in
                                         zip(rec["order"], rec["values"], strict=True))
                            + " B/cycle (L1 > L2 > L3 > DRAM)"})
    if points is not None and len(points):
        ok = points[(points.status == "ok") & (points.kernel == "daxpy")
                    & points.intensity_mem.notna() & (points.state == "warm")]
        if len(ok):
            big = ok[ok.bytes_footprint == ok.bytes_footprint.max()]
            for _, p in big.iterrows():
                ratio = p["intensity_mem"] / (1 / 12)
                out.append({"name": f"daxpy_{p['flagset']}", "value": p["intensity_mem"],
                            "ok": abs(ratio - 1) <= 0.10,
                            "text": f"{p['benchmark']} n={p['n']} (warm, footprint "
                                    f"{int(p['bytes_footprint']) >> 20} MiB): memory-side "
                                    "intensity "
                                    f"{p['intensity_mem']:.4f} flop/byte vs analytic 1/12 = "
                                    f"0.0833 (2 flops per 3 doubles): {ratio - 1:+.1%} "
                                    "(within 10 %)"})
    return out
