#!/usr/bin/env python3
"""Run-to-run agreement of measurements: the same kernels measured in two separate runs.

Why: a model cannot be more accurate than the measurements it is fitted to and checked
against. Two runs of the pipeline (separate results directories, so nothing is reused) measure
the same held-out validation kernels (same seed, same count); this prints how far apart the two
measurements of each kernel are: the floor under any model's held-out error on this host.

    .venv/bin/python benchmarks/rerun_agreement.py RESULTS_A RESULTS_B [--json]

Each RESULTS is a results directory (results/<machine-id>/model/validation.tsv is read; with
several machine ids the common ones are compared). Prints the RMS and the median of the
relative differences, the largest one, and how many kernels differ by more than 2 %.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def validation(results: Path) -> dict[str, pd.DataFrame]:
    """machine id -> its validation table (kernel -> measured cycles)."""
    out = {}
    for path in sorted(Path(results).glob("*/model/validation.tsv")):
        out[path.parents[1].name] = pd.read_csv(path, sep="\t").set_index("kernel")
    return out


def compare(a: pd.DataFrame, b: pd.DataFrame) -> dict:
    common = a.index.intersection(b.index)
    x = a.loc[common, "cycles_measured"].astype(float)
    y = b.loc[common, "cycles_measured"].astype(float)
    rel = (y - x) / x
    return {"kernels": int(len(common)),
            "rms_rel_diff": float(np.sqrt(np.mean(rel ** 2))) if len(rel) else None,
            "median_abs_rel_diff": float(rel.abs().median()) if len(rel) else None,
            "max_abs_rel_diff": float(rel.abs().max()) if len(rel) else None,
            "over_2pct": int((rel.abs() > 0.02).sum()),
            "worst": rel.abs().sort_values(ascending=False).head(5).round(4).to_dict()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    va, vb = validation(args.a), validation(args.b)
    out = {mid: compare(va[mid], vb[mid]) for mid in sorted(set(va) & set(vb))}
    if not out:
        sys.exit("no machine id has a model/validation.tsv in both directories")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for mid, r in out.items():
        print(f"{mid}: {r['kernels']} kernels measured in both runs; relative difference "
              f"RMS {100 * r['rms_rel_diff']:.2f} %, median {100 * r['median_abs_rel_diff']:.2f}"
              f" %, largest {100 * r['max_abs_rel_diff']:.2f} %, {r['over_2pct']} over 2 %")
        for kernel, d in r["worst"].items():
            print(f"  {100 * d:6.2f} %  {kernel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
