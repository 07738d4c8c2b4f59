"""Rule eval_cachegrind: warm-cache D1 miss rate of one benchmark's kernel function.

Runs the binary with the problem size its cycles are measured with (suite.n, or the driver's
default), so the residency check is about the same run.
"""

import json
import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.evaluate import cachegrind
from cpumap.store import files

meta_path = Path(f"{snakemake.input.binary}.json")
meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
function = meta.get("function") or "kernel_" + snakemake.wildcards.bench.partition(".")[0]
args = ["--n", str(int(snakemake.params.n))] if snakemake.params.n else []
result = cachegrind.warm_miss_rate(snakemake.input.binary, function, args,
                                   reps=int(snakemake.params.reps),
                                   timeout_s=float(snakemake.params.timeout_s))
result |= {"benchmark": snakemake.wildcards.bench, "function": function, "args": args}
files.write_json_atomic(result, snakemake.output.result)
print(json.dumps(result))
