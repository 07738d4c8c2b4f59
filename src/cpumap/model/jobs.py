"""The modelling stage of the pipeline: Palmed against a Measurer, then held-out validation.

Glue between ``cpumap.model.palmed.build`` (Palmed's stages, each asking for kernels),
``cpumap.measure.backend.Measurer`` (answers from the DB or measures, one DB part per request) and
the pipeline's files: one function per Palmed job of workflow/rules/model.smk (``*_job``). The
planned stages (pairs, mapping kernels) write a plan that parallel batch jobs measure; the
stages whose next kernels depend on an LP over everything measured so far (core mapping,
refinement) measure their own rounds. Every measurement is stored as it is made, and a rerun
finds them all in the DB: the model is then rebuilt from the raw rows alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence, Set
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cpumap.isa import transition
from cpumap.measure import campaign
from cpumap.measure.backend import Measurer
from cpumap.model import flagchain, issue, resmodel, validation
from cpumap.model.mode_lines import dirty_line, wide_line
from cpumap.model.outside import (
    add_chain_forms,
    add_decomposed_forms,
    add_flags_chain,
    add_issue_width,
    modelable,
)
from cpumap.model.palmed import NON_ADDITIVE_SHARE, PalmedConfig
from cpumap.model.palmed.build import Build
from cpumap.model.palmed.dirty import DIRTY_BITS
from cpumap.store import db, files

#: Palmed's tolerance on real hardware when ``model.tol`` is null.
NATIVE_TOL = 0.05
#: On real hardware: resources the core adds per measurement round, and resources in all.
NATIVE_CORE_BATCH = 4
NATIVE_MAX_RESOURCES = 36
#: On real hardware: resources the core may find, and refinement resources per round. Allowed
#: all 32 resources (Zen 4, quick set), the core used them all and the refinement could add
#: none: dividers, which are never basic, kept uses of the FP multiplier or of a memory
#: resource. 24 core resources leave 12 to refinement rounds of 2, each dropped if it raises
#: the misfit of singletons and pairs: the first round gives VDIVPD/VSQRTPD a resource of their
#: own. Held-out, refitted from the same database: RMS IPC error 19.4%, MAPE 12.5%, Kendall's
#: tau 0.827 with a cap of 32 (and the singletons still forcing their uses); 18.7%, 10.2%,
#: 0.832 with 24 + 2 per round (18.9%, 10.4%, 0.824 with 4 per round).
NATIVE_MAX_CORE_RESOURCES = 24
NATIVE_REFINE_BATCH = 2


def palmed_config(model_cfg: Mapping[str, Any], noise: float | None) -> PalmedConfig:
    """Palmed's knobs from the ``model`` config section; ``tol: null`` follows the noise."""
    tol = model_cfg.get("tol")
    if tol is None:
        # about 3x the relative noise of the measurements (PalmedConfig's docstring); on
        # hardware shared with other jobs, medians of repetitions still move by 1-2% between
        # kernels of the same throughput, so 5%
        tol = max(1e-6, 3 * noise) if noise is not None else NATIVE_TOL
    rounds = model_cfg.get("max_refine")
    extra: dict[str, Any] = {"training_kernels": int(model_cfg.get("training_kernels", 0)),
                             "training_weight": float(model_cfg.get("training_weight", 1.0))}
    if rounds is not None:
        extra["max_refine"] = int(rounds)
    if noise is None:
        # hardware: every measurement round starts the harness bench.rounds times, and real
        # cores are not exactly resource models (memory forms), so the cutting plane would
        # go on adding resources: several per round, and fewer in all
        return PalmedConfig(tol=float(tol), max_basic=int(model_cfg.get("max_basic", 28)),
                            seed=int(model_cfg.get("seed", 0)), core_batch=NATIVE_CORE_BATCH,
                            max_resources=NATIVE_MAX_RESOURCES,
                            max_core_resources=NATIVE_MAX_CORE_RESOURCES,
                            refine_batch=NATIVE_REFINE_BATCH, **extra)
    return PalmedConfig(tol=float(tol), max_basic=int(model_cfg.get("max_basic", 28)),
                        seed=int(model_cfg.get("seed", 0)), **extra)


def measuring(measurer: Measurer, stage: str) -> Callable[[list[str]], list[float]]:
    """Palmed's ``measure`` callback: one DB part per round (batch id ``palmed-<stage>NNN``)."""
    round_no = [0]

    def measure(kernels: list[str]) -> list[float]:
        round_no[0] += 1
        got = measurer.measure(kernels, stage=f"palmed-{stage}{round_no[0]:03d}")
        missing = [k for k in kernels if k not in got]
        # Palmed leaves them out (NaN); the DB keeps their rows: failed ones, and those
        # measured but less certain than Palmed's tolerance (a noisy host's, most of them)
        vague = [k for k in missing if k in measurer.too_uncertain]
        failed = [k for k in missing if k not in measurer.too_uncertain]
        if failed:
            print(f"{len(failed)} kernels could not be measured, e.g. {failed[0]!r}",
                  flush=True)
        if vague:
            print(f"{len(vague)} kernels left out, less certain than the tolerance "
                  f"({measurer.max_uncertainty:.1%}), e.g. {vague[0]!r}", flush=True)
        return [got.get(k, math.nan) for k in kernels]

    return measure


def listed_forms(model_cfg: Mapping[str, Any], forms: pd.DataFrame,
                 lists: Sequence[str | Path] = ()) -> tuple[list[str], dict[str, str]]:
    """Forms of ``model.extra_forms`` (a form list file, or null) and of the other form lists
    given (the suite's forms with ``model.suite_forms``), and the reason each name that cannot
    be modelled is left out (unknown to the catalogue, or not measurable here)."""
    paths = [p for p in [model_cfg.get("extra_forms"), *lists] if p]
    status = dict(zip(forms["name"], forms["status"], strict=True))
    kept, left = [], {}
    for path in paths:
        for name in campaign.read_form_list(Path(path)):
            if name not in status:
                left[name] = f"listed in {path} but not in the catalogue"
            elif status[name] != "ok":
                left[name] = f"listed in {path} but not measurable here ({status[name]})"
            elif name not in kept:
                kept.append(name)
    return kept, left


def model_forms(measurer: Measurer, planned: Sequence[str], model_cfg: Mapping[str, Any],
                lists: Sequence[str | Path] = ()) -> tuple[list[str], dict[str, str]]:
    """The forms Palmed models, and each form left out with the reason.

    The forms of the singleton plan whose singleton measured ok (a failed form has no time),
    plus the listed forms (``listed_forms``; their singletons are measured by Palmed's first
    stage if missing), minus those a resource model cannot describe (``modelable``).
    """
    known = measurer.known()
    names = {k for k in planned if k in known}
    extra, left = listed_forms(model_cfg, measurer.forms, lists)
    kept, not_modelled = modelable(measurer.forms, sorted(names | set(extra)))
    return kept, not_modelled | left


class StageJob:
    """One pipeline job of Palmed (see ``cpumap.model.palmed.build``): the Build state in and out,
    kernels measured through the Measurer (every measurement stored as it is made)."""

    def __init__(self, measurer: Measurer, cfg: PalmedConfig, stage: str,
                 log: Callable[[str], None]):
        self.measurer, self.cfg, self.stage, self.log = measurer, cfg, stage, log
        self.measure = measuring(measurer, stage)
        self.t0 = time.perf_counter()

    def load(self, state: Path) -> Build:
        # the reload's own batch name: a kernel missing from the DB (a lost part) is measured
        # again under palmed-<stage>-reloadNNN, and the stage's rounds keep their numbers
        return Build.load(state, measuring(self.measurer, f"{self.stage}-reload"), self.cfg)

    def record(self, b: Build) -> None:
        """This job's kernels measured and seconds, kept in the state for the statistics."""
        b.info.setdefault("measured_by_job", {})[self.stage] = self.measurer.measured_now
        b.info.setdefault("job_seconds", {})[self.stage] = time.perf_counter() - self.t0
        self.log(f"{self.stage}: measured now {self.measurer.measured_now}")

    def save(self, b: Build, state: Path) -> None:
        self.record(b)
        b.save(state)

    def plan(self, kernels: Sequence[str], batch_size: int, path: Path) -> None:
        """A plan of measuring batches, as the singleton plan (``palmed_measure`` jobs)."""
        files.write_json_atomic({"stage": self.stage, "batches": campaign.batched(sorted(kernels),
                                                                       batch_size)}, path)
        self.log(f"{self.stage}: {len(kernels)} kernels planned in batches of {batch_size}")


def pairs_job(job: StageJob, forms: list[str], not_modelled: Mapping[str, str], state: Path,
              plan: Path, batch_size: int, sse_avx: Mapping[str, Any] | None = None,
              wide: bool = True, first: Sequence[str] = ()) -> None:
    """Checkpoint palmed_pairs: singletons (missing ones measured), the pairs' plan.

    ``sse_avx``: the transition probe's record (``cpumap.measure.transition``); with a
    penalty, no Palmed kernel mixes legacy-SSE and 256-bit AVX forms, and the model carries
    the cost per switch for its predictions. ``wide``: probe the 512-bit mode. ``first``: the
    forms taken first as pair candidates (``model.first_candidates``)."""
    penalty = bool(sse_avx and sse_avx.get("penalty"))
    cat = job.measurer.forms
    fams = transition.families(cat)
    # the vector lengths: the wide probe (``palmed.wide``) sees whether the host runs narrow
    # vector forms differently beside 512-bit ones; without a penalty per switch, the dirty
    # probe (``palmed.dirty``) whether legacy-SSE forms run differently beside AVX ones
    b = Build.start(forms, job.measure, job.cfg, job.log, fams if penalty else {},
                    transition.vector_lengths(cat) if wide else None, transition.carriers(cat),
                    first, transition.plain_forms(cat),
                    dict(zip(cat["name"], cat["encoding"], strict=True)),
                    (fams, transition.carriers(cat, DIRTY_BITS)) if wide and not penalty else None)
    b.info["not_modelled"] = dict(sorted(not_modelled.items()))
    if sse_avx is not None:
        b.info["sse_avx_transition"] = {
            "penalty": penalty, "cycles_per_switch": float(sse_avx.get("cycles_per_switch", 0.0))}
    job.plan(b.pair_kernels(), batch_size, plan)
    job.save(b, state)


def basic_job(job: StageJob, state_in: Path, state_out: Path) -> None:
    """Rule palmed_basic: the measured pairs (from the DB), classes and basic instructions."""
    b = job.load(state_in)
    b.pairs(job.measure, job.log)
    b.classes(job.log)
    job.save(b, state_out)


def core_job(job: StageJob, state_in: Path, state_out: Path) -> None:
    """Rule palmed_core: the core mapping, measuring its own rounds."""
    b = job.load(state_in)
    b.core_mapping(job.measure, job.log)
    job.save(b, state_out)


def mapping_job(job: StageJob, state_in: Path, state_out: Path, plan: Path,
                batch_size: int) -> None:
    """Checkpoint palmed_mapping: the plan of the saturating and mapping kernels."""
    b = job.load(state_in)
    job.plan(b.mapping_kernels(), batch_size, plan)
    job.save(b, state_out)


def fit_job(job: StageJob, state_in: Path) -> tuple[resmodel.ResourceModel, dict, list[str]]:
    """Rule fit_model: the measured mapping kernels (from the DB), the remaining forms'
    LPs and refinement rounds (measured here): the model, the statistics of all stages and
    the random training kernels, plain and wide (``palmed.training``: never held out)."""
    b = job.load(state_in)
    b.mapping(job.measure, job.log)
    model, stats = b.remaining(job.measure, job.log)
    left = b.info.get("not_modelled", {})
    stats["approximate"] = add_chain_forms(model, left, job.measure, job.log)
    stats["approximate"] |= add_decomposed_forms(model)
    stats["flags_chain"] = add_flags_chain(model, job.measurer.forms, b.singletons, b.config.tol,
                                           job.log)
    stats["issue"] = add_issue_width(model, b.meas, b.singletons, b.config.tol, job.log)
    if "sse_avx_transition" in b.info:
        model.provenance["sse_avx_transition"] = dict(b.info["sse_avx_transition"]) | {
            "families": {f: fam for f, fam in sorted(b.apart.items()) if f in model.rho}}
    job.record(b)
    stats["not_modelled"] = {f: r for f, r in left.items() if f not in stats["approximate"]}
    # kernels each Palmed job measured itself when it last ran (the pairs and mapping kernels
    # are measured by the palmed_measure batch jobs), and each job's seconds; the total is
    # the Palmed jobs' time, without the batch jobs (their rows carry their own timestamps)
    stats["measured_by_job"] = b.info["measured_by_job"]
    stats["job_seconds"] = b.info["job_seconds"]
    stats["wall_seconds"]["total"] = sum(stats["job_seconds"].values())
    return model, stats, b.training() + b.training(wide=True)


def write_model(model: resmodel.ResourceModel, stats: dict, model_path: Path, table_path: Path,
                stats_path: Path) -> None:
    resmodel.save(model, model_path)
    files.write_tsv_atomic(model.table(), table_path)
    files.write_json_atomic(stats, stats_path)


def run_validation(model: resmodel.ResourceModel, forms: list[str], measurer: Measurer,
                   count: int, seed: int, repeat: int = 0,
                   training: Set[str] = frozenset()) -> tuple[pd.DataFrame, dict]:
    """The held-out kernels measured and predicted (``validation.tsv``) and their metrics;
    with ``repeat``, the first ``repeat`` of them measured again in a batch of their own:
    ``run_to_run`` is the RMS relative difference of IPC between the two measurements, the
    floor that no model's error on the same kernels can be expected to go under."""
    # where the host pays for switching between legacy SSE and 256-bit AVX, the held-out
    # kernels keep them apart too: the throughput model is what is validated
    kernels = validation.random_kernels(forms, count, seed, apart=model.sse_avx[0],
                                        exclude=training)
    catalogue = getattr(measurer, "forms", None)
    table = validation.validate(
        model, kernels, lambda ks: measurer.measure(ks, stage=f"validation-s{seed}"),
        **({"widths": transition.vector_lengths(catalogue),
            "fams": transition.families(catalogue)} if catalogue is not None else {}),
        uncertainty=getattr(measurer, "uncertainty", None))
    metrics = validation.metrics(table)
    if "measured_uncertainty" in table:  # the ground truth's own; unstable ones are kept
        metrics["measured_unstable"] = int(
            (table.measured_uncertainty > measurer.bench.stable_tol).sum())
    # beside the whole set, as the interacting pairs below
    for column, key in (("mixes_512", "mixing_512_bit"), ("mixes_sse_avx", "mixing_sse_avx")):
        if table[column].any():
            metrics[key] = {"with": validation.metrics(table[table[column]]),
                            "without": validation.metrics(table[~table[column]])}
    # beside (never instead of) the whole set: the kernels without an interacting pair, the
    # part a resource model can describe; the rest are flagged in validation.tsv
    metrics["without_interacting"] = validation.metrics(table[~table.interacting])
    if repeat:
        first = table.dropna(subset=["cycles_measured"]).head(repeat)
        again = measurer.again(list(first.kernel),
                               stage=f"{db.REPEAT_PREFIX}validation-s{seed}")
        pairs = [(m, again[k]) for k, m in zip(first.kernel, first.cycles_measured,
                                                strict=True) if k in again]
        diff = np.array([m1 / m2 - 1.0 for m1, m2 in pairs])  # IPC again / IPC first - 1
        metrics["run_to_run"] = {
            "kernels": len(pairs),
            "rms_rel_diff_ipc": float(np.sqrt(np.mean(diff ** 2))) if len(diff) else None,
            "max_rel_diff_ipc": float(np.max(np.abs(diff))) if len(diff) else None}
        metrics["run_to_run"] |= _rank_floor(first[first.kernel.isin(again)], again)
    return table, metrics


def _rank_floor(first: pd.DataFrame, again: Mapping[str, float]) -> dict[str, Any]:
    """Kendall's tau between the two measurements of the repeated kernels (with its
    bootstrap interval), and the model's RMS error and tau on the same kernels.

    Why: the RMS difference alone is a floor for the error, not for the ranking; a tau target
    (issue 13: 0.9) means little where two measurements of the same kernels do not rank
    them that well themselves, and the model's figures on the whole set are not on the same
    kernels."""
    if len(first) < 3:
        return {}
    second = first.n_insns / first.kernel.map(again)
    rerun = validation.metrics(first.assign(ipc_predicted=second.to_numpy(float)))
    own = validation.metrics(first)
    return {"kendall_tau": rerun["kendall_tau"], "kendall_tau_ci": rerun.get("kendall_tau_ci"),
            "model": {k: own[k] for k in ("rms_rel_error_ipc", "kendall_tau",
                                          "kendall_tau_ci") if k in own}}


def validation_report(metrics: Mapping[str, float], stats: Mapping[str, Any], machine_id: str,
                      count: int, noise_line: str | None = None,
                      model: resmodel.ResourceModel | None = None) -> str:
    """A short Markdown report of the model and its held-out errors; ``noise_line`` says how
    quiet the host was while it was measured (cpumap.evaluate.noise.summary_line); with the
    ``model``, a table of its resources and their labels (what each one is)."""
    def fmt(v: float) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"

    def ci(v: Sequence[float] | None) -> str:
        return "" if not v else f" (95 % bootstrap interval {v[0]:.4f}-{v[1]:.4f})"

    def fmt_s(v: float | None) -> str:
        return "" if v is None else f"{v:.2f}"

    def refit_line(r: dict[str, Any] | None) -> str:
        if not r:
            return "not run (exact measurements, or nothing to refit)"
        size = (f"{r['kernels']} kernels x {r['resources'] - 1} resources = "
                f"{r['candidate_bounds']} candidate upper bounds")
        size += (f", above refit_max_bounds {r['max_bounds']}: on a sample of {r['sampled']} "
                 f"kernels ({r.get('sampled_first', 0)} of them training kernels)"
                 ) if "sampled" in r else ""
        return f"not run: {size}" if not r["done"] else (
            f"{size} ({r['bounds_used']} used, {r['lps']} LP(s)); RMS relative misfit "
            f"{r['misfit_before']:.2%} -> {r['misfit_after']:.2%}")

    lines = [f"# Resource model of {machine_id}", "",
             f"- forms modelled: {stats.get('n_forms')} (pairs measured among "
             f"{stats.get('n_pair_forms')})",
             f"- resources: {stats.get('n_resources')} ({stats.get('n_core_resources')} from "
             f"the core mapping), basic instructions: {stats.get('n_basic')}, classes: "
             f"{stats.get('n_classes')}; forms fitted on their own: "
             f"{stats.get('n_behaviour_reps')} (the others behave like one of them against "
             "every saturating kernel and take its uses)",
             f"- kernels: {stats.get('total_kernels')} in total; measured by the Palmed jobs "
             f"themselves when they last ran: {stats.get('measured_by_job')} (the pairs and "
             "mapping kernels are measured by the palmed_measure batch jobs, "
             "db/part-palmed-{pairs,mapping}-*.parquet; kernels found in the database are "
             "not measured again)",
             f"- joint refit: {refit_line(stats.get('joint_refit'))}",
             f"- 512-bit mode: {wide_line(stats.get('wide'))}",
             f"- joint refit of the wide uses: {refit_line(stats.get('wide_refit'))}",
             f"- legacy SSE beside AVX (dirty upper halves): "
             f"{dirty_line(stats.get('dirty_upper'))}",
             f"- forms not modelled: {len(nm := stats.get('not_modelled', {}))} {sorted(nm)}",
             f"- forms modelled approximately (dependence chains, on a resource of their own"
             f" sized by their measured cycles; LEAVE as its parts): "
             f"{len(ap := stats.get('approximate', {}))} {sorted(ap)}",
             "- the flags chain (a kernel without a form writing every flag takes at least "
             "the sum of these forms' times, in cycles): "
             + (", ".join(f"{f} {v:.3f}" for f, v in fc.items())
                if (fc := stats.get("flags_chain")) else "none"),
             "- the issue width (no kernel predicted to run more instructions a cycle): "
             + (f"{iw['width']:.4g} ({iw['form']} alone; the fastest measured kernel "
                f"{iw['fastest_rate']:.4g}, {iw['fastest_kernel']})"
                if (iw := stats.get("issue")) else "none"),
             f"- forms modelled approximately because their time depends on the code layout "
             f"(measured alone at 1, 24, 56, 40 and 88 copies a kernel instance; no resource "
             f"defined by them; predicted from the singleton, flagged): "
             f"{len(stats.get('layout_sensitive', []))} {stats.get('layout_sensitive', [])}",
             f"- forms modelled approximately because at least {NON_ADDITIVE_SHARE * 100:g} %"
             f" of their kernels beside other forms took longer than their parts in sequence"
             f" (flagged): "
             f"{len(na := stats.get('non_additive', {}))} {sorted(na)}",
             f"- seconds of the Palmed jobs: {fmt_s(stats.get('wall_seconds', {}).get('total'))}"
             " (" + ", ".join(f"{k} {v:.2f}" for k, v in stats.get("job_seconds", {}).items())
             + "; batch measuring jobs not included)",
             "", "## Stages", "",
             "| stage | kernels | measurement rounds | LP solves | LP seconds | wall seconds |",
             "| --- | --- | --- | --- | --- | --- |"]
    kernels = stats.get("kernels", {})
    rounds = stats.get("measure_rounds", {})
    lp = stats.get("lp", {})
    wall = stats.get("wall_seconds", {})
    # kernels are counted per measuring stage, LPs and wall time per fitting stage
    where = {"core": "core", "saturating": "remaining", "mapping": "remaining",
             "training": "remaining", "refine": "remaining", "wide-training": "wide"}
    for stage in ("singletons", "pairs", "basic", "core", "saturating", "mapping", "training",
                  "refine", "remaining", "wide-training", "wide"):
        if stage not in kernels and stage not in lp and stage not in wall:
            continue
        lp_s = lp.get(stage, {}) if where.get(stage, stage) == stage else {}
        lines.append(f"| {stage} | {kernels.get(stage, '')} | {rounds.get(stage, '')} | "
                     f"{lp_s.get('solves', '')} | {fmt_s(lp_s.get('seconds'))} | "
                     f"{fmt_s(wall.get(stage))} |")
    lines += ["", "## Held-out validation", "",
             f"{metrics['kernels']} of {count} random kernels (1-5 distinct forms) measured"
             + (f"; {u} of them less certain than the measuring tolerance (their rounds "
                "disagree: `measured_uncertainty` in validation.tsv), kept."
                if (u := metrics.get("measured_unstable")) else "."), "",
             "| metric | value |", "| --- | --- |",
             f"| RMS relative error of IPC | {fmt(metrics['rms_rel_error_ipc'])}"
             f"{ci(metrics.get('rms_rel_error_ipc_ci'))} |",
             f"| MAPE of IPC | {fmt(metrics['mape_ipc'])} |",
             f"| Kendall's tau of IPC | {fmt(metrics['kendall_tau'])}"
             f"{ci(metrics.get('kendall_tau_ci'))} |", ""]
    floor = metrics.get("run_to_run")
    if floor and floor.get("kernels"):
        lines += [f"The measurement's own floor: {floor['kernels']} of these kernels measured "
                  "again in a batch of their own differ from their first measurement by "
                  f"{fmt(floor['rms_rel_diff_ipc'])} RMS (relative, IPC; at most "
                  f"{fmt(floor['max_rel_diff_ipc'])}): no model's error on them can be "
                  "expected below that."]
        if floor.get("kendall_tau") is not None:
            same = floor.get("model", {})
            lines += [f"The two measurements rank them with Kendall's tau "
                      f"{fmt(floor['kendall_tau'])}{ci(floor.get('kendall_tau_ci'))}; the "
                      f"model, on the same kernels: RMS relative error "
                      f"{fmt(same.get('rms_rel_error_ipc'))}, tau "
                      f"{fmt(same.get('kendall_tau'))}{ci(same.get('kendall_tau_ci'))}."]
        lines += [""]
    if noise_line:
        lines += [noise_line, ""]
    if model is not None:
        lines += resource_table(model)
    how = ("predicted with the wide uses (`wide` in model.json)" if model is not None
           and model.wide else "predicted with the plain uses: the build saw no mode")
    for key, what in (("mixing_512_bit", "a 512-bit vector form beside narrower vector forms "
                       f"(`mixes_512` in validation.tsv; the host's 512-bit mode: "
                       f"docs/model.md; {how})"),
                      ("mixing_sse_avx", "a legacy-SSE form beside a 256-bit or wider AVX "
                       "form (`mixes_sse_avx` in validation.tsv; the AVX forms leave the "
                       "upper halves of the vector registers dirty, which no resource of the "
                       "model says: docs/model.md)")):
        if (pair := metrics.get(key)) is not None:
            w, o = pair["with"], pair["without"]
            lines += [f"Kernels holding {what}: {w['kernels']}, RMS relative error of IPC "
                      f"{fmt(w['rms_rel_error_ipc'])}, Kendall's tau {fmt(w['kendall_tau'])};"
                      f" the {o['kernels']} others: {fmt(o['rms_rel_error_ipc'])}, "
                      f"tau {fmt(o['kendall_tau'])}.", ""]
    sub = metrics.get("without_interacting")
    if sub is not None:
        lines += [f"The {metrics['kernels'] - sub['kernels']} kernels holding a pair of forms "
                  "the build found interacting (slower together than one after the other: "
                  "no resource model predicts them; `interacting` in validation.tsv, "
                  "`provenance.interacting` in model.json) left out, for the "
                  f"{sub['kernels']} others: RMS relative error of IPC "
                  f"{fmt(sub['rms_rel_error_ipc'])}, MAPE {fmt(sub['mape_ipc'])}, "
                  f"Kendall's tau {fmt(sub['kendall_tau'])}.", ""]
    return "\n".join(lines)


def resource_table(model: resmodel.ResourceModel) -> list[str]:
    """Markdown lines: each shared resource, its label, how many forms use it and are limited
    by it; the private resources (``resmodel.private``: hundreds, one form or class each)
    one line per kind."""
    labels = resmodel.resource_labels(model)
    users = dict.fromkeys(model.resources, 0)
    limited = dict.fromkeys(model.resources, 0)
    for form in model.forms:
        for r in model.rho[form]:
            users[r] = users.get(r, 0) + 1
        _, bottleneck = resmodel.predict(model, {form: 1})
        if bottleneck is not None:  # chain:flags is no resource (``flagchain``)
            limited[bottleneck] = limited.get(bottleneck, 0) + 1
    lines = ["## Resources", "",
             "| resource | label | forms using it | forms it limits alone |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {r} | {labels[r]} | {users[r]} | {limited[r]} |" for r in model.resources
              if not resmodel.private(r)]
    if links := model.flags_chain[0]:
        lines.append(f"| {flagchain.FLAGS} | {labels[flagchain.FLAGS]} | {len(links)} | "
                     f"{limited.get(flagchain.FLAGS, 0)} |")
    if model.issue_width:
        lines.append(f"| {issue.ISSUE} | {labels[issue.ISSUE]} | {len(model.rho)} | "
                     f"{limited.get(issue.ISSUE, 0)} |")
    for prefix, what in ((resmodel.OWN, "a class's own unit, as long as its singleton"),
                         (resmodel.CHAIN, "a dependence chain's measured cycles")):
        kind = [r for r in model.resources if r.startswith(prefix)]
        if kind:
            lines.append(f"| {prefix}* ({len(kind)} resources) | {what} | "
                         f"{sum(users[r] for r in kind)} | {sum(limited[r] for r in kind)} |")
    return [*lines, ""]
