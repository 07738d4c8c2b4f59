"""One measuring batch: generate and compile its kernels into one shared object, run the
harness over it in rounds, and turn what it printed into DB rows.

A batch is prepared (generated and compiled, :func:`prepare_batch`) and then measured
(:func:`measure_prepared`); :func:`measure_batch` does both. The pipeline prepares the next
singleton batch on one core while the previous one is measured on the other (rule
compile_batch), so that compiling costs no measuring time.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from cpumap.isa.catalogue import host_flags
from cpumap.isa.x86 import FormSpec
from cpumap.measure import asmgen, blockgen, estimate, harness, quiet, robust, rows, slot
from cpumap.measure.settings import BenchSettings, bench_settings
from cpumap.store import db

#: The noise monitor the report shows: measured first in every batch, so that the report can
#: show how quiet the host was over a run. Integer adds on all four ALUs are what a neighbour
#: on the same core slows down most (docs/measurement.md); its estimate should stay at 0.25
#: cycles on Zen 3/4 while its median repetition shows the neighbour. The load monitor
#: (quiet.MONITOR_KERNELS) shows what the adds cannot: a neighbour on the load pipes.
MONITOR_KERNEL = quiet.MONITOR_KERNELS[0]


def _specs(forms: pd.DataFrame, names) -> dict[str, FormSpec]:
    picked = forms.set_index("name").loc[sorted(set(names))]
    return {n: FormSpec.from_json(s) for n, s in zip(picked.index, picked["spec"], strict=True)}


@dataclasses.dataclass
class Prepared:
    """A generated and compiled batch: the shared object and what each of its kernels is.

    ``kernels`` are the canonical texts of the kernels in the .so, in order (``monitor`` of
    them are monitors: :func:`monitor_indices`); ``unmeasurable`` maps a kernel that cannot be
    generated here to the reason. Stored beside the .so as JSON, so that one job can compile
    and another measure.
    """

    so: str
    kernels: list[str]
    metas: list[dict]
    monitor: int
    unmeasurable: dict[str, str]
    #: pages the harness maps on demand per kernel (blocks measured as written), 0: none
    map_pages: int = 0

    def save(self, path: Path | str) -> None:
        Path(path).write_text(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def load(cls, path: Path | str) -> Prepared:
        return cls(**json.loads(Path(path).read_text()))

    def kernel_metas(self) -> list[asmgen.KernelMeta]:
        return [asmgen.KernelMeta(**m) for m in self.metas]


def prepare_batch(kernels: list[str], forms: pd.DataFrame, machine: dict,
                  bench: BenchSettings | Mapping, so: Path,
                  progress: Callable[[str], None] | None = None) -> Prepared:
    """Generate and compile kernels (canonical texts) into the shared object ``so``."""
    say = progress or (lambda _m: None)
    bench = bench_settings(bench)
    parsed = [asmgen.parse_canonical(k) for k in kernels]
    ok_forms = set(forms.loc[forms.status == "ok", "name"])
    specs = _specs(forms, [n for k in parsed for n in k if n in ok_forms])
    unmeasurable: dict[str, str] = {}
    good: list[dict[str, int]] = []
    for k in parsed:
        bad = [n for n in k if n not in ok_forms]
        err = f"form(s) not measurable here: {', '.join(bad)}" if bad else ""
        if not err:
            try:
                asmgen.plan_pools([specs[n] for n in k])
            except asmgen.KernelError as exc:
                err = str(exc)
        if err:
            unmeasurable[asmgen.canonical(k)] = err
        else:
            good.append(k)
    monitors = [k for k in quiet.MONITOR_KERNELS if k in ok_forms] \
        if bench.monitor and good else []
    if monitors:
        # the noise references: how quiet the host was while this batch ran
        specs |= _specs(forms, monitors)
        n = len(good) + len(monitors)
        at = dict(zip(monitor_indices(n, len(monitors)), monitors, strict=True))
        rest = iter(good)
        good = [{at[i]: 1} if i in at else next(rest) for i in range(n)]
    t0 = time.monotonic()
    # an empty batch too (every kernel already in the database, or none measurable): the
    # shared object is a rule's output, and the harness runs a batch of no kernels
    asm, metas = asmgen.generate_batch(good, specs, bench.gen_params, host_flags(machine))
    asmgen.compile_batch(asm, Path(so))
    say(f"{Path(so).stem}: generated and compiled {len(good)} kernels in "
        f"{time.monotonic() - t0:.1f} s")
    return Prepared(str(so), [asmgen.canonical(k) for k in good],
                    [dataclasses.asdict(m) for m in metas], len(monitors), unmeasurable)


def prepare_blocks(codes: list[bytes], catalogue, machine: dict, bench: BenchSettings | Mapping,
                   so: Path, progress: Callable[[str], None] | None = None) -> Prepared:
    """Basic blocks (machine code) measured as written (:mod:`cpumap.measure.blockgen`):
    compiled into the shared object ``so``; the blocks that cannot run as written are
    ``unmeasurable`` with the reason. Kernel texts are ``BLOCK:<hex>``."""
    say = progress or (lambda _m: None)
    bench = bench_settings(bench)
    blocks = [blockgen.prepare(c, catalogue) for c in dict.fromkeys(codes)]
    good = [b for b in blocks if not b.error]
    metas: list[asmgen.KernelMeta] = []
    if good:
        t0 = time.monotonic()
        asm, metas = blockgen.generate_batch(good, bench.gen_params, host_flags(machine))
        asmgen.compile_batch(asm, Path(so))
        say(f"{Path(so).stem}: generated and compiled {len(good)} blocks in "
            f"{time.monotonic() - t0:.1f} s")
    return Prepared(str(so), [b.text for b in good], [dataclasses.asdict(m) for m in metas],
                    0, {b.text: b.error for b in blocks if b.error}, blockgen.MAP_PAGES)


def measure_prepared(prep: Prepared, machine: dict, bench: BenchSettings | Mapping,
                     harness_bin: Path, batch_id: str,
                     progress: Callable[[str], None] | None = None,
                     skip: set[str] | frozenset[str] = frozenset(),
                     reference: Path | None = None,
                     reference_kernels: bool = False) -> pd.DataFrame:
    """Measure a prepared batch in rounds; return its DB rows.

    A kernel that cannot be generated or that fails in the harness gets a ``failed`` row with
    the reason; the rest of the batch is measured normally. Kernels whose id is in ``skip``
    (already in the database) are not run and produce no rows. ``reference``: the machine's
    reference values (cpumap.measure.quiet), read to judge the rounds and updated after with
    the monitors' values (and with ``reference_kernels`` the kernels', as `cpumap measure`
    does: a kernel measured slower than this machine settled on before is measured again, and
    a kernel still unstable after ``bench.max_rounds`` too, within ``bench.settle_s``).
    """
    say = progress or (lambda _m: None)
    bench = bench_settings(bench)
    machine_id = machine["machine_id"]
    params = bench.measurement_params()
    now = pd.Timestamp(datetime.now(UTC)).floor("us")
    unmade: list[dict] = []
    for canon, err in prep.unmeasurable.items():
        if asmgen.kernel_id(canon) not in skip:
            n = blockgen.n_insns(canon) if blockgen.is_block(canon) else \
                sum(asmgen.parse_canonical(canon).values())
            unmade.append(rows.failed_row(machine_id, batch_id, params, canon, n, err, now))
    metas = prep.kernel_metas()
    mons = monitor_indices(len(metas), int(prep.monitor))
    skipped = [m.index for m in metas if m.kernel_id in skip and m.index not in mons]
    if skipped:
        say(f"{batch_id}: {len(skipped)} of {len(metas)} kernels already in the database, "
            "not measured again")
    todo = [m.index for m in metas if m.index not in set(skipped)]
    todo = [*mons, *(i for i in todo if i not in mons)]  # the monitors first
    if all(i in mons for i in todo):
        todo = []  # nothing left to measure but the monitors
    done = pd.DataFrame()
    if todo:
        say(f"{batch_id}: measuring {len(todo)} kernels in {bench.rounds} rounds (more, up "
            f"to {bench.max_rounds} or {bench.settle_s:g} s, for unsettled ones)")
        results = _rounds(Path(prep.so), len(metas), todo, metas, bench, harness_bin,
                          batch_id, mons, say, prep.map_pages,
                          quiet.load_reference(reference, db.params_id(params)),
                          patient=reference_kernels)
        t_rows = time.monotonic()
        done = rows.rows_from_rounds(results, metas, machine_id, batch_id, params, now, mons)
        say(f"{batch_id}: {len(done)} DB rows built in {time.monotonic() - t_rows:.1f} s")
        if mons or reference_kernels:
            quiet.update_reference(reference, done, bench.stable_tol,
                                   kernels=reference_kernels)
    parts = [f for f in (pd.DataFrame(unmade), done) if len(f)]
    return db.conform(pd.concat(parts, ignore_index=True)) if parts else db.empty_frame()


def measure_batch(kernels: list[str], forms: pd.DataFrame, machine: dict,
                  bench: BenchSettings | Mapping, workdir: Path, harness_bin: Path,
                  batch_id: str, progress: Callable[[str], None] | None = None,
                  skip: set[str] | frozenset[str] = frozenset(),
                  reference: Path | None = None,
                  reference_kernels: bool = False) -> pd.DataFrame:
    """Generate, compile and measure kernels (canonical texts) as one batch; return DB rows
    (:func:`prepare_batch`, then :func:`measure_prepared`). Kernels whose id is in ``skip``
    (already in the database) are not generated and produce no rows."""
    todo = [k for k in kernels
            if asmgen.kernel_id(asmgen.kernel_key(k)) not in skip]
    if len(todo) < len(kernels) and progress is not None:
        progress(f"{batch_id}: {len(kernels) - len(todo)} of {len(kernels)} kernels already "
                 "in the database, not measured again")
    prep = prepare_batch(todo, forms, machine, bench, Path(workdir) / f"{batch_id}.so",
                         progress)
    return measure_prepared(prep, machine, bench, harness_bin, batch_id, progress,
                            reference=reference, reference_kernels=reference_kernels)


def _rounds(so: Path, n_kernels: int, todo: list[int], metas: list[asmgen.KernelMeta],
            bench: BenchSettings, harness_bin: Path, batch_id: str, mons: Sequence[int],
            say: Callable[[str], None], map_pages: int = 0,
            reference: dict[str, float] | None = None,
            patient: bool = False) -> list[harness.BatchResult]:
    """The harness's passes over the batch: ``bench.rounds``, then more (up to
    ``bench.max_rounds``) for the kernels still unsettled, each pass at least
    ``bench.round_gap_ms`` after the previous one started. While no round was quiet (the
    monitors against ``reference``, cpumap.measure.quiet) the whole batch is measured again,
    the gap doubled each time (up to :data:`MAX_GAP_S`): a neighbour on the load pipes holds
    for whole seconds. Only rounds short enough for the monitors to speak for the whole round
    are judged (quiet.JUDGED_ROUND_S), and longer ones that measured the monitors at both ends
    (quiet.TRAILING_MIN_KERNELS); while a batch of judged rounds has no quiet round or a
    kernel above its reference, it has a time budget instead of a round count
    (``bench.settle_s``, at least ``bench.max_rounds`` rounds): a spell outlasts
    eight rounds now and then (one `cpumap measure MOV_R64_M64` in fifteen with a busy loop on
    the other vCPU, 2026-11-25), and a user waits seconds for a right value more gladly than
    for a warning. A ``patient`` batch (`cpumap measure`: one kernel a user asked for) also
    spends the budget on a kernel only unstable: the first measurement of a kernel has no
    reference of its own, and a neighbour on pipes no monitor uses shows only as rounds that
    disagree (VPADDD ymm, 2026-11-25, a fresh results directory: one invocation in five at
    0.2551, flagged, against 0.2500). The monitors (the kernels ``mons``) run first in every
    round."""
    t_run = time.monotonic()
    rounds = max(1, bench.rounds)
    everything = list(todo)
    gap = bench.round_gap_ms / 1000
    # progress: kernel runs finished in earlier rounds, and planned in all
    runs = {"before": 0, "total": len(_order(todo, mons)) * rounds, "last": t_run}

    def tick(done: int) -> None:
        now_t = time.monotonic()
        finished = runs["before"] + done
        if finished < runs["total"] and now_t - runs["last"] < 2.0:
            return  # a progress line every 2 s is enough, and costs nothing
        runs["last"] = now_t
        say(f"{batch_id}: {finished}/{runs['total']} kernel runs, "
            f"{runs['total'] - finished} left, {finished / max(now_t - t_run, 1e-9):.1f} runs/s")

    results: list[harness.BatchResult] = []
    started: list[float] = []
    noisy = False
    judging = 0.0  # seconds spent judging the rounds, for the batch's closing line
    # a job of the model's chain keeps the others out of the gaps between its rounds (the
    # gate, cpumap.measure.slot); the slot itself is held round by round
    with slot.batch():
        while True:
            if started:  # rounds apart in time: bursts of interference last seconds
                time.sleep(max(0.0, started[-1] + gap - time.monotonic()))
            # the slot is held for one round: between rounds (the gap, the judging) and
            # between batches another job may measure, unless this batch measures first
            order = _order(todo, mons)
            trailing = len(order) > len(todo)
            with slot.held():
                started.append(time.monotonic())
                results.append(harness.run_batch(so, n_kernels, harness_bin=harness_bin,
                                                 progress=tick, indices=order,
                                                 map_pages=map_pages,
                                                 map_fill=blockgen.BLOCK_INIT,
                                                 **bench.harness_args()))
            runs["before"] += len(order)
            # the monitors speak for the kernels measured near them in time: a round much
            # longer than a neighbour's spell (a whole singleton batch, seconds) is judged
            # only where the monitors ran at both of its ends
            judge = trailing or time.monotonic() - started[-1] <= quiet.JUDGED_ROUND_S
            if len(results) < rounds:
                continue
            # past max_rounds, only a batch that has seen the host's noise (no quiet round, a
            # kernel above its reference) or a patient one goes on, within its time budget
            if len(results) >= max(rounds, bench.max_rounds) and not (
                    judge and (noisy or patient) and time.monotonic() - t_run < bench.settle_s):
                break
            t_judge = time.monotonic()
            todo, loud, slow = _unsettled(results, metas, bench, mons, reference, judge=judge,
                                          only=todo)
            judging += time.monotonic() - t_judge
            noisy = noisy or bool(loud or slow)
            if loud:
                todo, gap = everything, min(2 * gap, MAX_GAP_S)
                say(f"{batch_id}: no quiet round yet ({loud}): round {len(results) + 1} for all "
                    f"{len(todo)} kernels, {gap:.1f} s after the last")
            elif slow:
                gap = min(2 * gap, MAX_GAP_S)
                say(f"{batch_id}: slower than this machine's reference ({slow}): round "
                    f"{len(results) + 1} for {len(todo)} kernel(s), {gap:.1f} s after the last")
            elif not todo:
                break
            else:
                say(f"{batch_id}: round {len(results) + 1} for {len(todo)} unsettled kernel(s)")
            runs["total"] = runs["before"] + len(_order(todo, mons))
    say(f"{batch_id}: {len(results)} rounds, {runs['before']} kernel runs in "
        f"{time.monotonic() - t_run:.1f} s, of which judging the rounds {judging:.1f} s")
    return results


def _order(todo: Sequence[int], mons: Sequence[int]) -> list[int]:
    """What a round measures, in order: ``todo``, and the monitors again at the end of a long
    round (quiet.TRAILING_MIN_KERNELS), so that it can be judged on both ends."""
    kernels = sum(1 for i in todo if i not in mons)
    return [*todo, *mons] if mons and kernels >= quiet.TRAILING_MIN_KERNELS else list(todo)


#: The longest wait between two rounds while none was quiet.
MAX_GAP_S = 2.0


def _unsettled(results: list, metas: list, bench: BenchSettings, mons: Sequence[int],
               reference: dict[str, float] | None = None,
               judge: bool = True,
               only: Sequence[int] | None = None) -> tuple[list[int], str, str]:
    """What the next round measures, why the whole batch must be measured again ("" when a
    round was quiet, else which monitor was how slow in every round), and which kernels are
    still slower than their reference (judged rounds only; "" when none).

    The next round: the kernels whose estimate over the rounds so far is unstable or above
    their reference, with the monitors; the monitors alone when only the core clock is
    unsettled (the fastest calibration chains of the best round not matched by another
    round: a neighbour slows the add chain too); nothing when everything settled.

    ``only``: the kernels the last round measured (and the monitors); the others got no
    new rows and are not judged again, but their samples still give the batch's clock
    (``rows.calibration_rows``). Why: judging every round's rows (350,000 in a 2,000-kernel
    batch after eight rounds) took about 7 s a round (Emerald Rapids-class guest,
    2026-11-29) while the last rounds measured 44-113 kernels. Judged whole, that batch
    also had 12 kernels the last samples' nudge to the clock tipped over tolerance."""
    keep = None if only is None else {*only, *mons}
    ts0 = pd.Timestamp(0, tz="UTC")
    df = rows.rows_from_rounds(results, metas, "m", "b", {}, ts0, mons, keep=keep)
    if df.empty or "rep" not in df:
        return [], "", ""
    ok = df[df.status == "ok"]
    cal = ok if keep is None else rows.calibration_rows(results, "m", "b", {}, ts0)
    ratios = estimate.batch_ratios(cal)
    if mons and judge:
        per_round = quiet.round_estimates(ok, ratios)
        calm, worst = quiet.quiet_rounds(per_round, reference)
        if not calm and len(per_round):
            return [], ", ".join(f"{k} {100 * v:+.1f} %" for k, v in worst.items()
                                 if v > quiet.QUIET_TOL), ""
    agg = estimate.aggregate(ok, bench.stable_tol, ratios)
    above = quiet.above_reference(agg, reference) if judge else {}
    bad = set(agg.kernel[agg.unstable]) | set(above)
    todo = [m.index for m in metas if m.kernel in bad and m.index not in mons]
    slow = ", ".join(f"{k} {100 * v:+.1f} %" for k, v in above.items())
    if todo:
        return [*mons, *todo], "", slow
    cal = cal.dropna(subset=["cal1", "cal2"]) if "cal1" in cal else cal.iloc[:0]
    clock = sorted((robust.calib_ratio(g.cal1.to_numpy(), g.cal2.to_numpy(),
                                         float(g.cal_adds.iat[0]))
                    for _, g in cal.groupby("round")), reverse=True)
    if len(clock) >= 2 and clock[0] / clock[1] - 1 > bench.stable_tol / 2:
        return list(mons) or [metas[0].index], "", ""
    return [], "", ""


def monitor_indices(n_kernels: int, n_mon: int) -> tuple[int, ...]:
    """Where a batch's ``n_mon`` monitors sit among its ``n_kernels`` kernels: the integer-add
    monitor first, the others last. Why not all first: a kernel's measured value depends a
    little on where its code lies in the shared object (ADD_R64_R64 read 0.2493 cycles, below
    the 0.25 four ALUs allow, as the third function of a batch, and 0.2500 as the second,
    2026-11-25: f1 ran 0.7 % slower than half of f2), so the monitors added later keep the
    kernels where they were."""
    if n_mon <= 0:
        return ()
    return (0, *range(n_kernels - n_mon + 1, n_kernels))
