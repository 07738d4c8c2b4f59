"""Archive and restore ``results/``: the raw-data backup of seed 001 ("backup/restore").

An archive is a tar file (gzip or xz compressed when its name says so) holding
``MANIFEST.json`` first, then every result file under ``results/<machine-id>/...``: the raw
Parquet parts, machine descriptions, catalogues, plans, models, tables, plots and logs.
The manifest lists each file with its size and sha256, so a restore can prove that what it
unpacked is what was packed.

Restoring never half-replaces results: the archive is unpacked into a staging directory
beside the target, every file is checked against the manifest (a mismatch names the file),
and only then are the machine directories renamed into place. Existing machine
directories are refused unless ``force`` is given.

Restored files all get the same modification time (the restore time; the original times
stay in the manifest). Snakemake reruns a job when an input is newer than its output, and a
fresh checkout's sources (``harness/papi_bench.c``...) are newer than an old archive's
files: with the original times, a rerun on a restored archive would rebuild the harness and
then re-measure, deleting the raw parts it was meant to keep. One common time makes the
restored results exactly up to date with each other and with the checkout.

Temporary work directories (``work``, ``work-*``) and hidden temporary files (a crash can
leave ``.part-*.tmp`` behind) are not archived; every database part is read in full first,
so a damaged part stops the archive with its path instead of being backed up silently.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from cpumap.store import db

__all__ = [
    "ArchiveError",
    "ChecksumError",
    "MANIFEST",
    "archive",
    "collect_files",
    "restore",
]

MANIFEST = "MANIFEST.json"
FORMAT = "cpumap-archive"
VERSION = 1
_PREFIX = "results"  # member names: results/<machine-id>/<path>
_CHUNK = 1 << 20


class ArchiveError(RuntimeError):
    """The archive cannot be written or restored (bad member, missing manifest, conflict)."""


class ChecksumError(ArchiveError):
    """A file in the archive does not match its manifest entry; names the file."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        super().__init__(f"checksum mismatch for {path}: {reason}")


def _skipped(rel: PurePosixPath) -> bool:
    """Temporary work directories and hidden (temporary) files are not results."""
    return any(p == "work" or p.startswith("work-") or p.startswith(".") for p in rel.parts)


def collect_files(results: Path) -> list[PurePosixPath]:
    """Result files under ``results`` (relative POSIX paths, sorted): what an archive holds."""
    out: list[PurePosixPath] = []
    for dirpath, dirnames, filenames in os.walk(results):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = PurePosixPath(path.relative_to(results).as_posix())
            if _skipped(rel) or path.is_symlink() or not path.is_file():
                continue
            if len(rel.parts) < 2:
                continue  # a stray file beside the machine directories is not a result
            out.append(rel)
    return sorted(out)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _mode(path: Path) -> str:
    """tarfile mode for writing or reading ``path``: compression from the file name."""
    name = path.name
    if name.endswith((".tar.gz", ".tgz")):
        return "gz"
    if name.endswith((".tar.xz", ".txz")):
        return "xz"
    if name.endswith(".tar"):
        return ""
    raise ArchiveError(f"{path}: archive name must end in .tar, .tar.gz, .tgz or .tar.xz")


def _check_parts(results: Path, files: list[PurePosixPath]) -> int:
    """Read every database part in full; a damaged one raises CorruptFileError naming it."""
    rows = 0
    for rel in files:
        if len(rel.parts) == 3 and rel.parts[1] == "db" and rel.name.endswith(".parquet"):
            rows += len(db.load_parts([results / rel], columns=["machine_id"]))
    return rows


def archive(results: Path | str, out: Path | str) -> dict[str, Any]:
    """Pack ``results`` into the tar file ``out`` (written atomically); returns the manifest.

    Files are added in sorted order with owner, group and permissions normalised, so the
    tar stream depends only on the files' contents, names and modification times.
    """
    src = Path(results)
    target = Path(out)
    mode = _mode(target)
    if not src.is_dir():
        raise ArchiveError(f"no results directory {src}")
    files = collect_files(src)
    if not files:
        raise ArchiveError(f"{src} holds no results to archive")
    rows = _check_parts(src, files)
    entries = []
    for rel in files:
        st = (src / rel).stat()
        entries.append({"path": str(rel), "size": st.st_size, "sha256": _sha256(src / rel),
                        "mtime_ns": st.st_mtime_ns})
    manifest = {
        "format": FORMAT, "version": VERSION,
        "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": str(src.resolve()),
        "machines": sorted({str(rel.parts[0]) for rel in files}),
        "db_rows": rows,
        "files": entries,
    }
    data = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode=f"w:{mode}",
                                                      format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
            for entry in entries:
                path = src / entry["path"]
                info = tar.gettarinfo(str(path), arcname=f"{_PREFIX}/{entry['path']}")
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            raw.flush()
            os.fsync(raw.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it 0600; an archive is shared
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return manifest


def _member_path(name: str) -> PurePosixPath | None:
    """Relative path of a results member, or None for the manifest; unsafe names raise."""
    if name == MANIFEST:
        return None
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts or p.parts[0] != _PREFIX:
        raise ArchiveError(f"unexpected member {name!r} in archive (not under {_PREFIX}/)")
    rel = PurePosixPath(*p.parts[1:])
    if len(rel.parts) < 2:
        raise ArchiveError(f"unexpected member {name!r} in archive (outside a machine folder)")
    return rel


def read_manifest(path: Path | str) -> dict[str, Any]:
    """The manifest of an archive (its first member)."""
    with tarfile.open(path, mode=f"r:{_mode(Path(path))}") as tar:
        member = tar.next()
        if member is None or member.name != MANIFEST or not member.isfile():
            raise ArchiveError(f"{path}: first member is not {MANIFEST}; not a cpumap archive")
        handle = tar.extractfile(member)
        assert handle is not None
        manifest = json.loads(handle.read())
    if manifest.get("format") != FORMAT:
        raise ArchiveError(f"{path}: {MANIFEST} is not a {FORMAT} manifest")
    return manifest


def restore(path: Path | str, into: Path | str, *, force: bool = False) -> dict[str, Any]:
    """Unpack archive ``path`` into the results directory ``into``, verified; returns a summary.

    Every file is checked (size and sha256) against the manifest before any machine
    directory is moved into place; files missing from the archive or not in the manifest are
    errors too. A machine directory that already exists under ``into`` is an error unless
    ``force`` (then it is replaced as a whole, after verification).
    """
    src = Path(path)
    dest = Path(into)
    mode = _mode(src)
    manifest = read_manifest(src)
    expected = {e["path"]: e for e in manifest["files"]}
    machines = sorted({PurePosixPath(p).parts[0] for p in expected})
    clash = [m for m in machines if (dest / m).exists()]
    if clash and not force:
        raise ArchiveError(f"{dest} already has results for {', '.join(clash)}; "
                           "restore elsewhere or pass --force to replace them")
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".cpumap-restore-", dir=dest))
    try:
        seen: set[str] = set()
        with tarfile.open(src, mode=f"r:{mode}") as tar:
            for member in tar:
                rel = _member_path(member.name)
                if rel is None or member.isdir():
                    continue
                if not member.isfile():
                    raise ArchiveError(f"member {member.name!r} is not a regular file")
                key = str(rel)
                entry = expected.get(key)
                if entry is None:
                    raise ChecksumError(key, "file is in the archive but not in its manifest")
                if key in seen:
                    raise ArchiveError(f"member {member.name!r} appears twice in the archive")
                seen.add(key)
                out = staging / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256()
                size = 0
                handle = tar.extractfile(member)
                assert handle is not None
                with open(out, "wb") as fh:
                    while chunk := handle.read(_CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        fh.write(chunk)
                os.chmod(out, 0o755 if member.mode & 0o100 else 0o644)
                if size != entry["size"] or digest.hexdigest() != entry["sha256"]:
                    raise ChecksumError(key, f"size {size} sha256 {digest.hexdigest()}, manifest "
                                             f"says size {entry['size']} sha256 {entry['sha256']}")
        missing = sorted(set(expected) - seen)
        if missing:
            raise ChecksumError(missing[0], f"listed in the manifest but missing from the "
                                            f"archive ({len(missing)} file(s) missing)")
        stamp = time.time_ns()
        for key in expected:
            os.utime(staging / key, ns=(stamp, stamp))
        for machine_id in machines:
            target = dest / machine_id
            if target.exists():
                if not force:  # appeared while we were unpacking
                    raise ArchiveError(f"{target} appeared during the restore; not replaced")
                old = staging / f".old-{machine_id}"
                os.replace(target, old)
            os.replace(staging / machine_id, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"archive": str(src), "into": str(dest), "machines": machines,
            "files": len(expected), "db_rows": manifest.get("db_rows")}
