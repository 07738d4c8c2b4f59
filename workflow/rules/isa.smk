# Stage 1: the host description, the measuring harness and the instruction-form catalogue.


rule machine:
    output:
        json=MACHINE_JSON,
    log:
        f"{LOGS}/machine.log",
    params:
        machine=config["machine"],
    priority: MODEL_PRIORITY
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/machine.py"


rule harness:
    input:
        source="harness/papi_bench.c",
        clock="harness/cpumap_clock.h",
    output:
        bin=HARNESS_BIN,
    log:
        f"{LOGS}/harness.log",
    params:
        out_dir=lambda wildcards, output: str(Path(output.bin).parent),
    priority: MODEL_PRIORITY
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/build_harness.py"


rule catalogue:
    input:
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        forms=FORMS,
    log:
        f"{LOGS}/catalogue.log",
    params:
        workdir=f"{MDIR}/isa/work",
        smoke_run=config["catalogue"]["smoke_run"],
        bench=config["bench"],
        machine=config["machine"],
    priority: MODEL_PRIORITY
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/catalogue.py"


# Whether legacy-SSE and 256-bit AVX forms in one kernel cost a penalty per switch (Zen 2/3):
# the model and its validation then keep them apart, predictions add the measured cost.
rule sse_avx_probe:
    input:
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        json=SSE_AVX,
    log:
        f"{LOGS}/sse_avx_probe.log",
    params:
        bench=config["bench"],
        machine=config["machine"],
        workdir=f"{MDIR}/isa/work/sse-avx",
    priority: MODEL_PRIORITY
    resources:
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/sse_avx_probe.py"


# The dependence-chain latencies of every ok form (config latency.all_forms; the full profile).
rule latency_catalogue:
    input:
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        table=LATENCY_ALL,
    log:
        f"{LOGS}/latency_catalogue.log",
    params:
        bench=config["bench"],
        machine=config["machine"],
        workdir=f"{MDIR}/isa/work/latency",
    threads: 1
    priority: MEASURING_PRIORITY
    resources:
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/latency.py"
