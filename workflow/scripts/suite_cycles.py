"""Rule suite_cycles: whole-kernel cycles, repeated, the minimum kept (cpumap.evaluate.suite)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure import slot

# each driver process takes the measuring slot while it runs (cpumap.evaluate.suite.run_driver)
slot.join_job(snakemake, whole=False)

from cpumap.evaluate.suite import cycles_record
from cpumap.store.files import write_json_atomic

bench = snakemake.wildcards.bench
rec = cycles_record(bench, snakemake.input.binary, snakemake.params.user,
                    dict(snakemake.params.n), int(snakemake.params.reps), snakemake.params.cpu,
                    int(snakemake.params.min_ticks), int(snakemake.params.processes),
                    int(snakemake.params.max_processes))
write_json_atomic(rec, snakemake.output.cycles)
if rec["available"]:
    print(f"{bench}: min {rec['cycles_min']:.0f} cycles over {rec['reps']} calls in each of "
          f"{rec['processes']} processes (process minima "
          f"{', '.join(f'{c:.0f}' for c in rec['process_cycles_min'])}"
          f"{'' if rec['settled'] else ', the two fastest never agreed within 1 %: unsettled'}; "
          f"clock {rec['clock']}, n {rec['n']})")
else:
    print(f"{bench}: {rec['reason']}")
