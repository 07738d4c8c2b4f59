"""Rule roofline_points: kernel points (flops, bytes, cycles) of the real-kernel suite."""

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

from cpumap.roofline.points import measure_points
from cpumap.store.files import read_parquet_checked, write_parquet_atomic

with open(snakemake.input.machine, encoding="utf-8") as handle:
    machine = json.load(handle)
pts = snakemake.params.points
benchmarks = dict(zip(snakemake.params.benchmarks, snakemake.input.binaries, strict=True))
df = measure_points(benchmarks, pts["sizes"], pts["states"], machine, reps=int(pts["reps"]),
                    cpu=pts["cpu"], counts=read_parquet_checked(snakemake.input.counts),
                    processes=int(pts["processes"]),
                    progress=lambda message: print(message, flush=True))
write_parquet_atomic(df, snakemake.output.points)
print(f"{len(df)} points, {int((df.status == 'ok').sum())} ok")
