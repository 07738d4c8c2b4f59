"""Where measurements come from: this CPU (the harness) or a simulated machine, behind one API.

Every stage of the pipeline (singletons, Palmed's stages, validation) asks a ``Measurer`` for
the cycles of a list of kernels. It answers from the measurement database when the kernel was
already measured on this machine with the same parameters and harness, and measures the rest
as one batch, stored as one new database part. So a rerun, or a rebuild from an archived
database, measures nothing and gets the same numbers, which makes the model derivable from the
raw rows alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import shutil
from collections.abc import Callable, Generator, Iterable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from cpumap.isa import catalogue
from cpumap.measure import asmgen, batch, blockgen, estimate, harness
from cpumap.measure.dbestimates import aggregate_db, calibration
from cpumap.measure.rows import base_row
from cpumap.measure.settings import BenchSettings, bench_settings
from cpumap.store import db

SIMULATED_VERSION = "sim-1"  # plays the part of the harness version for simulated rows


class Simulator(Protocol):
    """A simulated machine as the backend sees it (:class:`cpumap.model.simulate.Simulator`:
    its truth is a model, which sits on the floor above, so it is passed in, not imported)."""

    forms: list[str]
    kind: str

    def measure(self, kernels: Iterable[str]) -> list[float]: ...


def measurement_key(bench: BenchSettings | Mapping, simulated: bool) -> tuple[str, str]:
    """(params_id, harness version) that rows of this configuration carry in the DB."""
    params = bench_settings(bench).measurement_params()
    if simulated:
        return db.params_id(params | {"backend": "simulated"}), SIMULATED_VERSION
    return db.params_id(params), harness.HARNESS_VERSION


def simulated_forms(sim: Simulator) -> pd.DataFrame:
    """The catalogue of a simulated machine: every form of its mapping, all measurable."""
    rows = [{c: "" for c in catalogue.COLUMNS} | {
        "name": name, "code": name, "status": "ok", "mnemonic": name.split("_")[0],
        "category": "simulated", "encoding": "SIMULATED", "extension": sim.kind,
        "gas": "n/a", "att_template": name, "att_example": name,
    } for name in sorted(sim.forms)]
    df = pd.DataFrame(rows, columns=catalogue.COLUMNS)
    for c in catalogue.BOOL_COLUMNS:
        df[c] = False
    return df


def simulated_rows(kernels: list[str], sim: Simulator, machine_id: str,
                   bench: BenchSettings, batch_id: str) -> pd.DataFrame:
    """DB rows of kernels answered by a simulated machine: one exact (or noisy) row each."""
    params = bench.measurement_params() | {"backend": "simulated"}
    now = pd.Timestamp(datetime.now(UTC)).floor("us")
    rows = []
    for text, cycles in zip(kernels, sim.measure(kernels), strict=True):
        k = asmgen.parse_canonical(text)
        canon = asmgen.canonical(k)
        rows.append(base_row(machine_id, batch_id, params, canon, sum(k.values()),
                             backend="simulated", version=SIMULATED_VERSION) | {
            "rep": 0, "status": "ok", "error": "", "clock": "simulated", "insn_source": "simulated",
            "ticks1": 0, "ticks2": 0, "cycles1": -1, "cycles2": -1, "calib_ratio": np.nan,
            "instances": 1, "instructions": sum(k.values()), "cycles": cycles,
            "cycles_per_instance": cycles, "timestamp": now, "stable": True, "role": "kernel",
        })
    return db.conform(pd.DataFrame(rows))


def _unsimulated_rows(kernels: list[str], machine_id: str, bench: BenchSettings,
                      batch_id: str) -> pd.DataFrame:
    """Failed rows of blocks as written on a simulated machine: a mapping of forms has no
    registers, dependences or memory to run a block's own code on."""
    params = bench.measurement_params() | {"backend": "simulated"}
    now = pd.Timestamp(datetime.now(UTC)).floor("us")
    return db.conform(pd.DataFrame([base_row(
        machine_id, batch_id, params, k, blockgen.n_insns(k), backend="simulated",
        version=SIMULATED_VERSION) | {
        "rep": -1, "status": "failed", "timestamp": now,
        "error": "a simulated machine cannot run a block as written"} for k in kernels]))


class MeasuringDisabledError(RuntimeError):
    """Measuring is off (config ``measure: false``) and the database lacks some kernels."""


def batch_rows(kernels: list[str], forms: pd.DataFrame, machine: dict,
               bench: BenchSettings | Mapping, workdir: Path, batch_id: str, *,
               harness_bin: Path | None = None,
               sim: Simulator | None = None, skip: set[str] | frozenset[str] = frozenset(),
               progress: Callable[[str], None] | None = None,
               prepared: batch.Prepared | None = None,
               reference: Path | None = None) -> pd.DataFrame:
    """DB rows of one batch from either backend; kernels whose id is in ``skip`` (already in
    the database) produce no rows. The one place that decides simulated versus native.
    ``prepared``: the batch already generated and compiled (rule compile_batch);
    ``reference``: the machine's monitor reference (cpumap.measure.quiet)."""
    bench = bench_settings(bench)
    blocks = [k for k in kernels if blockgen.is_block(k)]
    if blocks and len(blocks) < len(kernels):
        raise ValueError("a batch holds blocks as written or multisets, not both")
    if sim is not None:
        todo = [k for k in kernels
                if asmgen.kernel_id(asmgen.kernel_key(k)) not in skip]
        if blocks:
            return _unsimulated_rows(todo, machine["machine_id"], bench, batch_id)
        return simulated_rows(todo, sim, machine["machine_id"], bench, batch_id)
    if harness_bin is None:
        raise ValueError("the native backend needs the harness binary")
    if blocks:
        codes = [bytes.fromhex(k[len(asmgen.BLOCK_PREFIX):]) for k in kernels
                 if asmgen.kernel_id(k) not in skip]
        Path(workdir).mkdir(parents=True, exist_ok=True)
        prepared = batch.prepare_blocks(codes, catalogue.Catalogue(forms), machine, bench,
                                        Path(workdir) / f"{batch_id}.so", progress)
    if prepared is not None:
        return batch.measure_prepared(prepared, machine, bench, harness_bin, batch_id,
                                      progress=progress, skip=skip, reference=reference)
    return batch.measure_batch(kernels, forms, machine, bench, workdir, harness_bin,
                               batch_id, progress=progress, skip=skip, reference=reference)


#: Kernels a Measurer measures as one batch; more go to consecutive batches, each stored as it
#: ends. A full-profile refinement round asked for 78,684 kernels at once: their repetition
#: rows, held until the batch ended, took fit_model to 18 GB on a 24 GB VM, and a crash would
#: have lost all of them.
MEASURE_CHUNK = 5_000


class Measurer:
    """Cycles per instance of kernels for one machine, from the DB or measured now.

    With ``measure=False`` nothing is ever measured: a kernel with no row at all in the
    database raises MeasuringDisabledError naming it (a kernel whose rows all failed is left
    out, as it was when it was measured), so a re-derivation from archived rows cannot
    quietly turn into a new measuring campaign.
    """

    def __init__(self, machine: dict, forms: pd.DataFrame, bench: BenchSettings | Mapping,
                 db_dir: Path, workdir: Path, *, harness_bin: Path | None = None,
                 sim: Simulator | None = None, log: Callable[[str], None] | None = None,
                 remeasure: bool = False, measure: bool = True,
                 max_uncertainty: float | None = None):
        self.machine, self.forms, self.bench = machine, forms, bench_settings(bench)
        self.db_dir, self.workdir = Path(db_dir), Path(workdir)
        self.harness_bin, self.sim = harness_bin, sim
        self.log = log or (lambda _m: None)
        self.remeasure = remeasure
        self.allow_measure = measure
        self._tried: set[str] = set()
        self.machine_id = machine["machine_id"]
        self.params_id, self.version = measurement_key(self.bench, sim is not None)
        self.max_uncertainty = max_uncertainty
        self.too_uncertain: set[str] = set()
        self._known: dict[str, float] | None = None
        self._cal = calibration(db.empty_frame())  # estimate.calibration_core of the database
        self._uncertainty: dict[str, float] = {}  # kernel -> rel. uncertainty of its estimate
        self.measured_now = 0
        #: generate and compile the next batch of a long request in a worker process while
        #: one is measured (a job that holds two cores: fit_model)
        self.prepare_ahead = False

    def _usable(self, agg: pd.DataFrame) -> dict[str, float]:
        """Estimates of the aggregated kernels, without those whose uncertainty exceeds
        ``max_uncertainty`` (they are left out as failed kernels are, and remembered).

        A singleton (one form, once) is kept whatever its uncertainty: it is the only
        measurement that puts its form in the model at all, and its estimate is the best
        round's, right whenever one round ran undisturbed."""
        keep = agg.cycles_per_instance_est > 0
        if self.max_uncertainty is not None:
            single = ~agg.kernel.astype(str).str.contains(r"[ *]")
            certain = agg.rel_uncertainty.fillna(np.inf) <= self.max_uncertainty
            self.too_uncertain |= set(agg.kernel[keep & ~certain & ~single])
            keep &= certain | single
        self._uncertainty.update(zip(agg.kernel[keep], agg.rel_uncertainty[keep].astype(float),
                                     strict=True))
        return dict(zip(agg.kernel[keep], agg.cycles_per_instance_est[keep].astype(float),
                        strict=True))

    def known(self) -> dict[str, float]:
        """Estimated cycles per instance (cpumap.measure.estimate) of every usable kernel in the
        DB for this machine/params."""
        if self._known is None:
            agg, self._tried, self._cal = aggregate_db(
                self.db_dir, self.machine_id, self.params_id, self.version,
                self.bench.stable_tol)
            self._known = {} if self.remeasure and self.allow_measure else self._usable(agg)
        return self._known

    def errors(self, kernels: list[str]) -> dict[str, str]:
        """Why each of these kernels failed, as its rows in the database say."""
        if not kernels:
            return {}
        keys = {asmgen.kernel_key(k): k for k in kernels}
        wanted = set(keys)
        out: dict[str, str] = {}
        # four columns of one part at a time: the whole database is a full profile's GBs
        for _, rows in db.iter_parts(self.db_dir, ["machine_id", "kernel", "status", "error"],
                                     skip_batches=db.REPEAT_PREFIX, machine_id=self.machine_id):
            rows = rows[rows.kernel.isin(wanted) & (rows.status == "failed")]
            out |= {keys[k]: str(e) for k, e in zip(rows.kernel, rows.error, strict=True)}
        return out

    def uncertainty(self, kernels: list[str]) -> dict[str, float]:
        """Relative uncertainty of the estimate ``measure`` returned for each kernel (kept
        from the same aggregate; ``measure`` returns the estimate alone)."""
        self.known()
        return {k: self._uncertainty[key] for k in kernels
                if (key := asmgen.kernel_key(k)) in self._uncertainty}

    def measure(self, kernels: list[str], stage: str) -> dict[str, float]:
        """Cycles of each kernel (canonical text); failed kernels are left out."""
        canon = list(dict.fromkeys(asmgen.kernel_key(k)
                                   for k in kernels))
        known = self.known()
        todo = [k for k in canon if k not in known]
        if not self.remeasure:
            # rows that all failed: measured already (and failed), not measured again, so
            # that a rebuild from the DB asks for nothing new
            todo = [k for k in todo if k not in self._tried]
        if not self.allow_measure:
            missing = [k for k in todo if k not in self._tried]
            if missing:
                raise MeasuringDisabledError(
                    f"{stage}: measuring is off (measure: false) and the database "
                    f"{self.db_dir} has no rows for {len(missing)} kernel(s) of "
                    f"{self.machine_id}: {', '.join(missing[:20])}"
                    + (" ..." if len(missing) > 20 else ""))
            todo = []
        if todo:
            self.log(f"{stage}: measuring {len(todo)} kernels ({len(canon) - len(todo)} "
                     "already in the database)"
                     + (f" in batches of {MEASURE_CHUNK}" if len(todo) > MEASURE_CHUNK else ""))
        chunks = [todo[i:i + MEASURE_CHUNK] for i in range(0, len(todo), MEASURE_CHUNK)]
        # closed when a batch raises: the batch prepared ahead is then removed at once
        with contextlib.closing(self._prepared(chunks, stage)) as ahead:
            for part, prepared in ahead:
                rows = self._measure_new(part, stage, prepared)
                self._tried |= set(part)
                # the batch's clock ratio as the database will give it (pooled with the earlier
                # batches: ``estimate.batch_ratios``), so that a rebuild reads the same estimates
                self._cal = estimate.calibration_core(
                    pd.concat([self._cal, calibration(rows)], ignore_index=True))
                known.update(self._usable(estimate.aggregate(
                    rows, self.bench.stable_tol, estimate.batch_ratios(self._cal))))
        return {k: known[k] for k in canon if k in known}

    def again(self, kernels: list[str], stage: str) -> dict[str, float]:
        """Cycles of each kernel measured a second time, in a batch of its own (``stage``
        starts with ``db.REPEAT_PREFIX``; the database's estimates leave such batches out):
        the measurement's own run-to-run spread. Kernels that
        such a batch of this stage already holds are answered from it (a rebuild from the
        database measures nothing); the others are measured, unless measuring is off."""
        if not stage.startswith(db.REPEAT_PREFIX):
            raise ValueError(f"a repeat stage must start with {db.REPEAT_PREFIX!r}: {stage!r}")
        canon = list(dict.fromkeys(asmgen.kernel_key(k)
                                   for k in kernels))
        key = {"machine_id": self.machine_id, "params_id": self.params_id,
               "harness_version": self.version}
        rows = [part for _, part in db.iter_parts(self.db_dir, batches=f"{stage}-", **key)]
        have = pd.concat(rows, ignore_index=True) if rows else db.empty_frame()
        done = set(have.kernel.astype(str))
        todo = [k for k in canon if k not in done]
        if todo and self.allow_measure:
            self.log(f"{stage}: measuring {len(todo)} kernels again")
            have = pd.concat([have, self._measure_new(todo, stage)], ignore_index=True)
        agg = estimate.aggregate(have, self.bench.stable_tol)
        ok = (agg.cycles_per_instance_est > 0) & agg.kernel.isin(canon)
        return dict(zip(agg.kernel[ok], agg.cycles_per_instance_est[ok].astype(float),
                        strict=True))

    def _prepared(self, chunks: list[list[str]], stage: str
                  ) -> Generator[tuple[list[str], batch.Prepared | None], None, None]:
        """Each chunk with its batch generated and compiled, the next one in a worker
        process while this one is measured (``prepare_ahead``: 8-15 s a 5,000-kernel batch,
        measured in 27-53 s, in the full profile's fit_model, Emerald Rapids-class guest,
        2026-11-29); None where it
        is prepared when measured (one chunk, a simulated machine, a worker that failed:
        the error is then the batch's own)."""
        if not (self.prepare_ahead and self.sim is None and len(chunks) > 1
                and not blockgen.is_block(chunks[0][0])):
            yield from ((chunk, None) for chunk in chunks)
            return
        # forked, not spawned: a spawned worker imports the parent's main module again, and
        # a pipeline job's main module is its Snakemake script, which would run once more
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
        # the batches prepared or being prepared and not handed over yet, and where
        unused: dict[Future, Path] = {}

        def submit(chunk: list[str]) -> Future:
            batch_id = self._batch_id(chunk, stage)
            future = pool.submit(batch.prepare_batch, chunk, self.forms, self.machine,
                                 self.bench, self.workdir / batch_id / f"{batch_id}.so")
            unused[future] = self.workdir / batch_id
            return future

        try:
            ahead = submit(chunks[0])
            for i, chunk in enumerate(chunks):
                mine = ahead
                if i + 1 < len(chunks):
                    ahead = submit(chunks[i + 1])  # starts once ``mine`` is compiled
                # handed over: its measuring removes the directory (or keeps a failed one)
                del unused[mine]
                try:
                    prepared = mine.result()
                    self.log(f"{self._batch_id(chunk, stage)}: {len(chunk)} kernels generated "
                             "and compiled in a worker process")
                except Exception as exc:  # noqa: BLE001 - prepared again here, where it tells
                    self.log(f"{self._batch_id(chunk, stage)}: the worker could not prepare "
                             f"it ({type(exc).__name__}: {exc}); preparing it here")
                    prepared = None
                yield chunk, prepared
        finally:
            # a batch that raised, or a request given up: the next batch, prepared (a few
            # hundred MB of assembly and shared object at 5,000 kernels) but never to be
            # measured, is removed once its worker is done with it
            pool.shutdown(wait=bool(unused), cancel_futures=True)
            for path in unused.values():
                shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def _batch_id(todo: list[str], stage: str) -> str:
        digest = hashlib.sha256("\n".join(todo).encode()).hexdigest()[:8]
        return f"{stage}-{digest}"

    def _measure_new(self, todo: list[str], stage: str,
                     prepared: batch.Prepared | None = None) -> pd.DataFrame:
        """Measure ``todo`` as one batch named after the stage and the kernels (``prepared``:
        already generated and compiled); store and return its rows."""
        batch_id = self._batch_id(todo, stage)
        workdir = self.workdir / batch_id
        rows = batch_rows(todo, self.forms, self.machine, self.bench, workdir, batch_id,
                          harness_bin=self.harness_bin, sim=self.sim, progress=self.log,
                          prepared=prepared)
        if db.part_path(self.db_dir, batch_id).exists():
            # the same kernels measured before (an interrupted run, a repeat): keep both
            batch_id = f"{batch_id}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%f')}"
            rows["batch_id"] = batch_id
        db.append(self.db_dir, rows, batch_id)
        # the batch's assembly and shared object are rebuilt from the kernels' texts when
        # needed: kept, they filled the disk (23 GB of model/work on the full profile at
        # 2 h, about 290 MB a batch of 5,000); kept only where the batch failed. The
        # directory the batch was built in: batch_id may have been renamed just above
        shutil.rmtree(workdir, ignore_errors=True)
        self.measured_now += len(todo)
        return rows
