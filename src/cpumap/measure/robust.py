"""The undisturbed value of repeated timings: the low end of their repetitions, and the
per-instance cost from the short and the long call (the estimator ``cpumap.measure.estimate``
applies to each kernel, and the harness tests and the calibration to theirs).

Interference only ever lengthens a call, so the fastest samples are the CPU's own, but the
single fastest may be a timer step's luck or a clock spike: the value is the mean of the
samples within a relative width (and a timer step) of the fastest that another sample agrees
with.
"""

from __future__ import annotations

import numpy as np

#: Relative width of the fastest cluster (harness/papi_bench.c ROBUST_WIDTH) and the timer step
#: every cluster spans at least (ROBUST_STEP ticks; in cycles, times the calibration ratio).
ROBUST_WIDTH = 0.003
ROBUST_STEP_TICKS = 32
#: How far the f1 and f2 loops' cycles per instance may differ, beyond the call's fixed cost,
#: and still be taken as one speed (then f2 - f1 cancels that cost). A looser bound lets a
#: short call slowed more than the long one pull the difference below what the CPU allows
#: (measured: loads at 0.328 cycles, under the 3-per-cycle limit, with 2 %).
LOOPS_AGREE = 0.005
#: Largest fixed cost of one call of a generated kernel function, in cycles: its prologue and
#: epilogue (16 register loads, 6 pushes and pops, two ldmxcsr, up to 32 vector loads,
#: vzeroupper) and the timer's fences: 50-600 cycles measured on Zen 4 (2 f1 - f2).
CALL_OVERHEAD_MAX = 600.0
#: Fixed cost of a calibration chain's call (two TSC reads, loop entry) as a fraction of the
#: shorter chain: measured 37 ticks of 14,092 (0.26 %) on Zen 4, 20,000 adds; the bound
#: leaves room for a slower TSC read four times that.
CALIB_OVERHEAD = 0.01

#: Samples the fastest cluster must hold to set a value (else the fastest sample alone does):
#: one sample faster than every other may be a clock spike, not the kernel (Cascade Lake
#: guest, 2026-11-28: one f2 call of MULSD xmm ran at the 2.7 GHz licence clock inside a run
#: the samples around it put at 2.4 GHz, and converted at 2.4 it made MULSD 0.448 cycles,
#: under the 0.5 its two pipes allow). The harness's stopping rule asks for three.
MIN_CLUSTER = 2


def robust_low(x: np.ndarray, step: float = 0.0) -> float:
    """The undisturbed value of a quantity from its repetitions: the mean of the samples within
    ``ROBUST_WIDTH`` (relative) or ``step`` (absolute, the timer's resolution) of the fastest
    sample that MIN_CLUSTER samples agree with (of the fastest, if none is). NaN for no
    samples."""
    x = np.asarray(x, dtype="float64")
    return float(low_by(x, np.zeros(len(x), dtype=np.int64), 1, np.array([step]))[0])


def per_instance(r1: float, r2: float, overhead_max: float = 0.0) -> tuple[float, bool]:
    """(cycles per instance, loops disagree) from the short call's and the long call's cycles
    per instance of the short call (``r1``: U copies + overhead, ``r2``: 2U copies + overhead).

    The difference ``r2 - r1`` is the marginal cost of U more instances only if both loops run
    at the same speed per instance; then the implied overhead ``2 r1 - r2`` is the call's
    fixed cost: at most ``overhead_max`` (per instance) plus ``LOOPS_AGREE`` of the short call,
    and not below minus ``LOOPS_AGREE`` of it. On Zen 4 some kernels run their two loops at
    different speeds, in a way that depends on the loop body (ADD m64,r64 x 4 with 10 vector
    ALU ops: f1 at 4.0 cycles per instance, f2 at 5.4, so f2 - f1 = 6.8, the speed of
    neither); the faster loop's own speed, overhead included, is then the best measured bound.
    """
    if not (np.isfinite(r1) and np.isfinite(r2)) or r2 <= 0:
        return r2 - r1, False
    overhead = 2.0 * r1 - r2
    if -LOOPS_AGREE * r1 <= overhead <= LOOPS_AGREE * r1 + overhead_max:
        return r2 - r1, False
    return min(r1, r2 / 2.0), True


def kernel_estimate(c1: np.ndarray, c2: np.ndarray, step: float = 0.0,
                    overhead_max: float = 0.0) -> tuple[float, bool]:
    """Cycles per instance from per-instance cycles of the f1 calls (``c1``) and the f2 calls
    (``c2``, both divided by f1's instance count): robust low of each, then their difference
    (``per_instance``)."""
    return per_instance(robust_low(c1, step), robust_low(c2, step), overhead_max)


def fastest(x: np.ndarray) -> float:
    """The mean of the samples within one TSC step of the fastest: the undisturbed duration,
    with the timer's step averaged out (a chain slowed by a neighbour is 0.2 % or more, over
    70 ticks, slower)."""
    x = np.asarray(x, dtype="float64")
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan")
    return float(x[x <= x.min() + ROBUST_STEP_TICKS].mean())


def near_fastest(x: np.ndarray) -> np.ndarray:
    """The samples ``fastest`` of these samples, or of them pooled with others, can use."""
    x = x[np.isfinite(x)]
    return x[x <= x.min() + ROBUST_STEP_TICKS] if x.size else x


def calib_ratio(cal1: np.ndarray, cal2: np.ndarray, adds: float) -> float:
    """Core cycles per TSC tick from calibration samples: ``adds`` more dependent adds in the
    2n chain than in the n chain, over the difference of their fastest samples (chains of
    tens of thousands of ticks; a neighbour only slows a chain).

    The difference alone is wrong by the whole disturbance when only one chain's samples are
    all slowed (CI on 2026-11-24: four 2n samples slowed, a ratio 9 % low, a latency-1 add
    chain at 0.91 cycles per add). Physics bounds it: a chain of k latency-1 adds takes at
    least k cycles, so k over its ticks is at most the ratio (lower bound: the call's fixed
    cost is not negative), and that fixed cost is at most CALIB_OVERHEAD of the chain (upper
    bound). Each chain's least disturbed sample then sets the ratio to within that fraction.
    """
    return float(sample_ratios(fastest(cal1), fastest(cal2), adds))


def sample_ratios(cal1: np.ndarray, cal2: np.ndarray, adds: np.ndarray) -> np.ndarray:
    """:func:`calib_ratio` of each single sample at once (its n and 2n chains ``cal1[i]`` and
    ``cal2[i]``): NaN where the 2n chain is not the longer."""
    cal1, cal2 = np.asarray(cal1, dtype="float64"), np.asarray(cal2, dtype="float64")
    adds = np.asarray(adds, dtype="float64")
    low = sample_floors(cal1, cal2, adds)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = cal2 - cal1
        out = np.clip(adds / d, low, low / (1.0 - CALIB_OVERHEAD))
    return np.where(d > 0, out, np.nan)


def sample_floors(cal1: np.ndarray, cal2: np.ndarray, adds: np.ndarray) -> np.ndarray:
    """The core clock each single sample proves, in cycles per tick: a chain of k latency-1
    adds takes at least k cycles, so k over its ticks is at most the ratio whatever slowed
    it (the larger of the n and the 2n chain's). NaN where a chain has no ticks."""
    cal1, cal2 = np.asarray(cal1, dtype="float64"), np.asarray(cal2, dtype="float64")
    adds = np.asarray(adds, dtype="float64")
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.maximum(adds / cal1, 2.0 * adds / cal2)
    return np.where((cal1 > 0) & (cal2 > 0), low, np.nan)


def low_by(x: np.ndarray, gid: np.ndarray, n: int, step: np.ndarray) -> np.ndarray:
    """:func:`robust_low` of each group at once (``gid``: group of each sample, ``step``: per
    group); NaN for a group without a finite sample."""
    x = np.asarray(x, dtype="float64")
    step = np.broadcast_to(np.asarray(step, dtype="float64"), (n,))
    ok = np.isfinite(x)
    x, gid = x[ok], gid[ok]
    order = np.lexsort((x, gid))
    xs, gs = x[order], gid[order]
    lim = np.maximum(xs * (1.0 + ROBUST_WIDTH), xs + step[gs])
    # a sample is an anchor if the MIN_CLUSTER - 1 next samples of its group lie within its limit
    k = np.arange(len(xs)) + MIN_CLUSTER - 1
    inside = k < len(xs)
    anchor = np.zeros(len(xs), dtype=bool)
    anchor[inside] = (gs[k[inside]] == gs[inside]) & (xs[k[inside]] <= lim[inside])
    first = np.full(n, -1)
    starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]]) if len(gs) else np.array([], int)
    first[gs[starts]] = starts  # the fastest sample, where no anchor
    where = np.flatnonzero(anchor)
    # the fastest anchor of each group (sorted: the first seen)
    firsts = np.unique(gs[where], return_index=True)
    first[firsts[0]] = where[firsts[1]]
    have = first >= 0
    base = np.full(n, np.inf)
    top = np.full(n, -np.inf)
    base[have] = xs[first[have]]
    top[have] = lim[first[have]]
    keep = (x >= base[gid]) & (x <= top[gid])
    total = np.bincount(gid[keep], weights=x[keep], minlength=n)
    count = np.bincount(gid[keep], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def per_instance_v(r1: np.ndarray, r2: np.ndarray, omax: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`per_instance` of arrays: (cycles per instance, loops disagree)."""
    overhead = 2.0 * r1 - r2
    agree = (overhead >= -LOOPS_AGREE * r1) & (overhead <= LOOPS_AGREE * r1 + omax)
    agree |= ~(np.isfinite(r1) & np.isfinite(r2) & (r2 > 0))
    return np.where(agree, r2 - r1, np.minimum(r1, r2 / 2.0)), ~agree


def estimates_by(c1: np.ndarray, c2: np.ndarray, gid: np.ndarray, n: int, step: np.ndarray,
               omax: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, loops disagree, robust low of f1, of f2) of each group."""
    r1, r2 = low_by(c1, gid, n, step), low_by(c2, gid, n, step)
    est, disagree = per_instance_v(r1, r2, omax)
    return est, disagree, r1, r2
