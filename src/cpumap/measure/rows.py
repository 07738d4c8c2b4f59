"""A batch's DB rows, built from what the harness printed in each round.

Kept apart from ``cpumap.measure.batch``, which runs the rounds and judges them: the rows are
built twice a batch at least (to judge the rounds, then to store them), column by column,
each repetition at the clock it ran at (``cpumap.measure.clocklevels``).
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Sequence

import numpy as np
import pandas as pd

from cpumap.measure import asmgen, clocklevels, harness
from cpumap.store import db


def base_row(machine_id: str, batch_id: str, params: dict, canon: str, n_insns: int, *,
             backend: str = "native", version: str = harness.HARNESS_VERSION) -> dict:
    """The identity columns every DB row of a kernel carries."""
    return {
        "machine_id": machine_id, "host": socket.gethostname(), "backend": backend,
        "kernel_id": asmgen.kernel_id(canon), "kernel": canon, "n_insns": n_insns,
        "params_id": db.params_id(params), "params": json.dumps(params, sort_keys=True),
        "harness_version": version, "batch_id": batch_id,
    }


def failed_row(machine_id: str, batch_id: str, params: dict, canon: str, n_insns: int,
                error: str, now: pd.Timestamp, clock: str = "", insn_source: str = "") -> dict:
    """The one row a kernel that could not be measured gets (rep -1)."""
    return base_row(machine_id, batch_id, params, canon, n_insns) | {
        "rep": -1, "status": "failed", "error": error, "clock": clock,
        "insn_source": insn_source, "timestamp": now}


def failed_kernels(results) -> dict[int, str]:
    """Kernel index -> the first reason it failed in any round."""
    failed: dict[int, str] = {}
    for res in results:
        for idx, reason in res.failures.items():
            failed.setdefault(int(idx), reason)
    return failed


def calibration_rows(results, machine_id, batch_id, params, now) -> pd.DataFrame:
    """All rounds' ok rows' calibration samples, with their round and the columns
    ``estimate.batch_ratios`` groups by: :func:`rows_from_rounds`'s, nothing else."""
    failed = failed_kernels(results)
    cal = [(rnd, r["cal1"], r["cal2"], r.get("cal_adds", np.nan))
           for rnd, res in enumerate(results) for r in res.rows
           if int(r["index"]) not in failed and r.get("cal1", -1) > 0]
    arr = np.array(cal, dtype="float64").reshape(-1, 4)
    return pd.DataFrame({"machine_id": machine_id, "batch_id": batch_id,
                         "params_id": db.params_id(params), "timestamp": now,
                         "round": arr[:, 0].astype("int64"), "cal1": arr[:, 1],
                         "cal2": arr[:, 2], "cal_adds": arr[:, 3]})


def rows_from_rounds(results, metas, machine_id, batch_id, params, now,
                     mons: Sequence[int] = (), keep: set[int] | None = None) -> pd.DataFrame:
    """DB rows of all rounds: a kernel that failed in any round gets one failed row only;
    only the ``keep`` kernels' if given (their clocks still from every row's samples)."""
    failed = failed_kernels(results)
    frames: list[pd.DataFrame] = []
    reps_done: dict[int, int] = {}
    # the clock each repetition ran at, from the samples around it; the clock levels from
    # all rounds' samples (clocklevels.assign_local_ratios)
    for res in results:
        if res.samples is None:
            res.samples = clocklevels.clock_samples(res.rows)
    samples = [res.samples for res in results]
    level = clocklevels.clock_levels(np.concatenate([np.concatenate(s) for s in samples])
                                 if samples else [])
    for res, own in zip(results, samples, strict=True):
        if res.clock != "papi":
            clocklevels.assign_local_ratios(res.rows, own, res.calib_after, level)
    for rnd, res in enumerate(results):
        kept = [r for r in res.rows if int(r["index"]) not in failed
                and (keep is None or int(r["index"]) in keep)]
        reps = []
        for r in kept:
            i = int(r["index"])
            reps.append(reps_done.get(i, 0))
            reps_done[i] = reps[-1] + 1
        frames.append(rows_from_result(dataclasses.replace(res, rows=kept), metas, machine_id,
                                       batch_id, params, now, mons, round_no=rnd, reps=reps))
    clock = results[0].clock if results else ""
    src = results[0].insn_source if results else ""
    by_index = {m.index: m for m in metas}
    lost = [failed_row(machine_id, batch_id, params, by_index[idx].kernel,
                        by_index[idx].n_insns, reason, now, clock, src)
            | {"role": role_of(idx, mons)}
            for idx, reason in failed.items() if keep is None or idx in keep]
    frames = [f for f in (*frames, pd.DataFrame(lost)) if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def role_of(index: int, mons: Sequence[int]) -> str:
    return "monitor" if index in mons else "kernel"


def rows_from_result(res, metas, machine_id, batch_id, params, now,
                     mons: Sequence[int] = (), round_no: int | None = None,
                     reps: Sequence[int] | None = None) -> pd.DataFrame:
    """DB rows of the measured repetitions of one harness run (failures: rows_from_rounds),
    built column by column (a dict per repetition, then a frame of them, was most of the
    judgement's 7 s above). ``round_no``, ``reps`` (one per row): the rows' round and rep.

    Every repetition is stored as ``ok`` with its raw ticks, even one whose f2 - f1 is not
    positive (its f1 call was disturbed): the estimate takes each call kind's undisturbed
    duration from all repetitions (cpumap.measure.estimate), never a repetition's difference.
    """
    rows = res.rows
    if not rows:
        return pd.DataFrame()
    ratio = harness.calib_ratio(res)
    by_index = {m.index: m for m in metas}
    index = np.array([int(r["index"]) for r in rows], dtype="int64")
    kernels = sorted(set(index.tolist()))
    pos = np.searchsorted(kernels, index)
    per = [by_index[i] for i in kernels]
    unroll = np.array([m.unroll for m in per], dtype="int64")[pos]
    n_insns = np.array([m.n_insns for m in per], dtype="int64")[pos]
    # the harness scales the iterations to the call length it aims for (bench.call_us)
    iters = np.array([r.get("iters", by_index[i].iters) for r, i in zip(rows, index.tolist(),
                                                                           strict=True)],
                     dtype="int64")
    instances = unroll * iters

    def col(key: str, default=None, dtype="int64") -> np.ndarray:
        return np.array([r.get(key, default) for r in rows], dtype=dtype)

    ticks1, ticks2 = col("ticks1"), col("ticks2")
    if res.clock == "papi":
        cycles = (col("cycles2") - col("cycles1")).astype("float64")
        instructions = col("insns2") - col("insns1")
        row_ratio = np.full(len(rows), np.nan)
    else:
        row_ratio = col("calib_ratio", ratio, "float64")
        cycles = (ticks2 - ticks1).astype("float64") * row_ratio
        # f2 - f1 executes exactly U copies of the kernel per iteration more
        instructions = instances * n_insns
    has_cal = col("cal1", -1) > 0
    bases = pd.DataFrame([base_row(machine_id, batch_id, params, m.kernel, m.n_insns)
                          for m in per]).iloc[pos].reset_index(drop=True)
    out = {
        **{c: bases[c] for c in bases.columns},
        "rep": np.asarray(reps, dtype="int64") if reps is not None else col("rep"),
        "status": "ok", "error": "", "clock": res.clock, "insn_source": res.insn_source,
        "ticks1": ticks1, "ticks2": ticks2, "cycles1": col("cycles1"), "cycles2": col("cycles2"),
        "calib_ratio": row_ratio, "instances": instances, "instructions": instructions,
        "cycles": cycles, "cycles_per_instance": cycles / instances, "timestamp": now,
        "cal1": np.where(has_cal, col("cal1", -1, "float64"), np.nan),
        "cal2": np.where(has_cal, col("cal2", -1, "float64"), np.nan),
        # None where a row has none: the types pandas infers for such a column
        "cal_adds": pd.Series([r.get("cal_adds") for r in rows]),
        "stable": pd.Series([r.get("stable") for r in rows]),
        "role": np.where(np.isin(index, list(mons)), "monitor", "kernel"),
        "round": (np.full(len(rows), round_no) if round_no is not None
                  else pd.Series([r.get("round") for r in rows])),
        "local_ratio": (col("local_ratio", np.nan, "float64") if res.clock != "papi"
                        else np.full(len(rows), np.nan)),
        "run_ratio_low": (col("run_ratio_low", np.nan, "float64") if res.clock != "papi"
                          else np.full(len(rows), np.nan)),
    }
    return pd.DataFrame(out)
