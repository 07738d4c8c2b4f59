"""Rules eval_latency, corpus_latency and latency_catalogue: the measured dependence-chain
latencies of the forms of the suite (its form list), of a block corpus (its blocks table) or
of the whole catalogue, and of the forms the loop predictor needs for memory
(cpumap.measure.latency), one row per chain."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure import slot

# the measuring lock of its results, taken around each of its batches' rounds
slot.join_job(snakemake, whole=False)

import json

import pandas as pd

from cpumap.isa.catalogue import Catalogue
from cpumap.measure import latency
from cpumap.measure.backend import Measurer
from cpumap.measure.settings import BenchSettings
from cpumap.store import files

cat = Catalogue.load(Path(snakemake.input.forms))
if "suite_forms" in snakemake.input.keys():
    names = [n.strip() for n in Path(snakemake.input.suite_forms).read_text().splitlines()
             if n.strip()]
elif "blocks" in snakemake.input.keys():
    table = files.read_parquet_checked(snakemake.input.blocks)
    names = sorted({str(f) for forms in table["forms"] for f in forms if f})
else:  # the catalogue's every ok form
    names = sorted(cat.df.name[cat.df.status == "ok"].astype(str))
names += list(latency.MEMORY_FORMS)
with open(snakemake.input.machine, encoding="utf-8") as handle:
    machine = json.load(handle)
if snakemake.params.machine["backend"] == "simulated":
    raise SystemExit("latency: a simulated machine has no latencies (evaluate.analyzers "
                     "lists loop)")
measurer = Measurer(machine, cat.df, BenchSettings.from_mapping(snakemake.params.bench),
                    Path(snakemake.input.forms).parents[1] / "db",
                    Path(snakemake.params.workdir), harness_bin=Path(snakemake.input.harness),
                    log=lambda message: print(message, flush=True))
rows = latency.latency_rows(measurer, cat, names)
unc = measurer.uncertainty([r["kernel"] for r in rows if r["kernel"]])
df = pd.DataFrame(rows)
df["uncertainty"] = df.kernel.map(unc)
files.write_text_atomic(df.to_csv(sep="\t", index=False), snakemake.output.table)
ok = df[df.status == "ok"]
print(f"{len(set(names))} forms: {ok.form.nunique()} with a measured chain ({len(ok)} chains), "
      f"{(df.status == 'none').sum()} without one, {(df.status == 'failed').sum()} failed")
