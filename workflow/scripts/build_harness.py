"""Rule harness: compile the measuring harness (harness/papi_bench.c)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure.harness import build_harness

built = Path(build_harness(Path(snakemake.params.out_dir)))
print(f"built {built}")
if built.resolve() != Path(snakemake.output.bin).resolve():
    raise SystemExit(f"build_harness wrote {built}, expected {snakemake.output.bin}")
