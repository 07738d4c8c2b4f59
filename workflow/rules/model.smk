# Stage 3: the resource model (Palmed) of the measured forms, and its held-out validation.
# One job per Palmed stage (cpumap.model.palmed.build); each hands the next a state file
# (model/stages/<stage>.json: the kernels every stage asked for, classes, core mapping; no
# measurements: each job reads those from the DB). The two planned stages are checkpoints whose
# kernels are measured by parallel batch jobs (palmed_measure, as the singletons); the core
# mapping and the refinement measure their own rounds inside their job, because each round's
# kernels depend on an LP over everything measured so far. model/stats.json and
# model/report.md record, per stage, the kernels measured, measurement rounds, LP solves and
# seconds, and the seconds of each Palmed job.


checkpoint palmed_pairs:
    input:
        summary=SINGLETON_SUMMARY,
        plan=SINGLETON_PLAN,
        forms=FORMS,
        # the SSE/AVX switching penalty: where it exists, no kernel mixes the two
        sse_avx=SSE_AVX,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
        # model.extra_forms is an input when set: editing the list refits the model
        extra=lambda wildcards: [p] if (p := config["model"].get("extra_forms")) else [],
        # model.first_candidates: the forms taken first as pair candidates
        first=lambda wildcards: [p] if (p := config["model"].get("first_candidates")) else [],
        # model.suite_forms: the forms of the real kernels' blocks, so that the evaluation's
        # model analyzer covers them
        suite_forms=lambda wildcards: (
            expand(EVAL_SUITE_FORMS, mid=wildcards.mid)
            if config["model"]["suite_forms"] and SUITE_ON
            else []
        ),
    output:
        state=PALMED_STATE.format(pstage="pairs", mid="{mid}"),
        plan=PALMED_PLAN.format(pstage="pairs", mid="{mid}"),
    log:
        f"{LOGS}/palmed/pairs.log",
    params:
        stage="pairs",
        bench=config["bench"],
        machine=config["machine"],
        model=config["model"],
        workdir=f"{MDIR}/model/work/pairs",
    threads: 1
    priority: MODEL_PRIORITY
    resources:
        # with the measuring lock, none: it takes the lock around each timed round only
        # (cpumap.measure.slot), so that others measure while it solves its LPs
        measure_slots=ROUND_MEASURE_SLOTS,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/palmed_stage.py"


rule palmed_compile:
    # Generation and compilation of a Palmed batch, a job of its own as compile_batch is for
    # the singletons: the next batch compiles on one core while the other measures (a full
    # profile's 28 mapping batches of 5,000 kernels spent 505 s compiling inside their
    # measuring jobs, Emerald Rapids-class guest, 2026-11-29).
    input:
        plan=ancient(PALMED_PLAN),
        forms=FORMS,
        machine=MACHINE_JSON,
    output:
        prepared=temp(PALMED_COMPILED),
        so=temp(PALMED_SO),
    log:
        f"{LOGS}/measure/compile-palmed-{{pstage}}-{{batch}}.log",
    wildcard_constraints:
        pstage="pairs|mapping",
    params:
        bench=config["bench"],
    threads: 1
    priority: MODEL_COMPILE_PRIORITY
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/compile_batch.py"


rule palmed_measure:
    input:
        # ancient: a batch id is a hash of its kernels, so a plan rewritten with the same
        # batch (e.g. by a re-derivation from restored rows) must not rerun, and so delete,
        # the part that holds its measurements
        plan=ancient(PALMED_PLAN),
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
        compiled=lambda wildcards: PALMED_COMPILED.format(**wildcards) if NATIVE else [],
        so=lambda wildcards: PALMED_SO.format(**wildcards) if NATIVE else [],
    output:
        part=PALMED_PART,
    log:
        f"{LOGS}/measure/palmed-{{pstage}}-{{batch}}.log",
    wildcard_constraints:
        pstage="pairs|mapping",
    params:
        batch_id=lambda wildcards: f"palmed-{wildcards.pstage}-{wildcards.batch}",
        bench=config["bench"],
        machine=config["machine"],
        workdir=lambda wildcards: (
            f"{RESULTS}/{wildcards.mid}/model/work/{wildcards.pstage}-{wildcards.batch}"
        ),
    threads: 1
    priority: MODEL_PRIORITY
    resources:
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/measure_batch.py"


rule palmed_basic:
    input:
        state=PALMED_STATE.format(pstage="pairs", mid="{mid}"),
        parts=palmed_parts("pairs"),
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        state=PALMED_STATE.format(pstage="basic", mid="{mid}"),
    log:
        f"{LOGS}/palmed/basic.log",
    params:
        stage="basic",
        bench=config["bench"],
        machine=config["machine"],
        model=config["model"],
        workdir=f"{MDIR}/model/work/basic",
    threads: 1
    priority: MODEL_PRIORITY
    resources:
        # answers from the DB: a pair that is missing there (a lost part) is measured here;
        # none with the measuring lock: its rounds take the lock (ROUND_MEASURE_SLOTS)
        measure_slots=ROUND_MEASURE_SLOTS,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/palmed_stage.py"


rule palmed_core:
    input:
        state=PALMED_STATE.format(pstage="basic", mid="{mid}"),
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        state=PALMED_STATE.format(pstage="core", mid="{mid}"),
    log:
        f"{LOGS}/palmed/core.log",
    params:
        stage="core",
        bench=config["bench"],
        machine=config["machine"],
        model=config["model"],
        workdir=f"{MDIR}/model/work/core",
    threads: 1
    priority: MODEL_PRIORITY
    resources:
        # none with the measuring lock: its rounds take the lock (ROUND_MEASURE_SLOTS)
        measure_slots=ROUND_MEASURE_SLOTS,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/palmed_stage.py"


checkpoint palmed_mapping:
    input:
        state=PALMED_STATE.format(pstage="core", mid="{mid}"),
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        state=PALMED_STATE.format(pstage="mapping", mid="{mid}"),
        plan=PALMED_PLAN.format(pstage="mapping", mid="{mid}"),
    log:
        f"{LOGS}/palmed/mapping.log",
    params:
        stage="mapping",
        bench=config["bench"],
        machine=config["machine"],
        model=config["model"],
        workdir=f"{MDIR}/model/work/mapping",
    threads: 1
    priority: MODEL_PRIORITY
    resources:
        # none with the measuring lock: its rounds take the lock (ROUND_MEASURE_SLOTS)
        measure_slots=ROUND_MEASURE_SLOTS,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/palmed_stage.py"


rule fit_model:
    input:
        state=PALMED_STATE.format(pstage="mapping", mid="{mid}"),
        parts=palmed_parts("mapping"),
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        model=MODEL_JSON,
        table=f"{MDIR}/model/mapping.tsv",
        stats=f"{MDIR}/model/stats.json",
        training=f"{MDIR}/model/training_kernels.txt",
    log:
        f"{LOGS}/fit_model.log",
    params:
        stage="remaining",
        bench=config["bench"],
        machine=config["machine"],
        model=config["model"],
        workdir=f"{MDIR}/model/work/remaining",
    # the per-form LPs of noisy fitting passes run in FIT_THREADS processes, and the next
    # batch of a long request (the lighter proportions, a refinement round) compiles while
    # one measures
    threads: FIT_THREADS
    priority: MODEL_PRIORITY
    resources:
        # none with the measuring lock: its rounds take the lock (ROUND_MEASURE_SLOTS)
        measure_slots=ROUND_MEASURE_SLOTS,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/palmed_stage.py"


rule validate_model:
    input:
        model=MODEL_JSON,
        plan=SINGLETON_PLAN,
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
        stats=f"{MDIR}/model/stats.json",
        training=f"{MDIR}/model/training_kernels.txt",
    output:
        table=f"{MDIR}/model/validation.tsv",
        metrics=f"{MDIR}/model/validation.json",
        report=f"{MDIR}/model/report.md",
    log:
        f"{LOGS}/validate_model.log",
    params:
        bench=config["bench"],
        machine=config["machine"],
        model=config["model"],
        workdir=f"{MDIR}/model/work-validation",
    threads: 1
    priority: MODEL_PRIORITY
    resources:
        # none with the measuring lock: its rounds take the lock (ROUND_MEASURE_SLOTS)
        measure_slots=ROUND_MEASURE_SLOTS,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/validate_model.py"
