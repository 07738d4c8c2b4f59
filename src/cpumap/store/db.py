"""The Parquet measurement database: one row per repetition, append-only.

A database is a directory of parts ``<dir>/part-<batch_id>.parquet``. Appending
writes one new part atomically (``cpumap.store.files``); existing parts are never
rewritten, so a crash, a rerun or a concurrent job cannot damage earlier raw
measurements, and backing up or merging databases from several machines is a
plain file copy. Every model, table and plot is derived from these rows
(DESIGN §7), so the schema is strict: a part with other columns or types is
rejected with its path.

Aggregation happens only when reading (``aggregate``): the raw repetitions
are the asset and are never replaced by their summary.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
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
    "aggregate",
    "append",
    "batch_key",
    "canonical_json",
    "conform",
    "empty_frame",
    "load",
    "load_parts",
    "measured_keys",
    "params_id",
    "part_path",
    "part_paths",
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
    ]
)
COLUMNS: list[str] = list(SCHEMA.names)

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


def part_paths(db_dir: str | Path) -> list[Path]:
    """All parts of a database, sorted by name; temporary files are not parts."""
    d = Path(db_dir)
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if _PART_RE.match(p.name) and p.is_file())


# --------------------------------------------------------------------------- writing


def empty_frame() -> pd.DataFrame:
    """A DataFrame with the database columns and no rows."""
    return SCHEMA.empty_table().to_pandas()


def to_table(rows: pd.DataFrame) -> pa.Table:
    """Convert rows to a table of exactly ``SCHEMA``; missing or extra columns are an error."""
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
    missing = [c for c in wanted if c not in names]
    if missing:
        raise CorruptFileError(path, f"not a cpumap DB part: missing columns {missing}")
    table = read_parquet_table_checked(path, columns=wanted).select(wanted)
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


def load(db_dir: str | Path, machine_id: str | None = None) -> pd.DataFrame:
    """All rows of the database in ``db_dir`` (empty if the directory does not exist yet)."""
    return load_parts(part_paths(db_dir), machine_id=machine_id)


def measured_keys(
    db_dir: str | Path, machine_id: str, params_id: str, harness_version: str
) -> set[str]:
    """Kernel ids with at least one ``ok`` row for this machine, parameters and harness.

    These need not be measured again (DESIGN §7); failed kernels are retried.
    """
    cols = ["machine_id", "kernel_id", "params_id", "harness_version", "status"]
    df = load_parts(part_paths(db_dir), columns=cols)
    mask = (
        (df["machine_id"] == machine_id)
        & (df["params_id"] == params_id)
        & (df["harness_version"] == harness_version)
        & (df["status"] == "ok")
    )
    return set(df.loc[mask, "kernel_id"].astype(str))


# --------------------------------------------------------------------------- aggregation

AGG_COLUMNS = [
    "machine_id",
    "kernel_id",
    "params_id",
    "kernel",
    "n_insns",
    "clock",
    "reps",
    "cycles_per_instance_median",
    "cycles_per_instance_min",
    "ipc",
    "f2_per_instance",
    "nonlinearity",
    "loops_disagree",
]

#: How far the f1 and f2 loops' cycles per instance may differ and still be taken as one speed
#: (then f2 - f1 cancels the call overhead). The overhead itself moves them apart by well under
#: 1 % (a few hundred cycles against calls of 200,000 instructions).
LOOPS_AGREE = 0.02


def per_instance(diff: pd.Series, loop1: pd.Series, loop2: pd.Series) -> pd.Series:
    """Cycles per kernel instance of each repetition: ``diff`` (f2 - f1, per instance) where
    the two loops ran at one speed, else the faster loop's own cycles per instance.

    Why: the difference is the marginal cost of U more instances only if the U-copy and the
    2U-copy loops run at the same speed per instance. On Zen 4 some kernels do not, in a way
    that depends on the loop body and changes from process to process (ADD m64,r64 x 4 with 10
    vector ALU ops: f1 at 4.0 cycles per instance, f2 at 5.4, so f2 - f1 = 6.7, the speed of
    neither loop; VCVTTPD2DQ xmm,ymm x 2: f2 at 1.33 in every process, f2 - f1 from 0.96 to 1.69
    between processes). The faster loop's speed, overhead included, is then the best measured
    bound of the throughput. Rows without timed calls (simulated machines) keep ``diff``.
    """
    faster = pd.concat([loop1, loop2], axis=1).min(axis=1, skipna=False)
    agree = (loop1 / loop2 - 1).abs() <= LOOPS_AGREE
    return diff.where(agree | faster.isna(), faster)


def aggregate(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (machine_id, kernel_id, params_id) over the ``ok`` repetitions.

    Columns: the keys, ``kernel``, ``n_insns``, ``clock`` (sorted distinct clocks
    joined by ','), ``reps`` (ok repetitions), ``cycles_per_instance_median``,
    ``cycles_per_instance_min``, ``ipc`` = n_insns / median cycles per instance,
    ``f2_per_instance``, ``nonlinearity`` and ``loops_disagree`` (see below).

    A repetition's cycles per instance are ``per_instance``'s: the f2 - f1 difference where the
    two loops ran at one speed, the faster loop's own speed where they did not (the fraction of
    such repetitions is ``loops_disagree``).

    ``cycles_per_instance_min`` is the fastest f2 call minus the fastest f1 call, per
    instance, not the smallest per-repetition difference: on a VM an interruption of the
    f1 call of one repetition makes that repetition's difference too *small*, so the
    minimum of differences is biased low, while the minimum of each call is not (and the same
    rule as above where the two fastest calls ran at different speeds).
    """
    keys = ["machine_id", "kernel_id", "params_id"]
    ok = df.loc[df["status"] == "ok"].copy()
    if ok.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in AGG_COLUMNS})
    tsc = ok["clock"] != "papi"
    ok["_c1"] = ok["cycles1"].astype("float64")
    ok["_c2"] = ok["cycles2"].astype("float64")
    ok.loc[tsc, "_c1"] = ok.loc[tsc, "ticks1"] * ok.loc[tsc, "calib_ratio"]
    ok.loc[tsc, "_c2"] = ok.loc[tsc, "ticks2"] * ok.loc[tsc, "calib_ratio"]
    inst = ok["instances"].astype("float64")
    ok["_est"] = per_instance(ok["cycles_per_instance"].astype("float64"), ok["_c1"] / inst,
                              ok["_c2"] / (2 * inst))
    ok["_disagree"] = (ok["_est"] != ok["cycles_per_instance"]).astype("float64")
    grouped = ok.groupby(keys, sort=True, dropna=False)
    out = grouped.agg(
        kernel=("kernel", "first"),
        n_insns=("n_insns", "first"),
        clock=("clock", lambda s: ",".join(sorted({str(v) for v in s.dropna()}))),
        reps=("rep", "size"),
        cycles_per_instance_median=("_est", "median"),
        _diff=("cycles_per_instance", "median"),
        _c1=("_c1", "min"),
        _c2=("_c2", "min"),
        _c2m=("_c2", "median"),
        _cmin=("cycles_per_instance", "min"),
        _inst=("instances", "first"),
        loops_disagree=("_disagree", "mean"),
    ).reset_index()
    out["cycles_per_instance_min"] = per_instance(
        (out["_c2"] - out["_c1"]) / out["_inst"], out["_c1"] / out["_inst"],
        out["_c2"] / (2 * out["_inst"]))
    out["ipc"] = out["n_insns"] / out["cycles_per_instance_median"]
    # Cross-check of the n/2n difference: the long call alone, per instance (it includes the
    # call and loop overhead, < 0.1 % here). ``nonlinearity`` = median difference / f2-alone
    # - 1: near 0 when the U and 2U bodies run at the same speed per instance, as the method
    # assumes; a few percent flags a kernel whose speed depends on the loop body's size.
    out["f2_per_instance"] = out["_c2m"] / (2 * out["_inst"])
    out["nonlinearity"] = out["_diff"] / out["f2_per_instance"] - 1
    # rows without timed calls (simulated machines): the plain minimum
    out["cycles_per_instance_min"] = out["cycles_per_instance_min"].fillna(out["_cmin"])
    return out.loc[:, AGG_COLUMNS]
