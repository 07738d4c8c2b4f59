"""The ``cpumap`` command: its parser and the dispatch to the subcommand modules."""

from __future__ import annotations

import argparse
from pathlib import Path

from cpumap.cli import analyze as analyze_cli
from cpumap.cli import count as count_cli
from cpumap.cli import measure as measure_cli
from cpumap.cli import predict as predict_cli
from cpumap.cli import roofline as roofline_cli
from cpumap.cli import store as store_cli
from cpumap.cli.context import Context, UsageError, say

DESCRIPTION = ("Measure and model the CPU: measure and predict kernels, analyze a function of "
               "any binary, count basic blocks, rooflines, archives.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cpumap", description=DESCRIPTION)
    p.add_argument("--results", default="results", help="results directory (default: results)")
    sub = p.add_subparsers(dest="cmd", required=True)
    measure_cli.add_parsers(sub)  # measure, forms, catalogue, machine
    predict_cli.add_parser(sub)  # predict
    count_cli.add_parser(sub)  # count-blocks
    analyze_cli.add_parser(sub)  # analyze
    store_cli.add_parsers(sub)  # archive, restore, merge
    roofline_cli.add_parser(sub)  # roofline
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for option in ("repeat", "reps", "processes"):
        value = getattr(args, option, None)
        if value is not None and value < 1:
            parser.error(f"--{option} must be at least 1")
    ctx = Context(Path(args.results))
    try:
        return args.fn(args, ctx)
    except UsageError as exc:
        say(f"error: {exc}")
        return 2
    except (RuntimeError, OSError, ValueError) as exc:
        say(f"error: {exc}")
        return 1

