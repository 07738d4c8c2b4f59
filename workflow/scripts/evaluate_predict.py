"""Rules eval_predict_* and corpus_predict_*: one analyzer's prediction of every block of the
suite, or of a block corpus.

Writes predictions/<analyzer>/<benchmark>.parquet (the suite: one row per block, failures with
their error) or corpus/predictions/<analyzer>/shard-<k>.parquet (the corpus: one table per
shard of its blocks, corpus_merge joins them; the loop analyzer's one table), and a .json
beside them (what ran, how long, how many blocks failed).
"""

import dataclasses
import json
import sys
import time
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure import slot

# the measuring lock of its results, taken around each of its batches' rounds
slot.join_job(snakemake, whole=False)

import pandas as pd

from cpumap.evaluate import analyzers as A
from cpumap.evaluate.analyzers import targets
from cpumap.model import resmodel
from cpumap.store import files

name = snakemake.wildcards.analyzer
cfg = snakemake.params.evaluate
inp = snakemake.input.blocks  # the suite's tables, or the corpus's one
tables = [files.read_parquet_checked(p) for p in ([inp] if isinstance(inp, str) else inp)]
blocks = A.block_inputs(pd.concat(tables, ignore_index=True), cfg["drop_terminator"])
shards = snakemake.params.get("shards")  # the corpus: this job's part of the blocks
if shards:
    from cpumap.evaluate.corpus import shard_of

    shard = int(snakemake.wildcards.shard)
    blocks = [b for b in blocks
              if shard_of(b.code or "\n".join(b.insns).encode(), shards) == shard]
    print(f"{name}: shard {shard} of {shards}", flush=True)
print(f"{name}: {len(blocks)} blocks of {len(tables)} benchmarks", flush=True)

target = None
if name in ("llvm-mca", "osaca"):
    with open(snakemake.input.machine, encoding="utf-8") as handle:
        host = json.load(handle)
if name == "llvm-mca":
    m = cfg["llvm_mca"]
    target = targets.llvm_mca_cpu(m["cpu"], host)
    analyzer = A.LlvmMca(m["command"], target.value, m["iterations"], m["timeout_s"],
                         m["batch_size"])
elif name == "osaca":
    o = cfg["osaca"]
    target = targets.osaca_arch(o["arch"], host)
    analyzer = A.Osaca(target.value, timeout_s=o["timeout_s"], batch_size=o["batch_size"],
                       ignore_unknown=o["ignore_unknown"])
if target is not None:
    print(f"{name}: target {target.value} ({target.describe()})", flush=True)
    if target.warning:
        print(f"WARNING: {target.warning}", file=sys.stderr, flush=True)
elif name == "model":
    analyzer = A.ModelAnalyzer(resmodel.load(snakemake.input.model),
                               files.read_parquet_checked(snakemake.input.forms))
elif name in ("native", "written"):
    from cpumap.measure.backend import Measurer
    from cpumap.measure.settings import BenchSettings
    from cpumap.model.simulate import SimulatedMachine

    with open(snakemake.input.machine, encoding="utf-8") as handle:
        machine = json.load(handle)
    forms = files.read_parquet_checked(snakemake.input.forms)
    backend = snakemake.params.machine
    sim = None
    if backend["backend"] == "simulated":
        sim = SimulatedMachine(backend["mapping"], backend["noise"], backend["seed"])
    measurer = Measurer(machine, forms, BenchSettings.from_mapping(snakemake.params.bench),
                        Path(snakemake.input.forms).parents[1] / "db",
                        Path(snakemake.params.workdir), harness_bin=Path(snakemake.input.harness),
                        sim=sim, log=lambda message: print(message, flush=True))
    analyzer = (A.NativeAnalyzer if name == "native" else A.WrittenAnalyzer)(measurer, forms)
elif name == "loop":
    def given(key):  # one table (the corpus) or one per benchmark (the suite)
        paths = snakemake.input.get(key, [])
        return [paths] if isinstance(paths, str) else list(paths)

    bounds = [A.Precomputed(a, pd.concat([files.read_parquet_checked(p) for p in given(a)],
                                         ignore_index=True))
              for a in ("native", "written") if given(a)]
    analyzer = A.LoopAnalyzer(pd.read_csv(snakemake.input.latency, sep="\t",
                                          keep_default_na=False, na_values=[""]),
                              A.FirstOk(bounds))
else:
    raise ValueError(f"unknown analyzer {name!r}")

if hasattr(analyzer, "stats"):  # the external tools: a progress line every few seconds
    analyzer.stats.log = lambda message: print(f"{name}: {message}", flush=True)
t0 = time.monotonic()
results = A.predict_blocks(analyzer, blocks)
seconds = time.monotonic() - t0
df = A.predictions_frame(name, blocks, results)
if "table" in snakemake.output.keys():  # the corpus: one table
    files.write_parquet_atomic(df, snakemake.output.table, A.PREDICTION_SCHEMA)
for path in snakemake.output.get("predictions", []):
    bench = Path(path).name.removesuffix(".parquet")
    files.write_parquet_atomic(df[df.benchmark == bench].reset_index(drop=True), path,
                            A.PREDICTION_SCHEMA)
failed = df[df.status != "ok"]
noted = df[(df.status == "ok") & (df.error != "")]
meta = {"analyzer": name, "description": analyzer.describe(), "blocks": int(len(df)),
        "failed_blocks": int(len(failed)), "seconds": seconds,
        "drop_terminator": bool(cfg["drop_terminator"]),
        "errors": failed.error.value_counts().head(20).to_dict(),
        "ok_with_notes": int(len(noted)),
        "notes": noted.error.value_counts().head(20).to_dict()}
if target is not None:
    meta["target"] = dataclasses.asdict(target)
if hasattr(analyzer, "stats"):
    meta["calls"] = analyzer.stats.calls
    meta["failed_calls"] = analyzer.stats.failed_calls
files.write_json_atomic(meta, snakemake.output.meta)
print(json.dumps({k: v for k, v in meta.items() if k != "errors"}))
