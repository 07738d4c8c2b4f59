"""Rule corpus_merge: one analyzer's corpus predictions from its shards (one table, one
metadata file; cpumap.evaluate.corpus.merge_shards)."""

import json
import sys
from pathlib import Path

# Import the cpumap package of this checkout (also when it is not pip-installed).
sys.path.insert(0, str(Path(snakemake.scriptdir).parents[1] / "src"))

from cpumap.store.files import redirect_output

redirect_output(snakemake.log[0])

from cpumap.evaluate import analyzers as A
from cpumap.evaluate.corpus import merge_shards
from cpumap.store import files

tables = [files.read_parquet_checked(p) for p in snakemake.input.tables]
metas = [json.loads(Path(p).read_text(encoding="utf-8")) for p in snakemake.input.metas]
df, meta = merge_shards(tables, metas)
files.write_parquet_atomic(df, snakemake.output.table, A.PREDICTION_SCHEMA)
files.write_json_atomic(meta, snakemake.output.meta)
print(f"{snakemake.wildcards.analyzer}: {len(df)} rows from {len(tables)} shards, "
      f"{meta.get('failed_blocks', 0)} failed, {meta.get('seconds', 0):.1f} s in all, the "
      f"longest shard {meta.get('shard_seconds_max', 0):.1f} s")
