"""Rule suite_blocks: the benchmark's basic blocks with their catalogue forms."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.io import redirect_output  # noqa: E402

redirect_output(snakemake.log[0])

from cpumap.blocks import extract_blocks, write_blocks  # noqa: E402
from cpumap.isa import Catalogue  # noqa: E402
from cpumap.suite import benchmark_function  # noqa: E402

bench = snakemake.wildcards.bench
function = benchmark_function(bench, snakemake.params.user)
blocks = extract_blocks(snakemake.input.binary, function, Catalogue.load(snakemake.input.forms))
write_blocks(blocks, bench, function, snakemake.output.blocks)
n_insns = sum(b.n_insns for b in blocks)
no_form = sum(f == "" for b in blocks for f in b.forms)
print(f"{bench}: {function} has {len(blocks)} blocks, {n_insns} instructions, "
      f"{no_form} without a catalogue form")
