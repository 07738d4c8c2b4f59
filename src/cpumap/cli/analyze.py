"""``cpumap analyze``: where the cycles of one function of any x86-64 binary go, by every analyzer.

    cpumap analyze [--json] [--model FILE] [--analyzers LIST] [--reps N] [--no-measure]
                   BINARY --function NAME [-- ARGS...]

The function's basic blocks (Capstone), their exact occurrences in its first call (gdb, with
repeated string instructions counted per iteration), each analyzer's cycles per block, the
totals lifted to the whole call (``cpumap.evaluate.lift``, the suite evaluation's own rule: a
call is predicted only when every executed block is) and the call's measured cycles
(``cpumap.evaluate.fntime``). Exit codes: 0 done, 1 a run failed (the program crashed or
hung under gdb, the function could not be timed), 2 bad input (no such binary or function).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from cpumap.cli.context import Context, UsageError, say

ALL = ["model", "native", "written", "loop", "llvm-mca", "osaca"]
USAGE = ("cpumap analyze [--json] [--model FILE] [--analyzers LIST] [--reps N] [--no-measure] "
         "[--timeout S] BINARY --function NAME [-- ARGS...]")


def _options(p: argparse.ArgumentParser, defaults: bool) -> None:
    keep = {} if defaults else {"default": argparse.SUPPRESS}
    p.add_argument("--function", help="function to analyze (clones and C++ names accepted)",
                   **keep)
    p.add_argument("--json", action="store_true", help="print JSON", **keep)
    p.add_argument("--model", type=Path, help="model.json (default: this machine's, from the "
                   "pipeline's results)", **keep)
    p.add_argument("--analyzers", help=f"comma-separated, of {','.join(ALL)} (default: all)",
                   **keep)
    p.add_argument("--reps", type=int, help="runs of the program to time (default 5)", **keep)
    p.add_argument("--no-measure", action="store_true", dest="no_measure",
                   help="do not time the function", **keep)
    p.add_argument("--timeout", type=float, help="seconds before a run of the program is "
                   "killed (default 300)", **keep)


def add_parser(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("analyze", help="blocks, counts, every analyzer's cycles and the "
                       "measured cycles of one function of any binary", usage=USAGE)
    _options(p, defaults=True)
    p.add_argument("binary", type=Path)
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(fn=run)


def _analyzers(names: list[str], ctx: Context, model_path: Path | None, forms, blocks,
               progress):
    """name -> analyzer object, or name -> why it is not run."""
    from cpumap.evaluate import analyzers as A
    from cpumap.evaluate.analyzers import targets

    out: dict[str, Any] = {}
    measurer = None
    for name in names:
        if name == "model":
            path = model_path or ctx.root / "model" / "model.json"
            if not path.exists():
                out[name] = (f"no model at {path}: run the pipeline (./scripts/setup.sh) or "
                             "give --model")
                continue
            from cpumap.model import resmodel

            out[name] = A.ModelAnalyzer(resmodel.load(path), forms)
        elif name == "llvm-mca":
            out[name] = A.LlvmMca(cpu=targets.llvm_mca_cpu("auto", ctx.desc).value)
        elif name == "osaca":
            out[name] = A.Osaca(targets.osaca_arch("auto", ctx.desc).value, ignore_unknown=True)
        else:  # native, written, loop: measured here, rows kept in this machine's database
            if measurer is None:
                from cpumap.measure.backend import Measurer
                from cpumap.measure.settings import BenchSettings

                measurer = Measurer(ctx.desc, forms, BenchSettings(), ctx.root / "db",
                                    ctx.root / "work" / "analyze", harness_bin=ctx.harness_bin(),
                                    log=progress)
            if name == "loop":
                import pandas as pd

                from cpumap.isa.catalogue import Catalogue
                from cpumap.measure import latency

                wanted = {f for b in blocks for f in b.forms if f} | set(latency.MEMORY_FORMS)
                progress(f"loop: the latencies of {len(wanted)} forms")
                table = pd.DataFrame(latency.latency_rows(measurer, Catalogue(forms), wanted,
                                                          stage="analyze-latency"))
                bound = A.FirstOk([A.NativeAnalyzer(measurer, forms, stage="analyze-native"),
                                   A.WrittenAnalyzer(measurer, forms, stage="analyze-written")])
                out[name] = A.LoopAnalyzer(table, bound)
                continue
            out[name] = (A.NativeAnalyzer if name == "native" else A.WrittenAnalyzer)(
                measurer, forms, stage=f"analyze-{name}")
    return out


def _rep_note(rep: dict[str, Any]) -> str:
    per = rep["iterations"] / rep["executions"] if rep["executions"] else 0.0
    return (f"approximate: {rep['text']} ran {rep['iterations']} iterations in "
            f"{rep['executions']} executions ({per:.1f} each); analyzers see it once")


def analyze(args: argparse.Namespace, ctx: Context, prog_args: list[str]) -> dict[str, Any]:
    """Everything ``cpumap analyze`` prints, as one JSON-ready dict."""
    import pandas as pd

    from cpumap.evaluate import analyzers as A
    from cpumap.evaluate import lift
    from cpumap.evaluate.blocks import BlockError, blocks_frame, extract_blocks
    from cpumap.evaluate.counting import CountError, count, counts_frame
    from cpumap.evaluate.symbols import FunctionNotFound, resolve_function

    names = [a.strip() for a in (args.analyzers or ",".join(ALL)).split(",") if a.strip()]
    unknown = [a for a in names if a not in ALL]
    if unknown:
        raise UsageError(f"unknown analyzer(s) {', '.join(unknown)}; known: {', '.join(ALL)}")
    timeout = args.timeout or 300.0
    try:
        found = resolve_function(args.binary, args.function)
    except FunctionNotFound as exc:
        raise UsageError(str(exc)) from exc
    except Exception as exc:  # pyelftools' own errors: not an ELF file
        raise UsageError(f"cannot read {args.binary} as an ELF binary: {exc}") from exc
    if found.note:
        say(found.note)
    symbol = found.symbol
    cat = ctx.catalogue()
    try:
        blocks = extract_blocks(args.binary, symbol, cat)
    except BlockError as exc:
        raise UsageError(str(exc)) from exc
    say(f"{symbol}: {len(blocks)} blocks; counting the first call under gdb")
    try:
        counted = count(args.binary, symbol, blocks, prog_args, timeout=timeout, plain=False)
    except CountError as exc:
        raise RuntimeError(str(exc)) from exc
    bdf = blocks_frame(blocks, "call", symbol)
    cdf = counts_frame(counted, "call")
    inputs = A.block_inputs(bdf)
    reps: dict[int, list[dict[str, Any]]] = {}  # block id -> its repeated instructions
    for r in counted.reps.values():
        reps.setdefault(r["block_id"], []).append(r)
    preds: dict[str, pd.DataFrame] = {}
    meta: dict[str, dict[str, Any]] = {}
    for name, an in _analyzers(names, ctx, args.model, cat.df, blocks, say).items():
        if isinstance(an, str):
            meta[name] = {"status": "not run", "reason": an}
            continue
        say(f"{name}: {len(inputs)} blocks")
        df = A.predictions_frame(name, inputs, A.predict_blocks(an, inputs))
        for v, block_reps in reps.items():  # told, in the block's note
            ok = (df.block_id == v) & (df.status == "ok")
            notes = [_rep_note(rep) for rep in block_reps]
            df.loc[ok, "error"] = df.loc[ok, "error"].map(
                lambda e, notes=notes: "; ".join(x for x in (e, *notes) if x))
        preds[name] = df
        meta[name] = {"status": "ran", "description": an.describe()}
    measured = None
    if not args.no_measure:
        from cpumap.evaluate.fntime import TimingError, build_timer, time_function

        say(f"timing the first call of {symbol}: {args.reps or 5} runs")
        try:
            with ctx.timing():
                measured = time_function(args.binary, symbol, prog_args, reps=args.reps or 5,
                                         timeout=timeout, lib=build_timer(ctx.root / "bin"),
                                         progress=say).to_dict()
        except TimingError as exc:
            measured = {"error": str(exc)}
    lifted = (lift.lift(bdf, cdf, pd.concat(preds.values(), ignore_index=True))
              if preds else pd.DataFrame())
    executed = {int(v) for v, c in counted.counts.items() if c > 0}
    n_exec = counted.executed_instructions()
    n_static = counted.static_instructions()
    for row in lifted.itertuples(index=False):
        p = preds[row.analyzer]
        ex = p[p.block_id.isin(executed)]
        ok = ex[ex.status == "ok"]
        insns = sum(counted.counts[int(v)] * blocks[int(v)].n_insns for v in ok.block_id)
        total = float(row.predicted_cycles)
        m = meta[row.analyzer] | {
            "status": row.status, "error": row.error,
            "cycles": None if math.isnan(total) else total,
            "blocks_predicted": int(len(ok)), "blocks_executed": len(executed),
            "instructions_covered": insns / max(1, n_static),
            "approximate": bool((ok.error != "").any())}
        if m["cycles"] and measured and "cycles" in measured:
            m["ipc"] = n_exec / m["cycles"]
            m["error_vs_measured"] = m["cycles"] / measured["cycles"] - 1.0
        meta[row.analyzer] = m
    rows = []
    for b in blocks:
        occ = int(counted.counts.get(b.block_id, 0))
        rows.append({"block_id": b.block_id, "address": b.address, "end": b.end,
                     "occurrences": occ, "insns": b.insns, "forms": b.forms,
                     "rep": reps.get(b.block_id, []),
                     "predictions": {
                         n: {"cycles": None if math.isnan(c) else float(c), "status": s,
                             "error": e}
                         for n, p in preds.items()
                         for c, s, e in p[p.block_id == b.block_id][
                             ["cycles", "status", "error"]].itertuples(index=False)}})
    if measured and "cycles" in measured:
        measured["ipc"] = n_exec / measured["cycles"] if measured["cycles"] > 0 else None
    return {"binary": str(args.binary), "function": args.function, "symbol": symbol,
            "note": found.note, "args": prog_args, "machine_id": ctx.desc["machine_id"],
            "blocks": rows, "counting": counted.meta(), "analyzers": meta,
            "measured": measured}


def _fmt(x: float | None, width: int = 12) -> str:
    return f"{x:{width},.1f}" if x is not None else f"{'-':>{width}}"


def print_table(out: dict[str, Any]) -> None:
    names = [n for n, m in out["analyzers"].items() if m["status"] != "not run"]
    print(f"{out['symbol']} in {out['binary']}: {len(out['blocks'])} blocks, "
          f"{out['counting']['instructions_executed']:,} instructions executed in the first "
          "call")
    head = f"{'address':>10} {'occurrences':>11} {'insns':>5}  " + " ".join(
        f"{n:>12}" for n in names) + "  first instruction"
    print(head)
    for b in out["blocks"]:
        cells = " ".join(_fmt(b["predictions"].get(n, {}).get("cycles")) for n in names)
        flag = " [rep]" if b["rep"] else ""
        first = b["insns"][0] if b["insns"] else ""
        print(f"{b['address']:#10x} {b['occurrences']:11,d} {len(b['insns']):5d}  {cells}  "
              f"{first}{flag}")
    print("\ncycles of the call, per analyzer (blocks' cycles x occurrences):")
    meas = out["measured"]
    for n, m in out["analyzers"].items():
        if m["status"] == "not run":
            print(f"  {n:10s} not run: {m['reason']}")
            continue
        cov = (f"{m['blocks_predicted']}/{m['blocks_executed']} executed blocks, "
               f"{100 * m['instructions_covered']:.1f} % of executed instructions")
        if m["cycles"] is None:
            print(f"  {n:10s} {'-':>14}  ({cov}; {m['error'][:100]})")
            continue
        err = (f", {100 * m['error_vs_measured']:+.1f} % vs measured"
               if "error_vs_measured" in m else "")
        approx = ", approximate" if m["approximate"] else ""
        print(f"  {n:10s} {m['cycles']:14,.0f}  ({cov}{err}{approx})")
    if meas is None:
        print("  measured   not measured (--no-measure)")
    elif "error" in meas:
        print(f"  measured   failed: {meas['error']}")
    else:
        print(f"  measured   {meas['cycles']:14,.0f}  (method {meas['method']}: fastest of "
              f"{len(meas['runs'])} runs, median {meas['cycles_median']:,.0f}; the method's "
              f"own {meas['overhead_cycles']:,.0f} cycles subtracted, "
              f"± {meas['overhead_spread_cycles']:,.0f})")
        if meas["cycles"] < meas["overhead_spread_cycles"]:
            print("  (the call is shorter than the method's own spread: its figure is an order "
                  "of magnitude, not a measurement to compare analyzers with)")


def run(args: argparse.Namespace, ctx: Context) -> int:
    from cpumap.cli.count import split_rest

    prog_args = split_rest(args, _options, "cpumap analyze")
    if args.reps is not None and args.reps < 1:
        raise UsageError("--reps must be at least 1")
    if not args.binary.is_file():
        raise UsageError(f"no such binary: {args.binary}")
    out = analyze(args, ctx, prog_args)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print_table(out)
    failed = out["measured"] is not None and "error" in out["measured"]
    return 1 if failed else 0
