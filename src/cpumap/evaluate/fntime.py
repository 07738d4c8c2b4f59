"""Measured cycles of one function of any dynamically linked x86-64 program (cpumap analyze).

The suite's kernels are timed by our own driver; a user's binary has none. Here the program
runs as it is, with ``harness/fntime.c`` preloaded (``LD_PRELOAD``): a trap at the function's
entry and at its return address read the TSC around the *first call* (the call that
``cpumap.evaluate.counting`` counts), and the library times its own method on an empty function
in the same process, so that its cost is subtracted, and converts ticks to core cycles with the
dependent add chain every cpumap program calibrates by. The program runs ``reps`` times; the
fastest run is the figure (interference only slows a run down), the median and every run are
kept beside it.

Hardware counters are not used by this method, on any host: the figure is named
``tsc-entry-return`` in the output. A statically linked program cannot preload the library;
a function never called leaves no figure; both are errors that say so.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile

from cpumap.measure.harness import HARNESS_DIR, build_c_program

__all__ = ["METHOD", "FunctionTiming", "TimingError", "build_timer", "time_function"]

FNTIME_SRC = HARNESS_DIR / "fntime.c"
METHOD = "tsc-entry-return"
CFLAGS = ("-O2", "-std=c11", "-Wall", "-Wextra", "-shared", "-fPIC")


class TimingError(RuntimeError):
    """The function could not be timed (why is in the message)."""


@dataclass
class FunctionTiming:
    """Core cycles of the function's first call: ``cycles`` the fastest run, method overhead
    subtracted."""

    method: str
    cycles: float
    cycles_median: float
    runs: list[float]
    overhead_cycles: float  # the method's own cost (fastest of its calibration calls)
    overhead_spread_cycles: float  # slowest minus fastest calibration call: the uncertainty
    cycles_per_tick: float
    failed_runs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_timer(out_dir: Path) -> Path:
    """Compile the preload library into ``out_dir`` (reused while newer than its sources)."""
    return build_c_program(FNTIME_SRC, Path(out_dir) / "fntime.so", cflags=CFLAGS, libs=())


def _elf_facts(binary: Path, symbol: str) -> tuple[int, bool]:
    """(ELF address of ``symbol``, position-independent?); TimingError for a static binary."""
    from cpumap.evaluate.symbols import function_symbols

    with open(binary, "rb") as handle:
        elf = ELFFile(handle)
        if not any(seg["p_type"] == "PT_INTERP" for seg in elf.iter_segments()):
            raise TimingError(f"{binary} is statically linked: the timer library cannot be "
                              "preloaded (link it dynamically to measure its cycles)")
        pie = elf.header["e_type"] == "ET_DYN"
    syms = function_symbols(binary)
    if symbol not in syms:
        raise TimingError(f"no function {symbol!r} in {binary}")
    return syms[symbol][0], pie


def _parse(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (item.split("=", 1) for item in text.split())}


def time_function(binary: Path | str, symbol: str, args: Sequence[str] = (), *,
                  reps: int = 5, timeout: float = 300.0, lib: Path | None = None,
                  progress=None) -> FunctionTiming:
    """Time the first call of ``symbol`` in ``reps`` runs of ``binary args`` (module
    docstring). ``lib``: the built preload library (built in a temporary cache otherwise)."""
    binary = Path(binary).resolve()
    addr, pie = _elf_facts(binary, symbol)
    lib = lib or build_timer(Path(tempfile.gettempdir()) / "cpumap-fntime")
    runs: list[float] = []
    failed: list[str] = []
    best: dict[str, float] | None = None
    with tempfile.TemporaryDirectory(prefix="cpumap-fntime-") as tmp:
        for r in range(reps):
            out = Path(tmp) / f"run{r}.txt"
            preload = " ".join(x for x in (str(lib), os.environ.get("LD_PRELOAD", "")) if x)
            env = dict(os.environ, LD_PRELOAD=preload, CPUMAP_FNTIME_ADDR=f"{addr:x}",
                       CPUMAP_FNTIME_PIE="1" if pie else "0", CPUMAP_FNTIME_OUT=str(out))
            try:
                proc = subprocess.run([str(binary), *map(str, args)], env=env,
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, timeout=timeout, check=False)
            except subprocess.TimeoutExpired:
                failed.append(f"run {r + 1}: killed after {timeout:g} s")
                continue
            if not out.exists():
                how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
                       else f"exit status {proc.returncode}")
                tail = proc.stderr.decode(errors="replace").strip()[-300:]
                failed.append(f"run {r + 1}: {symbol} was never called or did not return "
                              f"({how})" + (f": {tail}" if tail else ""))
                continue
            rec = _parse(out.read_text())
            cyc = (rec["ticks"] - rec["overhead_ticks"]) * rec["cycles_per_tick"]
            runs.append(cyc)
            if best is None or cyc <= min(runs):
                best = rec
            if progress:
                progress(f"timed run {r + 1}/{reps}: {cyc:,.0f} cycles")
    if not runs or best is None:
        raise TimingError(f"{symbol} could not be timed: " + "; ".join(failed[:3]))
    ratio = best["cycles_per_tick"]
    return FunctionTiming(
        METHOD, min(runs), statistics.median(runs), runs,
        best["overhead_ticks"] * ratio,
        (best["overhead_max_ticks"] - best["overhead_ticks"]) * ratio, ratio, failed)
