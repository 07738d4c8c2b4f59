"""The modelling stage of the pipeline: Palmed against a Measurer, then held-out validation.

Glue between ``cpumap.palmed`` (pure algorithm, asks for kernels), ``cpumap.backend.Measurer``
(answers from the DB or measures, one DB part per request) and the output files. Palmed's
later stages choose their kernels from earlier measurements in loops whose length depends on
the data (the core mapping adds a resource per round), so they run inside one job that asks
the Measurer stage by stage; every measurement is stored as it is made, and a rerun finds
them all in the DB: the model is then rebuilt from the raw rows alone.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from . import io, resmodel, validate
from .backend import Measurer
from .palmed import PalmedConfig, build_model


def modelable(forms: pd.DataFrame, names: list[str]) -> tuple[list[str], dict[str, str]]:
    """Forms Palmed can model, and the reason for each one left out.

    A resource model describes dependency-free throughput. Forms that write registers
    implicitly (RDX:RAX of MUL and DIV, ...) or read and write the flags (ADC, RCL) form a
    dependence chain in every kernel that contains them, so their cycles are a latency, and
    in company they can even fault (MUL leaves RDX:RAX such that DIV overflows): they stay out.
    """
    info = forms.set_index("name")
    kept, left = [], {}
    for n in names:
        row = info.loc[n]
        implicit = json.loads(row.implicit) if row.implicit else []
        written = [r for r, acc in implicit if "w" in acc]
        if written:
            left[n] = f"writes {'/'.join(written)} implicitly (dependence chain)"
        elif bool(row.reads_flags) and bool(row.writes_flags):
            left[n] = "reads and writes the flags (dependence chain)"
        else:
            kept.append(n)
    return kept, left


#: Palmed's tolerance on real hardware when ``model.tol`` is null.
NATIVE_TOL = 0.05
#: On real hardware: resources the core adds per measurement round, and resources in all.
NATIVE_CORE_BATCH = 4
NATIVE_MAX_RESOURCES = 36
#: On real hardware: resources the core may find, and refinement resources per round. Allowed
#: all 32 resources (Zen 4, quick set), the core used them all and the refinement could add
#: none: dividers, which are never basic, kept uses of the FP multiplier or of a memory
#: resource. 24 core resources leave 12 to refinement rounds of 2, each kept only if it lowers
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
    if noise is None:
        # hardware: every measurement round starts the harness bench.rounds times, and real
        # cores are not exactly resource models (memory forms), so the cutting plane would
        # go on adding resources: several per round, and fewer in all
        return PalmedConfig(tol=float(tol), max_basic=int(model_cfg.get("max_basic", 28)),
                            seed=int(model_cfg.get("seed", 0)), core_batch=NATIVE_CORE_BATCH,
                            max_resources=NATIVE_MAX_RESOURCES,
                            max_core_resources=NATIVE_MAX_CORE_RESOURCES,
                            refine_batch=NATIVE_REFINE_BATCH)
    return PalmedConfig(tol=float(tol), max_basic=int(model_cfg.get("max_basic", 28)),
                        seed=int(model_cfg.get("seed", 0)))


def fit(forms: list[str], measurer: Measurer, cfg: PalmedConfig,
        log: Callable[[str], None]) -> tuple[resmodel.ResourceModel, dict]:
    """Run Palmed on ``forms``; every kernel it asks for goes through ``measurer``."""
    round_no = [0]

    def measure(kernels: list[str]) -> list[float]:
        round_no[0] += 1
        got = measurer.measure(kernels, stage=f"palmed{round_no[0]:03d}")
        missing = [k for k in kernels if k not in got]
        if missing:
            # Palmed leaves failed kernels out (NaN); the DB keeps their failed rows
            print(f"{len(missing)} kernels could not be measured, e.g. {missing[0]!r}",
                  flush=True)
        return [got.get(k, math.nan) for k in kernels]

    t0 = time.perf_counter()
    model, stats = build_model(forms, measure, config=cfg, log=log)
    stats["wall_seconds"]["total"] = time.perf_counter() - t0
    stats["measured_now"] = measurer.measured_now
    return model, stats


def write_model(model: resmodel.ResourceModel, stats: dict, model_path: Path, table_path: Path,
                stats_path: Path) -> None:
    resmodel.save(model, model_path)
    io.write_tsv_atomic(model.table(), table_path)
    io.write_json_atomic(stats, stats_path)


def run_validation(model: resmodel.ResourceModel, forms: list[str], measurer: Measurer,
                   count: int, seed: int) -> tuple[pd.DataFrame, dict]:
    kernels = validate.random_kernels(forms, count, seed)
    table = validate.validate(model, kernels,
                              lambda ks: measurer.measure(ks, stage=f"validation-s{seed}"))
    return table, validate.metrics(table)


def validation_report(metrics: Mapping[str, float], stats: Mapping[str, Any], machine_id: str,
                      count: int) -> str:
    """A short Markdown report of the model and its held-out errors."""
    def fmt(v: float) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"

    def fmt_s(v: float | None) -> str:
        return "" if v is None else f"{v:.2f}"

    lines = [f"# Resource model of {machine_id}", "",
             f"- forms modelled: {stats.get('n_forms')} (pairs measured among "
             f"{stats.get('n_pair_forms')})",
             f"- resources: {stats.get('n_resources')} ({stats.get('n_core_resources')} from "
             f"the core mapping), basic instructions: {stats.get('n_basic')}, classes: "
             f"{stats.get('n_classes')}",
             f"- kernels: {stats.get('total_kernels')} in total, "
             f"{stats.get('measured_now')} measured by this run (the rest from the database)",
             f"- forms not modelled: {len(stats.get('not_modelled', {}))} "
             f"{sorted(stats.get('not_modelled', {}))}",
             f"- wall time of the fit: {fmt_s(stats.get('wall_seconds', {}).get('total'))} s",
             "", "## Stages", "",
             "| stage | kernels | measurement rounds | LP solves | LP seconds | wall seconds |",
             "| --- | --- | --- | --- | --- | --- |"]
    kernels = stats.get("kernels", {})
    rounds = stats.get("measure_rounds", {})
    lp = stats.get("lp", {})
    wall = stats.get("wall_seconds", {})
    # kernels are counted per measuring stage, LPs and wall time per fitting stage
    where = {"core": "core", "saturating": "remaining", "mapping": "remaining",
             "refine": "remaining"}
    for stage in ("singletons", "pairs", "basic", "core", "saturating", "mapping", "refine",
                  "remaining"):
        if stage not in kernels and stage not in lp and stage not in wall:
            continue
        lp_s = lp.get(stage, {}) if where.get(stage, stage) == stage else {}
        lines.append(f"| {stage} | {kernels.get(stage, '')} | {rounds.get(stage, '')} | "
                     f"{lp_s.get('solves', '')} | {fmt_s(lp_s.get('seconds'))} | "
                     f"{fmt_s(wall.get(stage))} |")
    lines += ["", "## Held-out validation", "",
             f"{metrics['kernels']} of {count} random kernels (1-5 distinct forms) measured.", "",
             "| metric | value |", "| --- | --- |",
             f"| RMS relative error of IPC | {fmt(metrics['rms_rel_error_ipc'])} |",
             f"| MAPE of IPC | {fmt(metrics['mape_ipc'])} |",
             f"| Kendall's tau of IPC | {fmt(metrics['kendall_tau'])} |", ""]
    return "\n".join(lines)
