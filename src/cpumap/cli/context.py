"""What every subcommand shares: the results of this machine (built on demand), bad-input errors.

Exit codes of the tool: 0 success, 1 a measurement or tool failure, 2 bad input (unknown
instruction, bad option): a subcommand raises :class:`UsageError` for the latter.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cpumap.isa import catalogue

# The floors below are imported where a subcommand first needs them, not here: every
# subcommand goes through this module, and `cpumap predict` must start in a fraction of a
# second (pandas, pyarrow and iced-x86 alone take longer).


class UsageError(Exception):
    """Bad input from the user: reported with exit code 2."""


def say(msg: str) -> None:
    print(f"cpumap: {msg}", file=sys.stderr, flush=True)


class Context:
    """Paths of one machine's results, created on demand (machine.json, harness, catalogue)."""

    def __init__(self, results: Path):
        self.results = Path(results)
        self._desc: dict | None = None

    @property
    def desc(self) -> dict:
        if self._desc is None:
            from cpumap.host import machine

            self._desc = machine.describe()
        return self._desc

    @property
    def root(self) -> Path:
        return self.results / self.desc["machine_id"]

    def machine_json(self) -> Path:
        from cpumap.host import machine

        path = self.root / "machine.json"
        if not path.exists():
            machine.write_machine_json(path, self.desc)
        return path

    def harness_bin(self) -> Path:
        from cpumap.measure import harness, slot

        # a measurement from the CLI waits for a pipeline's on the same results: the
        # harness's rounds take the slot each (cpumap.measure.batch)
        slot.use(slot.lock_path(self.root))
        return harness.build_harness(self.root / "bin")

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Hold this host's measuring slot for the block: for code timed outside the
        harness's rounds (a function's calls, the bandwidth sweep, kernel points, the
        all-core compute ceilings), which would otherwise overlap a pipeline measuring into
        the same results."""
        from cpumap.measure import slot

        slot.use(slot.lock_path(self.root))
        with slot.held():
            yield

    def catalogue(self, rebuild: bool = False, smoke: bool = True) -> catalogue.Catalogue:
        from cpumap.isa import catalogue
        from cpumap.measure.smoke import SmokeRun
        from cpumap.store import files

        path = self.root / "isa" / "forms.parquet"
        if rebuild or not path.exists():
            self.machine_json()
            say(f"building the instruction catalogue for {self.desc['machine_id']} "
                 "(once per machine)")
            runner = SmokeRun(self.harness_bin()) if smoke else None
            df = catalogue.build_catalogue(self.desc, self.root / "work" / "isa",
                                           smoke_run=smoke, runner=runner, progress=say)
            files.write_parquet_atomic(df, path)
        return catalogue.Catalogue.load(path)


def resolve_kernel(cat: catalogue.Catalogue, terms: list[str]) -> dict[str, int]:
    """Form -> count of a kernel given as terms (form names or AT&T, ``*N``); UsageError
    names what is unknown."""
    from cpumap.isa import catalogue
    from cpumap.measure import asmgen

    kernel: dict[str, int] = {}
    try:
        for text, n in asmgen.parse_kernel_terms(terms):
            name = cat.resolve(text)
            kernel[name] = kernel.get(name, 0) + n
    except (catalogue.UnknownInstruction, asmgen.KernelError) as exc:
        raise UsageError(str(exc)) from exc
    return kernel
