"""``cpumap roofline``: ceilings (and optionally kernel points) and plots outside Snakemake.

    cpumap roofline [--json] [--out DIR] [--no-sweep] [--quick] [--points daxpy,gemv]
                    [--flagsets O2,O3-v3] [--sizes 1024,65536] [--states warm,cold]

Measures the compute ceilings (rows go to the database as a part of their own, batch
``cli-roofline-<time>``), runs the bandwidth sweep, writes compute.json, sweep.parquet,
ceilings.json, points.parquet (with --points: suite binaries are built under DIR/bin),
plots/ and section.html to DIR (default results/<machine>/roofline-cli, so the pipeline's
own outputs are never touched), and prints the acceptance checks.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

from cpumap.cli.context import UsageError, say


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("roofline", help="compute and bandwidth ceilings, kernel points, "
                                        "roofline plots")
    p.add_argument("--out", type=Path, help="output directory (default "
                                            "results/<machine>/roofline-cli)")
    p.add_argument("--no-sweep", action="store_true", help="compute ceilings only")
    p.add_argument("--quick", action="store_true",
                   help="one sweep round, 2 points per level, fewer repetitions")
    p.add_argument("--points", default="", help="suite kernels to place, comma-separated")
    p.add_argument("--flagsets", default="O2,O3-v3,O3-native")
    p.add_argument("--sizes", default="", help="problem sizes n for every --points kernel")
    p.add_argument("--states", default="warm,cold")
    p.add_argument("--reps", type=int, default=10, help="repetitions K of each point")
    p.add_argument("--processes", type=int, default=3,
                   help="driver processes per point, the fastest kept (a whole process can "
                        "run slow on a shared host)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(fn=run)
    return p


def run(args: argparse.Namespace, ctx) -> int:
    from cpumap.evaluate import suite
    from cpumap.measure.settings import BenchSettings
    from cpumap.roofline import build, plots, points, report
    from cpumap.roofline.sweep import build_sweep
    from cpumap.store import files

    machine = json.loads(ctx.machine_json().read_text())
    out = Path(args.out) if args.out else ctx.root / "roofline-cli"
    out.mkdir(parents=True, exist_ok=True)
    cfg: dict = {}
    if args.quick:
        cfg = {"compute_bench": {"min_reps": 16},
               "sweep": {"per_level": 2, "rounds": 1, "quiet_reps": 1, "max_reps": 6}}
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    part = ctx.root / "db" / f"part-cli-roofline-{stamp}.parquet"
    # the kernels to place are checked and built before anything is timed
    benches = {}
    size_map: dict = {}
    if args.points:
        kernels = [k for k in args.points.split(",") if k]
        flagsets = [f for f in args.flagsets.split(",") if f]
        sizes = [int(x) for x in args.sizes.split(",") if x]
        if not sizes:
            raise UsageError("--points needs --sizes")
        size_map = {k: sizes for k in kernels}
        for k in kernels:
            for f in flagsets:
                benches[f"{k}.{f}"] = suite.build_benchmark(k, f, out / "bin" / f"{k}.{f}")
    forms, harness_bin = ctx.catalogue().df, ctx.harness_bin()
    sweep_bin = None if args.no_sweep else build_sweep(ctx.root / "bin")
    with ctx.timing():
        compute = build.run_compute(forms, machine, BenchSettings(), cfg, out / "work",
                                    harness_bin, part, progress=say)
        build.write_json(compute, out / "compute.json")
        rows = None
        if sweep_bin is not None:
            rows = build.run_sweep(sweep_bin, machine, cfg, progress=say)
            files.write_parquet_atomic(rows, out / "sweep.parquet")
        build.write_json(build.make_ceilings(compute, rows, machine, cfg), out / "ceilings.json")
        ceil = json.loads((out / "ceilings.json").read_text())
        pts = None
        if benches:
            df = points.measure_points(benches, size_map, args.states.split(","), machine,
                                       reps=args.reps, progress=say, processes=args.processes)
            files.write_parquet_atomic(df, out / "points.parquet")
            pts = points.from_frame(df)
    plots.all_plots(ceil, pts, out / "plots")
    checks = build.checks(ceil, pts)
    files.write_text_atomic(report.section_html(ceil, pts, out / "plots", checks),
                         out / "section.html")
    if args.json:
        print(json.dumps({"out": str(out), "checks": checks}, indent=2, default=str))
    else:
        for c in checks:
            print(("ok   " if c["ok"] else "FAIL ") + c["text"])
        print(f"outputs in {out}")
    return 0
