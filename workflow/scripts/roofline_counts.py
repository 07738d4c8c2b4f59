"""Rule roofline_counts: the work (instructions, flops, bytes) of every kernel point."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

import json

from cpumap.roofline.points import count_points
from cpumap.store.files import write_parquet_atomic

with open(snakemake.input.machine, encoding="utf-8") as handle:
    machine = json.load(handle)
pts = snakemake.params.points
benchmarks = dict(zip(snakemake.params.benchmarks, snakemake.input.binaries, strict=True))
df = count_points(benchmarks, pts["sizes"], pts["states"], machine,
                  count_timeout=float(pts["count_timeout_s"]),
                  sim_timeout=float(pts["sim_timeout_s"]),
                  gdb_max_footprint=int(pts["gdb_max_footprint"]),
                  progress=lambda message: print(message, flush=True))
write_parquet_atomic(df, snakemake.output.counts)
print(f"{len(df)} points counted, {int((df.status == 'ok').sum())} ok")
