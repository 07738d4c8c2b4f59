"""Shared by the model job scripts: the Measurer and the modelled forms of this run."""

import json
from pathlib import Path

from cpumap.backend import Measurer
from cpumap.io import read_parquet_checked
from cpumap.simulate import SimulatedMachine


def measurer_and_forms(snakemake):
    """(Measurer, forms of the singleton plan that measured ok, noise or None)."""
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
    measurer = Measurer(machine, forms, snakemake.params.bench, db_dir,
                        Path(snakemake.params.workdir), harness_bin=Path(snakemake.input.harness),
                        sim=sim, log=lambda message: print(message, flush=True),
                        measure=bool(snakemake.config.get("measure", True)))
    with open(snakemake.input.plan, encoding="utf-8") as handle:
        planned = [k for batch in json.load(handle)["batches"] for k in batch]
    # only forms whose singleton measured ok take part (a failed form has no time)
    known = measurer.known()
    names = sorted(k for k in planned if k in known)
    return measurer, names, noise, machine
