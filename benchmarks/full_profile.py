"""Throughput of the full profile: singletons of every ``ok`` form, kernels measured per second.

Runs the real pipeline (Snakemake, config/full.yaml) into a fresh results directory, so nothing
is reused from an earlier run, in two timed steps: the catalogue (iced analysis, GNU as check and
smoke run), then the measuring stage (planning, generation, compilation, measurement, storage,
summary). The figure asked for is kernels per second of the second step, wall clock, generation
and compilation included.

    .venv/bin/python benchmarks/full_profile.py [--cores 2] [--keep DIR]
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
    cmd = [str(Path(sys.executable).with_name("snakemake")), "--cores", str(cores),
           "--configfile", "config/full.yaml", "--config", f"results_dir={results}",
           "--quiet", "all", *targets]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"snakemake failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="results directory to keep (default: temporary)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = args.keep or Path(tempfile.mkdtemp(prefix="cpumap-full-"))
    try:
        mid = subprocess.run([sys.executable, "-m", "cpumap.host.machine", "--id"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
        forms = results / mid / "isa" / "forms.parquet"
        t_cat = snakemake(results, args.cores, "--until", "catalogue")
        t_meas = snakemake(results, args.cores)
        rows = pd.concat(pd.read_parquet(p) for p in (results / mid / "db").glob("*.parquet"))
        kernels = rows.kernel_id.nunique()
        ok = rows.loc[rows.status == "ok", "kernel_id"].nunique()
        n_forms = int((pd.read_parquet(forms).status == "ok").sum())
        out = {
            "machine_id": mid, "ok_forms": n_forms, "kernels": int(kernels),
            "kernels_ok": int(ok), "catalogue_s": round(t_cat, 1),
            "measure_s": round(t_meas, 1), "kernels_per_s": round(kernels / t_meas, 1),
            "kernels_per_s_incl_catalogue": round(kernels / (t_cat + t_meas), 1),
        }
    finally:
        if args.keep is None:
            shutil.rmtree(results, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"machine {out['machine_id']}: {out['ok_forms']} ok forms in the catalogue")
        print(f"catalogue (analysis, as check, smoke run): {out['catalogue_s']} s")
        print(f"measuring stage: {out['kernels']} kernels ({out['kernels_ok']} ok) in "
              f"{out['measure_s']} s = {out['kernels_per_s']} kernels/s (wall, generation and "
              "compilation included)")
        print(f"whole run: {out['kernels_per_s_incl_catalogue']} kernels/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
