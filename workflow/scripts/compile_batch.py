"""Rules compile_batch and palmed_compile: generate and compile one batch of a plan
(cpumap.measure.batch)."""

import json
import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure.asmgen import canonical, kernel_id, parse_canonical
from cpumap.measure.backend import measurement_key
from cpumap.measure.batch import prepare_batch
from cpumap.measure.campaign import read_plan
from cpumap.measure.settings import BenchSettings
from cpumap.store import db
from cpumap.store.files import read_parquet_checked

batches = read_plan(snakemake.input.plan)
kernels = {db.batch_key(i, k): k for i, k in enumerate(batches)}[snakemake.wildcards.batch]
with open(snakemake.input.machine, encoding="utf-8") as handle:
    machine = json.load(handle)
bench = BenchSettings.from_mapping(snakemake.params.bench)
# kernels already in the database are not compiled (measure_batch skips them too)
skip = set() if bench.remeasure else db.measured_keys(
    Path(snakemake.input.forms).parents[1] / "db", machine["machine_id"],
    *measurement_key(bench, simulated=False))
todo = [k for k in kernels if kernel_id(canonical(parse_canonical(k))) not in skip]
prep = prepare_batch(todo, read_parquet_checked(snakemake.input.forms), machine, bench,
                     Path(snakemake.output.so), progress=lambda message: print(message, flush=True))
prep.save(snakemake.output.prepared)
print(f"prepared {len(prep.kernels)} kernels ({len(prep.unmeasurable)} not measurable)")
