"""Which rounds of a batch ran on a quiet host: the monitors against a reference.

Why a second monitor and a reference at all: the robust estimator (cpumap.measure.estimate)
finds the CPU's speed wherever some repetitions ran undisturbed, but a neighbour that shares
the physical core can also slow *every* call of a kernel for seconds without leaving a fast
tail. Measured on Zen 4 (2026-11-25, a C loop timed in 100 ms windows, the fastest call of
each window): 64-bit loads at 3 per cycle ran 3.5-6 % slow in whole windows, for up to 1.5 s
with a busy loop on the other vCPU and now and then without one, while independent integer
adds, vector adds and the dependent-add clock chain in the same windows kept their speed. A
harness round (about 0.1 s per kernel) that falls inside such a window is slow and
self-consistent, and three of them can agree with each other: `cpumap measure MOV_R64_M64`
gave 0.340 one invocation in five. The ADD monitor cannot see it; a load monitor can.

So every native batch measures the monitors (:data:`MONITOR_KERNELS`: integer adds on all
ALUs, 64-bit loads on all load pipes) in every round, and a round is *quiet* when each
monitor's estimate of that round is within :data:`QUIET_TOL` of its reference: the lowest of
the batch's own rounds and of the machine's reference, the lower quartile of the recent
settled monitor estimates kept in a small JSON file beside the database (without it a batch
whose every round was slow would look quiet to itself). A batch whose rounds are short
measures more rounds, further apart, until one is quiet or its time budget is spent
(cpumap.measure.batch); the rounds that were not stay in the database, and the estimate,
which takes each kernel's fastest cluster over all rounds, finds the quiet round's calls.
What the monitors do not catch: spells shorter than a round. With a busy loop on the other
vCPU the loads' spells last milliseconds, and a monitor measured quiet can sit next to a
kernel measured slow in the same round; for that `cpumap measure` also keeps each kernel's
own settled values in the same file and measures a kernel again while it is more than
:data:`KERNEL_TOL` slower than them (:func:`above_reference`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from cpumap.measure import estimate
from cpumap.store.files import write_json_atomic

#: The monitors, in the order they are measured first in every round (where they lie in the
#: shared object: cpumap.measure.batch.monitor_indices): integer adds on the four ALUs
#: (what a neighbour's integer work slows) and 64-bit loads on the load pipes (what a
#: neighbour's memory work slows, and the adds do not show).
MONITOR_KERNELS = ("ADD_R64_R64", "MOV_R64_M64")
#: A round is quiet when every monitor's estimate of the round is at most this far above its
#: reference. A quiet round's own estimate scatters by 0.3-0.6 % (the load monitor's rounds,
#: 2026-11-25); the slow windows above are 2-6 % slow.
QUIET_TOL = 0.01
#: The longest round the monitors are taken to speak for: they run at its start, and a
#: neighbour's spell on the load pipes lasts from milliseconds to seconds (above). A
#: `cpumap measure` round or a small batch's (0.1-0.5 s) is judged; a full-profile singleton
#: batch's round (about 1,000 kernels, 3 s and more) is not: measuring it again whole because
#: its first milliseconds were slow would cost 40 % more time for no evidence about the rest
#: (measured 2026-11-25: `benchmarks/full_profile.py` 76 kernels/s with every round judged).
JUDGED_ROUND_S = 1.0
#: A round of at least this many kernels (besides the monitors) measures the monitors again at
#: its end, and a round longer than JUDGED_ROUND_S is then judged on both ends: loud only where
#: the monitors were slow at its start and at its end (their estimate for the round takes the
#: faster end). Why: a neighbour's spell of seconds covers whole rounds. Seen on the Emerald
#: Rapids-class guest (2026-12-01): the 200 held-out kernels measured again in a batch of
#: their own (rounds of about 1.3 s) had the integer-add monitor at 0.33 cycles (0.20 quiet)
#: in all three first rounds, no round judged, and 25-44 of the kernels came out 20-97 %
#: slow with rounds that agreed (`INC_R64*4 SUB_R64_R64` 1.63 cycles, 0.83 alone): the
#: validation's run-to-run floor read 8.4-11.6 % RMS where the same batch measured quiet
#: agreed within 0.5 %.
TRAILING_MIN_KERNELS = 32
#: A kernel (`cpumap measure`) is measured again while its estimate is more than this above
#: its reference. Tighter than :data:`QUIET_TOL`: it judges an estimate over all rounds, not
#: one round, and five invocations must agree within 1 % (the 64-bit load, 2026-11-25, with a
#: busy loop on the other vCPU: accepted at up to 1 % above, invocations spread 0.93 % and one
#: in fifteen ended 1.7 % above after its eight rounds; at 0.5 % and a time budget, 0.45 %).
KERNEL_TOL = 0.005
#: How many recent settled estimates per kernel the machine's reference keeps, and which
#: quantile of them is the reference (:func:`_reference_of`). Not the lowest: the settled
#: estimates of a quiet host scatter by the calibration's luck, 0.2-0.3 % both ways (the
#: 64-bit load: 0.3323-0.3342 where 3 loads a cycle is 0.3333), so the second lowest of 32
#: sat 0.3 % below the CPU and a right value 0.5 % above it was measured again for 22 s. The
#: lower quartile stays below the quiet scatter's middle and above its luckiest tail; a slow
#: settled value (a spell that outlasted a batch) moves it only when a quarter of the recent
#: values are slow.
REFERENCE_KEEP = 32
REFERENCE_QUANTILE = 0.25


def round_estimates(rows: pd.DataFrame, ratios: Mapping | None = None) -> pd.DataFrame:
    """Each monitor's estimate in each round of a batch's rows (columns round, kernel, est).

    One ``estimate.aggregate`` over all rounds, each (monitor, round) its own group by the
    kernel id: its groups are estimated independently, and its fixed cost (pandas' group-by
    set-up, 40-60 ms) paid once a judgement instead of once a round was most of a small
    batch's judging (0.2-0.35 s after its eighth round, 100 kernels)."""
    mon = rows[(rows.get("role") == "monitor") & (rows["status"] == "ok")]
    if mon.empty or "round" not in mon:
        return pd.DataFrame({"round": [], "kernel": [], "est": []})
    ratios = estimate.batch_ratios(rows) if ratios is None else ratios
    rnd = mon["round"].astype("int64")
    agg = estimate.aggregate(mon.assign(
        role="kernel", kernel_id=mon["kernel_id"].astype(str) + "#" + rnd.astype(str)),
        ratios=ratios)
    return pd.DataFrame({
        "round": agg["kernel_id"].str.rpartition("#")[2].astype("int64").to_numpy(),
        "kernel": agg["kernel"].to_numpy(),
        "est": agg["cycles_per_instance_est"].astype("float64").to_numpy()}) \
        .sort_values("round", kind="stable").reset_index(drop=True)


def quiet_rounds(per_round: pd.DataFrame, reference: Mapping[str, float] | None = None,
                 tol: float = QUIET_TOL) -> tuple[set[int], dict[str, float]]:
    """The quiet rounds and, per monitor, how slow its slowest quiet-or-not round was
    against the reference (the worst round's excess, for the report and the CLI)."""
    ok = per_round[per_round["est"] > 0] if len(per_round) else per_round
    if ok.empty:  # nothing to judge by (no monitor timed): every round counts as quiet
        return set(per_round.get("round", pd.Series(dtype=int)).astype(int)), {}
    reference = reference or {}
    ref = ok.groupby("kernel")["est"].min()
    ref = pd.Series({k: min(v, reference.get(k, np.inf)) for k, v in ref.items()})
    excess = ok["est"] / ok["kernel"].map(ref) - 1.0
    loud = ok.loc[~(excess <= tol), "round"]
    rounds = set(ok["round"].astype(int)) - set(loud.astype(int))
    worst = excess.groupby(ok["kernel"]).max().fillna(np.inf).to_dict()
    return rounds, {str(k): float(v) for k, v in worst.items()}


def reference_path(db_dir: Path | str) -> Path:
    """Where a database's machine keeps its reference values: beside the database."""
    return Path(db_dir).parent / "monitor" / "reference.json"


def _key(kernel: str, params_id: str) -> str:
    return f"{kernel}|{params_id}"


def load_reference(path: Path | str | None, params_id: str) -> dict[str, float]:
    """The machine's reference value of each monitor (and of each kernel `cpumap measure`
    measured) under the measurement parameters ``params_id``; empty without a file or with a
    bad one: a reference only ever adds rounds, it never changes a value."""
    return {k.rpartition("|")[0]: _reference_of(v)
            for k, v in _kept(path).items() if v and k.endswith(f"|{params_id}")}


def _reference_of(values: list[float]) -> float:
    """The lower quartile of ``values``, but never the lowest of two or more: one value low
    by luck does not set the reference of a kernel measured only a few times."""
    v = sorted(values)
    return v[max(min(1, len(v) - 1), int(REFERENCE_QUANTILE * (len(v) - 1)))]


def _kept(path: Path | str | None) -> dict[str, list[float]]:
    """The reference file's values per key; empty without a file or with a damaged one."""
    if path is None or not Path(path).exists():
        return {}
    try:
        return {str(k): [float(x) for x in v]
                for k, v in json.loads(Path(path).read_text()).items()}
    except (ValueError, TypeError, AttributeError, OSError):
        return {}


def update_reference(path: Path | str | None, rows: pd.DataFrame,
                     stable_tol: float = estimate.STABLE_TOL, kernels: bool = False) -> None:
    """Add each monitor's estimate over the batch (and with ``kernels`` each measured
    kernel's) to the machine's reference when it settled (its best round matched by
    another); written atomically. A slow batch that settled adds a slow value, which the
    reference's low rank leaves aside."""
    if path is None:
        return
    roles = ("monitor", "kernel") if kernels else ("monitor",)
    keep = rows[rows.get("role", pd.Series("kernel", index=rows.index)).isin(roles)
                & (rows["status"] == "ok")]
    if keep.empty:
        return
    agg = estimate.aggregate(keep.assign(role="kernel"), stable_tol,
                             ratios=estimate.batch_ratios(rows))
    settled = agg[~agg["unstable"] & (agg["cycles_per_instance_est"] > 0)]
    if settled.empty:
        return
    kept = _kept(path)
    for k, p, e in zip(settled["kernel"], settled["params_id"],
                       settled["cycles_per_instance_est"], strict=True):
        key = _key(str(k), str(p))
        kept[key] = (kept.get(key, []) + [float(e)])[-REFERENCE_KEEP:]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(kept, path)


def above_reference(agg: pd.DataFrame, reference: Mapping[str, float] | None,
                    tol: float = KERNEL_TOL) -> dict[str, float]:
    """Kernels (of an ``estimate.aggregate`` table) measured more than ``tol`` slower than
    their reference, and by how much: interference only slows, so a value above one this
    machine settled on before is more likely a neighbour than the CPU."""
    out = {}
    for k, e in zip(agg["kernel"], agg["cycles_per_instance_est"], strict=True):
        ref = (reference or {}).get(str(k))
        if ref and e > 0 and e / ref - 1 > tol:
            out[str(k)] = float(e / ref - 1)
    return out
