"""Shared by the model job scripts: this run's Measurer and Palmed configuration."""

import json
from pathlib import Path

from cpumap.measure.backend import Measurer
from cpumap.measure.settings import BenchSettings
from cpumap.model import jobs
from cpumap.model.palmed import PalmedConfig
from cpumap.model.simulate import SimulatedMachine
from cpumap.store.files import read_parquet_checked


def measurer_of(snakemake) -> tuple[Measurer, float | None, dict]:
    """(Measurer over the machine's DB, the simulated machine's noise or None, machine
    description) of a rule with inputs machine, forms, harness and params machine, bench,
    workdir."""
    with open(snakemake.input.machine, encoding="utf-8") as handle:
        machine = json.load(handle)
    backend = snakemake.params.machine
    sim = None
    noise = None
    if backend["backend"] == "simulated":
        sim = SimulatedMachine(backend["mapping"], backend["noise"], backend["seed"])
        noise = float(backend["noise"])
    forms = read_parquet_checked(snakemake.input.forms)
    db_dir = Path(snakemake.input.forms).parents[1] / "db"
    measurer = Measurer(machine, forms, BenchSettings.from_mapping(snakemake.params.bench), db_dir,
                        Path(snakemake.params.workdir), harness_bin=Path(snakemake.input.harness),
                        sim=sim, log=lambda message: print(message, flush=True),
                        # `measure: false`: answer from the DB only (read from the config, not
                        # params, so that switching it reruns nothing)
                        measure=bool(snakemake.config.get("measure", True)))
    return measurer, noise, machine


def measurer_and_config(snakemake) -> tuple[Measurer, PalmedConfig, dict]:
    """(Measurer over the machine's DB, Palmed's configuration, machine description)."""
    measurer, noise, machine = measurer_of(snakemake)
    config = jobs.palmed_config(snakemake.params.model, noise)
    # a kernel whose measurement is less certain than Palmed's tolerance cannot bound an LP
    # to that tolerance: it is left out, as a failed kernel is
    measurer.max_uncertainty = config.tol
    return measurer, config, machine
