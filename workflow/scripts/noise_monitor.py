"""Rule noise_monitor: the noise monitor of every measuring batch, as a table, a summary and a
report section (cpumap.measure.estimate.monitor_table, cpumap.evaluate.noise)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.evaluate import noise
from cpumap.measure.dbestimates import monitor_db
from cpumap.measure.settings import BenchSettings
from cpumap.store.files import write_json_atomic, write_text_atomic, write_tsv_atomic

bench = BenchSettings.from_mapping(snakemake.params.bench)
mid = Path(snakemake.output.table).parents[1].name
table = monitor_db(Path(snakemake.params.db_dir), mid, bench.stable_tol)
write_tsv_atomic(table, snakemake.output.table)
summary = noise.summary(table)
write_json_atomic(summary, snakemake.output.summary)
write_text_atomic(noise.section_html(table), snakemake.output.section)
print(noise.summary_line(summary))
