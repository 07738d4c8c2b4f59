#!/usr/bin/env python3
"""What the rounds past the first K of each batch changed: are the extra rounds worth it?

Why: under noisy neighbours most native batches go past ``bench.rounds`` (3) to
``bench.max_rounds`` (8) or their time budget, and that is most of the default run's time on a
busy guest. Here each batch of a database that measured more than K + 1 rounds is estimated
again from its rounds 0..K alone (``cpumap.measure.estimate.aggregate``, the same estimator),
and set beside its estimate over every round: the share of kernels whose estimate the later
rounds lowered by more than 1, 3 and 5 % (interference only slows, so lower is nearer the CPU),
and the share stable after round K, and of those, how many the later rounds still lowered.

    .venv/bin/python benchmarks/late_rounds.py results/<machine-id>/db [--k 2]

Nothing is measured; the database is read one part at a time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from cpumap.measure import estimate
from cpumap.store import db


def _agg(rows: pd.DataFrame) -> pd.DataFrame:
    return estimate.aggregate(rows, ratios=estimate.batch_ratios(rows)).set_index("kernel")


def batch_table(db_dir: Path, k: int) -> pd.DataFrame:
    """One row per batch measured past round ``k`` + 1."""
    out = []
    for _, part in db.iter_parts(db_dir):
        if "round" not in part or part["round"].isna().all():
            continue
        for bid, b in part.groupby("batch_id"):
            if b["round"].max() <= k + 1:
                continue
            j = _agg(b).join(_agg(b[b["round"] <= k]).add_suffix("_k"), how="inner")
            if j.empty:
                continue
            d = j["cycles_per_instance_est_k"] / j["cycles_per_instance_est"] - 1
            st = ~j["unstable_k"].astype(bool)
            out.append({"batch": bid, "rounds": int(b["round"].max()) + 1, "kernels": len(j),
                        "lowered>1%": (d > 0.01).mean(), "lowered>3%": (d > 0.03).mean(),
                        "lowered>5%": (d > 0.05).mean(), "stable_at_k": st.mean(),
                        "stable_lowered>3%": ((d > 0.03) & st).mean(),
                        "unstable_at_end": j["unstable"].astype(bool).mean()})
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("db", type=Path, help="a database directory (results/<machine-id>/db)")
    ap.add_argument("--k", type=int, default=2, help="the last round kept (0-based; 2: the "
                    "three rounds of bench.rounds)")
    args = ap.parse_args()
    t = batch_table(args.db, args.k)
    if t.empty:
        print("no batch measured past round", args.k + 1)
        return
    pd.set_option("display.width", 200)
    print(t.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    w = t["kernels"] / t["kernels"].sum()
    cols = [c for c in t.columns if c not in ("batch", "rounds", "kernels")]
    print(f"{len(t)} batches, {int(t['kernels'].sum())} kernels; weighted by kernels: "
          + ", ".join(f"{c} {100 * (t[c] * w).sum():.1f} %" for c in cols))


if __name__ == "__main__":
    main()
