"""Rule roofline_count: the work (instructions, flops, bytes) of one kernel point size, in
every cache state."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

import json

from cpumap.evaluate.suite import split_benchmark
from cpumap.roofline.points import count_points
from cpumap.store.files import write_parquet_atomic

with open(snakemake.input.machine, encoding="utf-8") as handle:
    machine = json.load(handle)
pts = snakemake.params.points
bench, n = snakemake.wildcards.bench, int(snakemake.wildcards.n)
df = count_points({bench: snakemake.input.binary}, {split_benchmark(bench)[0]: [n]},
                  pts["states"], machine,
                  count_timeout=float(pts["count_timeout_s"]),
                  sim_timeout=float(pts["sim_timeout_s"]),
                  gdb_max_footprint=int(pts["gdb_max_footprint"]),
                  progress=lambda message: print(message, flush=True))
write_parquet_atomic(df, snakemake.output.part)
print(f"{bench} n={n}: {len(df)} points counted, {int((df.status == 'ok').sum())} ok")
