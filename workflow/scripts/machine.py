"""Rule machine: describe the host CPU and write machine.json."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.host.machine import write_machine_json

desc = write_machine_json(snakemake.output.json, machine_config=dict(snakemake.params.machine))
print(f"machine id: {desc['machine_id']}")
# The Snakefile computed the id from /proc/cpuinfo at parse time; results must not be
# filed under another machine's id (e.g. a results/ copied from another host).
if desc["machine_id"] != snakemake.wildcards.mid:
    raise SystemExit(
        f"this host is machine {desc['machine_id']!r}, not {snakemake.wildcards.mid!r}: "
        "measure a machine on that machine"
    )
