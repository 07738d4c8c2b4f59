"""Merge measurement databases from several machines or nodes into one results directory.

Identical nodes share a machine id (``cpumap.host.machine``), so they can split a campaign
(DESIGN §11) and their raw rows end up in one database per machine id, whose model then uses
every row (``db.load`` reads all parts of the id). A row is identified by its natural key
``ROW_KEY``: the machine, the host that measured it, the kernel, the measuring parameters
and harness, the batch, the repetition and the batch's timestamp. Two nodes running the same
plan write parts with the same name but different hosts and times: both are kept. The same
part arriving twice, or the same rows in a part of another name, add nothing.

Merging only ever adds files: a source part whose rows are all new and whose name is free is
copied byte for byte (so Snakemake finds a planned batch in place); otherwise its new rows are
written as a new part named after the source part and a hash of those rows, which makes a
repeated merge a no-op. Rows of different machine ids go to their own ``<id>/db``. A
damaged source or destination part stops the merge with its path before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cpumap.store import db
from cpumap.store.files import write_table_atomic

__all__ = ["ROW_KEY", "MergeReport", "find_databases", "merge", "row_keys"]

#: Columns that identify one stored repetition.
ROW_KEY = ["machine_id", "host", "kernel_id", "params_id", "harness_version", "batch_id",
           "rep", "timestamp"]
#: Per-machine files copied along with the rows when the destination lacks them.
DESCRIPTIONS = ["machine.json", "isa/forms.parquet"]


@dataclass
class MergeReport:
    """What a merge did, per destination machine id."""

    parts_copied: list[str] = field(default_factory=list)
    parts_written: list[str] = field(default_factory=list)
    parts_skipped: list[str] = field(default_factory=list)
    rows_added: dict[str, int] = field(default_factory=dict)
    rows_duplicate: int = 0
    files_copied: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"parts_copied": self.parts_copied, "parts_written": self.parts_written,
                "parts_skipped": self.parts_skipped, "rows_added": self.rows_added,
                "rows_duplicate": self.rows_duplicate, "files_copied": self.files_copied}


def row_keys(rows: pd.DataFrame) -> pd.Series:
    """One hashable key per row (a tuple of the ``ROW_KEY`` columns)."""
    if rows.empty:
        return pd.Series([], dtype="object")
    keyed = rows.loc[:, ROW_KEY].copy()
    keyed["timestamp"] = pd.to_datetime(keyed["timestamp"], utc=True).astype("int64")
    return pd.Series(list(keyed.itertuples(index=False, name=None)), index=rows.index)


def find_databases(src: Path) -> list[Path]:
    """Database directories under ``src``: a results dir, a machine dir or a db dir itself."""
    src = Path(src)
    if not src.is_dir():
        raise FileNotFoundError(f"no such results or database directory: {src}")
    if db.part_paths(src):
        return [src]
    if (src / "db").is_dir():
        return [src / "db"]
    found = sorted(d / "db" for d in src.iterdir() if d.is_dir() and (d / "db").is_dir())
    if not found:
        raise FileNotFoundError(f"{src} holds no measurement database (no part-*.parquet, "
                                "no db/ and no <machine-id>/db/)")
    return found


def _copy_atomic(src: Path, dest: Path) -> None:
    """Copy a file to ``dest`` through a temporary file in the same directory."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp",
                                     delete=False) as tmp:
        with open(src, "rb") as handle:
            shutil.copyfileobj(handle, tmp)
        tmp.flush()
    Path(tmp.name).replace(dest)


def merge(sources: list[Path | str], into: Path | str) -> MergeReport:
    """Merge the databases of ``sources`` into the results directory ``into``."""
    dest = Path(into)
    report = MergeReport()
    parts = [p for s in sources for d in find_databases(Path(s)) for p in db.part_paths(d)]
    # read everything first: a damaged part (source or destination) stops the merge untouched
    loaded = [(p, db.load_parts([p])) for p in parts]
    known: dict[str, set] = {}

    def known_keys(machine_id: str) -> set:
        if machine_id not in known:
            mdb = dest / machine_id / "db"
            known[machine_id] = (set(row_keys(db.load(mdb, repeats=True))) if mdb.is_dir()
                                 else set())
        return known[machine_id]

    for machine_id in sorted({m for _, rows in loaded for m in rows["machine_id"].unique()}):
        known_keys(str(machine_id))
    for path, rows in loaded:
        if rows.empty:
            report.parts_skipped.append(str(path))
            continue
        keys = row_keys(rows)
        for machine_id, group in rows.groupby("machine_id", sort=True):
            mid = str(machine_id)
            have = known[mid]
            gkeys = keys.loc[group.index]
            fresh = ~gkeys.isin(have) & ~gkeys.duplicated()
            new = group.loc[fresh]
            report.rows_duplicate += int((~fresh).sum())
            if new.empty:
                report.parts_skipped.append(str(path))
                continue
            mdb = dest / mid / "db"
            target = mdb / path.name
            single = len(new) == len(rows)
            if single and not target.exists():
                _copy_atomic(path, target)
                report.parts_copied.append(str(target))
            else:
                digest = hashlib.sha256(
                    json.dumps(sorted(map(str, gkeys[fresh]))).encode()).hexdigest()[:8]
                stem = path.name[len("part-"):-len(".parquet")]
                target = mdb / f"part-{stem}.m{digest}.parquet"
                if target.exists():
                    report.parts_skipped.append(str(path))
                    continue
                write_table_atomic(db.to_table(new.reset_index(drop=True)), target)
                report.parts_written.append(str(target))
            have.update(gkeys[fresh])
            report.rows_added[mid] = report.rows_added.get(mid, 0) + len(new)
            src_root = path.parent.parent
            for rel in DESCRIPTIONS:
                if (src_root / rel).is_file() and not (dest / mid / rel).exists() \
                        and src_root.name == mid:
                    _copy_atomic(src_root / rel, dest / mid / rel)
                    report.files_copied.append(str(dest / mid / rel))
    return report
