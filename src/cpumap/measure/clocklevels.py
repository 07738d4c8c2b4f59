"""The core clock each repetition ran at, from the calibration samples around it.

An Intel core's clock follows the code it runs (AVX licences), so a batch's repetitions do
not all run at its fastest clock: each is converted at the clock level of the samples the
harness took before and after its run of repetitions (``local_ratios``), a level
being what most of the batch's samples near a sample read (``clock_levels``), not the
sample's own ratio, which a neighbour may have slowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cpumap.measure import robust

#: A calibration sample's clock level: the most common sample ratio (counting the batch's
#: samples within LEVEL_WIDTH of each) among those within LEVEL_REACH of it, if at least
#: LEVEL_MIN_SAMPLES and LEVEL_MIN_SHARE of the batch's samples agree with that one
#: (``clock_levels``). A clock level is crisp, a neighbour's slowdown is not: on the Cascade
#: Lake guest the undisturbed chains of a level agree within a few ticks of 52,140 (1,142 of
#: a validation batch's 12,487 samples within 0.03 %), while chains a neighbour slowed by
#: 1-2 % for a while spread over hundreds of ticks; counted within 0.2 %, five of those
#: made a level of a 131-sample batch, and a latency chain whose run they bracketed read
#: 12 % fast (CMP/SETB round trip 1.76 cycles where 2 is the floor).
LEVEL_WIDTH = 0.0003
LEVEL_REACH = 0.02
LEVEL_MIN_SAMPLES = 4
LEVEL_MIN_SHARE = 0.01
#: A sample with no crisp level near it that reads a licence clock (LEVEL_GAP_MIN or more
#: under the batch's fastest level; a neighbour's slowdown is mostly a few percent) takes the
#: fastest blurred level from LEVEL_REACH under it to LEVEL_REACH_UP over it: the median of
#: the first group of as many samples as a level needs within LEVEL_BLUR of each other. A
#: neighbour that stays for seconds blurs a licence level too: on the Cascade Lake guest
#: (2026-11-28) ADDPD xmm measured after an FMA zmm kernel had its 35 samples at 2.4 GHz
#: spread over 0.92-0.97, no four within 0.03 %, and converted at the batch's 3.1 GHz it
#: read 0.649 cycles; at the blurred level (0.958), 0.501.
LEVEL_GAP_MIN = 0.05
LEVEL_REACH_UP = 0.04
LEVEL_BLUR = 0.006


def clock_samples(rows: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's calibration samples as core cycles per TSC tick
    (``robust.sample_ratios``): the one taken before its repetition (``cal1``, ``cal2``)
    and the one closing its kernel's repetitions (``end1``, ``end2``), NaN where it has
    none. One pass over the rows: a full-profile batch has a quarter of a million."""
    return sample_pairs(*_chains(rows))


def clock_floors(rows: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """The clock each of :func:`clock_samples`'s samples proves (:func:`floor_pairs`)."""
    return floor_pairs(*_chains(rows))


def _chains(rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """The rows' chains (``cal1``, ``cal2``, ``end1``, ``end2``, ``cal_adds``), a row of
    the array each, -1 (NaN for the adds) where a row has none."""
    return np.array([(r.get("cal1", -1), r.get("cal2", -1), r.get("end1", -1),
                      r.get("end2", -1), r.get("cal_adds", np.nan)) for r in rows],
                    dtype="float64").reshape(-1, 5).T


def sample_pairs(cal1: np.ndarray, cal2: np.ndarray, end1: np.ndarray, end2: np.ndarray,
                 adds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`clock_samples` of the rows' columns (-1 where a row has no such chain)."""
    out = []
    for c1, c2 in ((cal1, cal2), (end1, end2)):
        out.append(np.where((c1 > 0) & (c2 > 0), robust.sample_ratios(c1, c2, adds), np.nan))
    return out[0], out[1]


def floor_pairs(cal1: np.ndarray, cal2: np.ndarray, end1: np.ndarray, end2: np.ndarray,
                adds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The clock each of :func:`sample_pairs`'s samples proves (``robust.sample_floors``):
    what ``local_ratios`` never goes under."""
    return robust.sample_floors(cal1, cal2, adds), robust.sample_floors(end1, end2, adds)


def clock_levels(ratios: Sequence[float] | np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The clock level of sample ratios, from all the samples of a batch.

    Why not the sample's own ratio: a neighbour slows one sample's chains by a percent or a
    few (on the Cascade Lake guest 2 % of the samples lay 1-15 % under their level), and a
    kernel's n and 2n calls, converted at ratios 1 % apart, gave ADDPD xmm 0.4963 cycles,
    under the 0.5 its two pipes allow. The level is what most samples near it read: the clock
    undisturbed; for a licence clock a neighbour blurred, the top of its samples
    (LEVEL_GAP_MIN). A sample with no level nearby (NaN) sets no clock."""
    levels = np.sort(np.asarray(ratios, dtype="float64"))
    levels = levels[np.isfinite(levels)]
    density = (np.searchsorted(levels, levels * (1 + LEVEL_WIDTH), side="right")
               - np.searchsorted(levels, levels * (1 - LEVEL_WIDTH), side="left"))
    need = max(LEVEL_MIN_SAMPLES, LEVEL_MIN_SHARE * len(levels))
    crisp = levels[density >= need]
    licence_below = crisp.max() * (1 - LEVEL_GAP_MIN) if len(crisp) else -math.inf
    # samples within LEVEL_BLUR under each one, itself included
    blur = np.arange(1, len(levels) + 1) - np.searchsorted(levels, levels * (1 - LEVEL_BLUR))

    def licence(v: float, lo: int) -> float:
        """The level of a sample ``v`` with no crisp level within LEVEL_REACH (``lo``: the
        first sample there): a licence clock a neighbour blurred, within LEVEL_REACH_UP
        above it, or NaN."""
        if v >= licence_below:
            return math.nan
        hi = int(np.searchsorted(levels, min(v * (1 + LEVEL_REACH_UP), licence_below),
                                 side="right"))
        tops = lo + np.flatnonzero(blur[lo:hi] >= need)
        if not len(tops):
            return math.nan
        top = int(tops[-1])
        return float(np.median(levels[top + 1 - blur[top]:top + 1]))

    def snap(values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype="float64")
        ok = np.isfinite(values)
        # quantised ticks: a batch's samples take a few thousand distinct values: the
        # densest sample within LEVEL_REACH of each, when it is crisp, all at once; the
        # others one by one (``licence``)
        uniq, inv = np.unique(values[ok], return_inverse=True)
        got = np.full(len(uniq), np.nan)
        lo = np.searchsorted(levels, uniq * (1 - LEVEL_REACH), side="left")
        hi = np.searchsorted(levels, uniq * (1 + LEVEL_REACH), side="right")
        top = _window_top(density, lo, hi)
        crisp_near = top >= 0
        crisp_near[crisp_near] = density[top[crisp_near]] >= need
        got[crisp_near] = levels[top[crisp_near]]
        for i in np.flatnonzero(~crisp_near):
            got[i] = licence(float(uniq[i]), int(lo[i]))
        out = np.full(values.shape, np.nan)
        out[ok] = got[inv] if len(uniq) else []
        return out

    return snap


def _window_top(density: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Index of the densest sample in each window ``[lo, hi)`` of the sorted samples, the
    last of equally dense ones (the fastest), -1 for an empty window: ``clock_levels``'s
    choice, for every window at once (a sparse table of range maxima). Why: one window at
    a time took two thirds of a 5,000-kernel batch's judgement (``benchmarks/rounds_speed.py``,
    2026-11-29), a max over tens of thousands of samples for each of a few thousand values."""
    n = len(density)
    out = np.full(len(lo), -1, dtype="int64")
    width = hi - lo
    have = width > 0
    if not n or not have.any():
        return out
    # density and position in one key: the larger key is the denser, then the later sample
    key = density.astype("int64") * (n + 1) + np.arange(n)
    table = [key]  # table[j][i]: the largest key of key[i:i + 2**j]
    while 2 ** len(table) <= width.max():
        prev, half = table[-1], 2 ** (len(table) - 1)
        table.append(np.maximum(prev[:-half], prev[half:]))
    j = np.zeros(len(lo), dtype="int64")
    j[have] = np.floor(np.log2(width[have])).astype("int64")
    for level in np.unique(j[have]):
        sel = have & (j == level)
        t = table[level]
        out[sel] = np.maximum(t[lo[sel]], t[hi[sel] - 2 ** level]) % (n + 1)
    return out


def local_ratios(n_rows: int, samples: tuple[np.ndarray, np.ndarray], after: float | None,
                 level: Callable[[np.ndarray], np.ndarray],
                 floors: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(``local_ratio``, ``run_ratio_low``) of each of a process's ``n_rows`` rows.

    ``local_ratio``: the core clock while its repetition ran, the faster of the
    clock levels (``clock_levels``) of the calibration samples just before and just after its
    run of repetitions (the rows: one process's, in the order it ran them, ``samples``: their
    ``clock_samples``; the harness takes a
    sample every ``calib_every`` repetitions, before them, and one after the kernel's last;
    without that one, from older harnesses, the next kernel's first sample or the process's
    closing calibration ``after``).

    Why: an Intel core's clock follows the code it runs (AVX licences: Cascade Lake guest,
    2026-11-28, three levels, 3.1, 2.7 and 2.4 GHz, held for milliseconds after the last
    heavy vector instruction), so a kernel measured after a 512-bit one runs at 2.4 GHz
    throughout, and converted at the batch's fastest level its cycles read 29 % high
    (``ADDPD xmm`` 0.6455 cycles, 0.4996 at its own clock). The faster of the two: a clock
    that rose during the run makes its repetitions at most slower, never faster, than their
    cycles. NaN where either sample has no level (the estimator then uses the batch's
    ratio).

    A sample's level is never under the clock its own chains prove (``floors``, from
    :func:`floor_pairs`, NaN where a sample proves nothing): chains are only ever slowed.
    Why: on the busy Sapphire Rapids-class guest (2026-12-03) a batch's samples lay in bands
    about 2.5 % wide, 4 % apart, and the densest ratio of a band, under its top, was the
    level of the whole band: 32 % of a core batch's samples had a level under what their own
    chains proved (by 0.7 % at the median), and its monitors, converted there, read ``ADD
    r64, r64`` 0.1975 cycles and ``MOV r64, m64`` 0.3291, under the 0.2 and 1/3 that five
    ALUs and three load pipes allow.

    Each row's ``run_ratio_low`` is the lower of the two samples' own ratios (not levels):
    a sample reading the batch's fastest clock proves the clock was that fast then (chains
    are only ever slowed), a slower one does not prove a slower clock (the estimator's use of
    it: ``estimate.aggregate``)."""
    local = np.full(n_rows, np.nan)
    low = np.full(n_rows, np.nan)
    if not n_rows:
        return local, low
    raw_before, raw_closing = samples
    at = np.flatnonzero(np.isfinite(raw_before))
    before, closing = level(raw_before), level(raw_closing)
    # NaN (no level) stays NaN
    before = np.where(np.isnan(before), np.nan, np.fmax(before, floors[0]))
    closing = np.where(np.isnan(closing), np.nan, np.fmax(closing, floors[1]))
    if len(at):
        ends = np.append(at[1:], n_rows)
        # after each run: the kernel's own closing sample, else the next run's first sample,
        # else (the last run of an older harness) the process's closing calibration
        last = np.nan if after is None or not math.isfinite(after) else after
        has_closing = np.isfinite(raw_closing[ends - 1])
        nxt = np.where(has_closing, closing[ends - 1], np.append(before[at[1:]], last))
        run = np.maximum(before[at], nxt)  # NaN where either is
        local[at[0]:] = np.repeat(run, ends - at)
        raw_nxt = np.where(has_closing, raw_closing[ends - 1],
                           np.append(raw_before[at[1:]], last))
        low[at[0]:] = np.repeat(np.minimum(raw_before[at], raw_nxt), ends - at)
    return local, low
