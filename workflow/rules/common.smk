# Shared by all the .smk files: validated config, the machine id, output paths and
# input functions. Kept free of side effects other than reading the config and
# the CPU identity, so that `snakemake -n` and `--lint` work before anything ran.

import json
import sys
from pathlib import Path

from snakemake.utils import validate

# The package lives in src/; make it importable here even before `pip install -e .`
# (the job scripts themselves run with the venv's interpreter, where it is installed).
_SRC = str(Path(workflow.basedir) / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)

from cpumap import db as cpumap_db  # noqa: E402
from cpumap import machine as cpumap_machine  # noqa: E402


validate(config, schema="../schemas/config.schema.yaml", set_default=True)

RESULTS = config["results_dir"].rstrip("/")


def _machine_id():
    """Id of the machine the results are for: the host's, or the simulated machine's.

    Only /proc/cpuinfo is read here (cheap); the full description is written by
    the machine job, which checks that it describes the same machine.
    """
    m = config["machine"]
    if m["backend"] == "simulated":
        return cpumap_machine.simulated_machine_id(m["mapping"], m["noise"], m["seed"])
    return cpumap_machine.machine_id()


MACHINE_ID = _machine_id()


wildcard_constraints:
    mid=r"[A-Za-z0-9][A-Za-z0-9._+-]*",
    batch=r"[0-9]{4}-[0-9a-f]{8}",


# Output paths, with {mid} (and {batch}) left as wildcards.
MDIR = f"{RESULTS}/{{mid}}"
MACHINE_JSON = f"{MDIR}/machine.json"
HARNESS_BIN = f"{MDIR}/bin/papi_bench"
FORMS = f"{MDIR}/isa/forms.parquet"
SINGLETON_PLAN = f"{MDIR}/bench/singletons/plan.json"
SINGLETON_PART = f"{MDIR}/db/part-singletons-{{batch}}.parquet"
SINGLETON_SUMMARY = f"{MDIR}/bench/singletons/summary.tsv"
SINGLETON_TABLE = f"{MDIR}/bench/singletons/singletons.tsv"
MODEL_JSON = f"{MDIR}/model/model.json"
MODEL_REPORT = f"{MDIR}/model/report.md"
LOGS = f"{MDIR}/logs"


def quick_list_input(wildcards):
    """The quick form list is an input only when it is used, so editing it reruns the plan."""
    sel = config["selection"]
    return [sel["quick_list"]] if sel["forms"] == "quick" else []


def plan_batch_ids(plan_path):
    """Batch ids of a plan.json: position plus a hash of the batch's kernels."""
    with open(plan_path, encoding="utf-8") as handle:
        batches = json.load(handle)["batches"]
    return [cpumap_db.batch_key(i, kernels) for i, kernels in enumerate(batches)]


def singleton_parts(wildcards):
    """All DB parts of the singleton plan; known only once checkpoint plan_singletons ran."""
    plan = checkpoints.plan_singletons.get(mid=wildcards.mid).output.plan
    return expand(SINGLETON_PART, mid=wildcards.mid, batch=plan_batch_ids(plan))
