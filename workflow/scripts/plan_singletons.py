"""Checkpoint plan_singletons: split the selected forms into measuring batches."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.io import redirect_output  # noqa: E402

redirect_output(snakemake.log[0])

from cpumap.campaign import plan_singletons  # noqa: E402
from cpumap.io import read_parquet_checked, write_json_atomic  # noqa: E402

forms = read_parquet_checked(snakemake.input.forms)
batches = plan_singletons(forms, dict(snakemake.params.selection), int(snakemake.params.batch_size))
write_json_atomic({"batches": batches}, snakemake.output.plan)
print(f"{sum(len(b) for b in batches)} kernels in {len(batches)} batches")
