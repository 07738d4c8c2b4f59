"""Rule corpus_blocks: the blocks of a BHive-format corpus, decoded and mapped to forms."""

import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.evaluate import corpus
from cpumap.isa.catalogue import Catalogue
from cpumap.store import files

sources = {Path(p).stem.removesuffix(".goto"): Path(p) for p in snakemake.input.sources}
if not sources:
    raise SystemExit("corpus.dir holds no <application>.csv files")
blocks = corpus.corpus_blocks(sources, Catalogue.load(Path(snakemake.input.forms)))
files.write_parquet_atomic(blocks, snakemake.output.blocks)
print(f"{len(blocks)} blocks of {len(sources)} applications "
      f"({blocks.code.nunique()} distinct)")
