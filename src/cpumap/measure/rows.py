"""A batch's DB rows, built from what the harness printed in each round.

Kept apart from ``cpumap.measure.batch``, which runs the rounds and judges them: the rows are
built twice a batch at least (to judge the rounds, then to store them), column by column,
each repetition at the clock it ran at (``cpumap.measure.clocklevels``).
"""

from __future__ import annotations

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
    failed = np.array(sorted(failed_kernels(results)), dtype="int64")
    parts = []
    for rnd, res in enumerate(results):
        cols = round_columns(res)
        ok = ~np.isin(cols["index"], failed) & (cols["cal1"] > 0)
        parts.append((np.full(int(ok.sum()), rnd), cols["cal1"][ok], cols["cal2"][ok],
                      cols["cal_adds_f"][ok]))
    rnd, cal1, cal2, adds = (np.concatenate([p[j] for p in parts]) if parts else np.zeros(0)
                             for j in range(4))
    return pd.DataFrame({"machine_id": machine_id, "batch_id": batch_id,
                         "params_id": db.params_id(params), "timestamp": now,
                         "round": rnd.astype("int64"), "cal1": cal1.astype("float64"),
                         "cal2": cal2.astype("float64"), "cal_adds": adds.astype("float64")})


def round_columns(res) -> dict:
    """The columns of one harness run's rows that no later round changes, read from its
    row dicts once and kept on it (``res.columns``): each judgement of a batch builds the
    rows of every round again (their clocks move with each new round's samples), and a
    Python pass per column each time cost a scripted 5,000-kernel batch's rows 4.97 s
    against 3.87 s read once (``benchmarks/rounds_speed.py``, 2026-11-29)."""
    if res.columns is not None:
        return res.columns
    rows = res.rows

    def col(key: str, default=None, dtype="int64") -> np.ndarray:
        return np.array([r.get(key, default) for r in rows], dtype=dtype)

    cols: dict = {"index": col("index"), "ticks1": col("ticks1"), "ticks2": col("ticks2"),
                  "cycles1": col("cycles1"), "cycles2": col("cycles2"),
                  "iters": col("iters", -1), "cal1": col("cal1", -1, "float64"),
                  "cal2": col("cal2", -1, "float64"),
                  "cal_adds_f": col("cal_adds", np.nan, "float64"),
                  "end1": col("end1", -1, "float64"), "end2": col("end2", -1, "float64"),
                  # None where a row has none: the types pandas infers for such a column
                  "cal_adds": pd.Series([r.get("cal_adds") for r in rows]),
                  "stable": pd.Series([r.get("stable") for r in rows])}
    if res.clock == "papi":
        cols["instructions"] = col("insns2") - col("insns1")
    else:
        cols["calib_ratio"] = col("calib_ratio", harness.calib_ratio(res), "float64")
    # its calibration samples as clock ratios (``clocklevels.clock_samples``)
    chains = (cols["cal1"], cols["cal2"], cols["end1"], cols["end2"], cols["cal_adds_f"])
    cols["samples"] = clocklevels.sample_pairs(*chains)
    cols["floors"] = clocklevels.floor_pairs(*chains)
    res.columns = cols
    return cols


def rows_from_rounds(results, metas, machine_id, batch_id, params, now,
                     mons: Sequence[int] = (), keep: set[int] | None = None) -> pd.DataFrame:
    """DB rows of all rounds: a kernel that failed in any round gets one failed row only;
    only the ``keep`` kernels' if given (their clocks still from every row's samples).

    Every repetition is stored as ``ok`` with its raw ticks, even one whose f2 - f1 is not
    positive (its f1 call was disturbed): the estimate takes each call kind's undisturbed
    duration from all repetitions (cpumap.measure.estimate), never a repetition's difference.
    """
    failed = failed_kernels(results)
    # the clock each repetition ran at, from the samples around it; the clock levels from
    # all rounds' samples (clocklevels.local_ratios)
    samples = [round_columns(res)["samples"] for res in results]
    level = clocklevels.clock_levels(np.concatenate([np.concatenate(s) for s in samples])
                                     if samples else [])
    by_index = {m.index: m for m in metas}
    ids = sorted(by_index)
    # each kernel's identity columns, built once and taken by every row of it
    bases = pd.DataFrame([base_row(machine_id, batch_id, params, by_index[i].kernel,
                                   by_index[i].n_insns) for i in ids])
    unroll = np.array([by_index[i].unroll for i in ids], dtype="int64")
    n_insns = np.array([by_index[i].n_insns for i in ids], dtype="int64")
    iters0 = np.array([by_index[i].iters for i in ids], dtype="int64")
    ids_arr = np.array(ids, dtype="int64")
    dropped = np.array(sorted(failed), dtype="int64")
    kept_ids = None if keep is None else np.array(sorted(keep), dtype="int64")
    done = np.zeros(len(ids), dtype="int64")  # repetitions of each kernel in earlier rounds
    frames: list[pd.DataFrame] = []
    for rnd, (res, own) in enumerate(zip(results, samples, strict=True)):
        cols = round_columns(res)
        index = cols["index"]
        pos = np.searchsorted(ids_arr, index)
        rep = done[pos] + pd.Series(pos).groupby(pos).cumcount().to_numpy()
        done += np.bincount(pos, minlength=len(ids))
        take = ~np.isin(index, dropped)
        if kept_ids is not None:
            take &= np.isin(index, kept_ids)
        if not take.any():
            continue
        if res.clock != "papi":
            local, low = clocklevels.local_ratios(len(index), own, res.calib_after, level,
                                                  cols["floors"])
        else:
            local = low = np.full(len(index), np.nan)
        frames.append(_round_frame(res, cols, take, pos[take], rep[take], local[take],
                                   low[take], bases, unroll, n_insns, iters0, now, mons, rnd))
    clock = results[0].clock if results else ""
    src = results[0].insn_source if results else ""
    lost = [failed_row(machine_id, batch_id, params, by_index[idx].kernel,
                       by_index[idx].n_insns, reason, now, clock, src)
            | {"role": role_of(idx, mons)}
            for idx, reason in failed.items() if keep is None or idx in keep]
    frames = [f for f in (*frames, pd.DataFrame(lost)) if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def role_of(index: int, mons: Sequence[int]) -> str:
    return "monitor" if index in mons else "kernel"


def _round_frame(res, cols: dict, take: np.ndarray, pos: np.ndarray, rep: np.ndarray,
                 local: np.ndarray, low: np.ndarray, bases: pd.DataFrame, unroll: np.ndarray,
                 n_insns: np.ndarray, iters0: np.ndarray, now, mons: Sequence[int],
                 round_no: int) -> pd.DataFrame:
    """DB rows of the ``take`` repetitions of one round (``pos``: each one's kernel in
    ``bases`` and the per-kernel arrays)."""
    n = len(pos)
    # the harness scales the iterations to the call length it aims for (bench.call_us)
    iters = np.where(cols["iters"][take] >= 0, cols["iters"][take], iters0[pos])
    instances = unroll[pos] * iters
    ticks1, ticks2 = cols["ticks1"][take], cols["ticks2"][take]
    if res.clock == "papi":
        cycles = (cols["cycles2"][take] - cols["cycles1"][take]).astype("float64")
        instructions = cols["instructions"][take]
        row_ratio = np.full(n, np.nan)
    else:
        row_ratio = cols["calib_ratio"][take]
        cycles = (ticks2 - ticks1).astype("float64") * row_ratio
        # f2 - f1 executes exactly U copies of the kernel per iteration more
        instructions = instances * n_insns[pos]
    cal1, cal2 = cols["cal1"][take], cols["cal2"][take]
    has_cal = cal1 > 0
    base = bases.iloc[pos].reset_index(drop=True)
    out = {
        **{c: base[c] for c in base.columns},
        "rep": rep.astype("int64"),
        "status": "ok", "error": "", "clock": res.clock, "insn_source": res.insn_source,
        "ticks1": ticks1, "ticks2": ticks2, "cycles1": cols["cycles1"][take],
        "cycles2": cols["cycles2"][take],
        "calib_ratio": row_ratio, "instances": instances, "instructions": instructions,
        "cycles": cycles, "cycles_per_instance": cycles / instances, "timestamp": now,
        "cal1": np.where(has_cal, cal1, np.nan), "cal2": np.where(has_cal, cal2, np.nan),
        "cal_adds": cols["cal_adds"][take].reset_index(drop=True),
        "stable": cols["stable"][take].reset_index(drop=True),
        "role": np.where(np.isin(cols["index"][take], list(mons)), "monitor", "kernel"),
        "round": np.full(n, round_no),
        "local_ratio": local, "run_ratio_low": low,
    }
    return pd.DataFrame(out)
