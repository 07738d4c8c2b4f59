"""Throughput of the full profile: singletons of every ``ok`` form, kernels measured per second.

Runs the real pipeline (Snakemake, config/full.yaml) into a fresh results directory, so nothing
is reused from an earlier run, in timed steps: the catalogue (iced analysis, GNU as check and
smoke run), then the singleton stage alone (planning, generation, compilation, measurement,
storage, summary: the target bench/singletons/summary.tsv), and with ``--whole`` the rest of
the full profile (the roofline campaign and whatever else config/full.yaml turns on). The
figure asked for is kernels per second of the singleton stage, wall clock, generation and
compilation included.

    .venv/bin/python benchmarks/full_profile.py [--cores 2] [--keep DIR] [--whole]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def snakemake(results: Path, cores: int, *targets: str) -> float:
    # targets first: --quiet takes a list of what to silence
    cmd = [str(Path(sys.executable).with_name("snakemake")), *targets, "--cores", str(cores),
           "--configfile", "config/full.yaml", "--config", f"results_dir={results}",
           "--quiet", "all"]
    print(f"full_profile: snakemake {' '.join(targets) or 'all'}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"snakemake failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="results directory to keep (default: temporary)")
    ap.add_argument("--whole", action="store_true",
                    help="then run the rest of the full profile and time it too")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = args.keep or Path(tempfile.mkdtemp(prefix="cpumap-full-"))
    try:
        mid = subprocess.run([sys.executable, "-m", "cpumap.host.machine", "--id"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
        forms = results / mid / "isa" / "forms.parquet"
        t_cat = snakemake(results, args.cores, "--until", "catalogue")
        summary = results / mid / "bench" / "singletons" / "summary.tsv"
        t_meas = snakemake(results, args.cores, str(summary))
        parts = sorted((results / mid / "db").glob("part-singletons-*.parquet"))
        rows = pd.concat(pd.read_parquet(p) for p in parts)
        rows = rows[rows.role == "kernel"]
        kernels = rows.kernel_id.nunique()
        ok = rows.loc[rows.status == "ok", "kernel_id"].nunique()
        n_forms = int((pd.read_parquet(forms).status == "ok").sum())
        out = {
            "machine_id": mid, "ok_forms": n_forms, "kernels": int(kernels),
            "kernels_ok": int(ok), "repetitions": int(len(rows)),
            "catalogue_s": round(t_cat, 1), "singletons_s": round(t_meas, 1),
            "kernels_per_s": round(kernels / t_meas, 1),
            "kernels_per_s_incl_catalogue": round(kernels / (t_cat + t_meas), 1),
        }
        if args.whole:
            out["rest_of_profile_s"] = round(snakemake(results, args.cores), 1)
    finally:
        if args.keep is None:
            shutil.rmtree(results, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"machine {out['machine_id']}: {out['ok_forms']} ok forms in the catalogue")
        print(f"catalogue (analysis, as check, smoke run): {out['catalogue_s']} s")
        print(f"singleton stage: {out['kernels']} kernels ({out['kernels_ok']} ok, "
              f"{out['repetitions']} repetitions) in {out['singletons_s']} s = "
              f"{out['kernels_per_s']} kernels/s (wall, generation and compilation included)")
        print(f"catalogue + singletons: {out['kernels_per_s_incl_catalogue']} kernels/s")
        if "rest_of_profile_s" in out:
            print(f"rest of the full profile: {out['rest_of_profile_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
