"""The Python side of measuring a batch in rounds, at the default run's batch size.

Usage: python benchmarks/rounds_speed.py [--kernels 2000] [--reps 40] [--rounds 8]
                                         [--unsettled 0.05]

Scripts the harness's results of one batch (no native code runs): ``--kernels`` kernels of
``--reps`` repetitions a round in the first three rounds, then a share ``--unsettled`` of
them measured again in each later round (with the two monitors), as a batch on a noisy host
is. Prints the seconds of:

- the judgement after each round past the third (``batch._unsettled``), with ``only`` the
  kernels the last round measured, as ``batch._rounds`` calls it, and over the whole batch;
- building the batch's DB rows once (``rows.rows_from_rounds`` and ``db.conform``).

The rounds' own harness time is not here: a round of 100 kernels measures in well under a
second, so a judgement taking seconds is what a batch's later rounds cost.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from cpumap.measure import asmgen, batch, harness, quiet
from cpumap.measure.rows import rows_from_rounds
from cpumap.measure.settings import BenchSettings
from cpumap.store import db


def scripted_rounds(n_kernels: int, reps: int, rounds: int, unsettled: float,
                    seed: int = 0) -> tuple[list, list, tuple[int, ...]]:
    """(results, metas, monitors) of a batch measured in ``rounds`` rounds."""
    rng = np.random.default_rng(seed)
    names = [*quiet.MONITOR_KERNELS, *(f"ADD_R64_R64*{i + 1}" for i in range(n_kernels - 2))]
    metas = [asmgen.KernelMeta(i, k, asmgen.kernel_id(k), 1, 20, 1000, 1, 2, 20_000)
             for i, k in enumerate(names)]
    mons = (0, 1)
    cpi = rng.uniform(0.25, 4.0, n_kernels)
    results, todo = [], list(range(n_kernels))
    for rnd in range(rounds):
        if rnd >= 3:
            k = max(1, int(unsettled * n_kernels * 0.6 ** (rnd - 3)))
            todo = [*mons, *sorted(rng.choice(np.arange(2, n_kernels), k, replace=False))]
        rows = []
        for i in todo:
            slow = 1.0 + rng.exponential(0.02, reps)
            # a crisp clock level, a sample in twenty slowed by a neighbour
            cal1 = 20_000 + rng.integers(0, 3, reps) + np.where(
                rng.random(reps) < 0.05, rng.integers(40, 400, reps), 0)
            for rep in range(reps):
                c = cpi[i] * 20_000 * slow[rep]
                rows.append({"index": i, "rep": rep, "iters": 1000, "stable": rep % 2 == 0,
                             "ticks1": int((300 + c) / 1.4), "ticks2": int((300 + 2 * c) / 1.4),
                             "cycles1": -1, "cycles2": -1, "cal1": int(cal1[rep]),
                             "cal2": int(2 * cal1[rep] - 40), "cal_adds": 28_000})
        results.append(harness.BatchResult("tsc-calibrated", "derived", 1.4, 1.4, rows))
    return results, metas, mons


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--unsettled", type=float, default=0.05)
    a = ap.parse_args()
    results, metas, mons = scripted_rounds(a.kernels, a.reps, a.rounds, a.unsettled)
    print(f"{a.kernels} kernels, {sum(len(r.rows) for r in results):,} repetitions in "
          f"{a.rounds} rounds")
    bench = BenchSettings(rounds=3, max_rounds=a.rounds)
    for n in range(3, a.rounds):
        last = sorted({int(r["index"]) for r in results[n].rows})
        t = time.perf_counter()
        batch._unsettled(results[:n + 1], metas, bench, mons, only=last)
        some = time.perf_counter() - t
        t = time.perf_counter()
        batch._unsettled(results[:n + 1], metas, bench, mons)
        whole = time.perf_counter() - t
        print(f"after round {n + 1} ({len(last)} kernels measured): judged {some:.2f} s, "
              f"the whole batch judged {whole:.2f} s")
    t = time.perf_counter()
    rows = db.conform(rows_from_rounds(results, metas, "m", "b", {},
                                             pd.Timestamp.now(tz="UTC"), mons))
    print(f"DB rows of the batch: {len(rows):,} in {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main()
