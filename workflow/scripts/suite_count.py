"""Rule suite_count: the exact occurrences of the benchmark's basic blocks (suite_blocks) in
one kernel invocation (gdb + flow conservation)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.evaluate.blocks import blocks_from_frame
from cpumap.evaluate.counting import count, write_counts
from cpumap.evaluate.suite import benchmark_args, benchmark_function
from cpumap.store.files import read_parquet_checked

bench = snakemake.wildcards.bench
user = snakemake.params.user
function = benchmark_function(bench, user)
blocks = blocks_from_frame(read_parquet_checked(snakemake.input.blocks))
args = benchmark_args(bench, user, dict(snakemake.params.n), reps=1)
result = count(snakemake.input.binary, function, blocks, args,
               all_blocks=bool(snakemake.params.all_blocks),
               timeout=float(snakemake.params.timeout))
write_counts(result, bench, snakemake.output.counts)
m = result.meta()
print(f"{bench}: {m['breakpoints']} blocks by breakpoint, {m['derived']} derived, "
      f"{m['breakpoint_hits']} hits in {m['region_seconds']:.3f} s; {m['seconds']:.2f} s under "
      f"gdb vs {m['plain_seconds']:.3f} s plain (slowdown {m['slowdown']:.1f}x)")
