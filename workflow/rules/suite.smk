# Real-kernel suite of the analyzer evaluation (issue 4): build each kernel with each flag
# set (suite_build), split it into basic blocks (suite_blocks), count the blocks' occurrences
# in one invocation with gdb (suite_count), and measure the whole kernel's cycles (suite_cycles).
# Paths and SUITE_BENCHMARKS are in common.smk.


rule suite_build:
    input:
        src="kernels/{kernel}.c",
        driver="kernels/driver.c",
        header="kernels/driver.h",
        clock="harness/cpumap_clock.h",
    output:
        bin=f"{RESULTS}/{{mid}}/suite/bin/{{kernel}}.{{flagset}}",
        meta=f"{RESULTS}/{{mid}}/suite/bin/{{kernel}}.{{flagset}}.json",
    log:
        f"{LOGS}/suite/build-{{kernel}}.{{flagset}}.log",
    wildcard_constraints:
        kernel=r"[A-Za-z0-9_]+",
        flagset=r"[A-Za-z0-9_+-]+",
    params:
        flags=lambda wildcards: config["suite"]["flagsets"][wildcards.flagset],
        common=config["suite"]["common_flags"],
    priority: SUITE_BLOCKS_PRIORITY
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/suite_build.py"


if SUITE_BENCHMARKS:

    rule suite_blocks:
        # every benchmark's basic blocks (Capstone, no run) in one job: with model.suite_forms
        # the model's chain waits for them, and not for the counting under gdb (36 jobs of
        # 2-3 s: the chain's first stage started 77 s into a default run when it waited for
        # those, busy Sapphire Rapids-class guest, 2026-12-02)
        input:
            binaries=suite_binaries,
            forms=FORMS,
        output:
            blocks=eval_benchmark_files(EVAL_BLOCKS),
        log:
            f"{LOGS}/suite/blocks.log",
        params:
            benchmarks=SUITE_BENCHMARKS,
            user=SUITE_USER,
        priority: SUITE_BLOCKS_PRIORITY
        conda:
            "../../envs/cpumap.yaml"
        script:
            "../scripts/suite_blocks.py"


rule suite_count:
    # the blocks' exact occurrences in one kernel invocation (gdb + flow conservation)
    input:
        binary=suite_binary,
        blocks=EVAL_BLOCKS,
    output:
        counts=EVAL_COUNTS,
        meta=EVAL_COUNTS_META,
    log:
        f"{LOGS}/suite/count-{{bench}}.log",
    wildcard_constraints:
        bench=r"[A-Za-z0-9][A-Za-z0-9._+-]*",
    params:
        user=lambda wildcards: SUITE_USER.get(wildcards.bench),
        n=config["suite"]["n"],
        timeout=config["suite"]["count_timeout_s"],
        all_blocks=config["suite"]["count_all_blocks"],
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/suite_count.py"


rule suite_cycles:
    input:
        binary=suite_binary,
    output:
        cycles=EVAL_CYCLES,
    log:
        f"{LOGS}/suite/cycles-{{bench}}.log",
    wildcard_constraints:
        bench=r"[A-Za-z0-9][A-Za-z0-9._+-]*",
    params:
        user=lambda wildcards: SUITE_USER.get(wildcards.bench),
        n=config["suite"]["n"],
        reps=config["suite"]["reps"],
        cpu=config["suite"]["cpu"],
        min_ticks=config["suite"]["min_sample_ticks"],
        processes=config["suite"]["processes"],
        max_processes=config["suite"]["max_processes"],
    threads: 1
    priority: MEASURING_PRIORITY
    resources:
        # whole-kernel cycles are a measurement: each driver process takes the measuring
        # lock while it runs (the whole job without the lock: common.smk)
        measure_slots=ROUND_MEASURE_SLOTS,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/suite_cycles.py"


localrules:
    suite_all,


rule suite_all:
    # Every suite output for this machine: `snakemake suite_all`; rule all can take
    # rules.suite_all.input.
    input:
        blocks=expand(EVAL_BLOCKS, mid=MACHINE_ID, bench=SUITE_BENCHMARKS),
        counts=expand(EVAL_COUNTS, mid=MACHINE_ID, bench=SUITE_BENCHMARKS),
        cycles=expand(EVAL_CYCLES, mid=MACHINE_ID, bench=SUITE_BENCHMARKS),
