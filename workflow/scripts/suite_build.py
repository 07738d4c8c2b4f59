"""Rule suite_build: compile one kernel with one flag set (cpumap.suite.build_benchmark)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.io import redirect_output  # noqa: E402

redirect_output(snakemake.log[0])

from cpumap.suite import build_benchmark  # noqa: E402

out = build_benchmark(snakemake.wildcards.kernel, snakemake.wildcards.flagset,
                      Path(snakemake.output.bin), flags=list(snakemake.params.flags),
                      common=list(snakemake.params.common))
print(f"built {out} with {' '.join(snakemake.params.flags)}")
