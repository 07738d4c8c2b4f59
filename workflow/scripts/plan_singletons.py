"""Checkpoint plan_singletons: split the selected forms into measuring batches."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure.campaign import plan_singletons
from cpumap.store.files import read_parquet_checked, write_json_atomic

forms = read_parquet_checked(snakemake.input.forms)
batches = plan_singletons(forms, dict(snakemake.params.selection), int(snakemake.params.batch_size))
write_json_atomic({"batches": batches}, snakemake.output.plan)
print(f"{sum(len(b) for b in batches)} kernels in {len(batches)} batches")
