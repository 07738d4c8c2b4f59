"""The Parquet measurement database: one row per repetition, append-only.

A database is a directory of parts ``<dir>/part-<batch_id>.parquet``. Appending
writes one new part atomically (``cpumap.store.files``); existing parts are never
rewritten, so a crash, a rerun or a concurrent job cannot damage earlier raw
measurements, and backing up or merging databases from several machines is a
plain file copy. Every model, table and plot is derived from these rows
(DESIGN §7), so the schema is strict: a part with other columns or types is
rejected with its path; columns added later (``OPTIONAL``) read with their
documented default from parts written before them.

Estimates are made only when reading (``cpumap.measure.estimate.aggregate``):
the raw repetitions are the asset and are never replaced by their summary.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from cpumap.store.files import (
    CorruptFileError,
    read_parquet_schema_checked,
    read_parquet_table_checked,
    write_table_atomic,
)

__all__ = [
    "COLUMNS",
    "SCHEMA",
    "SchemaMismatchError",
    "OPTIONAL",
    "REPEAT_PREFIX",
    "append",
    "batch_key",
    "canonical_json",
    "conform",
    "empty_frame",
    "iter_parts",
    "load",
    "load_parts",
    "measured_keys",
    "params_id",
    "part_path",
    "part_paths",
    "read_part",
    "read_part_table",
    "to_table",
]

#: Exact columns and types of a database row (see CONTRACTS: one row per repetition).
SCHEMA = pa.schema(
    [
        pa.field("machine_id", pa.string()),
        pa.field("host", pa.string()),
        pa.field("backend", pa.string()),  # 'native' | 'simulated'
        pa.field("kernel_id", pa.string()),
        pa.field("kernel", pa.string()),  # canonical multiset text 'FORM_A*2 FORM_B'
        pa.field("n_insns", pa.int64()),  # instructions per kernel instance
        pa.field("params_id", pa.string()),
        pa.field("params", pa.string()),  # canonical JSON of the generator/bench parameters
        pa.field("harness_version", pa.string()),
        pa.field("batch_id", pa.string()),
        pa.field("rep", pa.int64()),
        pa.field("status", pa.string()),  # 'ok' | 'failed'
        pa.field("error", pa.string()),
        pa.field("clock", pa.string()),  # 'papi' | 'tsc-calibrated' | 'simulated' ...
        pa.field("insn_source", pa.string()),  # 'counted' | 'derived'
        pa.field("ticks1", pa.int64()),
        pa.field("ticks2", pa.int64()),
        pa.field("cycles1", pa.int64()),
        pa.field("cycles2", pa.int64()),
        pa.field("calib_ratio", pa.float64()),  # core cycles per TSC tick; NaN with papi
        pa.field("instances", pa.int64()),
        pa.field("instructions", pa.int64()),  # in the f2 - f1 difference
        pa.field("cycles", pa.float64()),  # core cycles of the f2 - f1 difference
        pa.field("cycles_per_instance", pa.float64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        # added with the adaptive harness (parts written before read them as OPTIONAL says)
        pa.field("cal1", pa.int64()),  # ticks of the n-add calibration chain before this rep
        pa.field("cal2", pa.int64()),  # ... and of the 2n-add chain (null: no sample here)
        pa.field("cal_adds", pa.int64()),  # adds the 2n chain has more than the n chain
        pa.field("stable", pa.bool_()),  # the harness stopped at a stability checkpoint
        pa.field("role", pa.string()),  # 'kernel' | 'monitor' (noise reference of a batch)
        pa.field("round", pa.int64()),  # which of the batch's harness passes measured it
        # core cycles per TSC tick while this repetition ran (clocklevels.local_ratios)
        pa.field("local_ratio", pa.float64()),
        # the lower of the two samples' own ratios around its run (clocklevels.local_ratios)
        pa.field("run_ratio_low", pa.float64()),
    ]
)
COLUMNS: list[str] = list(SCHEMA.names)
#: Columns a part written before they existed lacks, and the value its rows read as.
OPTIONAL: dict[str, Any] = {"cal1": None, "cal2": None, "cal_adds": None, "stable": None,
                            "role": "kernel", "round": None, "local_ratio": None,
                            "run_ratio_low": None}

_PART_RE = re.compile(r"^part-(?P<batch>[A-Za-z0-9._-]+)\.parquet$")
_BATCH_RE = re.compile(r"^[A-Za-z0-9._-]+$")


class SchemaMismatchError(ValueError):
    """Rows (or a stored part) do not have exactly the database columns and types."""


# --------------------------------------------------------------------------- ids


def canonical_json(obj: Any) -> str:
    """The one JSON text of ``obj`` used for hashing and for the ``params`` column."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def params_id(params: dict[str, Any]) -> str:
    """Short sha256 (12 hex digits) of the canonical JSON of ``params``.

    Key order does not matter; values do (``1`` and ``1.0`` are different JSON).
    """
    return hashlib.sha256(canonical_json(params).encode()).hexdigest()[:12]


def batch_key(index: int, kernels: Iterable[str]) -> str:
    """Name of batch ``index`` of a plan: its position plus a hash of its kernel list.

    The hash makes a changed plan produce new part names instead of silently
    replacing the parts (and raw data) of the old plan.
    """
    digest = hashlib.sha256(canonical_json(list(kernels)).encode()).hexdigest()[:8]
    return f"{index:04d}-{digest}"


def part_path(db_dir: str | Path, batch_id: str) -> Path:
    """Path of the part holding batch ``batch_id``."""
    if not _BATCH_RE.match(batch_id):
        raise ValueError(f"invalid batch id {batch_id!r}: use letters, digits, '.', '_', '-'")
    return Path(db_dir) / f"part-{batch_id}.parquet"


#: How much older than ``modified_since`` a part's file must be to be left out: a margin for
#: file systems whose times are coarse or a little behind the clock the rows were stamped by.
MODIFIED_MARGIN_S = 60.0


def part_paths(db_dir: str | Path, *, batches: str | None = None,
               skip_batches: str | None = None,
               modified_since: float | None = None) -> list[Path]:
    """All parts of a database, sorted by name; temporary files are not parts. ``batches`` /
    ``skip_batches``: only the parts whose batch id starts with that prefix / all but those.
    ``modified_since`` (seconds since the epoch): only the parts whose file was written after
    it (less ``MODIFIED_MARGIN_S``). A part is written once, after its rows were measured, so
    an older file holds no row stamped after that time: what reads the last hour's rows of a
    database of months need not open the older parts."""
    d = Path(db_dir)
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.iterdir()):
        if not (_PART_RE.match(p.name) and p.is_file()):
            continue
        batch = p.name.removeprefix("part-")
        if (batches is None or batch.startswith(batches)) and \
                (skip_batches is None or not batch.startswith(skip_batches)) and \
                (modified_since is None
                 or p.stat().st_mtime >= modified_since - MODIFIED_MARGIN_S):
            out.append(p)
    return out


# --------------------------------------------------------------------------- writing


def empty_frame() -> pd.DataFrame:
    """A DataFrame with the database columns and no rows."""
    return SCHEMA.empty_table().to_pandas()


def to_table(rows: pd.DataFrame) -> pa.Table:
    """Convert rows to a table of exactly ``SCHEMA``; missing or extra columns are an error,
    except the ``OPTIONAL`` ones, which take their default."""
    absent = [c for c in OPTIONAL if c not in rows.columns]
    if absent:
        rows = rows.assign(**{c: OPTIONAL[c] for c in absent})
    missing = [c for c in COLUMNS if c not in rows.columns]
    extra = [c for c in rows.columns if c not in COLUMNS]
    if missing or extra:
        raise SchemaMismatchError(
            f"rows do not match the DB schema: missing {missing}, extra {extra}"
        )
    df = rows.loc[:, COLUMNS].copy()
    ts = pd.to_datetime(df["timestamp"], utc=True)
    df["timestamp"] = ts.dt.floor("us")
    try:
        return pa.Table.from_pandas(df, schema=SCHEMA, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
        raise SchemaMismatchError(f"rows cannot be converted to the DB schema: {exc}") from exc


def conform(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows with exactly the DB columns, in order and with the DB types.

    Columns that a kind of row does not have (a failed kernel has no ticks) are
    added as nulls; unknown columns are an error, so that a typo cannot create
    a column that silently never gets stored.
    """
    extra = [c for c in rows.columns if c not in COLUMNS]
    if extra:
        raise SchemaMismatchError(f"rows have columns that are not in the DB schema: {extra}")
    df = rows.copy()
    for name in COLUMNS:
        if name not in df.columns:
            df[name] = pd.Series([None] * len(df), index=df.index, dtype="object")
    return to_table(df).to_pandas()


def append(
    db_dir: str | Path, rows_df: pd.DataFrame, batch_id: str | None = None, *, replace: bool = False
) -> Path:
    """Store ``rows_df`` as a new part of the database in ``db_dir``; returns the part's path.

    ``batch_id`` defaults to the single value of the rows' ``batch_id`` column.
    An existing part is never overwritten unless ``replace`` is true (Snakemake
    deletes a job's output before rerunning it, so reruns need no ``replace``).
    """
    table = to_table(rows_df)
    ids = set(rows_df["batch_id"].dropna().unique()) if len(rows_df) else set()
    if batch_id is None:
        if len(ids) != 1:
            raise ValueError(f"cannot infer one batch id from rows (found {sorted(ids)})")
        batch_id = str(next(iter(ids)))
    elif ids - {batch_id}:
        raise ValueError(f"rows carry batch ids {sorted(ids)} but are stored as {batch_id!r}")
    path = part_path(db_dir, batch_id)
    if path.exists() and not replace:
        raise FileExistsError(f"database part already exists, not overwriting: {path}")
    return write_table_atomic(table, path)


# --------------------------------------------------------------------------- reading


def _read_part(path: Path, columns: list[str] | None = None) -> pa.Table:
    """Read one part (only ``columns`` if given) and check it against ``SCHEMA``."""
    wanted = COLUMNS if columns is None else columns
    names = read_parquet_schema_checked(path).names
    missing = [c for c in wanted if c not in names and c not in OPTIONAL]
    if missing:
        raise CorruptFileError(path, f"not a cpumap DB part: missing columns {missing}")
    present = [c for c in wanted if c in names]
    table = read_parquet_table_checked(path, columns=present).select(present)
    for c in wanted:
        if c not in names:  # an older part: the column's documented default
            value = pa.array([OPTIONAL[c]] * table.num_rows, type=SCHEMA.field(c).type)
            table = table.append_column(SCHEMA.field(c), value)
    table = table.select(wanted)
    expected = pa.schema([SCHEMA.field(c) for c in wanted])
    if not table.schema.equals(expected):
        try:
            table = table.cast(expected)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise CorruptFileError(path, f"column types differ from the DB schema: {exc}") from exc
    return table


def load_parts(
    paths: Iterable[str | Path], machine_id: str | None = None, columns: list[str] | None = None
) -> pd.DataFrame:
    """Rows of the given parts (optionally of one machine only); a corrupt part names itself."""
    tables = [_read_part(Path(p), columns) for p in paths]
    schema = SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    if machine_id is not None and "machine_id" in table.schema.names:
        table = table.filter(pc.equal(table["machine_id"], machine_id))
    return table.to_pandas()


def iter_parts(
    db_dir: str | Path, columns: list[str] | None = None, *, batches: str | None = None,
    skip_batches: str | None = None, modified_since: float | None = None, **equal: str
) -> Iterator[tuple[Path, pd.DataFrame]]:
    """(path, rows) of each part in turn, only the rows whose columns equal the ``equal``
    values (compared before the rows become a DataFrame): what reads a database larger than
    memory, one part at a time (a full-profile campaign holds tens of millions of rows; as
    one DataFrame, 0.7 kB each, more than this machine has). ``batches``, ``skip_batches``,
    ``modified_since``: as for :func:`part_paths`."""
    for path in part_paths(db_dir, batches=batches, skip_batches=skip_batches,
                           modified_since=modified_since):
        yield path, read_part(path, columns, **equal)


def read_part_table(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """One part as a pyarrow table (only ``columns`` if given), checked against ``SCHEMA``."""
    return _read_part(Path(path), columns)


def read_part(path: str | Path, columns: list[str] | None = None, **equal: str) -> pd.DataFrame:
    """The rows of one part whose columns equal the ``equal`` values (``iter_parts``)."""
    table = _read_part(Path(path), columns)
    for name, value in equal.items():
        table = table.filter(pc.equal(table[name], value))
    return table.to_pandas()


#: Batches that measure kernels a second time on purpose (the validation's run-to-run floor)
#: have ids starting with this: estimates leave them out (they are compared with the first
#: measurement, not pooled into it); archives and merges keep them like every row.
REPEAT_PREFIX = "repeat-"


def load(db_dir: str | Path, machine_id: str | None = None, *,
         repeats: bool = False) -> pd.DataFrame:
    """All rows of the database in ``db_dir`` (empty if the directory does not exist yet),
    without the repeat batches (``REPEAT_PREFIX``) unless ``repeats``."""
    skip = None if repeats else REPEAT_PREFIX
    return load_parts(part_paths(db_dir, skip_batches=skip), machine_id=machine_id)


def measured_keys(
    db_dir: str | Path, machine_id: str, params_id: str, harness_version: str
) -> set[str]:
    """Kernel ids with at least one ``ok`` row for this machine, parameters and harness.

    These need not be measured again (DESIGN §7); failed kernels are retried. A batch's noise
    monitor (role ``monitor``) does not count as a measurement of its kernel.
    """
    cols = ["machine_id", "kernel_id", "params_id", "harness_version", "status", "role"]
    keys: set[str] = set()
    # filtered in Arrow, part by part, distinct ids only: every measuring job of a campaign
    # asks, and as one DataFrame the 22 million rows a full profile holds by its last
    # mapping batch took 12 s a job (Emerald Rapids-class guest, 2026-11-29)
    for path in part_paths(db_dir):
        t = _read_part(path, cols)
        mask = pc.and_(
            pc.and_(pc.equal(t["machine_id"], machine_id), pc.equal(t["params_id"], params_id)),
            pc.and_(pc.equal(t["harness_version"], harness_version),
                    pc.equal(t["status"], "ok")))
        # a null role (an older part's rows) is a kernel's, as ``role != "monitor"`` reads it
        mask = pc.and_(mask, pc.invert(pc.fill_null(pc.equal(t["role"], "monitor"), False)))
        keys.update(pc.unique(t["kernel_id"].filter(mask)).to_pylist())
    return keys
