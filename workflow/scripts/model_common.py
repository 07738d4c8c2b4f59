"""Shared by the model job scripts: the Measurer and the modelled forms of this run."""

import json
from pathlib import Path

from cpumap.backend import Measurer
from cpumap.campaign import read_form_list
from cpumap.io import read_parquet_checked
from cpumap.simulate import SimulatedMachine


def extra_forms(model_cfg, forms, lists=()) -> tuple[list[str], dict[str, str]]:
    """Forms of ``model.extra_forms`` (a form list file, or null) and of the other form lists
    given (the suite's forms with ``model.suite_forms``), and the reason each name that cannot
    be modelled is left out (unknown to the catalogue, or not measurable here)."""
    paths = [p for p in [model_cfg.get("extra_forms"), *lists] if p]
    status = dict(zip(forms["name"], forms["status"], strict=True))
    kept, left = [], {}
    for path in paths:
        for name in read_form_list(Path(path)):
            if name not in status:
                left[name] = f"listed in {path} but not in the catalogue"
            elif status[name] != "ok":
                left[name] = f"listed in {path} but not measurable here ({status[name]})"
            elif name not in kept:
                kept.append(name)
    return kept, left


def measurer_and_forms(snakemake):
    """(Measurer, forms to model, noise or None, machine, forms left out with the reason).

    The forms are those of the singleton plan whose singleton measured ok, plus the forms of
    ``model.extra_forms`` (their singletons are measured by Palmed's first stage if missing).
    """
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
                        # `measure: false`: answer from the DB only (read from the config, not
                        # params, so that switching it reruns nothing)
                        measure=bool(snakemake.config.get("measure", True)))
    with open(snakemake.input.plan, encoding="utf-8") as handle:
        planned = [k for batch in json.load(handle)["batches"] for k in batch]
    # only forms whose singleton measured ok take part (a failed form has no time)
    known = measurer.known()
    names = {k for k in planned if k in known}
    extra, left = extra_forms(snakemake.params.model, forms,
                              list(getattr(snakemake.input, "suite_forms", []) or []))
    names |= set(extra)
    return measurer, sorted(names), noise, machine, left
