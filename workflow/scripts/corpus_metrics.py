"""Rule corpus_metrics: every analyzer against the two ground truths, per application; the
report section (table and predicted-vs-measured density plots)."""

import json
import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

import pandas as pd

from cpumap.evaluate import corpus, report
from cpumap.store import files

blocks = files.read_parquet_checked(snakemake.input.blocks)
predictions = pd.concat([files.read_parquet_checked(p) for p in snakemake.input.predictions],
                        ignore_index=True)
metas = [json.loads(Path(p).read_text()) for p in snakemake.input.meta]
metrics = corpus.metrics_table(blocks, predictions)
files.write_tsv_atomic(metrics, snakemake.output.metrics)
files.write_json_atomic({"metrics": json.loads(metrics.to_json(orient="records")),
                         "analyzers": metas, "corpus": snakemake.params.corpus},
                        snakemake.output.metrics_json)
plots = Path(snakemake.output.plots)
plots.mkdir(parents=True, exist_ok=True)
section = report.corpus_section(blocks, predictions, metrics, metas,
                                str(snakemake.params.corpus["dir"]), plots)
files.write_text_atomic(section, snakemake.output.section)
print(metrics[metrics.application == "all"].to_string(index=False))
