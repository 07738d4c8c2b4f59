"""Subcommands on kernels and forms: measure, forms, catalogue, machine."""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cpumap.cli.context import Context, resolve_kernel, say

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd



def summarize(rows: pd.DataFrame, kernel: dict[str, int], cached: bool,
              recent: pd.DataFrame | None = None,
              reference: dict[str, float] | None = None) -> dict:
    """The JSON of ``cpumap measure``; ``recent``: other rows of this machine measured lately,
    whose calibration samples join the batch's (cpumap.measure.estimate.batch_ratios);
    ``reference``: the machine's reference values (cpumap.measure.quiet): the monitors',
    against which the rounds are judged quiet, and the kernel's own."""
    import pandas as pd

    from cpumap.measure import asmgen, estimate, quiet

    # a cached kernel's rows come with the rest of its batch (a pipeline batch holds hundreds
    # of kernels): the calibration and the monitors are the batch's, the estimate is this
    # kernel's alone
    mine = rows[(rows.kernel_id == asmgen.kernel_id(asmgen.canonical(kernel)))
                & (rows.role != "monitor")]
    ok = mine[mine.status == "ok"]
    if ok.empty:
        errors = "; ".join(sorted(set(mine.error))) or "no row of it in its batch"
        raise RuntimeError(f"kernel {asmgen.canonical(kernel)} failed: {errors}")
    pool = rows if recent is None or recent.empty else pd.concat([recent, rows])
    agg = estimate.aggregate(ok, ratios=estimate.batch_ratios(pool)).iloc[0]
    cyc = float(agg["cycles_per_instance_est"])
    mon = estimate.monitor_table(rows)
    mon = mon[mon.kernel == quiet.MONITOR_KERNELS[0]]
    per_round = quiet.round_estimates(rows)
    calm, worst = quiet.quiet_rounds(per_round, reference)
    return {
        "kernel": asmgen.canonical(kernel), "kernel_id": str(agg["kernel_id"]),
        "forms": sorted(kernel), "n_insns": int(agg["n_insns"]),
        "cycles": cyc, "uncertainty": float(agg["rel_uncertainty"]),
        "unstable": bool(agg["unstable"]),
        "cycles_median": float(agg["cycles_per_instance_median"]),
        "noise": float(agg["noise"]), "ipc": float(agg["ipc"]),
        "nonlinearity": float(agg["nonlinearity"]),
        "loops_disagree": bool(agg["loops_disagree"]), "clock": str(ok.clock.iloc[0]),
        "insn_source": str(ok.insn_source.iloc[0]), "repetitions": int(len(ok)),
        "calib_ratio": float(agg["calib_ratio"]), "machine_id": str(ok.machine_id.iloc[0]),
        "params_id": str(ok.params_id.iloc[0]), "cached": cached,
        "host_noise": float(mon.noise.iloc[-1]) if len(mon) else None,
        "rounds": int(ok["round"].nunique()) if "round" in ok else None,
        "quiet_rounds": len(calm) if len(per_round) else None,
        "monitors_slowest_round": worst or None,
        "reference": (reference or {}).get(str(agg["kernel"])),
        "above_reference": quiet.above_reference(agg.to_frame().T, reference).get(
            str(agg["kernel"])),
    }


#: What a batch's clock (``estimate.batch_ratios``) is computed from: the columns read of the
#: recent rows, whose calibration samples join a one-kernel batch's.
_CLOCK_COLUMNS = ["machine_id", "batch_id", "params_id", "cal1", "cal2", "cal_adds",
                  "timestamp", "harness_version"]
#: What finds the batches that stored a kernel.
_KEY_COLUMNS = ["machine_id", "kernel_id", "params_id", "harness_version", "status", "role",
                "batch_id", "timestamp"]


def _recent(db_dir, machine_id: str, hours: float = 1.0) -> pd.DataFrame | None:
    """The calibration columns of the rows of this machine and harness stored in the last
    ``hours``: their samples help estimate the core clock of a one-kernel measurement. Only
    those columns: a default run's database is 200 MB, and read whole it took most of a cached
    answer's 40 s."""
    import pandas as pd

    from cpumap.measure import harness
    from cpumap.store import db

    if not db_dir.exists():
        return None
    since = pd.Timestamp(datetime.now(UTC)) - pd.Timedelta(hours=hours)
    # the parts written before then hold no such row: not opened
    rows = pd.concat([part for _, part in db.iter_parts(db_dir, _CLOCK_COLUMNS,
                                                         modified_since=since.timestamp(),
                                                         machine_id=machine_id)]
                     or [db.empty_frame()[_CLOCK_COLUMNS]], ignore_index=True)
    return rows[(rows.harness_version == harness.HARNESS_VERSION) & (rows.timestamp >= since)]


#: The index of which parts hold which kernels (``cpumap.store.kernel_index``), under the
#: results' ``work/cli``.
KERNEL_INDEX = "kernel-index.parquet"


def _settled(db_dir, machine_id: str, kid: str, pid: str, kernel: dict[str, int],
             reference: dict[str, float], index_path: Path
             ) -> tuple[pd.DataFrame | None, dict | None, int]:
    """The rows of the latest stored batch whose estimate of ``kernel`` (id ``kid``, measured
    with parameters ``pid`` by this harness) settled, its answer, and how many later batches
    held the kernel unsettled. Why not the latest batch whatever it says: a value the rounds
    never agreed on is the host's noise as much as the CPU's (`MOVZX_R32_M8*3
    VMOVDQA64_YMM_YMM*4`, a held-out kernel of a default run on a busy Sapphire Rapids-class
    guest, stored at 2.03 cycles, unstable; `MOV_R32_M32*3 VMOVDQA64_YMM_YMM*4` settled at
    1.167), and one kernel measured again costs seconds. Only the parts that hold the kernel
    are read (the index): a cached answer read every part's keys before, 1.7 s of its 6.7 s
    on a default run's database."""
    from cpumap.measure import harness
    from cpumap.store import db, kernel_index

    found = []  # (when measured, part, batch id)
    for path in kernel_index.parts_holding(db_dir, kid, index_path,
                                           skip_batches=db.REPEAT_PREFIX):
        keys = db.read_part(path, _KEY_COLUMNS, machine_id=machine_id, kernel_id=kid)
        keys = keys[(keys.params_id == pid) & (keys.status == "ok") & (keys.role != "monitor")
                    & (keys.harness_version == harness.HARNESS_VERSION)]
        found += [(t, str(path), b) for b, t in keys.groupby("batch_id")["timestamp"].max()
                  .items()]
    recent = _recent(db_dir, machine_id) if found else None
    unsettled = 0
    for _, path, bid in sorted(found, reverse=True):  # the latest first
        rows = db.read_part(path, machine_id=machine_id, batch_id=bid)
        out = summarize(rows, kernel, True, recent, reference)
        if not out["unstable"]:
            return rows, out, unsettled
        unsettled += 1
    return None, None, unsettled


def cmd_measure(args: argparse.Namespace, ctx: Context) -> int:
    if args.latency:
        from cpumap.cli.latency import cmd_latency

        return cmd_latency(args, ctx)
    from cpumap.measure import asmgen, batch, quiet
    from cpumap.measure.settings import BenchSettings
    from cpumap.store import db

    bench = BenchSettings() if args.repeat is None else BenchSettings(min_reps=args.repeat)
    for key in ("unroll_size", "total_insn", "cpu"):
        if getattr(args, key) is not None:
            bench = bench.replace(**{key: getattr(args, key)})
    cat = ctx.catalogue()
    kernel = resolve_kernel(cat, args.instr)
    canon = asmgen.canonical(kernel)
    kid = asmgen.kernel_id(canon)
    pid = db.params_id(bench.measurement_params())
    db_dir = ctx.root / "db"
    reference = quiet.load_reference(quiet.reference_path(db_dir), pid)
    rows, out = None, None
    if not args.force and db_dir.exists():
        rows, out, unsettled = _settled(db_dir, ctx.desc["machine_id"], kid, pid, kernel,
                                        reference, ctx.root / "work" / "cli" / KERNEL_INDEX)
        if rows is None and unsettled:
            say(f"{canon}: stored by {unsettled} batch(es), unstable in each: measured again")
    if rows is None:
        # unique per invocation: two measurements of one kernel in the same second must not
        # collide (parts are never overwritten)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        batch_id = f"cli-{stamp}-{os.getpid()}-{kid[:8]}"
        rows = batch.measure_batch(
            [canon], cat.df, ctx.desc, bench, ctx.root / "work" / "cli", ctx.harness_bin(),
            batch_id, progress=say if args.verbose else None,
            reference=quiet.reference_path(db_dir), reference_kernels=True)
        if not args.no_db:
            db.append(db_dir, rows, batch_id)
        # the reference as this measurement left it (its own settled value added)
        out = summarize(rows, kernel, False, _recent(db_dir, ctx.desc["machine_id"]),
                        quiet.load_reference(quiet.reference_path(db_dir), pid))
    cached = bool(out["cached"])
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        flag = ", UNSTABLE" if out["unstable"] else ""
        print(f"{out['kernel']}: {out['cycles']:.4f} cycles per instance "
              f"(± {100 * out['uncertainty']:.2f} %{flag}), IPC {out['ipc']:.3f}, "
              f"{out['repetitions']} repetitions, median repetition {out['cycles_median']:.4f}, "
              f"clock {out['clock']}{' (cached)' if cached else ''}")
    if out["above_reference"]:
        say(f"warning: {100 * out['above_reference']:.1f} % slower than this machine's "
            f"reference for the kernel ({out['reference']:.4f} cycles) after "
            f"{out['rounds']} rounds: a neighbour, most likely; measure again")
    if out["quiet_rounds"] == 0:
        say(f"warning: no round of this measurement ran on a quiet host (monitors' slowest "
            f"rounds: {out['monitors_slowest_round']}); the value may be slow: measure again")
    return 0


def cmd_forms(args: argparse.Namespace, ctx: Context) -> int:
    import pandas as pd

    df = ctx.catalogue().df
    if not args.all:
        df = df[df.status == "ok"]
    if args.pattern:
        df = df[df.name.str.contains(args.pattern, case=False, regex=True)
                | df.att_template.str.contains(args.pattern, case=False, regex=True)]
    cols = ["name", "att_template", "extension", "category", "status", "reason"]
    if args.json:
        print(df[cols].to_json(orient="records", indent=1))
    else:
        with pd.option_context("display.max_rows", None, "display.width", 200):
            print(df[cols].to_string(index=False))
    return 0


def cmd_catalogue(args: argparse.Namespace, ctx: Context) -> int:
    df = ctx.catalogue(rebuild=args.rebuild, smoke=not args.no_smoke).df
    print(f"{int((df.status == 'ok').sum())} forms ok, {int((df.status != 'ok').sum())} excluded")
    print(df[df.status != "ok"].reason.value_counts().head(args.top).to_string())
    return 0


def cmd_machine(args: argparse.Namespace, ctx: Context) -> int:
    path = ctx.machine_json()
    if args.json:
        print(path.read_text())
    else:
        d = ctx.desc
        print(f"{d['machine_id']}: {d.get('model_name')} ({d.get('uarch')}), "
              f"{path}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register measure, forms, catalogue and machine."""
    m = sub.add_parser("measure", help="measure the throughput of one kernel (a multiset)")
    m.add_argument("instr", nargs="+", help="form name or AT&T instruction, optionally *N")
    m.add_argument("--json", action="store_true")
    m.add_argument("--repeat", type=int, default=None,
                   help="at least K repetitions (default bench.min_reps); more until stable")
    m.add_argument("--force", action="store_true", help="measure even if already in the DB")
    m.add_argument("--no-db", action="store_true", help="do not store the rows")
    m.add_argument("--unroll-size", type=int, dest="unroll_size")
    m.add_argument("--total-insn", type=int, dest="total_insn")
    m.add_argument("--cpu", type=int, help="core to pin the harness to")
    m.add_argument("-v", "--verbose", action="store_true")
    m.add_argument("--latency", action="store_true",
                   help="the latency of each dependence chain of one form instead")
    m.set_defaults(fn=cmd_measure)
    f = sub.add_parser("forms", help="list instruction forms of the catalogue")
    f.add_argument("pattern", nargs="?", help="regular expression on name or AT&T template")
    f.add_argument("--all", action="store_true", help="include excluded forms")
    f.add_argument("--json", action="store_true")
    f.set_defaults(fn=cmd_forms)
    c = sub.add_parser("catalogue", help="build or summarize the instruction catalogue")
    c.add_argument("--rebuild", action="store_true")
    c.add_argument("--no-smoke", action="store_true", help="skip running each form once")
    c.add_argument("--top", type=int, default=30)
    c.set_defaults(fn=cmd_catalogue)
    mc = sub.add_parser("machine", help="describe this machine")
    mc.add_argument("--json", action="store_true")
    mc.set_defaults(fn=cmd_machine)
