# Stage 2: singleton measurements. The plan is a checkpoint: the number of batches
# is known only once the catalogue exists. One job measures a whole batch.


checkpoint plan_singletons:
    input:
        forms=FORMS,
        quick_list=quick_list_input,
    output:
        plan=SINGLETON_PLAN,
    log:
        f"{LOGS}/plan_singletons.log",
    params:
        selection=config["selection"],
        batch_size=config["bench"]["batch_size"],
    priority: MODEL_PRIORITY
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/plan_singletons.py"


rule compile_batch:
    # Generation and compilation of a batch, a job of its own so that the next batch is
    # compiled on one core while the previous one is measured on the other (native only).
    input:
        plan=ancient(SINGLETON_PLAN),
        forms=FORMS,
        machine=MACHINE_JSON,
    output:
        prepared=temp(SINGLETON_COMPILED),
        so=temp(SINGLETON_SO),
    log:
        f"{LOGS}/measure/compile-{{batch}}.log",
    params:
        bench=config["bench"],
    threads: 1
    priority: MODEL_COMPILE_PRIORITY
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/compile_batch.py"


rule measure_batch:
    input:
        # ancient: a batch id is a hash of its kernels, so a plan rewritten with the same
        # batch must not rerun, and so delete, the part that holds its measurements
        plan=ancient(SINGLETON_PLAN),
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
        compiled=lambda wildcards: SINGLETON_COMPILED.format(**wildcards) if NATIVE else [],
        so=lambda wildcards: SINGLETON_SO.format(**wildcards) if NATIVE else [],
    output:
        part=SINGLETON_PART,
    log:
        f"{LOGS}/measure/singletons-{{batch}}.log",
    params:
        batch_id=lambda wildcards: f"singletons-{wildcards.batch}",
        bench=config["bench"],
        machine=config["machine"],
        workdir=lambda wildcards: f"{RESULTS}/{wildcards.mid}/bench/singletons/work/{wildcards.batch}",
    threads: 1
    priority: MODEL_PRIORITY
    resources:
        # One measuring job per measuring slot: the workflow profile sets
        # measure_slots=1 (at most one job measures at a time, so jobs never share
        # a core or perturb each other); raise it only with one free core per slot.
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/measure_batch.py"
