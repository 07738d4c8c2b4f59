"""Rule singleton_summary: outcome counts and the per-form singleton table."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure.backend import measurement_key
from cpumap.measure.campaign import read_plan, singleton_summary
from cpumap.measure.settings import BenchSettings
from cpumap.store import db
from cpumap.store.files import read_parquet_checked, write_tsv_atomic

forms = read_parquet_checked(snakemake.input.forms)
kernels = {k for batch in read_plan(snakemake.input.plan) for k in batch}
# All rows of this machine, parameters and harness for the plan's kernels: the plan's own
# parts plus earlier parts that already held some of its kernels (those were not remeasured).
db_dir = Path(snakemake.input.parts[0]).parent if snakemake.input.parts else None
rows = db.load(db_dir, machine_id=snakemake.wildcards.mid) if db_dir else db.empty_frame()
params_id, version = measurement_key(BenchSettings.from_mapping(snakemake.params.bench),
                                     snakemake.params.machine["backend"] == "simulated")
rows = rows[rows.kernel.isin(kernels) & (rows.params_id == params_id)
            & (rows.harness_version == version)]
summary, singletons = singleton_summary(forms, rows)
write_tsv_atomic(summary, snakemake.output.summary)
write_tsv_atomic(singletons, snakemake.output.singletons)
print(f"{len(rows)} rows for {len(kernels)} planned kernels; {len(singletons)} forms measured")
