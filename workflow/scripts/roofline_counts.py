"""Rule roofline_counts: the kernel points' counts in one table (the parts of roofline_count)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

import pandas as pd

from cpumap.store.files import read_parquet_checked, write_parquet_atomic

parts = [read_parquet_checked(p) for p in snakemake.input.parts]
df = pd.concat(parts, ignore_index=True)
write_parquet_atomic(df, snakemake.output.counts)
print(f"{len(df)} points counted in {len(parts)} parts, {int((df.status == 'ok').sum())} ok")
