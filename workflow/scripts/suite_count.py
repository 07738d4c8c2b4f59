"""Rule suite_count: the benchmark's basic blocks, then their exact occurrences in one kernel
invocation (gdb + flow conservation)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.evaluate.blocks import extract_blocks, write_blocks
from cpumap.evaluate.counting import count, write_counts
from cpumap.evaluate.suite import benchmark_args, benchmark_function
from cpumap.isa.catalogue import Catalogue

bench = snakemake.wildcards.bench
user = snakemake.params.user
function = benchmark_function(bench, user)
blocks = extract_blocks(snakemake.input.binary, function, Catalogue.load(snakemake.input.forms))
write_blocks(blocks, bench, function, snakemake.output.blocks)
no_form = sum(f == "" for b in blocks for f in b.forms)
print(f"{bench}: {function} has {len(blocks)} blocks, {sum(b.n_insns for b in blocks)} "
      f"instructions, {no_form} without a catalogue form")
args = benchmark_args(bench, user, dict(snakemake.params.n), reps=1)
result = count(snakemake.input.binary, function, blocks, args,
               all_blocks=bool(snakemake.params.all_blocks),
               timeout=float(snakemake.params.timeout))
write_counts(result, bench, snakemake.output.counts)
m = result.meta()
print(f"{bench}: {m['breakpoints']} blocks by breakpoint, {m['derived']} derived, "
      f"{m['breakpoint_hits']} hits in {m['region_seconds']:.3f} s; {m['seconds']:.2f} s under "
      f"gdb vs {m['plain_seconds']:.3f} s plain (slowdown {m['slowdown']:.1f}x)")
