"""Command-line tool (``cpumap``): the top floor, importing from every stage below it.

Modules: ``context`` (this machine's results, built on demand; UsageError), ``measure``
(measure, predict, forms, catalogue, machine), ``count`` (count-blocks), ``roofline``,
``store`` (archive, restore, merge), ``app`` (the parser and ``main``). Exit codes: 0 success,
1 a measurement or tool failure, 2 bad input.
"""

from cpumap.cli.app import main

__all__ = ["main"]
