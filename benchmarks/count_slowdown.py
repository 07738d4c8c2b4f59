#!/usr/bin/env python3
"""Cost of counting block occurrences with gdb, with and without the flow-conservation
reduction, on the real-kernel suite.

For each benchmark (built into a temporary directory, default sizes) and each mode -- a
breakpoint on every block ("all"), flow conservation only ("flow"), flow conservation plus
trip-count loops ("flow+trip", the default of cpumap.evaluate.counting) -- this prints the
breakpoint hits, hits per second in the counted region, and the whole run under gdb against a
plain run of the same command (the fastest of --plain-runs runs); totals compare the counted regions
with the plain kernel time (driver ticks / TSC frequency).  It checks every mode gives the
same counts.  Then it counts the whole set again with --processes gdb processes at a time
and prints the wall time against the sequential sum.

    .venv/bin/python benchmarks/count_slowdown.py                  # every kernel x flag set
    .venv/bin/python benchmarks/count_slowdown.py --kernels daxpy dot --flagsets O2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cpumap.evaluate import (
    blocks,  # noqa: E402
    counting,
    suite,
)
from cpumap.host import machine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", nargs="*", default=suite.kernels())
    ap.add_argument("--flagsets", nargs="*", default=list(suite.FLAGSETS))
    ap.add_argument("--plain-runs", type=int, default=3)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    tsc_hz = machine.describe()["tsc"]["mhz"] * 1e6
    rows = []
    with tempfile.TemporaryDirectory(prefix="cpumap-slowdown-") as tmp:
        t0 = time.perf_counter()
        built = {f"{k}.{f}": suite.build_benchmark(k, f, Path(tmp) / f"{k}.{f}")
                 for k in args.kernels for f in args.flagsets}
        build_s = time.perf_counter() - t0
        print(f"built {len(built)} benchmarks in {build_s:.1f} s")
        modes = {"all": {"all_blocks": True}, "flow": {"trips": False}, "flow+trip": {}}
        print("per mode: breakpoint hits, hits/s in the counted region, seconds under gdb, "
              "slowdown of the whole run against a plain run")
        print(f"{'benchmark':24} {'blk':>3} {'plain s':>7} {'kern us':>7} | " + " | ".join(
            f"{m + ' hits':>15} {'/s':>5} {'gdb s':>5} {'slow':>5}" for m in modes))
        for bench, exe in built.items():
            k, _ = suite.split_benchmark(bench)
            fn = suite.function_name(k)
            bl = blocks.extract_blocks(exe, fn)
            run_args = suite.benchmark_args(bench, reps=1)
            plain = min(counting.plain_run_seconds(exe, run_args)
                        for _ in range(args.plain_runs))
            kern_s = min(suite.measure_kernel(exe, reps=1)["ticks"][0] / tsc_hz
                         for _ in range(args.plain_runs))
            res = {m: counting.count(exe, fn, bl, run_args, plain=False, **kw)
                   for m, kw in modes.items()}
            if not all(r.counts == res["all"].counts for r in res.values()):
                print(f"{bench}: DERIVED COUNTS DIFFER FROM FULL COUNTS", file=sys.stderr)
                return 1
            row = {"benchmark": bench, "blocks": len(bl), "plain_s": plain, "kernel_s": kern_s}
            for m, r in res.items():
                row[m] = {"hits": r.hits, "region_s": r.region_seconds, "gdb_s": r.seconds,
                          "breakpoints": sum(x == "breakpoint" for x in r.method.values()),
                          "trips": sum(x == "trip" for x in r.method.values())}
            rows.append(row)
            print(f"{bench:24} {len(bl):3d} {plain:7.3f} {kern_s * 1e6:7.1f} | " + " | ".join(
                f"{row[m]['hits']:15d} {row[m]['hits'] / row[m]['region_s']:5.0f} "
                f"{row[m]['gdb_s']:5.2f} {row[m]['gdb_s'] / plain:5.1f}" for m in modes))
        plain_s = sum(r["plain_s"] for r in rows)
        kern_s = sum(r["kernel_s"] for r in rows)
        for m in modes:
            hits = sum(r[m]["hits"] for r in rows)
            reg = sum(r[m]["region_s"] for r in rows)
            gdb_s = sum(r[m]["gdb_s"] for r in rows)
            print(f"total {m:9}: {hits:6d} hits, {hits / reg:5.0f} hits/s in the counted "
                  f"regions ({reg:.2f} s against {kern_s * 1e6:.0f} us of plain kernel time: "
                  f"x{reg / kern_s:.0f}); {gdb_s:.1f} s under gdb against {plain_s:.2f} s of "
                  f"plain runs: slowdown x{gdb_s / plain_s:.1f}")
        gdb_s = sum(r["flow+trip"]["gdb_s"] for r in rows)
        jobs = [{"binary": exe, "function": suite.function_name(suite.split_benchmark(b)[0]),
                 "args": suite.benchmark_args(b, reps=1), "plain": False}
                for b, exe in built.items()]
        t0 = time.perf_counter()
        res = counting.count_many(jobs, processes=args.processes)
        par = time.perf_counter() - t0
        failed = [r for r in res if isinstance(r, str)]
        print(f"parallel: {len(jobs)} counts with {args.processes} gdb processes at a time in "
              f"{par:.1f} s (sequential sum {gdb_s:.1f} s, x{gdb_s / par:.2f}); "
              f"{len(failed)} failed")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
