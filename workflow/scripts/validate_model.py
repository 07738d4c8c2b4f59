"""Rule validate_model: held-out random kernels, measured and predicted; the model report."""

import json
import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))
sys.path.insert(0, str(Path(snakemake.scriptdir)))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure import slot

# the measuring lock of its results, taken around each timed round; a job of the model's
# chain: no other job measures between the rounds of its batches
slot.join_job(snakemake, whole=False, first=True)

from model_common import measurer_and_config

from cpumap.evaluate import noise
from cpumap.measure.dbestimates import monitor_db
from cpumap.model import jobs, resmodel
from cpumap.store import files

measurer, _cfg, machine = measurer_and_config(snakemake)
# the held-out kernels are all checked, however certain their measurement (the report gives
# the host's noise beside the errors)
measurer.max_uncertainty = None
model = resmodel.load(snakemake.input.model)
# held-out kernels of the modelled forms only, without the approximate ones (dependence
# chains: their error is not the resource model's; the report lists them)
forms = [f for f in model.forms if f not in model.approximate]
count = int(snakemake.params.model["validation_kernels"])
seed = int(snakemake.params.model["validation_seed"])
repeat = int(snakemake.params.model.get("validation_repeat", 0))
# never one of the random kernels the joint refit was fitted to
training = set(Path(snakemake.input.training).read_text(encoding="utf-8").splitlines())
table, metrics = jobs.run_validation(model, forms, measurer, count, seed, repeat, training)
with open(snakemake.input.stats, encoding="utf-8") as handle:
    stats = json.load(handle)
files.write_tsv_atomic(table, snakemake.output.table)
files.write_json_atomic(metrics, snakemake.output.metrics)
# how quiet the host was while the model's kernels were measured (the monitor of each batch)
monitor = monitor_db(measurer.db_dir, machine["machine_id"], measurer.bench.stable_tol)
report = jobs.validation_report(metrics, stats, machine["machine_id"], count,
                                noise.summary_line(noise.summary(monitor)), model=model)
files.write_text_atomic(report, snakemake.output.report)
print(json.dumps(metrics))
print(f"waited {slot.waited_s():.1f} s for the measuring slot", flush=True)
