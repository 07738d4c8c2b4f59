"""Rule eval_suite_forms: the distinct measurable catalogue forms of all suite blocks.

The model stage reads this list so that the model covers the forms real code uses.
"""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.evaluate import blocks
from cpumap.isa import catalogue
from cpumap.store import files

catalogue = catalogue.Catalogue.load(Path(snakemake.input.forms))
forms = blocks.suite_forms(list(snakemake.input.blocks), catalogue)
files.write_text_atomic("".join(f"{f}\n" for f in forms), snakemake.output.forms)
print(f"{len(forms)} distinct measurable forms in {len(snakemake.input.blocks)} blocks tables")
