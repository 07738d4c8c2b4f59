"""Rule suite_build: one kernel, one flag set (cpumap.evaluate.suite.build_benchmark)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.evaluate.suite import build_benchmark

out = build_benchmark(snakemake.wildcards.kernel, snakemake.wildcards.flagset,
                      Path(snakemake.output.bin), flags=list(snakemake.params.flags),
                      common=list(snakemake.params.common))
print(f"built {out} with {' '.join(snakemake.params.flags)}")
