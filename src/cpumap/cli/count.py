"""``cpumap count-blocks``: exact basic-block occurrences of one function invocation (gdb)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cpumap.cli.context import UsageError, say


def _options(p: argparse.ArgumentParser, defaults: bool) -> None:
    keep = {} if defaults else {"default": argparse.SUPPRESS}
    p.add_argument("--function", help="function symbol to count (required)", **keep)
    p.add_argument("--json", action="store_true", help="print JSON", **keep)
    p.add_argument("--all-blocks", action="store_true", dest="all_blocks",
                   help="break on every block (no flow-conservation derivation)", **keep)
    p.add_argument("--timeout", type=float, help="seconds before the program is killed "
                   "(default: cpumap.evaluate.counting.DEFAULT_TIMEOUT_S)", **keep)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``cpumap count-blocks [--json] BINARY --function NAME [-- ARGS...]``.

    Everything after BINARY is parsed again in ``run``: options up to ``--``, program
    arguments after it (argparse alone cannot take positionals after options and ``--``).
    """
    p = sub.add_parser("count-blocks", help="exact basic-block occurrences of one function "
                       "invocation (gdb)",
                       usage="cpumap count-blocks [--json] [--all-blocks] [--timeout S] "
                             "BINARY --function NAME [-- ARGS...]")
    _options(p, defaults=True)
    p.add_argument("binary", type=Path)
    p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(fn=run)
    return p


def split_rest(args: argparse.Namespace, options=_options,
               command: str = "cpumap count-blocks") -> list[str]:
    """Merge options given after BINARY into ``args``; return the program arguments.

    ``options(parser, defaults)`` adds the subcommand's options (count-blocks' and analyze's
    share this way of taking ``BINARY --function NAME [-- ARGS...]``)."""
    rest = list(args.rest)
    prog: list[str] = []
    if "--" in rest:
        k = rest.index("--")
        rest, prog = rest[:k], rest[k + 1:]
    if rest:
        p = argparse.ArgumentParser(prog=command, add_help=False, exit_on_error=False)
        options(p, defaults=False)
        try:
            extra, unknown = p.parse_known_args(rest)
        except argparse.ArgumentError as exc:
            raise UsageError(str(exc)) from exc
        if unknown:
            raise UsageError(f"unknown arguments {' '.join(unknown)} (program arguments go "
                             "after --)")
        for key, val in vars(extra).items():
            setattr(args, key, val)
    if not args.function:
        raise UsageError(f"{command.split()[-1]} needs --function NAME")
    return prog


def run(args: argparse.Namespace, ctx: Any = None) -> int:
    # local: Capstone, pyelftools and iced-x86 are only needed here, not to start `cpumap`
    from cpumap.evaluate.blocks import BlockError, FunctionNotFound, extract_blocks
    from cpumap.evaluate.counting import DEFAULT_TIMEOUT_S, CountError, count
    from cpumap.evaluate.symbols import resolve_function

    prog_args = split_rest(args)
    timeout = args.timeout if args.timeout is not None else DEFAULT_TIMEOUT_S
    if not args.binary.is_file():
        raise UsageError(f"no such binary: {args.binary}")
    try:
        found = resolve_function(args.binary, args.function)
        if found.note:
            say(found.note)
        blocks = extract_blocks(args.binary, found.symbol)
    except (FunctionNotFound, BlockError) as exc:
        raise UsageError(str(exc)) from exc
    try:
        res = count(args.binary, found.symbol, blocks, prog_args,
                    all_blocks=args.all_blocks, timeout=timeout)
    except CountError as exc:
        raise RuntimeError(str(exc)) from exc
    rows = [{"block_id": v, "address": res.blocks[v].address,
             "n_insns": res.blocks[v].n_insns, "occurrences": c, "method": res.method[v]}
            for v, c in sorted(res.counts.items())]
    if args.json:
        print(json.dumps({"blocks": rows, **res.meta()}, indent=2))
    else:
        print(f"{'address':>18} {'insns':>5} {'occurrences':>12}  method")
        for r in rows:
            print(f"{r['address']:#18x} {r['n_insns']:5d} {r['occurrences']:12d}  {r['method']}")
        m = res.meta()
        for rep in m["rep_instructions"]:
            print(f"# {rep['address']:#x} {rep['text']}: {rep['iterations']} iterations in "
                  f"{rep['executions']} executions, {rep['executed']} as Callgrind counts it",
                  file=sys.stderr)
        print(f"# {m['instructions_static']} instructions by the blocks' static counts, "
              f"{m['instructions_executed']} executed (repeated string instructions per "
              "iteration)", file=sys.stderr)
        print(f"# {m['breakpoints']} blocks counted by breakpoint, {m['derived']} derived; "
              f"{m['breakpoint_hits']} hits in {m['region_seconds']:.3f} s; run {m['seconds']:.2f}"
              f" s under gdb vs {m['plain_seconds']:.3f} s plain", file=sys.stderr)
    return 0
