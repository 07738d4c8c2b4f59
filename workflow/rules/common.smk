# Shared by all the .smk files: validated config, the machine id, output paths and
# input functions. Kept free of side effects other than reading the config and
# the CPU identity, so that `snakemake -n` and `--lint` work before anything ran.

import sys
from pathlib import Path

from snakemake.utils import validate

# The package lives in src/; make it importable here even before `pip install -e .`
# (the job scripts themselves run with the venv's interpreter, where it is installed).
_SRC = str(Path(workflow.basedir) / "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)

from cpumap.store import db as cpumap_db  # noqa: E402
from cpumap.measure.campaign import read_plan  # noqa: E402
from cpumap.host import machine as cpumap_machine  # noqa: E402


validate(config, schema="../schemas/config.schema.yaml", set_default=True)

RESULTS = config["results_dir"].rstrip("/")

# The priority of the jobs that measure (resource measure_slots): one measures at a time, so
# they are the run's critical path, and a free core goes to the next of them before any
# other job. Without it the scheduler filled both cores with palmed_compile jobs while
# compiled batches waited: the measuring slot stood idle 3-41 s between mapping batches
# (Emerald Rapids-class guest, full profile, 2026-11-29), about 20 s a batch.
MEASURING_PRIORITY = 10
# The model's chain (catalogue, singletons, the Palmed stages, validation) is the run's
# longest: its jobs go first, measuring or not, so that the roofline's and the suite's
# measurements fill the slot while a Palmed stage solves its LPs (cpumap.measure.slot). Its
# compile jobs come after its measuring ones, so that both cores never compile while a
# compiled batch waits for the slot.
MODEL_PRIORITY = 20
MODEL_COMPILE_PRIORITY = 15
# The measure_slots of a job that measures round by round between LPs: none while the
# measuring lock (config measuring_lock) keeps its rounds apart from every other job's
# measurements, one (the whole job) without it.
ROUND_MEASURE_SLOTS = 0 if config["measuring_lock"] else 1
# fit_model's cores. A fit of every form (a full profile: 74,237 per-form LPs in 1,527 s, Zen 4,
# 2026-11-27) runs its LPs in a pool of two and compiles ahead. The quick set's fit solves
# 2,703 in 11 s (Emerald Rapids-class guest, 2026-12-01), and a job of two cores waits for
# both to be free: the scheduler gave every core that freed to one-core jobs, and fit_model
# started 111 s after its inputs were ready.
FIT_THREADS = 2 if config["selection"]["forms"] == "all" else 1


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

# The real-kernel suite, its evaluation and the roofline run real code on this CPU: they only
# make sense for the native backend (a simulated machine id would file host measurements
# under a machine that does not exist).
NATIVE = config["machine"]["backend"] == "native"
SUITE_ON = config["suite"]["enabled"] and NATIVE
# With model.suite_forms the suite's blocks (built, counted) feed the model's first stage:
# they join its chain, below its measuring jobs.
SUITE_BLOCKS_PRIORITY = (MODEL_COMPILE_PRIORITY if SUITE_ON and config["model"]["enabled"]
                         and config["model"]["suite_forms"] else 0)


wildcard_constraints:
    mid=r"[A-Za-z0-9][A-Za-z0-9._+-]*",
    batch=r"[0-9]{4}-[0-9a-f]{8}",


# Output paths, with {mid} (and {batch}) left as wildcards.
MDIR = f"{RESULTS}/{{mid}}"
MACHINE_JSON = f"{MDIR}/machine.json"
HARNESS_BIN = f"{MDIR}/bin/papi_bench"
FORMS = f"{MDIR}/isa/forms.parquet"
SSE_AVX = f"{MDIR}/isa/sse_avx.json"
LATENCY_ALL = f"{MDIR}/isa/latency.tsv"
SINGLETON_PLAN = f"{MDIR}/bench/singletons/plan.json"
SINGLETON_PART = f"{MDIR}/db/part-singletons-{{batch}}.parquet"
SINGLETON_COMPILED = f"{MDIR}/bench/singletons/compiled/{{batch}}.json"
SINGLETON_SO = f"{MDIR}/bench/singletons/compiled/{{batch}}.so"
SINGLETON_SUMMARY = f"{MDIR}/bench/singletons/summary.tsv"
SINGLETON_TABLE = f"{MDIR}/bench/singletons/singletons.tsv"
MODEL_JSON = f"{MDIR}/model/model.json"
# Palmed's stages (model.smk): state files, plans of the measured stages, their DB parts
PALMED_STATE = f"{MDIR}/model/stages/{{pstage}}.json"
PALMED_PLAN = f"{MDIR}/model/stages/{{pstage}}-plan.json"
PALMED_PART = f"{MDIR}/db/part-palmed-{{pstage}}-{{batch}}.parquet"
PALMED_COMPILED = f"{MDIR}/model/compiled/{{pstage}}-{{batch}}.json"
PALMED_SO = f"{MDIR}/model/compiled/{{pstage}}-{{batch}}.so"
MODEL_REPORT = f"{MDIR}/model/report.md"
LOGS = f"{MDIR}/logs"

# Real-kernel suite (issue 4, H-suite): {bench} is <kernel>.<flagset> or a user entry's name.
SUITE_BIN = f"{MDIR}/suite/bin/{{bench}}"
SUITE_BIN_META = f"{MDIR}/suite/bin/{{bench}}.json"
EVAL_BLOCKS = f"{MDIR}/evaluate/blocks/{{bench}}.parquet"
EVAL_COUNTS = f"{MDIR}/evaluate/counts/{{bench}}.parquet"
EVAL_COUNTS_META = f"{MDIR}/evaluate/counts/{{bench}}.json"
EVAL_CYCLES = f"{MDIR}/evaluate/cycles/{{bench}}.json"
SUITE_USER = {u["name"]: u for u in config["suite"]["user"]}
SUITE_BENCHMARKS = (
    [f"{k}.{f}" for k in config["suite"]["kernels"] for f in config["suite"]["flagsets"]]
    + list(SUITE_USER)
    if config["suite"]["enabled"]
    else []
)


def _suite_binary(mid, bench):
    user = SUITE_USER.get(bench)
    return user["binary"] if user else SUITE_BIN.format(mid=mid, bench=bench)


def suite_binary(wildcards):
    """The benchmark's binary: built by suite_build, or a user entry's own path."""
    return _suite_binary(wildcards.mid, wildcards.bench)


def suite_binaries(wildcards):
    """Every benchmark's binary, in SUITE_BENCHMARKS' order."""
    return [_suite_binary(wildcards.mid, b) for b in SUITE_BENCHMARKS]


# Analyzer evaluation (issue 4 items 5-7, H-eval; rules in evaluate.smk).
EVAL = config["evaluate"]
EDIR = f"{MDIR}/evaluate"
# EVAL_BLOCKS, EVAL_COUNTS, EVAL_CYCLES, SUITE_BENCHMARKS and suite_binary: common.smk ({bench})
EVAL_PRED = f"{EDIR}/predictions/{{analyzer}}/{{bench}}.parquet"
EVAL_PRED_META = f"{EDIR}/predictions/{{analyzer}}.json"
EVAL_CACHEGRIND = f"{EDIR}/cachegrind/{{bench}}.json"
EVAL_SUITE_FORMS = f"{EDIR}/suite_forms.txt"
EVAL_LATENCY = f"{EDIR}/latency.tsv"
EVAL_KERNELS = f"{EDIR}/kernels.tsv"
EVAL_METRICS = f"{EDIR}/metrics.tsv"
EVAL_METRICS_JSON = f"{EDIR}/metrics.json"
EVAL_REPORT = f"{MDIR}/report/index.html"
EVAL_PLOTS = f"{EDIR}/plots"


def eval_analyzers_run():
    """Analyzers that run in this configuration (model only when the model stage runs)."""
    return [a for a in EVAL["analyzers"] if a != "model" or config["model"]["enabled"]]


def eval_benchmark_files(pattern):
    """``pattern`` for every benchmark, other wildcards ({mid}, {analyzer}) left open."""
    return expand(pattern, bench=SUITE_BENCHMARKS, allow_missing=True)


def eval_predictions(wildcards):
    return [p for a in eval_analyzers_run()
            for p in expand(eval_benchmark_files(EVAL_PRED), mid=wildcards.mid, analyzer=a)]


def eval_prediction_meta(wildcards):
    return [EVAL_PRED_META.format(mid=wildcards.mid, analyzer=a) for a in eval_analyzers_run()]


def eval_cachegrind_files(wildcards):
    """Cachegrind results of the suite's benchmarks (user benchmarks, without a driver that
    takes --reps, are not checked)."""
    if not EVAL["cachegrind"]:
        return []
    suite = [b for b in SUITE_BENCHMARKS if b not in SUITE_USER]
    return expand(EVAL_CACHEGRIND, mid=wildcards.mid, bench=suite)


#: HTML fragment files other stages add to the report as sections (e.g. the roofline): paths
#: with {mid}, appended by their rule files (EVAL_REPORT_EXTRA.append(...)). Each fragment's
#: first <h2> is its section title (cpumap.evaluate.report.fragment_section).
EVAL_REPORT_EXTRA = []


# Roofline (issue 5, H-roof; rules in roofline.smk).
ROOF = config["roofline"]
ROOF_DIR = f"{MDIR}/roofline"
ROOF_BW_BIN = f"{MDIR}/bin/bw_sweep"
ROOF_COMPUTE_PART = f"{MDIR}/db/part-roofline-compute.parquet"
ROOF_COMPUTE = f"{ROOF_DIR}/compute.json"
ROOF_SWEEP = f"{ROOF_DIR}/sweep.parquet"
ROOF_CEILINGS = f"{ROOF_DIR}/ceilings.json"
ROOF_COUNTS = f"{ROOF_DIR}/counts.parquet"
# one kernel point size, every cache state: {bench} as SUITE_BIN, {n} the problem size
ROOF_COUNTS_PART = f"{ROOF_DIR}/counts/{{bench}}-n{{n}}.parquet"
ROOF_POINTS = f"{ROOF_DIR}/points.parquet"
ROOF_PLOTS = f"{ROOF_DIR}/plots"
ROOF_SECTION = f"{ROOF_DIR}/section.html"
ROOF_SUMMARY = f"{ROOF_DIR}/summary.json"


def roofline_point_benchmarks():
    """<kernel>.<flagset> of the kernel points (suite binaries built by suite_build)."""
    pts = ROOF["points"]
    if not (ROOF["enabled"] and pts["enabled"] and config["suite"]["enabled"]):
        return []
    flagsets = pts["flagsets"] or list(config["suite"]["flagsets"])
    return [f"{k}.{f}" for k in pts["kernels"] for f in flagsets]


def roofline_count_parts(wildcards):
    """The count part of every kernel point size (rule roofline_count)."""
    sizes = ROOF["points"]["sizes"]
    return [ROOF_COUNTS_PART.format(mid=wildcards.mid, bench=b, n=n)
            for b in roofline_point_benchmarks() for n in sizes.get(b.partition(".")[0], [])]


def quick_list_input(wildcards):
    """The quick form list is an input only when it is used, so editing it reruns the plan."""
    sel = config["selection"]
    return [sel["quick_list"]] if sel["forms"] == "quick" else []


def plan_batch_ids(plan_path):
    """Batch ids of a plan.json: position plus a hash of the batch's kernels."""
    return [cpumap_db.batch_key(i, kernels) for i, kernels in enumerate(read_plan(plan_path))]


def singleton_parts(wildcards):
    """All DB parts of the singleton plan; known only once checkpoint plan_singletons ran."""
    plan = checkpoints.plan_singletons.get(mid=wildcards.mid).output.plan
    return expand(SINGLETON_PART, mid=wildcards.mid, batch=plan_batch_ids(plan))


def palmed_parts(stage):
    """Input function: the DB parts of a planned Palmed stage (pairs or mapping), known only
    once its checkpoint (palmed_pairs, palmed_mapping) wrote the plan."""

    def parts(wildcards):
        plan = getattr(checkpoints, f"palmed_{stage}").get(mid=wildcards.mid).output.plan
        return expand(PALMED_PART, mid=wildcards.mid, pstage=stage, batch=plan_batch_ids(plan))

    return parts


# The noise monitor (db.smk): its table is read after every stage that measures.

NOISE_TABLE = f"{MDIR}/monitor/noise.tsv"
# Real blocks at scale (corpus.smk): a BHive-format corpus, every analyzer, two ground truths
CORPUS = config["corpus"]
CORPUS_ON = CORPUS["enabled"] and NATIVE
CORPUS_DIR = Path(CORPUS["dir"])
CORPUS_SOURCES = sorted(
    str(p)
    for p in (
        (CORPUS_DIR / "sources").glob("*.csv")
        if (CORPUS_DIR / "sources").is_dir()
        else CORPUS_DIR.glob("*.csv")
    )
)
CDIR = f"{MDIR}/corpus"
CORPUS_BLOCKS = f"{CDIR}/blocks.parquet"
CORPUS_PRED = f"{CDIR}/predictions/{{analyzer}}.parquet"
CORPUS_PRED_META = f"{CDIR}/predictions/{{analyzer}}.json"
CORPUS_SHARD = f"{CDIR}/predictions/{{analyzer}}/shard-{{shard}}.parquet"
CORPUS_SHARD_META = f"{CDIR}/predictions/{{analyzer}}/shard-{{shard}}.json"
CORPUS_LATENCY = f"{CDIR}/latency.tsv"
CORPUS_METRICS = f"{CDIR}/metrics.tsv"
CORPUS_METRICS_JSON = f"{CDIR}/metrics.json"
CORPUS_SECTION = f"{CDIR}/section.html"
CORPUS_PLOTS = f"{CDIR}/plots"


def corpus_analyzers():
    """Analyzers run on the corpus (model only when the model stage runs)."""
    return [a for a in CORPUS["analyzers"] if a != "model" or config["model"]["enabled"]]


def corpus_shards(kind):
    """The shard tables (kind "table") or their metadata ("meta") of one analyzer."""
    path = CORPUS_SHARD if kind == "table" else CORPUS_SHARD_META

    def shards(wildcards):
        return [path.format(mid=wildcards.mid, analyzer=wildcards.analyzer, shard=k)
                for k in range(CORPUS.get("shards", 1))]

    return shards


def corpus_predictions(wildcards):
    return [CORPUS_PRED.format(mid=wildcards.mid, analyzer=a) for a in corpus_analyzers()]


def corpus_prediction_meta(wildcards):
    return [CORPUS_PRED_META.format(mid=wildcards.mid, analyzer=a) for a in corpus_analyzers()]


NOISE_SECTION = f"{MDIR}/monitor/section.html"
NOISE_SUMMARY = f"{MDIR}/monitor/summary.json"


def noise_monitor_after(wildcards):
    """The outputs of every stage that measures: the monitor table is read after them all."""
    mid = wildcards.mid
    after = [SINGLETON_SUMMARY.format(mid=mid)]
    if config["model"]["enabled"]:
        after.append(f"{RESULTS}/{mid}/model/validation.json")
    for measured in ("native", "written"):
        if SUITE_ON and measured in eval_analyzers_run():
            after.append(EVAL_PRED_META.format(mid=mid, analyzer=measured))
        if CORPUS_ON and measured in corpus_analyzers():
            after.append(CORPUS_PRED_META.format(mid=mid, analyzer=measured))
    if ROOF["enabled"] and NATIVE:
        after.append(ROOF_COMPUTE.format(mid=mid))
    return after
