"""Rule roofline_ceilings: ceilings.json from compute.json and the sweep rows (no measuring)."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

import json

from cpumap.roofline.build import make_ceilings, write_json
from cpumap.store.files import read_parquet_checked

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
