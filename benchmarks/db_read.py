"""How long a job takes to estimate a whole measurement database, with and without the files
kept for its parts (``cpumap.measure.dbestimates``), and that both give the same table.

Usage: python benchmarks/db_read.py <results>/<machine_id> [--config config/config.yaml ...]

Reads the database of a results directory (nothing is measured): the estimates of every
kernel under the measurement parameters of the given config files (merged in order, as
Snakemake does), first from the rows alone, then twice through ``db/.estimates`` (the first
of those makes the files a part lacks, the second reads them all), and the noise record
(``monitor_db``) both ways. Prints the seconds of each and checks the tables are equal.
Run it with nothing else on the machine: the reads are CPU-bound.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import yaml

from cpumap.measure import estimate
from cpumap.measure.backend import measurement_key
from cpumap.measure.dbestimates import aggregate_db, monitor_db
from cpumap.measure.settings import BenchSettings
from cpumap.store import db


def merged(paths: list[str]) -> dict:
    cfg: dict = {}
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for k, v in (yaml.safe_load(handle) or {}).items():
                if isinstance(v, dict):
                    cfg.setdefault(k, {}).update(v)
                else:
                    cfg[k] = v
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("machine_dir", type=Path)
    ap.add_argument("--config", nargs="+", default=["config/config.yaml"])
    args = ap.parse_args()
    bench = BenchSettings.from_mapping(merged(args.config)["bench"])
    with open(args.machine_dir / "machine.json", encoding="utf-8") as handle:
        mid = json.load(handle)["machine_id"]
    db_dir = args.machine_dir / "db"
    parts = db.part_paths(db_dir)
    size = sum(p.stat().st_size for p in parts)
    print(f"{db_dir}: {len(parts)} parts, {size / 1e6:.0f} MB")
    key = (db_dir, mid, *measurement_key(bench, False), bench.stable_tol)
    t = time.perf_counter()
    rows_only = aggregate_db(*key, kept=False)
    print(f"estimates from the rows: {time.perf_counter() - t:.2f} s, "
          f"{len(rows_only[0])} kernels")
    for label in ("kept files (made where missing)", "kept files"):
        t = time.perf_counter()
        again = aggregate_db(*key)
        print(f"estimates through the {label}: {time.perf_counter() - t:.2f} s")
        pd.testing.assert_frame_equal(again[0], rows_only[0])
        assert again[1] == rows_only[1]
        assert estimate.batch_ratios(again[2]) == estimate.batch_ratios(rows_only[2])
    t = time.perf_counter()
    noise = monitor_db(db_dir, mid, bench.stable_tol, kept=False)
    print(f"noise record from the rows: {time.perf_counter() - t:.2f} s")
    for label in ("kept files (made where missing)", "kept files"):
        t = time.perf_counter()
        pd.testing.assert_frame_equal(monitor_db(db_dir, mid, bench.stable_tol), noise)
        print(f"noise record through the {label}: {time.perf_counter() - t:.2f} s")
    print("same tables both ways")


if __name__ == "__main__":
    main()
