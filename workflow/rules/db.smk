# Stage 3: tables derived from the measurement database.


rule singleton_summary:
    input:
        parts=singleton_parts,
        plan=SINGLETON_PLAN,
        forms=FORMS,
    output:
        summary=SINGLETON_SUMMARY,
        singletons=SINGLETON_TABLE,
    log:
        f"{LOGS}/singleton_summary.log",
    params:
        bench=config["bench"],
        machine=config["machine"],
    priority: MODEL_PRIORITY
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/singleton_summary.py"


rule noise_monitor:
    input:
        after=noise_monitor_after,
    output:
        table=NOISE_TABLE,
        section=NOISE_SECTION,
        summary=NOISE_SUMMARY,
    log:
        f"{LOGS}/noise_monitor.log",
    params:
        bench=config["bench"],
        db_dir=lambda wildcards: f"{RESULTS}/{wildcards.mid}/db",
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/noise_monitor.py"


if NATIVE and config["bench"]["monitor"]:
    EVAL_REPORT_EXTRA.append(NOISE_SECTION)
