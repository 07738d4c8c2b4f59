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
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/singleton_summary.py"
