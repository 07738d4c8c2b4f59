"""Rule eval_metrics: lift block predictions to kernels; coverage, RMS, MAPE, Kendall's tau.

Writes kernels.tsv (one row per benchmark and analyzer), metrics.tsv (per analyzer, over all
flag sets and per flag set) and metrics.json (the same plus the status of every analyzer,
including those not run and those unavailable here, with the reason).
"""

import json
import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

import pandas as pd

from cpumap.evaluate import analyzers as A
from cpumap.evaluate import lift
from cpumap.store import files

cfg = snakemake.params.evaluate
blocks = pd.concat([files.read_parquet_checked(p) for p in snakemake.input.blocks],
                   ignore_index=True)
counts = pd.concat([files.read_parquet_checked(p) for p in snakemake.input.counts],
                   ignore_index=True)
preds = [files.read_parquet_checked(p) for p in snakemake.input.predictions]
predictions = (pd.concat(preds, ignore_index=True) if preds
               else pd.DataFrame(columns=A.PREDICTION_COLUMNS))
cycles = lift.load_cycles(snakemake.input.cycles)
residency = {}
for p in snakemake.input.cachegrind:
    obj = json.loads(Path(p).read_text())
    residency[obj["benchmark"]] = obj

metas = {json.loads(Path(p).read_text())["analyzer"]: json.loads(Path(p).read_text())
         for p in snakemake.input.meta}
derived = {}
if "osaca" in metas and cfg["osaca"]["ignore_unknown"]:
    # what OSACA does without --ignore-unknown, from the same run
    predictions = pd.concat([predictions, lift.strict_variant(predictions, "osaca")],
                            ignore_index=True)
    derived["osaca" + lift.STRICT_SUFFIX] = (
        "the osaca run above without --ignore-unknown: a block with an instruction lacking "
        f"{metas['osaca'].get('target', {}).get('value', cfg['osaca']['arch'])} data fails")
status = lift.analyzer_status(cfg["analyzers"], metas, snakemake.params.model_enabled,
                                  derived)
lifted = lift.lift(blocks, counts, predictions)
kernels = lift.kernel_table(lifted, cycles, residency, float(cfg["miss_threshold"]),
                            lift.load_spreads(snakemake.input.cycles))
metrics = lift.metrics_table(kernels, [a for a, s in status.items() if s["status"] == "ran"])
files.write_tsv_atomic(kernels, snakemake.output.kernels)
files.write_tsv_atomic(metrics, snakemake.output.metrics)
summary = lift.summary(kernels, residency, float(cfg["miss_threshold"]))
# a list, not an object: the JSON writer sorts keys, and the analyzers' order is the report's
analyzers = [{"name": name} | info for name, info in status.items()]
files.write_json_atomic({"analyzers": analyzers, "metrics": json.loads(metrics.to_json(
    orient="records")), "summary": summary, "config": cfg}, snakemake.output.metrics_json)
print(metrics.to_string())
print(json.dumps(summary, indent=1))
