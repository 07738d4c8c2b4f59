"""Rule suite_blocks: every benchmark's basic blocks, from its binary alone (Capstone)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.evaluate.blocks import extract_blocks, write_blocks
from cpumap.evaluate.suite import benchmark_function
from cpumap.isa.catalogue import Catalogue

catalogue = Catalogue.load(snakemake.input.forms)
for bench, binary, out in zip(snakemake.params.benchmarks, snakemake.input.binaries,
                              snakemake.output.blocks, strict=True):
    function = benchmark_function(bench, snakemake.params.user.get(bench))
    blocks = extract_blocks(binary, function, catalogue)
    write_blocks(blocks, bench, function, out)
    no_form = sum(f == "" for b in blocks for f in b.forms)
    print(f"{bench}: {function} has {len(blocks)} blocks, {sum(b.n_insns for b in blocks)} "
          f"instructions, {no_form} without a catalogue form", flush=True)
