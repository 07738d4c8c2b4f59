"""``cpumap measure --latency INSTR``: the latency of every dependence chain of one form."""

from __future__ import annotations

import argparse
import json
import math

from cpumap.cli.context import Context, UsageError, resolve_kernel, say


def cmd_latency(args: argparse.Namespace, ctx: Context) -> int:
    from cpumap.isa import x86
    from cpumap.measure import latency
    from cpumap.measure.backend import Measurer
    from cpumap.measure.settings import BenchSettings

    cat = ctx.catalogue()
    kernel = resolve_kernel(cat, args.instr)
    if len(kernel) != 1 or sum(kernel.values()) != 1:
        raise UsageError("--latency takes one instruction form, once")
    name = next(iter(kernel))
    chains, why = latency.chains(name, cat)
    if why:
        say(f"{name}: {why}")
        return 1
    bench = BenchSettings() if args.repeat is None else BenchSettings(min_reps=args.repeat)
    measurer = Measurer(ctx.desc, cat.df, bench, ctx.root / "db", ctx.root / "work" / "latency",
                        harness_bin=ctx.harness_bin(), remeasure=args.force,
                        log=say if args.verbose else None)
    rows = latency.latency_rows(measurer, cat, [name], stage="cli-latency")
    unc = measurer.uncertainty([r["kernel"] for r in rows if r["kernel"]])
    for r in rows:
        u = unc.get(r["kernel"], math.nan)
        r["uncertainty"] = None if math.isnan(u) else u
        insns = x86.instruction_hexes(bytes.fromhex(r["kernel"].split(":", 1)[1]))
        # one link (a form and its moves back), or two instances of a chain of one form
        r["chain"] = "; ".join(x86.att(i) for i, _ in
                               insns[:max(2, len(insns) // latency.LINKS)])
        for key in ("latency", "round_trip"):
            if math.isnan(r[key]):
                r[key] = None
    if args.json:
        print(json.dumps({"form": name, "chains": rows}, indent=2))
    else:
        print(f"{name}: latency per dependence chain (cycles per link, {latency.LINKS} links "
              "a block, measured as written)")
        for r in rows:
            if r["latency"] is None:
                print(f"  {r['pair']:40s} failed: {r['error']}")
                continue
            u = f" ± {100 * r['uncertainty']:.1f} %" if r["uncertainty"] is not None else ""
            trip = f" (round trip {r['round_trip']:.3f})" if r["round_trip"] is not None else ""
            print(f"  {r['pair']:40s} {r['latency']:7.3f}{u}{trip}   {r['chain']}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1
