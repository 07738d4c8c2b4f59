"""Atomic file writing and checked reading.

Every result file of the pipeline is written to a temporary file in the *same*
directory, flushed and fsync'ed, then moved over the target with ``os.replace``.
A reader (another Snakemake job, a crash-interrupted rerun, a backup tool) thus
sees either the old complete file or the new complete file, never a truncated
one. The temporary name starts with a dot so that globbing ``part-*.parquet``
in a database directory never picks up a half-written part.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: `cpumap predict` writes JSON only and starts fast
    import pandas as pd
    import pyarrow as pa

__all__ = [
    "CorruptFileError",
    "read_parquet_checked",
    "read_parquet_schema_checked",
    "read_parquet_table_checked",
    "redirect_output",
    "write_json_atomic",
    "write_parquet_atomic",
    "write_table_atomic",
    "write_text_atomic",
    "write_tsv_atomic",
]


class CorruptFileError(RuntimeError):
    """A result file exists but cannot be read (truncated, not Parquet, wrong schema).

    The message always names the file, so that a user can delete or restore
    exactly that file from a backup instead of guessing.
    """

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"corrupt or unreadable file {self.path}: {reason}")


def _fsync_dir(directory: Path) -> None:
    """Persist the rename itself; not all filesystems support fsync on a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _atomic_target(path: Path | str, mode: str = "wb") -> Iterator[IO[Any]]:
    """Yield a temporary file beside ``path``; on success fsync it and move it into place."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates files 0600; results are meant to be shared like any output.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _write_with(path: Path | str, writer: Callable[[IO[Any]], None], mode: str) -> Path:
    with _atomic_target(path, mode) as handle:
        writer(handle)
    return Path(path)


def write_table_atomic(table: pa.Table, path: Path | str) -> Path:
    """Write a pyarrow table as Parquet atomically; returns the path."""
    import pyarrow.parquet as pq

    return _write_with(path, lambda handle: pq.write_table(table, handle), "wb")


def write_parquet_atomic(
    df: pd.DataFrame, path: Path | str, schema: pa.Schema | None = None
) -> Path:
    """Write a DataFrame as Parquet atomically (index dropped); returns the path.

    With ``schema`` the columns are converted to exactly those types, so a
    writer cannot silently change a column type between runs.
    """
    import pyarrow as pa

    table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    return write_table_atomic(table, path)


def write_bytes_atomic(data: bytes, path: Path | str) -> Path:
    """Write bytes atomically; returns the path."""
    return _write_with(path, lambda h: h.write(data), "wb")


def write_text_atomic(text: str, path: Path | str) -> Path:
    """Write UTF-8 text atomically; returns the path."""
    return _write_with(path, lambda handle: handle.write(text), "w")


def write_json_atomic(obj: Any, path: Path | str) -> Path:
    """Write ``obj`` as indented, key-sorted JSON (stable diffs) atomically; returns the path."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=True) + "\n"
    return write_text_atomic(text, path)


def write_tsv_atomic(df: pd.DataFrame, path: Path | str) -> Path:
    """Write a DataFrame as a tab-separated table (header, no index) atomically."""
    return write_text_atomic(df.to_csv(sep="\t", index=False, lineterminator="\n"), path)


def read_parquet_table_checked(path: Path | str, columns: list[str] | None = None) -> pa.Table:
    """Read a Parquet file as a pyarrow table; a damaged file raises CorruptFileError.

    A missing file raises FileNotFoundError as usual: that is a different
    problem (a stage did not run) from a file that exists but is damaged.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such Parquet file: {p}")
    try:
        return pq.read_table(p, columns=columns)
    except (pa.ArrowException, OSError, ValueError) as exc:
        # ArrowInvalid ("magic bytes not found", truncated footer), ArrowIOError,
        # and KeyError-like ValueErrors for missing columns all land here.
        raise CorruptFileError(p, f"{type(exc).__name__}: {exc}") from exc


def read_parquet_schema_checked(path: Path | str) -> pa.Schema:
    """The Arrow schema in a Parquet file's footer; a damaged file raises CorruptFileError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such Parquet file: {p}")
    try:
        return pq.read_schema(p)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CorruptFileError(p, f"{type(exc).__name__}: {exc}") from exc


def read_parquet_checked(path: Path | str, columns: list[str] | None = None) -> pd.DataFrame:
    """Read a Parquet file into a DataFrame; a damaged file raises CorruptFileError naming it."""
    return read_parquet_table_checked(path, columns=columns).to_pandas()


def redirect_output(log_path: Path | str) -> None:
    """Send this process's stdout and stderr (and its children's) to ``log_path``.

    Used by the thin workflow scripts so that everything, including the output
    of compilers and of the harness started as subprocesses, lands in the
    rule's ``log:`` file. File descriptors 1 and 2 are redirected, not only
    ``sys.stdout``/``sys.stderr``, because child processes inherit descriptors.
    """
    p = Path(log_path)
    p.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)
