"""Rule roofline_ceilings: ceilings.json from compute.json and the sweep rows (no measuring)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.io import redirect_output  # noqa: E402

redirect_output(snakemake.log[0])

import json  # noqa: E402

from cpumap.io import read_parquet_checked  # noqa: E402
from cpumap.roofline.build import make_ceilings, write_json  # noqa: E402

with open(snakemake.input.machine, encoding="utf-8") as handle:
    machine = json.load(handle)
with open(snakemake.input.compute, encoding="utf-8") as handle:
    compute = json.load(handle)
doc = make_ceilings(compute, read_parquet_checked(snakemake.input.sweep), machine,
                    snakemake.params.roofline)
write_json(doc, Path(snakemake.output.ceilings))
for scope, kinds in doc["bandwidth"].items():
    for kind, rec in kinds.items():
        levels = ", ".join(f"{lv['label']} {lv['bytes_per_cycle']:.1f} B/cyc {lv['gbs']:.1f} GB/s"
                           for lv in rec["levels"])
        print(f"{scope} {kind}: {levels}; problems: {rec['check']['problems']}")
