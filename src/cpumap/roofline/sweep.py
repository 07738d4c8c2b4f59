"""Bandwidth ceilings by working-set sweep (harness/bw_sweep.c) and plateau detection.

The C program runs read, write, copy, triad and non-temporal-write kernels over working sets
from a few KiB to several times the last-level cache, on one core and on every core at once,
and prints raw TSC ticks per repetition; this module builds it, runs it, turns ticks into
bytes per cycle (ticks x the calibrated core cycles per tick) and GB/s (bytes / ns of the same
span), and finds the plateaus.

Bytes are core-side and counted as STREAM counts them: the bytes the kernel's loads and stores
name (copy 2 x its array, triad 3 x); the extra line fills of write-allocate are not counted.

Plateaus: the sweep curve (log bandwidth over sizes in increasing order) is cut into k
constant pieces by exact least squares (dynamic programming); k is the largest number, at most
one per cache level plus DRAM plus two, for which neighbouring pieces differ by at least
``min_step``.  Each piece is labelled with the cache level most of its working sets fit in
(the level's capacity as the machine reports it, divided among the threads that share it);
neighbouring pieces with one label are merged; and the labels are checked: one piece per
label, in level order, bandwidth falling level by level, and the agreement of the members
with their label recorded.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cpumap.measure.harness import HARNESS_DIR, HarnessError, build_c_program

SWEEP_SRC = HARNESS_DIR / "bw_sweep.c"
KINDS = ("read", "write", "copy", "triad", "ntwrite")
CFLAGS = ("-O2", "-std=gnu11", "-Wall", "-Wextra", "-mavx2", "-mfma", "-pthread")
LIBS = ("-lpapi",)
MIN_BYTES = 4096


class SweepError(RuntimeError):
    """The sweep program could not be built or run, or printed something unexpected."""


def build_sweep(out_dir: Path, *, source: Path = SWEEP_SRC, cc: str = "gcc") -> Path:
    """Compile bw_sweep into out_dir (reused when newer than its sources); return its path."""
    try:
        return build_c_program(source, Path(out_dir) / "bw_sweep", cflags=CFLAGS, libs=LIBS,
                               cc=cc)
    except HarnessError as exc:
        raise SweepError(str(exc)) from exc


# ----------------------------------------------------------------------------- sizes


def cache_levels(machine: Mapping) -> list[dict]:
    """Data/unified cache levels of machine.json, smallest first: level, bytes, sharing."""
    out = []
    for c in machine.get("caches", []):
        if c.get("type") in ("Data", "Unified") and c.get("size_bytes"):
            out.append({"level": int(c["level"]), "bytes": int(c["size_bytes"]),
                        "shared_cpus": int(c.get("shared_cpus") or 1)})
    return sorted(out, key=lambda c: c["level"])


def _geom(lo: float, hi: float, n: int) -> list[int]:
    if n <= 1 or hi <= lo:
        return [int(hi)]
    return [int(lo * (hi / lo) ** (i / (n - 1))) for i in range(n)]


def sweep_sizes(levels: Sequence[Mapping], *, per_level: int = 3, per_octave: int = 0,
                max_factor: float = 8.0, threads: int = 1,
                max_bytes: float | None = None) -> list[int]:
    """Working-set sizes (bytes, multiples of 1 KiB): 4 KiB to max_factor x the LLC.

    per_octave > 0: that many points per doubling over the whole range (big campaigns).
    Otherwise ``per_level`` points well inside each level -- between twice the previous
    level's capacity and half this level's (the shared last level: half its share per
    thread) -- and as many DRAM points between 4x and max_factor x the LLC: a short sweep that
    still shows every plateau.

    ``max_bytes`` caps the largest working set, never below twice the LLC (a cyclic sweep of
    twice an LRU-like cache misses on every line). Why: the sweep's time grows with the bytes
    it touches, and some guests report an enormous LLC (480 MiB here on a Sapphire Rapids-class
    KVM guest: its 2-4 GB DRAM points took 1,000 of the sweep's 1,011 measured seconds). Under
    the cap the DRAM points run from twice the LLC to the cap.
    """
    llc = max(lv["bytes"] for lv in levels)
    top = max_factor * llc
    if max_bytes is not None:
        top = max(2 * llc, min(top, float(max_bytes)))
    if per_octave > 0:
        n = int(math.ceil(math.log2(top / MIN_BYTES) * per_octave)) + 1
        raw = [MIN_BYTES * 2 ** (i / per_octave) for i in range(n)]
    else:
        raw = []
        prev = MIN_BYTES / 2
        for lv in levels:
            share = lv["bytes"] / max(1, min(threads, lv["shared_cpus"]))
            raw += _geom(max(MIN_BYTES, 2 * prev), share / 2, per_level)
            prev = share
        raw += _geom(max(2 * llc, min(4 * llc, top / 2)), top, per_level)
    sizes = sorted({max(MIN_BYTES, int(round(s / 1024)) * 1024) for s in raw})
    return [s for s in sizes if s <= top * 1.0001]


# ----------------------------------------------------------------------------- running


def run_sweep(binary: Path, kinds: Iterable[str], sizes: Sequence[int], cpus: Sequence[int], *,
              reps: int = 3, min_ms: float = 20.0, quiet_reps: int = 0, max_reps: int = 64,
              point_ms: float = 0.0, max_point_ms: float = 0.0,
              timeout_s: float = 3600.0) -> dict:
    """Run bw_sweep once; return {"points": [...], "meta": {...}} as the program printed them."""
    kinds = list(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown sweep kind(s) {bad}; known: {KINDS}")
    cmd = [str(binary), "--kinds", ",".join(kinds), "--sizes", ",".join(map(str, sizes)),
           "--cpus", ",".join(map(str, cpus)), "--reps", str(reps), "--min-ms", str(min_ms),
           "--quiet-reps", str(quiet_reps), "--max-reps", str(max(reps, max_reps)),
           "--point-ms", str(point_ms), "--max-point-ms", str(max_point_ms)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        raise SweepError(f"{' '.join(cmd)} exited with {proc.returncode}: {proc.stderr[-2000:]}")
    points, meta = [], None
    for line in proc.stdout.splitlines():
        rec = json.loads(line)
        if rec.get("done"):
            meta = rec
        else:
            points.append(rec)
    if meta is None or len(points) != len(kinds) * len(sizes):
        raise SweepError(f"{binary}: incomplete output ({len(points)} points, done={meta})")
    return {"points": points, "meta": meta}


def to_frame(result: Mapping, scope: str) -> pd.DataFrame:
    """One row per (kind, size, repetition): raw ticks and ns, bytes, B/cycle, GB/s.

    Cycles = the slowest thread's ticks x the mean of the calibrations before and after the
    sweep (core cycles per TSC tick); GB/s = bytes / the controller's span in ns.
    """
    meta = result["meta"]
    ratio = (meta["calib_before"] + meta["calib_after"]) / 2
    best = max(meta["calib_before"], meta["calib_after"])
    rows = []
    for p in result["points"]:
        total = p["pass_bytes"] * p["passes"] * p["threads"]
        for rep, (ticks, span_ticks, span_ns, switches) in enumerate(
                zip(p["ticks"], p["span_ticks"], p["span_ns"], p["switches"], strict=True)):
            cycles = ticks * ratio
            rows.append({
                "scope": scope, "kind": p["kind"], "bytes": int(p["bytes"]),
                "threads": int(p["threads"]), "rep": rep, "passes": int(p["passes"]),
                "bytes_moved": int(total), "ticks": int(ticks), "span_ticks": int(span_ticks),
                "span_ns": float(span_ns), "switches": int(switches), "calib_ratio": ratio,
                "calib_best": best,
                "clock": meta["clock"],
                "tsc_mhz": float(meta["tsc_mhz"]), "cycles": cycles,
                "bytes_per_cycle": total / cycles,
                # thread-span seconds: ticks / TSC frequency (the same interval as cycles)
                "gbs": total / (ticks / (meta["tsc_mhz"] * 1e6)) / 1e9,
                "gbs_wall": total / span_ns,
            })
    return pd.DataFrame(rows)


def best_per_size(df: pd.DataFrame) -> pd.DataFrame:
    """Min-of-K per (scope, kind, bytes): the fastest repetition, and the median.

    Repetitions during which a measuring thread was switched out (``switches`` > 0: another
    process got its CPU) are left out when the point has any undisturbed one; ``quiet``
    says how many the point had.
    """
    df = df.assign(quiet=df["switches"] == 0)
    any_quiet = df.groupby(["scope", "kind", "bytes"])["quiet"].transform("any")
    use = df[df["quiet"] | ~any_quiet]
    g = use.groupby(["scope", "kind", "bytes"], sort=True)
    out = g.agg(threads=("threads", "first"), reps=("rep", "size"),
                bytes_per_cycle=("bytes_per_cycle", "max"),
                bytes_per_cycle_median=("bytes_per_cycle", "median"),
                gbs=("gbs", "max"), gbs_median=("gbs", "median")).reset_index()
    quiet = df.groupby(["scope", "kind", "bytes"], sort=True)["quiet"].sum()
    out["quiet"] = quiet.to_numpy().astype(int)
    out["reps_all"] = df.groupby(["scope", "kind", "bytes"], sort=True).size().to_numpy()
    return out


# ----------------------------------------------------------------------------- plateaus


def segment(values: Sequence[float], k: int) -> list[tuple[int, int]]:
    """Cut ``values`` into k contiguous pieces minimising the total squared deviation from
    each piece's mean (exact, by dynamic programming); returns [(start, end_exclusive)]."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if not 1 <= k <= n:
        raise ValueError(f"cannot cut {n} values into {k} pieces")
    c1 = np.concatenate([[0.0], np.cumsum(x)])
    c2 = np.concatenate([[0.0], np.cumsum(x * x)])

    def cost(i: int, j: int) -> float:  # values[i:j]
        s = c1[j] - c1[i]
        return float(c2[j] - c2[i] - s * s / (j - i))

    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    back = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for m in range(1, k + 1):
        for j in range(m, n + 1):
            for i in range(m - 1, j):
                v = best[m - 1][i] + cost(i, j)
                if v < best[m][j] - 1e-15:
                    best[m][j], back[m][j] = v, i
    cuts, j = [], n
    for m in range(k, 0, -1):
        i = back[m][j]
        cuts.append((i, j))
        j = i
    return cuts[::-1]


@dataclass
class Plateau:
    """One plateau of a sweep curve."""

    label: str  # L1, L2, L3, DRAM
    bytes_per_cycle: float  # median of the members' best-of-K values
    gbs: float
    sizes: list[int]  # working sets (bytes per thread) in the plateau
    values: list[float]  # their bytes per cycle
    capacity: int | None  # the level's capacity per thread (None for DRAM)
    agreement: float  # fraction of members whose working set fits the label's level
    boundary_bytes: float | None = None  # geometric mean across the drop to the next plateau
    extra: dict = field(default_factory=dict)


def level_of(size: int, levels: Sequence[Mapping], threads: int) -> str:
    """Smallest cache level whose (per-thread share of) capacity holds ``size``, or DRAM."""
    for lv in levels:
        share = lv["bytes"] / max(1, min(threads, lv["shared_cpus"]))
        if size <= share:
            return f"L{lv['level']}"
    return "DRAM"


def find_plateaus(sizes: Sequence[int], bpc: Sequence[float], levels: Sequence[Mapping],
                  threads: int = 1, min_step: float = 0.08,
                  gbs: Sequence[float] | None = None) -> tuple[list[Plateau], dict]:
    """Plateaus of one sweep curve and the check against the cache sizes.

    Returns (plateaus, check) where check = {"consistent": bool, "problems": [...],
    "k": pieces}.  ``sizes`` must be increasing.
    """
    order = np.argsort(sizes)
    s = np.asarray(sizes)[order]
    v = np.asarray(bpc, dtype=float)[order]
    g = np.asarray(gbs if gbs is not None else bpc, dtype=float)[order]
    logv = np.log(v)
    # up to two pieces more than levels: a noisy level (DRAM under load) may take two or
    # three pieces of its own instead of forcing two real levels into one; pieces that get
    # one label are merged below
    kmax = min(len(s), len(levels) + 3)
    cuts: list[tuple[int, int]] = [(0, len(s))]
    for k in range(kmax, 0, -1):
        cand = segment(logv, k)
        med = [float(np.median(v[a:b])) for a, b in cand]
        if all(abs(math.log(med[i] / med[i + 1])) >= math.log1p(min_step)
               for i in range(len(med) - 1)):
            cuts = cand
            break
    names = [f"L{lv['level']}" for lv in levels] + ["DRAM"]
    caps = {f"L{lv['level']}": lv["bytes"] / max(1, min(threads, lv["shared_cpus"]))
            for lv in levels}
    plateaus: list[Plateau] = []
    for a, b in cuts:
        member_levels = [level_of(int(x), levels, threads) for x in s[a:b]]
        counts = {n: member_levels.count(n) for n in names}
        # majority; a tie goes to the smaller level (the order of ``names``)
        label = max(names, key=lambda n: (counts[n], -names.index(n)))
        # a piece that really spans several levels (bandwidth equal across them, as writes
        # are up to L3 here) is labelled with the range, e.g. "L1-L3": a level counts when
        # it holds at least 2 members and a quarter of the piece (one transition point
        # between two plateaus does not)
        spanned = [n for n in names if counts[n] >= max(2, 0.25 * (b - a))]
        if len(spanned) > 1:
            label = f"{spanned[0]}-{spanned[-1]}"
        agree = sum(counts[n] for n in (spanned if len(spanned) > 1 else [label])) / (b - a)
        cap_label = spanned[-1] if len(spanned) > 1 else label
        plateaus.append(Plateau(label, float(np.median(v[a:b])), float(np.median(g[a:b])),
                                [int(x) for x in s[a:b]], [float(x) for x in v[a:b]],
                                int(caps[cap_label]) if cap_label in caps else None, agree))
    # neighbouring pieces with one label are one level split by noise: merge them
    merged: list[Plateau] = []
    for p in plateaus:
        if merged and merged[-1].label == p.label:
            q = merged[-1]
            n_q, n_p = len(q.sizes), len(p.sizes)
            q.sizes += p.sizes
            q.values += p.values
            q.agreement = (q.agreement * n_q + p.agreement * n_p) / (n_q + n_p)
            q.bytes_per_cycle = float(np.median(q.values))
            idx = [int(np.searchsorted(s, x)) for x in q.sizes]
            q.gbs = float(np.median(g[idx]))
            q.extra["merged_pieces"] = q.extra.get("merged_pieces", 1) + 1
        else:
            merged.append(p)
    plateaus = merged
    for p, q in zip(plateaus, plateaus[1:], strict=False):
        p.boundary_bytes = float(math.sqrt(max(p.sizes) * min(q.sizes)))
    problems = []
    labels = [p.label for p in plateaus]

    def rank(label: str) -> int:
        return names.index(label.split("-")[0])

    if len(set(labels)) != len(labels):
        problems.append(f"a label occurs twice: {labels}")
    if [rank(x) for x in labels] != sorted(rank(x) for x in labels):
        problems.append(f"labels out of level order: {labels}")
    for p, q in zip(plateaus, plateaus[1:], strict=False):
        if not p.bytes_per_cycle > q.bytes_per_cycle:
            problems.append(f"{p.label} ({p.bytes_per_cycle:.2f} B/cycle) is not faster than "
                            f"{q.label} ({q.bytes_per_cycle:.2f})")
    for p in plateaus:
        if p.agreement < 0.5:
            problems.append(f"{p.label}: only {p.agreement:.0%} of its working sets fit that "
                            "level")
    covered = {n for x in labels for n in names[rank(x):names.index(x.split("-")[-1]) + 1]}
    missing = [n for n in names if n not in covered]
    check = {"consistent": not problems, "problems": problems, "pieces": len(cuts),
             "plateaus": len(plateaus),
             "missing_levels": missing}
    return plateaus, check


def plateau_dicts(plateaus: Iterable[Plateau]) -> list[dict]:
    return [asdict(p) for p in plateaus]


def sweep_frame(binary: Path, kinds: Iterable[str], sizes: Sequence[int],
                scopes: Mapping[str, Sequence[int]], *, reps: int = 3, rounds: int = 3,
                min_ms: float = 10.0, quiet_reps: int = 0, max_reps: int = 64,
                point_ms: float = 0.0, max_point_ms: float = 0.0,
                progress=None) -> pd.DataFrame:
    """Raw rows of ``rounds`` passes over every scope (name -> CPUs), K = reps x rounds.

    Interference on a shared host comes in bursts; separate passes put a point's
    repetitions seconds apart, so min-of-K finds a quiet one (as campaign.split_repetitions).
    Each pass takes at least ``reps`` repetitions of a point and more, up to ``max_reps``,
    until ``quiet_reps`` ran without any measuring thread being switched out, but no more
    than ``reps`` once the point's repetitions took ``max_point_ms`` (when > 0: long DRAM
    repetitions are nearly never undisturbed on a shared guest, and a switch costs them little).
    """
    frames = []
    for rnd in range(rounds):
        for scope, cpus in scopes.items():
            res = run_sweep(binary, kinds, sizes, cpus, reps=reps, min_ms=min_ms,
                            quiet_reps=quiet_reps, max_reps=max_reps, point_ms=point_ms,
                            max_point_ms=max_point_ms)
            df = to_frame(res, scope)
            df["round"] = rnd
            df["rep"] = df["rep"] + rnd * max(reps, max_reps)
            frames.append(df)
            if progress:
                progress(f"sweep round {rnd + 1}/{rounds}, {scope} ({len(cpus)} CPU): "
                         f"{len(df)} rows")
    return with_best_ratio(pd.concat(frames, ignore_index=True))


def with_best_ratio(df: pd.DataFrame) -> pd.DataFrame:
    """Rows re-converted with the highest core-cycles-per-tick ratio of the sweep's
    calibrations (before and after each pass): a neighbour slows the calibration's add chain
    too, which lowers the ratio and so the cycles of a pass (cpumap.measure.estimate), while the
    clock itself held within 0.1 % over an hour of quiet runs on the reference guest."""
    if df.empty or "calib_best" not in df:
        return df
    ratio = float(df["calib_best"].max())
    df = df.assign(calib_ratio=ratio, cycles=df["ticks"] * ratio)
    return df.assign(bytes_per_cycle=df["bytes_moved"] / df["cycles"])


def analyse(best: pd.DataFrame, levels: Sequence[Mapping], min_step: float = 0.08) -> list[dict]:
    """Plateaus and their check for every (scope, kind) curve of ``best_per_size``.

    Non-temporal stores bypass the caches, so their curve has no cache plateaus by design:
    only the DRAM plateau (working sets beyond the last level's share) is defined for them.
    """
    out = []
    for (scope, kind), g in best.groupby(["scope", "kind"], sort=True):
        g = g.sort_values("bytes")
        threads = int(g["threads"].iloc[0])
        sizes, bpc, gbs = g["bytes"].tolist(), g["bytes_per_cycle"].tolist(), g["gbs"].tolist()
        if kind == "ntwrite":
            llc = levels[-1]["bytes"] / max(1, min(threads, levels[-1]["shared_cpus"]))
            idx = [i for i, x in enumerate(sizes) if x > llc]
            plateaus = []
            if idx:
                vals = [bpc[i] for i in idx]
                plateaus = [Plateau("DRAM", float(np.median(vals)),
                                    float(np.median([gbs[i] for i in idx])),
                                    [int(sizes[i]) for i in idx], [float(x) for x in vals],
                                    None, 1.0)]
            check = {"consistent": bool(idx), "pieces": 1,
                     "problems": [] if idx else ["no working set beyond the last level"],
                     "note": "non-temporal stores bypass the caches: only the DRAM plateau "
                             "is defined", "missing_levels": []}
        else:
            plateaus, check = find_plateaus(sizes, bpc, levels, threads, min_step, gbs=gbs)
        out.append({"scope": scope, "kind": kind, "threads": threads,
                    "plateaus": plateau_dicts(plateaus), "check": check})
    return out
