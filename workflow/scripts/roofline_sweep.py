"""Rule roofline_sweep: the bandwidth working-set sweep, one core and all cores (raw rows)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure import slot

# it times code outside the harness's rounds: the measuring lock is its own until it exits
slot.join_job(snakemake, whole=True)

import json

from cpumap.roofline.build import run_sweep
from cpumap.store.files import write_parquet_atomic

with open(snakemake.input.machine, encoding="utf-8") as handle:
    machine = json.load(handle)
rows = run_sweep(Path(snakemake.input.bin), machine, snakemake.params.roofline,
                 progress=lambda message: print(message, flush=True))
write_parquet_atomic(rows, snakemake.output.sweep)
print(f"stored {len(rows)} sweep rows in {snakemake.output.sweep}")
