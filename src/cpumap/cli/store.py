"""``cpumap archive``, ``restore`` and ``merge``: the results directory as the raw-data backup."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from cpumap.cli.context import say


def cmd_archive(args: argparse.Namespace, ctx: Any) -> int:
    from cpumap.store import archive  # local, as every subcommand's floors: a fast start

    t0 = time.monotonic()
    try:
        manifest = archive.archive(args.results, args.file)
    except archive.ArchiveError as exc:
        say(f"error: {exc}")
        return 2
    size = Path(args.file).stat().st_size
    say(f"archived {len(manifest['files'])} files of {', '.join(manifest['machines'])} "
         f"({manifest['db_rows']} DB rows) into {args.file}: {size} bytes in "
         f"{time.monotonic() - t0:.2f} s")
    return 0


def cmd_restore(args: argparse.Namespace, ctx: Any) -> int:
    from cpumap.store import archive

    into = args.into if args.into is not None else args.results
    t0 = time.monotonic()
    try:
        out = archive.restore(args.file, into, force=args.force)
    except archive.ArchiveError as exc:
        say(f"error: {exc}")
        return 2
    say(f"restored and verified {out['files']} files of {', '.join(out['machines'])} into "
         f"{into} in {time.monotonic() - t0:.2f} s")
    return 0


def add_parsers(sub: Any) -> None:
    """Register ``cpumap archive``, ``cpumap restore`` and ``cpumap merge``."""
    a = sub.add_parser("archive", help="pack results/ (raw DB, models, reports) into a tar file "
                                       "with a manifest of checksums")
    a.add_argument("file", type=Path, help="archive to write (.tar, .tar.gz, .tgz, .tar.xz)")
    a.set_defaults(fn=cmd_archive)
    r = sub.add_parser("restore", help="unpack an archive into results/, verifying every "
                                       "checksum before anything is moved into place")
    r.add_argument("file", type=Path, help="archive written by cpumap archive")
    r.add_argument("--into", type=Path, default=None,
                   help="results directory to restore into (default: --results)")
    r.add_argument("--force", action="store_true",
                   help="replace machine directories that already exist")
    r.set_defaults(fn=cmd_restore)
    _add_merge(sub)



def cmd_merge(args: argparse.Namespace, ctx: Any) -> int:
    from cpumap.store import merge

    into = args.into if args.into is not None else Path(args.results)
    try:
        rep = merge.merge(args.sources, into)
    except FileNotFoundError as exc:
        print(f"cpumap: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rep.as_dict(), indent=2))
    added = ", ".join(f"{m}: {n}" for m, n in sorted(rep.rows_added.items())) or "none"
    print(f"cpumap: merged into {into}: rows added {added}; {rep.rows_duplicate} duplicate "
          f"rows dropped; {len(rep.parts_copied)} parts copied, {len(rep.parts_written)} "
          f"written, {len(rep.parts_skipped)} skipped", file=sys.stderr)
    return 0


def _add_merge(sub: Any) -> None:
    m = sub.add_parser("merge", help="merge measurement databases (other nodes or machines) "
                                     "into results/, dropping duplicate rows")
    m.add_argument("sources", nargs="+", type=Path,
                   help="results directory, machine directory or db directory to merge from")
    m.add_argument("--into", type=Path, default=None,
                   help="results directory to merge into (default: --results)")
    m.add_argument("--json", action="store_true", help="print what was done as JSON")
    m.set_defaults(fn=cmd_merge)
