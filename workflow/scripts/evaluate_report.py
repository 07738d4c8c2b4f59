"""Rule eval_report: the self-contained HTML report (metrics, plots, kernels, failures).

Sections of other stages come in as HTML fragment files (input ``extra``).
"""

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

import pandas as pd

from cpumap.evaluate import analyzers as A
from cpumap.evaluate import coverage, report
from cpumap.isa.catalogue import Catalogue
from cpumap.store import files

kernels = pd.read_csv(snakemake.input.kernels, sep="\t", keep_default_na=True)
for col in ("excluded", "error", "cachegrind_error"):
    if col in kernels:
        kernels[col] = kernels[col].fillna("")
metrics = pd.read_csv(snakemake.input.metrics, sep="\t")
with open(snakemake.input.metrics_json, encoding="utf-8") as handle:
    mj = json.load(handle)
with open(snakemake.input.machine, encoding="utf-8") as handle:
    machine = json.load(handle)
preds = [files.read_parquet_checked(p) for p in snakemake.input.predictions]
predictions = pd.concat(preds, ignore_index=True) if preds else pd.DataFrame(
    columns=["benchmark", "block_id", "analyzer", "cycles", "status", "error", "seconds"])
s = mj["summary"]
cfg = mj["config"]
header = {
    "machine id": machine.get("machine_id", ""),
    "CPU": f"{machine.get('model_name', '')} ({(machine.get('uarch') or {}).get('name', '')})",
    "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    "benchmarks": f"{s['benchmarks']} ({s['measured']} measured, {s['eligible']} eligible)",
    "analyzer input": ("each block without its terminating control-flow instruction"
                       if cfg.get("drop_terminator", True) else "each whole block"),
}
# the instructions every analyzer was given (terminator dropped or not, as configured)
suite_blocks = pd.concat([files.read_parquet_checked(p) for p in snakemake.input.blocks],
                         ignore_index=True)
inputs = A.block_inputs(suite_blocks, cfg.get("drop_terminator", True))
blocks = pd.DataFrame({"benchmark": [b.benchmark for b in inputs],
                       "block_id": [b.block_id for b in inputs],
                       "insns": [list(b.insns) for b in inputs]})
counts = pd.concat([files.read_parquet_checked(p) for p in snakemake.input.counts],
                   ignore_index=True)
with open(snakemake.input.sse_avx, encoding="utf-8") as handle:
    sse_avx = json.load(handle)
mixing = coverage.summary(coverage.suite_coverage(
    suite_blocks, counts, (), Catalogue.load(Path(snakemake.input.forms))))
notes = [report.residency_note(s), report.sse_avx_note(mixing, sse_avx)]
extra = [report.fragment_section(p) for p in snakemake.input.extra]
plots = Path(snakemake.output.plots)
plots.mkdir(parents=True, exist_ok=True)
report.write_report(snakemake.output.html, title="cpumap: code analyzers on real kernels",
                    header=header, metrics=metrics, kernels=kernels, predictions=predictions,
                    analyzers={a["name"]: a for a in mj["analyzers"]}, notes=notes,
                    extra_sections=extra, blocks=blocks, counts=counts, plots=plots)
print(f"wrote {snakemake.output.html}")
