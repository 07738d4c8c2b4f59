"""Rule singleton_summary: outcome counts and the per-form singleton table."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.io import redirect_output  # noqa: E402

redirect_output(snakemake.log[0])

from cpumap import db  # noqa: E402
from cpumap.campaign import singleton_summary  # noqa: E402
from cpumap.io import read_parquet_checked, write_tsv_atomic  # noqa: E402

forms = read_parquet_checked(snakemake.input.forms)
rows = db.load_parts(snakemake.input.parts)
summary, singletons = singleton_summary(forms, rows)
write_tsv_atomic(summary, snakemake.output.summary)
write_tsv_atomic(singletons, snakemake.output.singletons)
print(f"{len(rows)} rows from {len(snakemake.input.parts)} parts; {len(singletons)} forms")
