"""From raw repetitions to one value per kernel, with its uncertainty: what the CPU does, not
what the neighbours did.

On a cloud VM the physical core is shared: a neighbour takes integer ALU slots for minutes,
and a call measured then runs 30-70 % slow, while calls that fell into a quiet moment run at
the CPU's own speed (docs/measurement.md: an independent C loop of 20,000 adds, timed 2,000
times, gave 0.253-0.258 cycles per add at the 1st percentile and 0.31-0.34 at the median).
Interference only ever lengthens a call, so each timed quantity is estimated from the low end
of its repetitions (:func:`cpumap.measure.robust.robust_low`): the mean of the samples
within 0.3 % (and one timer step) of the fastest that another sample agrees with, which
averages the TSC's 26-tick steps instead of picking the lowest.

What is estimated that way, each on its own: the short call (f1: U copies), the long call (f2:
2U copies), and the two calibration chains (n and 2n dependent adds) whose difference gives
the core cycles per TSC tick. The minimum of per-repetition *differences* or of per-repetition
*calibrated cycles* would be biased low (a disturbed f1 shrinks its repetition's difference; a
disturbed calibration lowers its ratio), which is why the differences are taken between
robust estimates, never before.

The core clock is one value per batch on the AMD guests (the fastest chains), but an Intel
core's clock follows its licence: after heavy 256- or 512-bit instructions it runs slower for
milliseconds, and every kernel measured then, scalar ones included, runs at that clock (the
Cascade Lake guest, 2026-11-28: 3.1, 2.7 or 2.4 GHz). A repetition whose calibration samples
before and after say it ran at a clock slower than the batch's fastest is converted at that
clock (``local_ratio``): its cycles are the core's, not the fastest clock's.

A kernel is measured in several rounds, passes over its batch seconds apart (bursts of
interference last seconds: a kernel measured only inside one is slowed in every call, with
nothing at the low end to find). The uncertainty is how far the best round's value is from
the next best round's; with one round, how far the first half of the repetitions is from all
of them (the harness stops measuring at the first doubling of the repetitions where they
agree within ``bench.stable_tol``). A kernel whose uncertainty exceeds that is ``unstable``:
its value is kept with the spread, never silently averaged, and Palmed leaves out kernels
less certain than its own tolerance (:class:`cpumap.measure.backend.Measurer`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cpumap.measure import robust

#: Default stability tolerance (bench.stable_tol): first half and all repetitions agree.
STABLE_TOL = 0.005

AGG_COLUMNS = [
    "machine_id", "kernel_id", "params_id", "kernel", "n_insns", "clock", "reps",
    "cycles_per_instance_est", "rel_uncertainty", "unstable", "cycles_per_instance_median",
    "noise", "ipc", "calib_ratio", "loops_disagree", "nonlinearity",
]


def _round_estimates(c1: np.ndarray, c2: np.ndarray, gid: np.ndarray, rounds: np.ndarray,
                     step: np.ndarray, omax: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each (group, round)'s own estimate: (its group, each row's (group, round) index, -1
    where the row has no round, the estimate)."""
    has_round = np.isfinite(rounds)
    rid = np.full(len(gid), -1, dtype=np.int64)
    pair = pd.DataFrame({"g": gid[has_round], "r": rounds[has_round]})
    rid[has_round] = pair.groupby(["g", "r"], sort=False).ngroup().to_numpy()
    nr = int(rid.max()) + 1 if len(rid) else 0
    rg = np.zeros(nr, dtype=np.int64)
    rg[rid[has_round]] = gid[has_round]
    per, _, _, _ = robust.estimates_by(c1[has_round], c2[has_round], rid[has_round], nr,
                                       step[rg], omax[rg])
    return rg, rid, per


def _lone_licence_rounds(rg: np.ndarray, rid: np.ndarray, per: np.ndarray,
                         faster: np.ndarray, tol: float) -> np.ndarray:
    """Which (group, round) of ``_round_estimates`` (``rg``, ``rid``, ``per``) is a group's
    fastest round, faster than its next fastest by more than ``tol``, by no more than a
    faster clock explains: some of its rows were converted at a licence clock, ``faster``
    times slower than the batch's (1 elsewhere). A value only such a round reached is not
    taken.

    Why: converting at a slower clock than the batch's is the one way a repetition reads
    faster than the CPU is, and the samples around a run bound the clock only where they were
    taken. The Cascade Lake guest's clock also moves with what shares the core: in a run of 16
    repetitions of the CMP/SETB round trip whose samples both read 2.4 GHz, the 7 after the
    first ran at 3.1 GHz (15.3 ticks a call against 17.5 in the 8 after them), and converted
    at 2.4 that round made the chain 1.77 cycles a link (2.00 in the seven other rounds;
    2026-11-28, half the runs of the native tests). Another round reaching that value would
    be the CPU's; one alone is that round's clock. A round faster than any clock makes it is
    the CPU's (``VADDPS ymm*4`` beside a 512-bit load: 2.24 cycles in one round of eight, 4.0
    in the others, all at 2.4 GHz: the 512-bit mode was off)."""
    lone = np.zeros(len(rg), dtype=bool)
    if not len(rg):
        return lone
    has = rid >= 0
    up = np.ones(len(rg))
    np.maximum.at(up, rid[has], faster[has])
    ranked = pd.DataFrame({"g": rg, "e": per, "up": up}).sort_values(["g", "e"], kind="stable")
    ranked = ranked[np.isfinite(ranked["e"])]
    second = ranked.groupby("g")["e"].nth(1)
    second = pd.Series(second.to_numpy(), index=ranked.loc[second.index, "g"].to_numpy())
    best = ranked.groupby("g").head(1)
    best = best[best["g"].isin(second.index)]
    nxt = second.loc[best["g"]].to_numpy() * (1.0 - tol)
    alone = (best["e"] < nxt) & (best["up"] > 1.0) & (best["e"] * best["up"] >= nxt)
    lone[best.index[alone.to_numpy()].to_numpy()] = True
    return lone


def _uncertainty(est: np.ndarray, c1: np.ndarray, c2: np.ndarray, gid: np.ndarray,
                 order: np.ndarray, step: np.ndarray, omax: np.ndarray, rg: np.ndarray,
                 per: np.ndarray) -> np.ndarray:
    """How far each group's estimate could be from the CPU's value, relative (``rg``,
    ``per``: the group and estimate of each of its rounds, ``_round_estimates``).

    With several rounds (passes over the batch seconds apart): how far the best round's value
    is from the next best round's; a value that only one round reached may be that round's
    luck, one that two reached is what the CPU does when left alone. With one round: how far
    the estimate of the first half of the repetitions is from that of all (the harness's
    stopping rule). Infinite when the estimate is not positive, NaN for one repetition.
    """
    n = len(est)
    unc = np.full(n, np.nan)
    if len(rg):
        ranked = pd.DataFrame({"g": rg, "e": per}).sort_values(["g", "e"], kind="stable")
        second = ranked.groupby("g")["e"].nth(1)
        multi = second.index.to_numpy() if len(second) else np.array([], dtype=np.int64)
        g2 = ranked.loc[multi, "g"].to_numpy() if len(multi) else multi
        unc[g2] = np.abs(second.to_numpy() - est[g2]) / est[g2]
    # one round (or none recorded): first half of the repetitions against all
    single = np.isnan(unc)
    size = np.bincount(gid, minlength=n)
    first = single[gid] & (order < (size // 2)[gid])
    if first.any():
        half, _, _, _ = robust.estimates_by(c1[first], c2[first], gid[first], n, step, omax)
        with np.errstate(invalid="ignore", divide="ignore"):
            unc = np.where(single, np.abs(half / est - 1.0), unc)
    unc[~(est > 0)] = np.inf
    return unc


#: A batch pools its calibration samples with those of the earlier batches whose own ratios lie
#: within this of its own: what separates them is the calibration chain slowed by a neighbour
#: (0.2-0.7 % seen here), not the clock (within 0.1 % over an hour of quiet runs on the
#: reference guest). Beyond it the clock itself moved, and those batches stay apart.
CLOCK_AGREE = 0.01


def batch_ratios(df: pd.DataFrame) -> dict[tuple[str, str], float]:
    """Core cycles per TSC tick of each batch and parameter set (the roofline's all-cores runs
    share a batch across CPUs), from the calibration samples of its rows (all kernels, all
    rounds, the monitor's too): the fastest n and 2n chains.

    Why not each kernel's own samples: the dependent-add chain is slowed by a busy neighbour
    as well, which lowers the ratio and so every cycle count, and a kernel's samples may all
    fall inside one burst; a batch's samples span its rounds, seconds apart. A batch also
    pools the samples of the batches of its machine and parameter set measured before it
    (``timestamp``, then batch id) whose own ratios agree with its own within
    ``CLOCK_AGREE`` (a burst that covered a whole batch then costs nothing either). Only the
    earlier ones: a batch's ratio, and so every estimate of its kernels, is then what it was
    when it was measured, whatever the database gained after (a rebuild from the database
    gives the same model; pooled with every batch, the estimates moved by a few parts per
    million as later batches came, and a default run's model rebuilt from its own database
    differed: 8 of 2,159 mapping kernels chosen otherwise). Batches without samples (older
    rows, simulated ones) are absent.
    """
    cols = {"machine_id", "batch_id", "params_id", "cal1", "cal2", "cal_adds"}
    if not cols <= set(df.columns):
        return {}
    have = df[df["cal1"].notna() & df["cal2"].notna() & df["cal_adds"].notna()]
    out: dict[tuple[str, str], float] = {}
    for _, same in have.groupby(["machine_id", "params_id", "cal_adds"], sort=False):
        adds = float(same["cal_adds"].iat[0])
        batches = []
        for (b, p), g in same.groupby(["batch_id", "params_id"], sort=False):
            t = g["timestamp"].min() if "timestamp" in g else pd.NaT
            c1, c2 = g["cal1"].to_numpy("float64"), g["cal2"].to_numpy("float64")
            # only a batch's fastest samples can be a pool's fastest (``robust.fastest``)
            batches.append((pd.NaT if pd.isna(t) else pd.Timestamp(t), str(b), str(p),
                            robust.near_fastest(c1), robust.near_fastest(c2),
                            robust.calib_ratio(c1, c2, adds)))
        # measuring order: timestamp, then batch id (rows without a timestamp first)
        batches.sort(key=lambda x: (not pd.isna(x[0]), x[0] if not pd.isna(x[0]) else 0, x[1]))
        for i, (_, b, p, _c1, _c2, own) in enumerate(batches):
            if not np.isfinite(own):
                continue
            pool = [x for x in batches[:i + 1]
                    if np.isfinite(x[5]) and abs(x[5] / own - 1) <= CLOCK_AGREE]
            pooled = robust.calib_ratio(np.concatenate([x[3] for x in pool]),
                                        np.concatenate([x[4] for x in pool]), adds)
            out[(b, p)] = pooled if np.isfinite(pooled) else own
    return out


def calibration_core(df: pd.DataFrame) -> pd.DataFrame:
    """The calibration rows :func:`batch_ratios` can use: each batch's near-fastest n or 2n
    chains and its earliest row (its place in the measuring order), so that ``batch_ratios``
    of the result equals that of ``df`` exactly.

    Why: a full profile's ``fit_model`` holds 2 million calibration samples and recomputed
    every batch's pooled ratio from all of them after each measured chunk (3.6 s each time);
    a batch's slower samples never reach a pool's fastest (``robust.fastest``)."""
    cols = {"machine_id", "batch_id", "params_id", "cal1", "cal2", "cal_adds"}
    if not cols <= set(df.columns) or df.empty:
        return df
    have = df[df["cal1"].notna() & df["cal2"].notna() & df["cal_adds"].notna()]
    keys = [have[k] for k in ("machine_id", "params_id", "cal_adds", "batch_id")]
    keep = np.zeros(len(have), dtype=bool)
    for c in ("cal1", "cal2"):
        x = have[c].astype("float64")
        x = x.where(np.isfinite(x))
        keep |= (x <= x.groupby(keys, sort=False).transform("min") + robust.ROBUST_STEP_TICKS
                 ).to_numpy()
    if "timestamp" in have and have["timestamp"].notna().any():
        # one row holding the batch's earliest timestamp (rows often share one)
        first = have["timestamp"].reset_index(drop=True).groupby(
            [k.reset_index(drop=True) for k in keys], sort=False).idxmin().dropna()
        keep[first.to_numpy("int64")] = True
    return have[keep]


def _per_instance_cycles(ok: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Core cycles per instance of each row's f1 and f2 call: counted (PAPI) or its ticks at
    its ``calib_ratio``; NaN where a call was not timed."""
    tsc = (ok["clock"] != "papi").to_numpy()
    c1 = np.where(tsc, ok["ticks1"] * ok["calib_ratio"], ok["cycles1"].astype("float64"))
    c2 = np.where(tsc, ok["ticks2"] * ok["calib_ratio"], ok["cycles2"].astype("float64"))
    timed = (c1 > 0) & (c2 > 0)
    inst = ok["instances"].to_numpy("float64")
    return np.where(timed, c1 / inst, np.nan), np.where(timed, c2 / inst, np.nan)


def _bounds(ratio: np.ndarray, inst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each group's timer step and largest call overhead, in cycles per instance (the
    estimator's ``step`` and ``omax``), from its median ratio and instances."""
    return robust.ROBUST_STEP_TICKS * ratio / inst, robust.CALL_OVERHEAD_MAX / inst


def _keeps_batch_clock(ok: pd.DataFrame, slower: pd.Series, keys: list[str]) -> np.ndarray:
    """Rows of kernels (``keys``) that all keep the batch's ratio although some ran where the
    samples read a slower clock (``slower``): those with a run whose two samples both read the
    batch's ratio (``run_ratio_low``; chains are only ever slowed, so a fast sample proves
    the clock) and whose repetitions there, in TSC ticks, are not slower (beyond
    ROBUST_WIDTH) than where the samples read slower.

    Why: a slower sample is a slower clock or a chain a neighbour slowed. Cascade Lake guest,
    2026-11-28: in one process of the add+imul chain (4 cycles a link) the samples read 0.93
    cycles per tick for six runs in a row, tightly enough to make a level, while the chain's
    fastest calls between them took 4.01 ticks (3.73 cycles at 0.93, under its latency) and
    3.70 in the runs proven at the batch's 1.087 (4.02 cycles): converted at 0.93 it read
    3.48. Where the clock really was slower the kernel takes more ticks there, or fewer when
    a neighbour slowed its proven runs (CMP_R64_I8*3 MOV_R64_M64: 0.923 ticks in runs whose
    samples both read 2.7 GHz, 1.0 cycle, against 0.95 and more in runs proven at the batch's
    3.1 GHz that neighbours took ALU slots from): then the slower clock stands. A kernel that
    lowers the clock itself (a heavy 512-bit form) has no proven run: its first run's
    closing sample is already slow."""
    groups = ok.groupby(keys, sort=True, dropna=False)
    gid, n = groups.ngroup().to_numpy(), groups.ngroups
    step, omax = _bounds(groups["calib_ratio"].median().fillna(1.0).to_numpy("float64"),
                         groups["instances"].median().to_numpy("float64"))
    # all at the batch's ratio: more cycles means more ticks
    c1, c2 = _per_instance_cycles(ok)
    proven = (ok["run_ratio_low"].astype("float64") >= ok["calib_ratio"] * (1.0 - CLOCK_AGREE)
              ).to_numpy()

    def est(mask: np.ndarray) -> np.ndarray:
        return robust.estimates_by(np.where(mask, c1, np.nan), np.where(mask, c2, np.nan), gid,
                                   n, step, omax)[0]

    at_proven, at_slower = est(proven), est(slower.to_numpy())
    with np.errstate(invalid="ignore"):
        # fewer ticks beyond the estimate's own width: the proven runs were slowed
        keep = np.isfinite(at_proven) & ~(at_slower < at_proven * (1.0 - robust.ROBUST_WIDTH))
    return keep[gid]


def _clocks(clock: pd.Series, gid: np.ndarray, n: int) -> np.ndarray:
    """Each group's clocks (``tsc``, ``papi``), sorted and joined by commas ("" for none).

    From the distinct (group, clock) pairs: a lambda per group cost 1-2 s a judgement of a
    5,000-kernel batch, where nearly every group has one clock."""
    pairs = pd.DataFrame({"g": gid, "c": clock.to_numpy()}).dropna()
    pairs = pairs.assign(c=pairs["c"].astype(str)).drop_duplicates() \
        .sort_values(["g", "c"], kind="stable")
    out = np.full(n, "", dtype=object)
    single = ~pairs["g"].duplicated(keep=False)
    out[pairs["g"][single].to_numpy()] = pairs["c"][single].to_numpy()
    several = pairs[~single]
    if len(several):
        joined = several.groupby("g")["c"].agg(",".join)
        out[joined.index.to_numpy()] = joined.to_numpy()
    return out


def aggregate(df: pd.DataFrame, stable_tol: float = STABLE_TOL,
              ratios: dict[tuple[str, str], float] | None = None) -> pd.DataFrame:
    """One row per (machine_id, kernel_id, params_id) over the ``ok`` repetitions (columns
    :data:`AGG_COLUMNS`; see the module docstring for the estimate and its uncertainty).

    Each row's ticks are converted with its batch's pooled ratio (:func:`batch_ratios`; the
    row's own ``calib_ratio`` where the batch has no calibration sample), or with the clock
    the row ran at (``local_ratio``) where that was slower by more than CLOCK_AGREE, unless
    the kernel's own repetitions contradict it (:func:`_keeps_batch_clock`). A round that
    alone reached its value at such a clock is left out (:func:`_lone_licence_rounds`).
    ``ratios`` may be given when ``df`` holds only part of the rows they come from (the
    batch's own, or those of the batches measured before it).

    ``cycles_per_instance_median`` is what the median calls give (the estimator of earlier
    harness versions) and ``noise`` how much slower than the undisturbed one the typical long
    call ran: what the host did to the measurement.
    """
    keys = ["machine_id", "kernel_id", "params_id"]
    ratios = batch_ratios(df) if ratios is None else ratios
    kernel_rows = df["role"] != "monitor" if "role" in df else True
    ok = df.loc[(df["status"] == "ok") & kernel_rows].copy()
    if ok.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in AGG_COLUMNS})
    sort = [c for c in ("batch_id", "rep") if c in ok.columns]
    ok = ok.sort_values(sort, kind="stable") if sort else ok
    if ratios and "batch_id" in ok:
        # looked up once per (batch, parameter set), not per row: a batch has 10^5 rows
        codes, pairs = pd.factorize(pd.MultiIndex.from_arrays(
            [ok["batch_id"].astype(str), ok["params_id"].astype(str)]))
        per_pair = np.array([ratios.get(pair, np.nan) for pair in pairs], dtype="float64")
        pooled = pd.Series(per_pair[codes], index=ok.index)
        ok["calib_ratio"] = pooled.where(pooled.notna(), ok["calib_ratio"])
    if "local_ratio" in ok:
        # a repetition run at a slower clock than the batch's fastest level (an Intel core's
        # AVX licence): converted at the clock it ran at (``clocklevels.local_ratios``);
        # within CLOCK_AGREE of the batch's level, the pooled value (more samples)
        local = ok["local_ratio"].astype("float64")
        slower = local.notna() & (local < ok["calib_ratio"] * (1.0 - CLOCK_AGREE))
        if "run_ratio_low" in ok and slower.any():
            # unless the kernel's own repetitions contradict the slower samples
            slower &= ~_keeps_batch_clock(ok, slower, keys)
        # how many times faster the batch's clock is than the one a row was converted at
        faster = np.where(slower, ok["calib_ratio"] / local, 1.0)
        ok["calib_ratio"] = ok["calib_ratio"].where(~slower, local)
    else:
        faster = np.ones(len(ok))
    c1, c2 = _per_instance_cycles(ok)
    groups = ok.groupby(keys, sort=True, dropna=False)
    gid = groups.ngroup().to_numpy()
    order = groups.cumcount().to_numpy()
    out = groups.agg(kernel=("kernel", "first"), n_insns=("n_insns", "first"),
                     reps=("kernel", "size"), calib_ratio=("calib_ratio", "median"),
                     _inst=("instances", "median"),
                     _value=("cycles_per_instance", "median")).reset_index()
    out["clock"] = _clocks(ok["clock"], gid, len(out))
    n = len(out)
    step, omax = _bounds(out["calib_ratio"].fillna(1.0).to_numpy("float64"),
                         out["_inst"].to_numpy("float64"))
    rounds = ok["round"].to_numpy("float64") if "round" in ok else np.full(len(ok), np.nan)
    rg, rid, per = _round_estimates(c1, c2, gid, rounds, step, omax)
    if (faster > 1.0).any():
        lone = _lone_licence_rounds(rg, rid, per, faster, stable_tol)
        # the rows of those rounds out of the estimate, the rounds out of its uncertainty
        drop = np.zeros(len(gid), dtype=bool)
        drop[rid >= 0] = lone[rid[rid >= 0]]
        c1, c2 = np.where(drop, np.nan, c1), np.where(drop, np.nan, c2)
        rg, per = rg[~lone], per[~lone]
    est, disagree, r1, r2 = robust.estimates_by(c1, c2, gid, n, step, omax)
    unc = _uncertainty(est, c1, c2, gid, order, step, omax, rg, per)
    med1 = pd.Series(c1).groupby(gid).median().reindex(range(n)).to_numpy()
    med2 = pd.Series(c2).groupby(gid).median().reindex(range(n)).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        out["cycles_per_instance_est"] = est
        out["rel_uncertainty"] = unc
        out["unstable"] = ~np.isfinite(unc) | (unc > stable_tol)
        # what the median calls give (the estimator of earlier harness versions), and how much
        # slower than the undisturbed one the typical long call ran: the host's noise
        out["cycles_per_instance_median"] = robust.per_instance_v(med1, med2, omax)[0]
        out["noise"] = med2 / r2 - 1.0
        out["loops_disagree"] = disagree
        # the n/2n difference against the long call alone (overhead included, well under
        # 1 %): near 0 when the U and 2U bodies run at one speed, as assumed
        out["nonlinearity"] = (r2 - r1) / (r2 / 2.0) - 1.0
    # groups without timed calls (simulated machines): their values themselves
    sim = ~np.isfinite(r1)
    if sim.any():
        value = out["_value"].to_numpy("float64")
        for col, v in (("cycles_per_instance_est", value), ("rel_uncertainty", 0.0),
                       ("unstable", False), ("cycles_per_instance_median", value),
                       ("noise", 0.0), ("loops_disagree", False), ("nonlinearity", 0.0)):
            out.loc[sim, col] = v[sim] if isinstance(v, np.ndarray) else v
    out["ipc"] = out["n_insns"] / out["cycles_per_instance_est"]
    for c in ("unstable", "loops_disagree"):
        out[c] = out[c].astype(bool)
    return out.loc[:, AGG_COLUMNS]


def monitor_table(df: pd.DataFrame, stable_tol: float = STABLE_TOL,
                  ratios: dict[tuple[str, str], float] | None = None) -> pd.DataFrame:
    """The noise monitors of every batch (rows with role ``monitor``; a row per batch and
    monitor kernel): when it ran, its estimate, its median repetition and ``noise`` =
    median / estimate - 1 (0: a quiet host; 0.5: the typical call ran 50 % slow), ordered by
    time. ``ratios`` (:func:`batch_ratios` of all
    the batches' rows) may be given when ``df`` holds only the monitor's rows."""
    cols = ["timestamp", "batch_id", "kernel", "reps", "cycles_per_instance_est",
            "rel_uncertainty", "unstable", "cycles_per_instance_median", "noise"]
    if "role" not in df or not (df["role"] == "monitor").any():
        return pd.DataFrame({c: pd.Series(dtype="object") for c in cols})
    ratios = batch_ratios(df) if ratios is None else ratios
    mon = df[df["role"] == "monitor"].copy()
    mon["role"] = "kernel"
    out = []
    for (batch, ts), g in mon.groupby(["batch_id", "timestamp"], sort=False):
        agg = aggregate(g, stable_tol, ratios)
        out += [r | {"timestamp": ts, "batch_id": batch} for r in agg.to_dict("records")]
    if not out:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in cols})
    return pd.DataFrame(out)[cols].sort_values(["timestamp", "kernel"], kind="stable") \
        .reset_index(drop=True)
