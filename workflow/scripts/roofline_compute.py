"""Rule roofline_compute: measure the compute variants (a DB part) and summarise them."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure import slot

# it times code outside the harness's rounds: the measuring lock is its own until it exits
slot.join_job(snakemake, whole=True)

import json
import shutil

from cpumap.measure.settings import BenchSettings
from cpumap.roofline.build import run_compute, write_json
from cpumap.store.files import read_parquet_checked

with open(snakemake.input.machine, encoding="utf-8") as handle:
    machine = json.load(handle)
workdir = Path(snakemake.params.workdir)
shutil.rmtree(workdir, ignore_errors=True)
workdir.mkdir(parents=True)
bench = BenchSettings.from_mapping(snakemake.params.bench)
summary = run_compute(read_parquet_checked(snakemake.input.forms), machine, bench,
                      snakemake.params.roofline, workdir,
                      Path(snakemake.input.harness), Path(snakemake.output.part),
                      progress=lambda message: print(message, flush=True))
write_json(summary, Path(snakemake.output.compute))
shutil.rmtree(workdir, ignore_errors=True)
for prec, rec in summary["peaks"].items():
    for kind, r in rec.items():
        print(f"peak {prec} {kind}: {r['measured_flops_per_cycle']:.2f} flop/cycle measured, "
              f"{r['theoretical']['flops_per_cycle']:g} theoretical ({r['fraction']:.1%})")
