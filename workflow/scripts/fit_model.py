"""Rule fit_model: Palmed on the measured forms; model.json, mapping table and statistics."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))
sys.path.insert(0, str(Path(snakemake.scriptdir)))

from cpumap.io import redirect_output  # noqa: E402

redirect_output(snakemake.log[0])

from model_common import measurer_and_forms  # noqa: E402

from cpumap import modelling  # noqa: E402

measurer, forms, noise, machine, extra_left = measurer_and_forms(snakemake)
forms, left_out = modelling.modelable(measurer.forms, forms)
left_out |= extra_left
for name, reason in sorted(left_out.items()):
    print(f"not modelled: {name}: {reason}", flush=True)
cfg = modelling.palmed_config(snakemake.params.model, noise)
print(f"modelling {len(forms)} forms of {machine['machine_id']} (tol {cfg.tol})", flush=True)
model, stats = modelling.fit(forms, measurer, cfg, lambda message: print(message, flush=True))
stats["not_modelled"] = left_out
modelling.write_model(model, stats, Path(snakemake.output.model), Path(snakemake.output.table),
                      Path(snakemake.output.stats))
print(f"{len(model.resources)} resources; kernels per stage {stats['kernels']}; "
      f"measured now {stats['measured_now']}")
