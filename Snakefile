# cpumap: measure and model the throughput of x86-64 instructions on this CPU.
#
#   ./scripts/setup.sh                       # install, then run the default (quick) pipeline
#   .venv/bin/snakemake --cores 2 -n         # dry run: what would be (re)computed
#   .venv/bin/snakemake --cores 2 --configfile config/full.yaml
#
# Every output lives under results/<machine_id>/ (see README.md). The logic is in
# the cpumap package (src/cpumap); rules only wire it together.

from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/isa.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/db.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/suite.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/corpus.smk"
include: "workflow/rules/roofline.smk"


localrules:
    all,


rule all:
    input:
        summary=expand(SINGLETON_SUMMARY, mid=MACHINE_ID),
        singletons=expand(SINGLETON_TABLE, mid=MACHINE_ID),
        sse_avx=expand(SSE_AVX, mid=MACHINE_ID),
        latency=(
            expand(LATENCY_ALL, mid=MACHINE_ID)
            if config["latency"]["all_forms"] and NATIVE
            else []
        ),
        model=expand(MODEL_REPORT, mid=MACHINE_ID) if config["model"]["enabled"] else [],
        suite=rules.suite_all.input if SUITE_ON else [],
        evaluation=rules.eval_all.input if SUITE_ON else [],
        corpus=expand(CORPUS_METRICS, mid=MACHINE_ID) if CORPUS_ON else [],
        roofline=expand(ROOF_SECTION, mid=MACHINE_ID) if ROOF["enabled"] and NATIVE else [],
        noise=expand(NOISE_TABLE, mid=MACHINE_ID) if NATIVE and config["bench"]["monitor"] else [],
    default_target: True
