"""Rule measure_batch: generate, compile and measure one batch; store its rows as a DB part."""

import json
import shutil
import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure import slot

# the measuring lock of its results, taken around each timed round; a job of the model's
# chain: no other job measures between the rounds of its batches
slot.join_job(snakemake, whole=False, first=True)

from cpumap.measure import quiet
from cpumap.measure.asmgen import canonical, kernel_id, parse_canonical
from cpumap.measure.backend import batch_rows, measurement_key
from cpumap.measure.batch import Prepared
from cpumap.measure.campaign import read_plan
from cpumap.measure.settings import BenchSettings
from cpumap.model.simulate import SimulatedMachine
from cpumap.store import db
from cpumap.store.files import read_parquet_checked

batches = read_plan(snakemake.input.plan)
by_key = {db.batch_key(i, kernels): kernels for i, kernels in enumerate(batches)}
kernels = by_key[snakemake.wildcards.batch]
with open(snakemake.input.machine, encoding="utf-8") as handle:
    machine = json.load(handle)

# One work directory per batch: parallel jobs never share temporary files, and a
# rerun starts clean. It is removed once the rows are safely stored.
workdir = Path(snakemake.params.workdir)
shutil.rmtree(workdir, ignore_errors=True)
workdir.mkdir(parents=True)

# Kernels already measured on this machine with the same parameters and harness are not
# measured again (DESIGN §7) unless bench.remeasure is set; the summary finds their rows.
bench = BenchSettings.from_mapping(snakemake.params.bench)
backend = snakemake.params.machine
simulated = backend["backend"] == "simulated"
# `measure: false` (re-deriving from restored or merged rows) never measures: the batch's
# kernels must all be in the database already; read from the config, not from params, so
# that switching it does not rerun (and so delete) stored parts.
measuring = bool(snakemake.config.get("measure", True))
skip = set()
if not bench.remeasure or not measuring:
    skip = db.measured_keys(
        Path(snakemake.output.part).parent, machine["machine_id"],
        *measurement_key(bench, simulated))
if not measuring:
    missing = [k for k in kernels if kernel_id(canonical(parse_canonical(k))) not in skip]
    if missing:
        raise SystemExit(
            f"measuring is off (measure: false) and the database has no ok rows for "
            f"{len(missing)} kernel(s) of batch {snakemake.params.batch_id}: "
            f"{', '.join(missing[:20])}{' ...' if len(missing) > 20 else ''}")
sim = (SimulatedMachine(backend["mapping"], backend["noise"], backend["seed"])
       if simulated else None)
compiled = getattr(snakemake.input, "compiled", None)
prepared = Prepared.load(compiled) if compiled else None
rows = batch_rows(
    kernels,
    read_parquet_checked(snakemake.input.forms),
    machine,
    bench,
    workdir,
    snakemake.params.batch_id,
    harness_bin=Path(snakemake.input.harness),
    sim=sim,
    skip=skip,
    progress=lambda message: print(message, flush=True),
    prepared=prepared,
    reference=quiet.reference_path(Path(snakemake.output.part).parent),
)
part = db.append(Path(snakemake.output.part).parent, rows, snakemake.params.batch_id)
if part.resolve() != Path(snakemake.output.part).resolve():
    raise SystemExit(f"DB part written to {part}, expected {snakemake.output.part}")
shutil.rmtree(workdir, ignore_errors=True)
n_ok = int((rows["status"] == "ok").sum())
print(f"stored {len(rows)} rows ({n_ok} ok) in {part}")
