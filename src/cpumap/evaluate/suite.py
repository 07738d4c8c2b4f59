"""The real-kernel suite: build each kernel with each flag set, run its driver.

A benchmark is one kernel (kernels/<name>.c, measured function ``kernel_<name>``) compiled
with one flag set into one binary, ``<kernel>.<flagset>`` (e.g. ``daxpy.O3-native``).  Every
later step (block extraction, gdb counting, cycle measurement, analyzers) uses that one binary:
recompiling cannot be assumed to give the same code.

The kernel's translation unit gets exactly the flag set plus COMMON_FLAGS; the driver
(kernels/driver.c: main, clock, JSON output) is always compiled with DRIVER_FLAGS, so the
flag set changes only the kernel.  COMMON_FLAGS keep the kernel a self-contained function
whose basic blocks a static splitter can find exactly: no library calls (gcc would otherwise
turn loops into memset/memcpy), no jump tables (indirect jumps hide jump targets), no hot/cold
splitting (a ``.cold`` part outside the symbol), no stack protector or CET landing pads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from cpumap.measure import slot
from cpumap.store.files import write_json_atomic

ROOT = Path(__file__).resolve().parents[3]
KERNELS_DIR = ROOT / "kernels"
DRIVER_SRC = KERNELS_DIR / "driver.c"
CLOCK_HEADER = ROOT / "harness" / "cpumap_clock.h"

FLAGSETS: dict[str, list[str]] = {
    "O2": ["-O2"],
    "O3-native": ["-O3", "-march=native"],
    "O3-v3": ["-O3", "-march=x86-64-v3"],
}
COMMON_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-fno-builtin",
                "-fno-tree-loop-distribute-patterns", "-fno-jump-tables",
                "-fno-reorder-blocks-and-partition", "-fno-stack-protector",
                "-fcf-protection=none"]
DRIVER_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra"]
LIBS = ["-lpapi"]
BENCH_RE = re.compile(r"^(?P<kernel>[A-Za-z0-9_]+)\.(?P<flagset>[A-Za-z0-9_+-]+)$")


class SuiteError(RuntimeError):
    """A kernel could not be built or its driver failed or printed something unexpected."""


def kernels() -> list[str]:
    """Names of the kernels in kernels/ (every .c file but the driver), sorted."""
    return sorted(p.stem for p in KERNELS_DIR.glob("*.c") if p.stem != "driver")


def function_name(kernel: str) -> str:
    return f"kernel_{kernel}"


def split_benchmark(benchmark: str) -> tuple[str, str]:
    """``daxpy.O3-native`` -> (``daxpy``, ``O3-native``); ValueError when malformed."""
    m = BENCH_RE.match(benchmark)
    if not m:
        raise ValueError(f"benchmark id {benchmark!r} is not <kernel>.<flagset>")
    return m["kernel"], m["flagset"]


def compiler_version(cc: str = "gcc") -> str:
    proc = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True)
    return proc.stdout.splitlines()[0].strip()


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SuiteError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr.strip()}")
    if proc.stderr.strip():  # warnings go to the log, they are not fatal
        print(proc.stderr.strip())


def build_benchmark(kernel: str, flagset: str, out: Path | str, *,
                    flags: list[str] | None = None, common: list[str] | None = None,
                    cc: str = "gcc") -> Path:
    """Compile kernels/<kernel>.c with a flag set and link it with the driver into ``out``.

    ``flags`` defaults to FLAGSETS[flagset], ``common`` to COMMON_FLAGS.  The binary is linked
    under a temporary name and renamed; ``<out>.json`` records the compiler, the exact command
    lines and the source hashes (``benchmark_meta``).  Returns ``out``.
    """
    src = KERNELS_DIR / f"{kernel}.c"
    if not src.exists():
        raise SuiteError(f"unknown kernel {kernel!r}: no {src}")
    if flags is None:
        if flagset not in FLAGSETS:
            raise SuiteError(f"unknown flag set {flagset!r} (known: {', '.join(FLAGSETS)})")
        flags = FLAGSETS[flagset]
    common = COMMON_FLAGS if common is None else common
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as tmp:
        kobj, dobj, exe = Path(tmp) / "kernel.o", Path(tmp) / "driver.o", Path(tmp) / "a.out"
        kcmd = [cc, *common, *flags, "-c", str(src), "-o", str(kobj)]
        dcmd = [cc, *DRIVER_FLAGS, "-c", str(DRIVER_SRC), "-o", str(dobj)]
        lcmd = [cc, str(kobj), str(dobj), "-o", str(exe), *LIBS]
        for cmd in (kcmd, dcmd, lcmd):
            _run(cmd)
        os.replace(exe, out)
    meta = {"benchmark": f"{kernel}.{flagset}", "kernel": kernel, "flagset": flagset,
            "function": function_name(kernel), "flags": list(flags), "common_flags": common,
            "compiler": compiler_version(cc), "commands": [kcmd, dcmd, lcmd],
            "source_sha256": {p.name: _sha256(p) for p in (src, DRIVER_SRC,
                                                          KERNELS_DIR / "driver.h",
                                                          CLOCK_HEADER)}}
    write_json_atomic(meta, out.parent / f"{out.name}.json")
    return out


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


# A timed repetition of a warm run lasts at least this many TSC ticks (~19 us at 2.6 GHz): the
# guest's TSC advances in steps of 26 ticks, so a 200-cycle call timed alone would be off by up
# to 17 %; 50,000 ticks bring the step below 0.06 %.
MIN_SAMPLE_TICKS = 50_000
#: Extra driver processes stop when the two fastest processes' minima agree this closely...
PROCESS_AGREE = 0.01
#: ...and start this long after the last one (a neighbour's burst of a second or two ends).
PROCESS_PAUSE_S = 0.5


def driver_args(n: int | None = None, reps: int = 1, cold: bool = False,
                cpu: int | None = None, min_ticks: int = 0, untimed: bool = False) -> list[str]:
    """The driver's command-line arguments (kernels/driver.c); ``untimed`` for runs that only
    count (no clock calibration: under Valgrind it cost about a second a run)."""
    args: list[str] = []
    if n is not None:
        args += ["--n", str(int(n))]
    args += ["--reps", str(int(reps))]
    if cold:
        args.append("--cold")
    if cpu is not None:
        args += ["--cpu", str(int(cpu))]
    if min_ticks and not cold:
        args += ["--min-ticks", str(int(min_ticks))]
    if untimed:
        args.append("--untimed")
    return args


def parse_driver_output(stdout: str) -> dict[str, Any]:
    """The driver's one JSON line, checked; adds ``cycles_min`` (the minimum over repetitions)."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    if len(lines) != 1:
        raise SuiteError(f"driver printed {len(lines)} lines, expected one JSON line")
    try:
        out = json.loads(lines[0])
    except json.JSONDecodeError as exc:
        raise SuiteError(f"driver output is not JSON: {exc}: {lines[0][:200]}") from exc
    for key in ("kernel", "n", "reps", "clock", "cycles_per_tick", "ticks", "cycles",
                "bytes_footprint", "checksum"):
        if key not in out:
            raise SuiteError(f"driver output lacks {key!r}")
    if len(out["cycles"]) != out["reps"] or not out["cycles"]:
        raise SuiteError("driver output: cycles do not match reps")
    out.setdefault("inner", 1)
    out["cycles_min"] = float(min(out["cycles"]))
    out["cycles_median"] = float(sorted(out["cycles"])[len(out["cycles"]) // 2])
    return out


def measure_kernel(binary: Path | str, n: int | None = None, reps: int = 10, cold: bool = False,
                   cpu: int | None = None, timeout: float = 120.0,
                   min_ticks: int = MIN_SAMPLE_TICKS, processes: int = 1) -> dict[str, Any]:
    """Run a suite binary's driver (K repetitions inside, in each of ``processes`` processes)
    and return the fastest process's JSON + cycles_min (see ``run_driver``).

    Warm runs time back-to-back calls for at least ``min_ticks`` per repetition (cycles are
    still per call); cold runs time every call alone, after the eviction."""
    return run_driver(binary, driver_args(n, reps, cold, cpu, min_ticks), timeout, processes)


def process_spread(minima: list[float]) -> float:
    """How far apart the two fastest processes' minima are, relative (0 for one process:
    nothing to disagree with)."""
    best = sorted(float(c) for c in minima)
    return best[1] / best[0] - 1 if len(best) >= 2 and best[0] > 0 else 0.0


def _settled(runs: list[dict]) -> bool:
    """The two fastest processes agree within PROCESS_AGREE."""
    return process_spread([r["cycles_min"] for r in runs]) <= PROCESS_AGREE


def run_driver(binary: Path | str, args: list[str], timeout: float,
               processes: int = 1, max_processes: int | None = None) -> dict[str, Any]:
    """Run a driver binary with ``args`` (no shell) ``processes`` times, then, up to
    ``max_processes``, once more every ``PROCESS_PAUSE_S`` until the two fastest processes'
    minima agree within ``PROCESS_AGREE``; return the checked JSON line of the process with
    the fastest repetition, with ``processes``, every process's minimum
    (``process_cycles_min``) and ``settled`` (whether the two fastest agreed) added.

    Why several processes: on a shared host a whole process can run slow (here about one in
    ten on the second vCPU ran AVX-512 daxpy 6-7x slower from start to end, and triad -O2
    1.7x), which no repetition inside it recovers; interference only ever slows a kernel
    down, so the fastest process is the kernel's. Why until two agree: a neighbour's burst
    can outlast three processes run back to back (triad -O2, 2026-11-24: minima 856, 1,059
    and 1,146 cycles where a quiet process takes 539); a minimum that a second process
    confirms is the kernel's, and one that none confirms is flagged, not trusted silently.

    Each process holds the measuring slot (:mod:`cpumap.measure.slot`) while it runs, and
    only then: the pauses between processes are for a neighbour to pass, and another job can
    measure in them (36 benchmarks of the default run sat 0.5 s at a time in 140 pauses, the
    slot held, on a busy Sapphire Rapids-class guest, 2026-12-02).
    """
    cmd = [str(binary), *args]
    runs: list[dict] = []
    least = max(1, int(processes))
    most = max(least, int(max_processes or least))
    while len(runs) < most:
        if len(runs) >= least:
            if _settled(runs):
                break
            time.sleep(PROCESS_PAUSE_S)
        try:
            with slot.held():
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise SuiteError(f"{binary} ran past {timeout} s") from exc
        if proc.returncode != 0:
            raise SuiteError(f"{' '.join(cmd)} failed ({proc.returncode}): "
                             f"{proc.stderr.strip()}")
        runs.append(parse_driver_output(proc.stdout))
    out = min(runs, key=lambda r: r["cycles_min"])
    return {**out, "processes": len(runs),
            "process_cycles_min": [r["cycles_min"] for r in runs], "settled": _settled(runs)}


def benchmark_function(benchmark: str, user: dict | None = None) -> str:
    """The function evaluated in a benchmark: a user entry's, else ``kernel_<kernel>``."""
    if user:
        return str(user["function"])
    return function_name(split_benchmark(benchmark)[0])


def benchmark_args(benchmark: str, user: dict | None = None, n_map: dict | None = None,
                   reps: int = 1, cpu: int | None = None, min_ticks: int = 0) -> list[str]:
    """Program arguments of one run: a user entry's own, else the driver's (``--n`` from
    ``n_map`` when the kernel is listed there, ``--reps``, and for cycles runs ``--cpu`` and
    ``--min-ticks``).  Counting uses reps=1, so the counted invocation is the one a cycles run
    repeats."""
    if user and not user.get("driver", False):
        return [str(a) for a in user.get("args", [])]
    if user:
        return [str(a) for a in user.get("args", [])] + driver_args(
            reps=reps, cpu=cpu, min_ticks=min_ticks)
    kernel = split_benchmark(benchmark)[0]
    return driver_args((n_map or {}).get(kernel), reps, cpu=cpu, min_ticks=min_ticks)


def cycles_record(benchmark: str, binary: Path | str, user: dict | None = None,
                  n_map: dict | None = None, reps: int = 10,
                  cpu: int | None = None, min_ticks: int = MIN_SAMPLE_TICKS,
                  processes: int = 1, max_processes: int | None = None) -> dict[str, Any]:
    """Whole-kernel cycles of a benchmark (evaluate/cycles/<benchmark>.json): the fastest of
    ``processes`` to ``max_processes`` driver processes (``run_driver``).

    ``available`` is false, with the reason, for a user binary without the driver: it has no
    measurement points around the function.
    """
    if user and not user.get("driver", False):
        return {"benchmark": benchmark, "available": False, "binary": str(binary),
                "reason": "user binary without kernels/driver.c: no measurement points "
                          "around the function, cycles not measured"}
    args = benchmark_args(benchmark, user, n_map, reps, cpu, min_ticks)
    return {"benchmark": benchmark, "available": True, "binary": str(binary), "args": args,
            **run_driver(binary, args, 600, processes, max_processes)}
