"""The whole pipeline on a simulated machine: wall time end to end, Palmed's stages, accuracy.

Usage: python benchmarks/pipeline_sim.py [--ports 10] [--forms 300] [--noise 0.0] [--cores 2]

Writes ``synthetic_mapping(ports, forms)`` and a config (config/simulated.yaml with that
mapping) into a temporary directory, runs ``snakemake --cores N`` there from scratch (machine,
catalogue, singletons, every Palmed stage job and batch, validation) and prints the wall time,
the number of jobs, the kernels, measurement rounds and LP seconds per Palmed stage, the
seconds of each Palmed job, and the held-out validation's RMS error and Kendall's tau.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from cpumap.model.portmap import synthetic_mapping

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ports", type=int, default=10)
    ap.add_argument("--forms", type=int, default=300)
    ap.add_argument("--noise", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        mapping = tmp / f"synthetic-{args.ports}p-{args.forms}f.json"
        mapping.write_text(json.dumps(synthetic_mapping(args.ports, args.forms, args.seed)))
        cfg = yaml.safe_load((ROOT / "config" / "simulated.yaml").read_text())
        cfg["results_dir"] = str(tmp / "results")
        cfg["machine"] |= {"mapping": str(mapping), "noise": args.noise, "seed": args.seed}
        cfgfile = tmp / "config.yaml"
        cfgfile.write_text(yaml.safe_dump(cfg))
        t0 = time.perf_counter()
        proc = subprocess.run([str(SNAKEMAKE), "--cores", str(args.cores), "--configfile",
                               str(cfgfile)], cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        (mdir,) = (tmp / "results").iterdir()
        stats = json.loads((mdir / "model" / "stats.json").read_text())
        val = json.loads((mdir / "model" / "validation.json").read_text())
        done = re.findall(r"(\d+) of (\d+) steps \(100%\) done", proc.stderr)
        jobs = int(done[-1][1]) if done else -1
        print(f"{args.ports} ports, {args.forms} forms, noise {args.noise}: pipeline "
              f"{wall:.1f} s wall on {args.cores} cores, {jobs} Snakemake jobs")
        print(f"  kernels {stats['total_kernels']} per stage {stats['kernels']}")
        print(f"  measurement rounds {stats['measure_rounds']}")
        print("  LP " + ", ".join(f"{k} {v['solves']} solves {v['seconds']:.1f} s"
                                 for k, v in stats["lp"].items()))
        print("  Palmed jobs (s) " + ", ".join(f"{k} {v:.1f}"
                                              for k, v in stats["job_seconds"].items()))
        print(f"  resources {stats['n_resources']}; validation {val['kernels']} kernels: "
              f"RMS IPC {val['rms_rel_error_ipc']:.2%}, tau {val['kendall_tau']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
