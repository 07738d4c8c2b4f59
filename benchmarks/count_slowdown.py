#!/usr/bin/env python3
"""Cost of counting block occurrences with gdb, with and without the flow-conservation
reduction, on the real-kernel suite.

For each benchmark (built into a temporary directory, default sizes) this prints:
breakpoints set and hits taken, hits per second in the counted region, the counted region's
time against the plain kernel's (driver ticks / TSC frequency), and the whole run under gdb
against a plain run of the same command (the fastest of --plain-runs runs) -- once breaking
only on the blocks conservation cannot derive, once on every block.  It checks both give
the same counts.  Then it counts the whole set again with --processes gdb processes at a time
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

from cpumap import blocks, counting, machine, suite  # noqa: E402


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
        hdr = (f"{'benchmark':24} {'blk':>3} {'bp':>3} {'hits':>6} {'hits/s':>6} "
               f"{'region':>7} {'x kern':>7} {'gdb s':>6} {'plain':>6} {'slow':>5} | "
               f"{'all:hits':>8} {'hits/s':>6} {'gdb s':>6} {'slow':>5}")
        print(hdr)
        for bench, exe in built.items():
            k, _ = suite.split_benchmark(bench)
            fn = suite.function_name(k)
            bl = blocks.extract_blocks(exe, fn)
            run_args = suite.benchmark_args(bench, reps=1)
            plain = min(counting.plain_run_seconds(exe, run_args)
                        for _ in range(args.plain_runs))
            kern_s = min(suite.measure_kernel(exe, reps=1)["ticks"][0] / tsc_hz
                         for _ in range(args.plain_runs))
            red = counting.count(exe, fn, bl, run_args, plain=False)
            full = counting.count(exe, fn, bl, run_args, all_blocks=True, plain=False)
            if red.counts != full.counts:
                print(f"{bench}: DERIVED COUNTS DIFFER FROM FULL COUNTS", file=sys.stderr)
                return 1
            row = {"benchmark": bench, "blocks": len(bl),
                   "breakpoints": sum(m == "breakpoint" for m in red.method.values()),
                   "hits": red.hits, "hits_per_s": red.hits / red.region_seconds,
                   "region_s": red.region_seconds, "kernel_s": kern_s,
                   "region_slowdown": red.region_seconds / kern_s,
                   "gdb_s": red.seconds, "plain_s": plain, "slowdown": red.seconds / plain,
                   "all_hits": full.hits, "all_hits_per_s": full.hits / full.region_seconds,
                   "all_gdb_s": full.seconds, "all_slowdown": full.seconds / plain}
            rows.append(row)
            print(f"{bench:24} {row['blocks']:3d} {row['breakpoints']:3d} {row['hits']:6d} "
                  f"{row['hits_per_s']:6.0f} {row['region_s']:7.3f} "
                  f"{row['region_slowdown']:7.0f} {row['gdb_s']:6.2f} {plain:6.3f} "
                  f"{row['slowdown']:5.1f} | {row['all_hits']:8d} "
                  f"{row['all_hits_per_s']:6.0f} {row['all_gdb_s']:6.2f} "
                  f"{row['all_slowdown']:5.1f}")
        hits, all_hits = sum(r["hits"] for r in rows), sum(r["all_hits"] for r in rows)
        reg, all_reg = sum(r["region_s"] for r in rows), 0.0
        gdb_s, all_gdb_s = sum(r["gdb_s"] for r in rows), sum(r["all_gdb_s"] for r in rows)
        plain_s = sum(r["plain_s"] for r in rows)
        all_reg = sum(r["all_hits"] / r["all_hits_per_s"] for r in rows)
        print(f"total: reduced {hits} hits ({hits / reg:.0f}/s in the counted regions), "
              f"{gdb_s:.1f} s under gdb, slowdown {gdb_s / plain_s:.1f}x of {plain_s:.2f} s "
              f"plain; every block {all_hits} hits ({all_hits / all_reg:.0f}/s), "
              f"{all_gdb_s:.1f} s, slowdown {all_gdb_s / plain_s:.1f}x; the reduction saves "
              f"{1 - hits / all_hits:.0%} of the hits")
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
