"""Measuring campaigns: which kernels to measure, in batches, and the rows they produce."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from cpumap.isa.catalogue import host_flags
from cpumap.isa.x86 import FormSpec
from cpumap.measure import asmgen, harness
from cpumap.measure.settings import BenchSettings, bench_settings
from cpumap.store import db


def read_form_list(path: Path) -> list[str]:
    """Form names, one per line; '#' starts a comment."""
    names = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def select_forms(forms: pd.DataFrame, selection: Mapping, base: Path | None = None) -> list[str]:
    """Names of the forms a profile measures; a named form missing from the catalogue is an error.

    Forms of the list that this CPU cannot run stay out (they are reported as excluded).
    """
    ok = set(forms.loc[forms.status == "ok", "name"])
    which = selection.get("forms", "quick")
    if which == "all":
        return sorted(ok)
    path = Path(selection.get("quick_list", "config/quick_forms.txt"))
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    names = read_form_list(path)
    known = set(forms["name"])
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{path}: unknown form(s) {', '.join(unknown)}")
    return [n for n in names if n in ok]


def plan_singletons(forms: pd.DataFrame, selection: Mapping, batch_size: int,
                    base: Path | None = None) -> list[list[str]]:
    return batched(select_forms(forms, selection, base), batch_size)


def batched(kernels: Sequence[str], size: int) -> list[list[str]]:
    """The batches of a measuring plan (``{"batches": [[kernel, ...], ...]}``), in order."""
    return [list(kernels[i:i + size]) for i in range(0, len(kernels), max(1, size))]


def read_plan(path: str | Path) -> list[list[str]]:
    """The batches of a plan written by plan_singletons or a Palmed checkpoint."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["batches"]


def _specs(forms: pd.DataFrame, names) -> dict[str, FormSpec]:
    rows = forms.set_index("name").loc[sorted(set(names))]
    return {n: FormSpec.from_json(s) for n, s in zip(rows.index, rows["spec"], strict=True)}


def base_row(machine_id: str, batch_id: str, params: dict, canon: str, n_insns: int, *,
             backend: str = "native", version: str = harness.HARNESS_VERSION) -> dict:
    """The identity columns every DB row of a kernel carries."""
    return {
        "machine_id": machine_id, "host": socket.gethostname(), "backend": backend,
        "kernel_id": asmgen.kernel_id(canon), "kernel": canon, "n_insns": n_insns,
        "params_id": db.params_id(params), "params": json.dumps(params, sort_keys=True),
        "harness_version": version, "batch_id": batch_id,
    }


def _failed_row(machine_id: str, batch_id: str, params: dict, canon: str, n_insns: int,
                error: str, now: pd.Timestamp, clock: str = "", insn_source: str = "") -> dict:
    """The one row a kernel that could not be measured gets (rep -1)."""
    return base_row(machine_id, batch_id, params, canon, n_insns) | {
        "rep": -1, "status": "failed", "error": error, "clock": clock,
        "insn_source": insn_source, "timestamp": now}


def measure_batch(
    kernels: list[str],
    forms: pd.DataFrame,
    machine: dict,
    bench: BenchSettings | Mapping,
    workdir: Path,
    harness_bin: Path,
    batch_id: str,
    progress: Callable[[str], None] | None = None,
    skip: set[str] | frozenset[str] = frozenset(),
) -> pd.DataFrame:
    """Generate, compile and measure kernels (canonical texts) as one batch; return DB rows.

    A kernel that cannot be generated or that fails in the harness gets a ``failed`` row with
    the reason; the rest of the batch is measured normally. Kernels whose id is in ``skip``
    (already in the database) produce no rows.
    """
    say = progress or (lambda _m: None)
    bench = bench_settings(bench)
    machine_id = machine["machine_id"]
    params = bench.measurement_params()
    flags = host_flags(machine)
    parsed = [asmgen.parse_canonical(k) for k in kernels]
    n_all = len(parsed)
    parsed = [k for k in parsed if asmgen.kernel_id(asmgen.canonical(k)) not in skip]
    if len(parsed) < n_all:
        say(f"{batch_id}: {n_all - len(parsed)} of {n_all} kernels already in the database, "
            "not measured again")
    ok_forms = set(forms.loc[forms.status == "ok", "name"])
    specs = _specs(forms, [n for k in parsed for n in k if n in ok_forms])
    now = pd.Timestamp(datetime.now(UTC)).floor("us")
    rows: list[dict] = []
    good: list[dict[str, int]] = []
    for k in parsed:
        canon = asmgen.canonical(k)
        bad = [n for n in k if n not in ok_forms]
        err = f"form(s) not measurable here: {', '.join(bad)}" if bad else ""
        if not err:
            try:
                asmgen.plan_pools([specs[n] for n in k])
            except asmgen.KernelError as exc:
                err = str(exc)
        if err:
            rows.append(_failed_row(machine_id, batch_id, params, canon, sum(k.values()), err,
                                    now))
        else:
            good.append(k)
    if good:
        t0 = time.monotonic()
        asm, metas = asmgen.generate_batch(good, specs, bench.gen_params, flags)
        so = asmgen.compile_batch(asm, Path(workdir) / f"{batch_id}.so")
        say(f"{batch_id}: generated and compiled {len(good)} kernels in "
            f"{time.monotonic() - t0:.1f} s")

        t_run = time.monotonic()
        last = [t_run]
        reps, rounds = bench.repetitions()
        total = len(good) * rounds

        offset = [0]  # kernel runs of the rounds already finished

        def tick(done: int) -> None:
            now_t = time.monotonic()
            finished = offset[0] + done
            if finished < total and now_t - last[0] < 2.0:
                return  # a progress line every 2 s is enough, and costs nothing
            last[0] = now_t
            el = now_t - t_run
            say(f"{batch_id}: {finished}/{total} kernel runs ({rounds} rounds), "
                f"{total - finished} left, {finished / max(el, 1e-9):.1f} runs/s")

        results = []
        for rnd in range(rounds):
            offset[0] = rnd * len(good)
            results.append(harness.run_batch(
                so, len(good), reps=reps, warmup=bench.warmup, cpu=bench.cpu,
                timeout_s=bench.timeout_s, clock=bench.clock, harness_bin=harness_bin,
                progress=tick, max_call_us=bench.max_call_us,
            ))
        rows += rows_from_rounds(results, metas, machine_id, batch_id, params, now)
    df = pd.DataFrame(rows)
    return db.conform(df) if len(df) else db.empty_frame()


def rows_from_rounds(results, metas, machine_id, batch_id, params, now) -> list[dict]:
    """DB rows of all rounds: a kernel that failed in any round gets one failed row only."""
    failed: dict[int, str] = {}
    for res in results:
        for idx, reason in res.failures.items():
            failed.setdefault(int(idx), reason)
    rows: list[dict] = []
    reps_done: dict[int, int] = {}
    for res in results:
        kept = [r for r in res.rows if int(r["index"]) not in failed]
        for r in kept:
            i = int(r["index"])
            r["rep"] = reps_done.get(i, 0)
            reps_done[i] = r["rep"] + 1
        rows += rows_from_result(dataclasses.replace(res, rows=kept), metas, machine_id,
                                 batch_id, params, now)
    clock = results[0].clock if results else ""
    src = results[0].insn_source if results else ""
    by_index = {m.index: m for m in metas}
    for idx, reason in failed.items():
        m = by_index[idx]
        rows.append(_failed_row(machine_id, batch_id, params, m.kernel, m.n_insns, reason, now,
                                clock, src))
    return rows


def rows_from_result(res, metas, machine_id, batch_id, params, now) -> list[dict]:
    """DB rows of the measured repetitions of one harness run (failures: rows_from_rounds)."""
    rows = []
    ratio = harness.calib_ratio(res)
    by_index = {m.index: m for m in metas}
    for r in res.rows:
        m = by_index[int(r["index"])]
        base = base_row(machine_id, batch_id, params, m.kernel, m.n_insns)
        # the harness may run a slow kernel with fewer iterations (bench.max_call_ms)
        iters = int(r.get("iters", m.iters))
        instances = m.unroll * iters
        if res.clock == "papi":
            cycles = float(r["cycles2"] - r["cycles1"])
            instructions = int(r["insns2"] - r["insns1"])
            row_ratio = np.nan
        else:
            row_ratio = float(r.get("calib_ratio", ratio))
            cycles = float(r["ticks2"] - r["ticks1"]) * row_ratio
            # f2 - f1 executes exactly U copies of the kernel per iteration more
            instructions = instances * m.n_insns
        # f2 runs twice f1's work: a difference <= 0 means the n/2n premise failed for this
        # repetition (seen on a few mixed memory kernels whose U-copy loop ran slower than
        # the 2U one); keep the raw ticks, but never as an ok measurement
        bad = cycles <= 0
        rows.append(base | {
            "rep": int(r["rep"]), "status": "failed" if bad else "ok",
            "error": "f2 - f1 <= 0: the U-copy loop ran slower than the 2U one" if bad else "",
            "clock": res.clock,
            "insn_source": res.insn_source, "ticks1": int(r["ticks1"]),
            "ticks2": int(r["ticks2"]), "cycles1": int(r["cycles1"]),
            "cycles2": int(r["cycles2"]), "calib_ratio": row_ratio, "instances": instances,
            "instructions": instructions, "cycles": cycles,
            "cycles_per_instance": cycles / instances, "timestamp": now,
        })
    return rows


def singleton_summary(forms: pd.DataFrame, rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary counts by outcome and reason, per-form singleton table)."""
    agg = db.aggregate(rows[rows.status == "ok"]) if len(rows) else pd.DataFrame()
    measured = set(agg["kernel"]) if len(agg) else set()
    failed_rows = rows[(rows.status == "failed") & ~rows.kernel.isin(measured)]
    failed = failed_rows.drop_duplicates("kernel")
    counts = [{"outcome": "measured", "reason": "", "forms": len(measured)}]
    for reason, n in failed.error.value_counts().items():
        counts.append({"outcome": "failed", "reason": reason, "forms": int(n)})
    excl = forms[forms.status != "ok"]
    for reason, n in excl.reason.value_counts().items():
        counts.append({"outcome": "excluded", "reason": reason, "forms": int(n)})
    summary = pd.DataFrame(counts)
    if len(agg):
        table = agg.merge(forms[["name", "att_template", "extension", "category"]],
                          left_on="kernel", right_on="name", how="left").drop(columns="name")
        table = table.sort_values("kernel").reset_index(drop=True)
    else:
        table = pd.DataFrame()
    return summary, table
