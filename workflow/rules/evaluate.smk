# Stage 4b: evaluation of code analyzers on the real-kernel suite (DESIGN §9, seed 003).
# The suite rules (suite.smk) provide, per benchmark <kernel>.<flagset>: the binary, its basic
# blocks, their occurrences and the whole-kernel cycles. Here: per-block predictions of each
# analyzer (one job per analyzer over all blocks: llvm-mca and OSACA analyse many blocks per
# call, native measures all multisets as one batch), Cachegrind's warm-cache D1 miss rate per
# benchmark, lifting + metrics, and the self-contained HTML report. Paths and input functions:
# common.smk (block "Analyzer evaluation").


rule eval_suite_forms:
    input:
        blocks=eval_benchmark_files(EVAL_BLOCKS),
        forms=FORMS,
    output:
        forms=EVAL_SUITE_FORMS,
    log:
        f"{LOGS}/evaluate/suite_forms.log",
    priority: SUITE_BLOCKS_PRIORITY
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_suite_forms.py"


rule eval_predict_tool:
    input:
        blocks=eval_benchmark_files(EVAL_BLOCKS),
        machine=MACHINE_JSON,
    output:
        predictions=eval_benchmark_files(EVAL_PRED),
        meta=EVAL_PRED_META,
    log:
        f"{LOGS}/evaluate/predict-{{analyzer}}.log",
    wildcard_constraints:
        analyzer="llvm-mca|osaca",
    params:
        evaluate=EVAL,
    threads: 1
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_predict.py"


rule eval_predict_model:
    input:
        blocks=eval_benchmark_files(EVAL_BLOCKS),
        model=MODEL_JSON,
        forms=FORMS,
    output:
        predictions=eval_benchmark_files(EVAL_PRED),
        meta=EVAL_PRED_META,
    log:
        f"{LOGS}/evaluate/predict-{{analyzer}}.log",
    wildcard_constraints:
        analyzer="model",
    params:
        evaluate=EVAL,
    threads: 1
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_predict.py"


rule eval_predict_native:
    input:
        blocks=eval_benchmark_files(EVAL_BLOCKS),
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        predictions=eval_benchmark_files(EVAL_PRED),
        meta=EVAL_PRED_META,
    log:
        f"{LOGS}/evaluate/predict-{{analyzer}}.log",
    wildcard_constraints:
        analyzer="native|written",
    params:
        evaluate=EVAL,
        bench=config["bench"],
        machine=config["machine"],
        workdir=f"{EDIR}/work-{{analyzer}}",
    threads: 1
    priority: MEASURING_PRIORITY
    resources:
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_predict.py"


rule eval_latency:
    input:
        forms=FORMS,
        suite_forms=EVAL_SUITE_FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        table=EVAL_LATENCY,
    log:
        f"{LOGS}/evaluate/latency.log",
    params:
        bench=config["bench"],
        machine=config["machine"],
        workdir=f"{EDIR}/work-latency",
    threads: 1
    priority: MEASURING_PRIORITY
    resources:
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/latency.py"


rule eval_predict_loop:
    input:
        blocks=eval_benchmark_files(EVAL_BLOCKS),
        latency=EVAL_LATENCY,
        native=expand(eval_benchmark_files(EVAL_PRED), analyzer="native", allow_missing=True),
        # the block as written, where the multiset cannot be generated (when it runs)
        written=lambda wildcards: (
            expand(eval_benchmark_files(EVAL_PRED), mid=wildcards.mid, analyzer="written")
            if "written" in eval_analyzers_run() else []
        ),
    output:
        predictions=eval_benchmark_files(EVAL_PRED),
        meta=EVAL_PRED_META,
    log:
        f"{LOGS}/evaluate/predict-{{analyzer}}.log",
    wildcard_constraints:
        analyzer="loop",
    params:
        evaluate=EVAL,
    threads: 1
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_predict.py"


rule eval_cachegrind:
    input:
        binary=suite_binary,
    output:
        result=EVAL_CACHEGRIND,
    log:
        f"{LOGS}/evaluate/cachegrind-{{bench}}.log",
    wildcard_constraints:
        bench=r"[A-Za-z0-9_]+\.[A-Za-z0-9_+-]+",
    params:
        # the problem size the cycles are measured with (suite.n, else the driver's default)
        n=lambda wildcards: config["suite"]["n"].get(wildcards.bench.partition(".")[0]),
        reps=EVAL["cachegrind_reps"],
        timeout_s=EVAL["cachegrind_timeout_s"],
    threads: 1
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_cachegrind.py"


rule eval_metrics:
    input:
        blocks=eval_benchmark_files(EVAL_BLOCKS),
        counts=eval_benchmark_files(EVAL_COUNTS),
        cycles=eval_benchmark_files(EVAL_CYCLES),
        predictions=eval_predictions,
        meta=eval_prediction_meta,
        cachegrind=eval_cachegrind_files,
    output:
        kernels=report(EVAL_KERNELS, caption="../report/eval_kernels.rst",
                       category="Analyzer evaluation"),
        metrics=report(EVAL_METRICS, caption="../report/eval_metrics.rst",
                       category="Analyzer evaluation"),
        metrics_json=EVAL_METRICS_JSON,
    log:
        f"{LOGS}/evaluate/metrics.log",
    params:
        evaluate=EVAL,
        model_enabled=config["model"]["enabled"],
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_metrics.py"


rule eval_report:
    input:
        kernels=EVAL_KERNELS,
        metrics=EVAL_METRICS,
        metrics_json=EVAL_METRICS_JSON,
        predictions=eval_predictions,
        blocks=eval_benchmark_files(EVAL_BLOCKS),
        counts=eval_benchmark_files(EVAL_COUNTS),
        machine=MACHINE_JSON,
        # the blocks mixing legacy SSE and 256-bit AVX, and what a switch costs here
        forms=FORMS,
        sse_avx=SSE_AVX,
        # evaluated when the DAG is built, after every rule file extended the list
        extra=lambda wildcards: [p.format(mid=wildcards.mid) for p in EVAL_REPORT_EXTRA],
    output:
        html=report(EVAL_REPORT, caption="../report/eval_report.rst",
                    category="Analyzer evaluation"),
        plots=report(directory(EVAL_PLOTS), patterns=["{name}.png"],
                     caption="../report/eval_plots.rst", category="Analyzer evaluation"),
    log:
        f"{LOGS}/evaluate/report.log",
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_report.py"


localrules:
    eval_all,


rule eval_all:
    # The evaluation's end products for this machine: `snakemake eval_all`; rule all can take
    # rules.eval_all.input.
    input:
        report=expand(EVAL_REPORT, mid=MACHINE_ID),
        metrics=expand(EVAL_METRICS, mid=MACHINE_ID),
        suite_forms=expand(EVAL_SUITE_FORMS, mid=MACHINE_ID),
