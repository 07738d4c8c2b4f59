# Roofline (issue 5, seed 004): compute ceilings from generated kernels, bandwidth ceilings
# from a working-set sweep, kernel points of the real-kernel suite, plots and the report
# section. Paths are in common.smk (ROOF_*); the logic is in cpumap.roofline.


rule roofline_bw_build:
    input:
        source="harness/bw_sweep.c",
        clock="harness/cpumap_clock.h",
    output:
        bin=ROOF_BW_BIN,
    log:
        f"{LOGS}/roofline/bw_build.log",
    params:
        out_dir=lambda wildcards, output: str(Path(output.bin).parent),
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/roofline_bw_build.py"


rule roofline_compute:
    input:
        forms=FORMS,
        machine=MACHINE_JSON,
        harness=HARNESS_BIN,
    output:
        part=ROOF_COMPUTE_PART,
        compute=ROOF_COMPUTE,
    log:
        f"{LOGS}/roofline/compute.log",
    params:
        bench=config["bench"],
        roofline=ROOF,
        workdir=lambda wildcards: f"{RESULTS}/{wildcards.mid}/roofline/work/compute",
    threads: workflow.cores
    priority: MEASURING_PRIORITY
    resources:
        # the all-cores run occupies every core: nothing else may measure meanwhile
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/roofline_compute.py"


rule roofline_sweep:
    input:
        bin=ROOF_BW_BIN,
        machine=MACHINE_JSON,
    output:
        sweep=ROOF_SWEEP,
    log:
        f"{LOGS}/roofline/sweep.log",
    params:
        roofline=ROOF,
    threads: workflow.cores
    priority: MEASURING_PRIORITY
    resources:
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/roofline_sweep.py"


rule roofline_ceilings:
    input:
        compute=ROOF_COMPUTE,
        sweep=ROOF_SWEEP,
        machine=MACHINE_JSON,
    output:
        ceilings=ROOF_CEILINGS,
    log:
        f"{LOGS}/roofline/ceilings.log",
    params:
        roofline=ROOF,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/roofline_ceilings.py"


rule roofline_count:
    # the work (instructions, flops, bytes) of one kernel point size from valgrind or gdb: no
    # timing, so no measuring slot; one size a job, so that the model's chain gets the core
    # back within seconds (one job of every point held it 27 min of a full profile, the
    # mapping's compiling then waiting on its measuring: Sapphire Rapids-class guest,
    # 2026-12-02)
    input:
        binary=SUITE_BIN,
        machine=MACHINE_JSON,
    output:
        part=ROOF_COUNTS_PART,
    log:
        f"{LOGS}/roofline/counts/{{bench}}-n{{n}}.log",
    wildcard_constraints:
        bench=r"[A-Za-z0-9_]+\.[A-Za-z0-9_+-]+",
        n=r"[0-9]+",
    params:
        points=ROOF["points"],
    threads: 1
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/roofline_count.py"


rule roofline_counts:
    input:
        parts=roofline_count_parts,
    output:
        counts=ROOF_COUNTS,
    log:
        f"{LOGS}/roofline/counts.log",
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/roofline_counts.py"


rule roofline_points:
    input:
        binaries=lambda wildcards: expand(SUITE_BIN, mid=wildcards.mid,
                                          bench=roofline_point_benchmarks()),
        machine=MACHINE_JSON,
        counts=ROOF_COUNTS,
    output:
        points=ROOF_POINTS,
    log:
        f"{LOGS}/roofline/points.log",
    params:
        benchmarks=roofline_point_benchmarks(),
        points=ROOF["points"],
    threads: 1
    priority: MEASURING_PRIORITY
    resources:
        measure_slots=1,
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/roofline_points.py"


rule roofline_plots:
    input:
        ceilings=ROOF_CEILINGS,
        points=lambda wildcards: (ROOF_POINTS.format(mid=wildcards.mid)
                                  if roofline_point_benchmarks() else []),
    output:
        section=ROOF_SECTION,
        summary=ROOF_SUMMARY,
        plots=report(
            directory(ROOF_PLOTS),
            patterns=["{name}.png"],
            caption="../report/roofline_plots.rst",
            category="Roofline",
        ),
    log:
        f"{LOGS}/roofline/plots.log",
    conda:
        "../../envs/cpumap.yaml"
    script:
        "../scripts/roofline_plots.py"


if ROOF["enabled"]:
    EVAL_REPORT_EXTRA.append(ROOF_SECTION)
