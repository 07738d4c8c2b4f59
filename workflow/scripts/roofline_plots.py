"""Rule roofline_plots: the figures, the acceptance checks and the report section."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

import json

from cpumap.roofline import (
    build,
    plots,
    points,
    report,
)
from cpumap.store.files import read_parquet_checked, write_json_atomic, write_text_atomic

with open(snakemake.input.ceilings, encoding="utf-8") as handle:
    ceil = json.load(handle)
pts = (points.from_frame(read_parquet_checked(snakemake.input.points))
       if snakemake.input.points else None)
out = Path(snakemake.output.plots)
paths = plots.all_plots(ceil, pts, out)
print("\n".join(str(p) for p in paths))
checks = build.checks(ceil, pts)
for c in checks:
    print(("ok   " if c["ok"] else "FAIL ") + c["text"])
write_json_atomic({"checks": checks, "plots": [p.name for p in paths]}, snakemake.output.summary)
write_text_atomic(report.section_html(ceil, pts, out, checks), snakemake.output.section)
