"""Rule catalogue: the host's instruction forms, with exclusion reasons."""

import json
import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.io import redirect_output  # noqa: E402

redirect_output(snakemake.log[0])

from cpumap.backend import simulated_forms  # noqa: E402
from cpumap.io import write_parquet_atomic  # noqa: E402
from cpumap.isa import build_catalogue  # noqa: E402
from cpumap.simulate import SimulatedMachine  # noqa: E402

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
        harness_bin=Path(snakemake.input.harness),
        smoke_run=bool(snakemake.params.smoke_run),
        bench=dict(snakemake.params.bench),
        progress=lambda message: print(message, flush=True),
    )
write_parquet_atomic(forms, snakemake.output.forms)
print(f"wrote {len(forms)} forms to {snakemake.output.forms}")
