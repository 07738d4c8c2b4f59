"""Rule sse_avx_probe: whether switching between legacy-SSE and 256-bit AVX forms costs this
host a penalty, measured (cpumap.measure.transition)."""

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

from model_common import measurer_of

from cpumap.measure import transition
from cpumap.store import files

measurer, _noise, machine = measurer_of(snakemake)
record = transition.probe(measurer.forms,
                          lambda kernels: measurer.measure(kernels, stage="sse-avx-probe"))
record["machine_id"] = machine["machine_id"]
files.write_json_atomic(record, snakemake.output.json)
print(transition.summary(record), flush=True)
