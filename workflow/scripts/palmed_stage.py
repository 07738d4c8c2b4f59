"""Rules palmed_pairs, palmed_basic, palmed_core, palmed_mapping and fit_model: one Palmed
stage each (cpumap.model.jobs's *_job functions), chosen by params.stage."""

import json
import sys
import time
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))
sys.path.insert(0, str(Path(snakemake.scriptdir)))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.measure import slot

# the measuring lock of its results, taken around each timed round; a job of the model's
# chain: no other job measures between the rounds of its batches
slot.join_job(snakemake, whole=False, first=True)

from model_common import measurer_and_config

from cpumap.measure import campaign, transition
from cpumap.model import jobs
from cpumap.store import files

measurer, cfg, machine = measurer_and_config(snakemake)
stage = snakemake.params.stage
# each line with the job's elapsed time: fit_model runs for most of an hour on a full profile,
# and its log is the only record of where that hour went
t_start = time.monotonic()
job = jobs.StageJob(measurer, cfg, stage,
                    lambda message: print(f"[{time.monotonic() - t_start:7.1f} s] {message}",
                                          flush=True))
out, inp = snakemake.output, snakemake.input
batch_size = int(snakemake.params.model["batch_size"])
if stage == "pairs":
    planned = [k for batch in campaign.read_plan(inp.plan) for k in batch]
    forms, left_out = jobs.model_forms(measurer, planned, snakemake.params.model,
                                            list(inp.suite_forms))
    for name, reason in sorted(left_out.items()):
        print(f"not modelled: {name}: {reason}", flush=True)
    print(f"modelling {len(forms)} forms of {machine['machine_id']} (tol {cfg.tol})", flush=True)
    with open(inp.sse_avx, encoding="utf-8") as handle:
        sse_avx = json.load(handle)
    print(transition.summary(sse_avx), flush=True)
    # model.first_candidates: the pair candidates taken first (a form list file, or none)
    first = [f for path in inp.first for f in campaign.read_form_list(Path(path))]
    jobs.pairs_job(job, forms, left_out, Path(out.state), Path(out.plan), batch_size, sse_avx,
                   bool(snakemake.params.model.get("wide", True)), first)
elif stage == "basic":
    jobs.basic_job(job, Path(inp.state), Path(out.state))
elif stage == "core":
    jobs.core_job(job, Path(inp.state), Path(out.state))
elif stage == "mapping":
    jobs.mapping_job(job, Path(inp.state), Path(out.state), Path(out.plan), batch_size)
elif stage == "remaining":
    from cpumap.model.palmed.forms import set_lp_workers

    set_lp_workers(snakemake.threads)  # the per-form LPs of noisy fitting passes
    # the next batch of a long request (the lighter proportions, a refinement round)
    # compiles on the other core while one measures
    measurer.prepare_ahead = snakemake.threads > 1
    model, stats, training = jobs.fit_job(job, Path(inp.state))
    jobs.write_model(model, stats, Path(out.model), Path(out.table), Path(out.stats))
    files.write_text_atomic("".join(f"{k}\n" for k in training), Path(out.training))
    print(f"{len(model.resources)} resources; kernels per stage {stats['kernels']}")
else:
    raise SystemExit(f"unknown Palmed stage {stage!r}")
# the stage holds the measuring slot round by round: what it waited while others measured
print(f"waited {slot.waited_s():.1f} s for the measuring slot", flush=True)
