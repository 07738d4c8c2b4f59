# Real basic blocks at scale (issue 14): a BHive-format block corpus (the vendored sample by
# default, corpus.dir for a whole corpus), every analyzer on every block, compared with two
# ground truths measured here: the block as written (BHive's method) and its multiset
# (Palmed's). Paths are in common.smk (CORPUS_*); the logic is in cpumap.evaluate.corpus.


rule corpus_blocks:
    input:
        sources=CORPUS_SOURCES,
        forms=FORMS,
    output:
        blocks=CORPUS_BLOCKS,
    log:
        f"{LOGS}/corpus/blocks.log",
    params:
        # another corpus directory reruns the stage (its files may be older than the output)
        corpus=lambda wildcards, input: sorted({str(Path(p).parent) for p in input.sources}),
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/corpus_blocks.py"


rule corpus_predict_tool:
    input:
        blocks=CORPUS_BLOCKS,
        machine=MACHINE_JSON,
    output:
        table=CORPUS_SHARD,
        meta=CORPUS_SHARD_META,
    log:
        f"{LOGS}/corpus/predict-{{analyzer}}-{{shard}}.log",
    wildcard_constraints:
        analyzer="llvm-mca|osaca",
        shard=r"\d+",
    params:
        evaluate=EVAL,
        shards=CORPUS.get("shards", 1),
    threads: 1
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_predict.py"


rule corpus_predict_model:
    input:
        blocks=CORPUS_BLOCKS,
        model=MODEL_JSON,
        forms=FORMS,
    output:
        table=CORPUS_SHARD,
        meta=CORPUS_SHARD_META,
    log:
        f"{LOGS}/corpus/predict-{{analyzer}}-{{shard}}.log",
    wildcard_constraints:
        analyzer="model",
        shard=r"\d+",
    params:
        evaluate=EVAL,
        shards=CORPUS.get("shards", 1),
    threads: 1
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_predict.py"


rule corpus_predict_native:
    input:
        blocks=CORPUS_BLOCKS,
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        table=CORPUS_SHARD,
        meta=CORPUS_SHARD_META,
    log:
        f"{LOGS}/corpus/predict-{{analyzer}}-{{shard}}.log",
    wildcard_constraints:
        analyzer="native|written",
        shard=r"\d+",
    params:
        evaluate=EVAL,
        shards=CORPUS.get("shards", 1),
        bench=config["bench"],
        machine=config["machine"],
        workdir=f"{CDIR}/work-{{analyzer}}",
    threads: 1
    priority: MEASURING_PRIORITY
    resources:
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_predict.py"


rule corpus_merge:
    input:
        tables=corpus_shards("table"),
        metas=corpus_shards("meta"),
    output:
        table=CORPUS_PRED,
        meta=CORPUS_PRED_META,
    log:
        f"{LOGS}/corpus/merge-{{analyzer}}.log",
    wildcard_constraints:
        analyzer="model|native|written|llvm-mca|osaca",
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/corpus_merge.py"


rule corpus_latency:
    input:
        forms=FORMS,
        blocks=CORPUS_BLOCKS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        table=CORPUS_LATENCY,
    log:
        f"{LOGS}/corpus/latency.log",
    params:
        bench=config["bench"],
        machine=config["machine"],
        workdir=f"{CDIR}/work-latency",
    threads: 1
    priority: MEASURING_PRIORITY
    resources:
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/latency.py"


rule corpus_predict_loop:
    # the throughput bound is native's only: written is a ground truth here
    input:
        blocks=CORPUS_BLOCKS,
        latency=CORPUS_LATENCY,
        native=CORPUS_PRED.replace("{analyzer}", "native"),
    output:
        table=CORPUS_PRED,
        meta=CORPUS_PRED_META,
    log:
        f"{LOGS}/corpus/predict-{{analyzer}}.log",
    wildcard_constraints:
        analyzer="loop",
    params:
        evaluate=EVAL,
    threads: 1
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/evaluate_predict.py"


rule corpus_metrics:
    input:
        blocks=CORPUS_BLOCKS,
        predictions=corpus_predictions,
        meta=corpus_prediction_meta,
    output:
        metrics=report(CORPUS_METRICS, caption="../report/corpus_metrics.rst",
                       category="Real blocks (BHive corpus)"),
        metrics_json=CORPUS_METRICS_JSON,
        section=CORPUS_SECTION,
        plots=report(directory(CORPUS_PLOTS), patterns=["{name}.png"],
                     caption="../report/corpus_plots.rst",
                     category="Real blocks (BHive corpus)"),
    log:
        f"{LOGS}/corpus/metrics.log",
    params:
        corpus=CORPUS,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/corpus_metrics.py"


if CORPUS_ON and SUITE_ON:
    EVAL_REPORT_EXTRA.append(CORPUS_SECTION)
