# Stage 3: the resource model (Palmed) of the measured forms, and its held-out validation.
# Palmed's stages after the singletons choose their kernels from earlier measurements in
# data-dependent loops; they run in one job that stores every measurement in the DB as it is
# made (see cpumap.modelling), so a rerun rebuilds the model from the raw rows alone.
# Why not one checkpoint per stage: the core mapping and the refinement are loops of 5-16
# rounds whose next kernels depend on an LP solved over everything measured so far; as
# checkpoints each round would be a job re-reading the DB and re-solving the previous LPs
# (the core LPs are most of the fit's time on hardware), and the number of rounds is only
# known at the end. Each measurement round is one DB part (batch id palmedNNN-<hash>) and
# model/stats.json + model/report.md record, per stage, the kernels measured, measurement
# rounds, LP solves and seconds, and wall seconds.


rule fit_model:
    input:
        summary=SINGLETON_SUMMARY,
        plan=SINGLETON_PLAN,
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
        # model.extra_forms is an input when set: editing the list refits the model
        extra=lambda wildcards: [p] if (p := config["model"].get("extra_forms")) else [],
        # model.suite_forms: the forms of the real kernels' blocks, so that the evaluation's
        # model analyzer covers them
        suite_forms=lambda wildcards: (
            expand(EVAL_SUITE_FORMS, mid=wildcards.mid)
            if config["model"]["suite_forms"] and SUITE_ON
            else []
        ),
    output:
        model=MODEL_JSON,
        table=f"{MDIR}/model/mapping.tsv",
        stats=f"{MDIR}/model/stats.json",
    log:
        f"{LOGS}/fit_model.log",
    params:
        bench=config["bench"],
        machine=config["machine"],
        model=config["model"],
        workdir=f"{MDIR}/model/work",
    threads: 1
    resources:
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/fit_model.py"


rule validate_model:
    input:
        model=MODEL_JSON,
        plan=SINGLETON_PLAN,
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
        stats=f"{MDIR}/model/stats.json",
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
    resources:
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/validate_model.py"
