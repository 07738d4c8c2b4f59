# Stage 3: tables derived from the measurement database.


rule singleton_summary:
    input:
        parts=singleton_parts,
        forms=FORMS,
    output:
        summary=SINGLETON_SUMMARY,
        singletons=SINGLETON_TABLE,
    log:
        f"{LOGS}/singleton_summary.log",
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/singleton_summary.py"
