"""Rule catalogue: the host's instruction forms, with exclusion reasons."""

import json
import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.isa.catalogue import build_catalogue
from cpumap.measure.backend import simulated_forms
from cpumap.measure.settings import BenchSettings
from cpumap.measure.smoke import SmokeRun
from cpumap.model.simulate import SimulatedMachine
from cpumap.store.files import write_parquet_atomic

with open(snakemake.input.machine, encoding="utf-8") as handle:
    machine = json.load(handle)
workdir = Path(snakemake.params.workdir)
workdir.mkdir(parents=True, exist_ok=True)
backend = snakemake.params.machine
if backend["backend"] == "simulated":
    # the forms of a simulated machine are the instructions of its mapping
    forms = simulated_forms(SimulatedMachine(backend["mapping"], backend["noise"], backend["seed"]))
else:
    forms = build_catalogue(
        machine,
        workdir,
        smoke_run=bool(snakemake.params.smoke_run),
        runner=SmokeRun(Path(snakemake.input.harness),
                        BenchSettings.from_mapping(snakemake.params.bench)),
        progress=lambda message: print(message, flush=True),
    )
write_parquet_atomic(forms, snakemake.output.forms)
print(f"wrote {len(forms)} forms to {snakemake.output.forms}")
