"""Which parts of a measurement database hold a kernel: an index kept beside the database.

Why: ``cpumap measure`` answers a stored kernel from the batch that measured it, and finding
that batch meant reading the key columns of every part (a default run's database: 48 parts,
6 million rows, 1.2 s; a full profile's is several times that) on every call. Parts are
written once and never rewritten (``cpumap.store.db``), so the kernel ids of a part are known
for good once read: the index records them per part, with the part's size and modification
time, and a later lookup reads only the parts it has not seen (or that changed: a part
replaced on purpose, ``db.append(..., replace=True)``). The index is derived data: a missing
or damaged one is rebuilt, one that cannot be written (a read-only archive) is only kept in
memory, and the database itself is never touched.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cpumap.store import db
from cpumap.store.files import write_table_atomic

#: The index's columns: one row per (part, kernel id); a part without rows has one row with a
#: null kernel id, so that it counts as read.
SCHEMA = pa.schema([pa.field("part", pa.string()), pa.field("size", pa.int64()),
                    pa.field("mtime_ns", pa.int64()), pa.field("kernel_id", pa.string())])


def _load(path: Path) -> pa.Table | None:
    """The stored index, or None where there is none or it cannot be read as one."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid):
        return None
    return table if table.schema.equals(SCHEMA) else None


def _entry(part: Path, stat: os.stat_result) -> pa.Table:
    """The index rows of one part: its distinct kernel ids."""
    ids = pc.unique(db.read_part_table(part, ["kernel_id"])["kernel_id"]).to_pylist() or [None]
    n = len(ids)
    return pa.table({"part": [part.name] * n, "size": [stat.st_size] * n,
                     "mtime_ns": [stat.st_mtime_ns] * n, "kernel_id": ids}, schema=SCHEMA)


def update(db_dir: str | Path, index_path: str | Path) -> pa.Table:
    """The index of every part of ``db_dir`` as it is now, written to ``index_path`` where
    it changed (atomically; not at all where it cannot be)."""
    parts = db.part_paths(db_dir)
    stats = {p.name: p.stat() for p in parts}
    old = _load(Path(index_path))
    kept = SCHEMA.empty_table()
    seen: set[str] = set()
    if old is not None and old.num_rows:
        # the rows of the parts that are still there, of the same size and time
        names = old["part"].to_pylist()
        sizes = old["size"].to_pylist()
        times = old["mtime_ns"].to_pylist()
        current = {n: (s, t) for n, s, t in zip(names, sizes, times, strict=True)
                   if n in stats and (stats[n].st_size, stats[n].st_mtime_ns) == (s, t)}
        mask = pa.array([n in current for n in names])
        kept = old.filter(mask)
        seen = set(current)
    fresh = [_entry(p, stats[p.name]) for p in parts if p.name not in seen]
    table = pa.concat_tables([kept, *fresh]) if fresh else kept
    if fresh or old is None or kept.num_rows != old.num_rows:
        try:
            Path(index_path).parent.mkdir(parents=True, exist_ok=True)
            write_table_atomic(table, index_path)
        except OSError:
            pass  # a read-only results directory: the index serves this call only
    return table


def parts_holding(db_dir: str | Path, kernel_id: str, index_path: str | Path, *,
                  skip_batches: str | None = None) -> list[Path]:
    """The parts of ``db_dir`` that hold rows of ``kernel_id``, sorted by name (those whose
    batch id starts with ``skip_batches`` left out, as ``db.part_paths`` does)."""
    table = update(db_dir, index_path)
    hits = table.filter(pc.equal(table["kernel_id"], kernel_id))
    names = sorted(set(hits["part"].to_pylist()))
    if skip_batches is not None:
        names = [n for n in names if not n.removeprefix("part-").startswith(skip_batches)]
    return [Path(db_dir) / n for n in names]
