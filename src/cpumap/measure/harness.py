"""Build and supervise the `papi_bench` measuring harness.

The C harness (harness/papi_bench.c) measures one batch shared object and already survives
kernels that fault or run too long (it reports them as `fail` lines).  What it cannot survive
is a kernel that takes the whole process down (a `kill` or `exit` system call, a corrupted
heap, signals blocked while looping).  `run_batch` therefore runs it as a child, parses its
output as it streams, and when the child dies or goes silent it blames the kernel that was in
flight and restarts the child after it, so one bad kernel never costs the rest of the batch.

Output format and exit codes: CONTRACTS "Harness CLI".  Converting a row to core cycles:
`row_cycles`.
"""

from __future__ import annotations

import hashlib
import math
import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cpumap.measure import robust
from cpumap.measure.harness_output import HarnessError, Segment, StreamParser

HARNESS_DIR = Path(__file__).resolve().parents[3] / "harness"
HARNESS_SRC = HARNESS_DIR / "papi_bench.c"
CLOCK_HEADER = HARNESS_DIR / "cpumap_clock.h"


def _source_hash(*paths: Path) -> str:
    """Short hash of the harness C sources, so every measurement row names the code that made it."""
    digest = hashlib.sha256()
    try:
        for path in paths:
            digest.update(path.read_bytes())
    except OSError:
        return "unknown"
    return digest.hexdigest()[:12]


HARNESS_VERSION = _source_hash(HARNESS_SRC, CLOCK_HEADER)

CLOCKS = ("auto", "tsc", "papi")
#: Kernels one harness process gets as a ``--kernels`` list, the rest going to the next: Linux
#: caps an argument at 128 KiB (a full-profile round re-measured 78,684 kernels of one batch).
MAX_LISTED_KERNELS = 10_000
CFLAGS = ("-O2", "-std=c11", "-Wall", "-Wextra")
LIBS = ("-lpapi", "-ldl", "-lm")
WATCHDOG_MARGIN_S = 5.0
_STDERR_CAP = 64 * 1024


@dataclass
class BatchResult:
    """Everything one batch run produced.

    rows: one dict per kernel repetition with the keys of the `row` line (index, id, rep,
    ticks1, ticks2, cycles1, cycles2, insns1, insns2, cal1, cal2) plus, per kernel, iters,
    stable (the harness stopped at a stability checkpoint), cal_adds (the calibration chains'
    difference in adds) and calib_ratio: core cycles per tick from the calibration samples of
    the kernel and its neighbours in the process (_assign_ratios), else the mean of its
    process's before/after calibrations (a batch may take several processes when kernels crash
    it).  failures: kernel index -> reason (SIGSEGV, timeout, "harness crashed: ...", "hang:
    ...").  calib_before is the first process's, calib_after the last's.
    """

    clock: str
    insn_source: str
    calib_before: float
    calib_after: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[int, str] = field(default_factory=dict)
    restarts: int = 0
    stderr: str = ""
    #: ``rows.round_columns`` of ``rows`` (their calibration samples as clock ratios
    #: among them), kept once read: a batch's rounds are read again after every round
    columns: dict | None = field(default=None, init=False, repr=False, compare=False)

    def cycles(self, row: Mapping[str, Any]) -> float:
        """Core cycles of the f2 - f1 difference of one row (its own process's ratio)."""
        return row_cycles(row, self.clock, row.get("calib_ratio", calib_ratio(self)))


def _mean_ratio(before: float, after: float | None) -> float:
    return before if after is None else (before + after) / 2.0


def calib_ratio(result: BatchResult) -> float:
    """Core cycles per TSC tick over a batch: the mean of the calibrations before and after."""
    return _mean_ratio(result.calib_before, result.calib_after)


def row_cycles(row: Mapping[str, Any], clock: str, ratio: float) -> float:
    """Core cycles of f2 - f1 for one row.

    With clock 'papi' the counted cycles are used and `ratio` is ignored; with
    'tsc-calibrated' the tick difference is scaled by `ratio` (core cycles per tick).
    """
    if clock == "papi":
        return float(row["cycles2"] - row["cycles1"])
    if clock == "tsc-calibrated":
        return (row["ticks2"] - row["ticks1"]) * ratio
    raise ValueError(f"unknown clock {clock!r}")


def _default_build_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "cpumap" / f"harness-{HARNESS_VERSION}"


def build_c_program(source: Path, out: Path, *, cflags: tuple[str, ...],
                    libs: tuple[str, ...], cc: str = "gcc") -> Path:
    """Compile one C program that includes cpumap_clock.h into `out` (reused when newer than
    both sources); return `out`.

    The binary is written to a temporary name and renamed, so a concurrent or interrupted build
    never leaves a half-written executable behind.
    """
    source, out = Path(source), Path(out)
    header = source.parent / CLOCK_HEADER.name
    newest = max(source.stat().st_mtime, header.stat().st_mtime if header.exists() else 0.0)
    if out.exists() and out.stat().st_mtime >= newest:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        cmd = [cc, *cflags, "-I", str(source.parent), "-o", str(tmp), str(source), *libs]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise HarnessError(f"building {source} failed:\n{proc.stderr}")
        tmp.chmod(0o755)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def build_harness(out_dir: Path, *, source: Path = HARNESS_SRC, cc: str = "gcc") -> Path:
    """Compile papi_bench into out_dir; return its path."""
    return build_c_program(source, Path(out_dir) / "papi_bench", cflags=CFLAGS, libs=LIBS, cc=cc)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


#: Kernels on each side whose calibration samples are pooled with a kernel's own, and the
#: fewest samples that give a ratio (else the process's own calibrations are used).
CALIB_WINDOW = 8
CALIB_MIN_SAMPLES = 4


def _assign_ratios(seg: Segment, fallback: float) -> None:
    """Each row's core cycles per TSC tick, from the calibration samples of its run and of
    the CALIB_WINDOW runs measured before and after it in the same process (a few to a few
    tens of milliseconds): a burst that disturbs every sample of one kernel does not set its
    ratio, and the window is short enough to follow a drifting core clock. ``fallback`` (the
    process's before/after calibration) where there are fewer than CALIB_MIN_SAMPLES.

    Runs, not kernels: a kernel the order names twice (the monitors at both ends of a long
    round) runs at both ends, and each run's neighbours in time are its own."""
    by_run: dict[int, list[dict[str, Any]]] = {}
    for row in seg.rows:
        by_run.setdefault(row["run"], []).append(row)
    order = sorted(by_run)
    samples = {i: [(r["cal1"], r["cal2"], r["cal_adds"]) for r in by_run[i]
                   if r["cal1"] > 0 and r["cal2"] > 0] for i in order}
    for pos, run in enumerate(order):
        near = [c for i in order[max(0, pos - CALIB_WINDOW):pos + CALIB_WINDOW + 1]
                for c in samples[i] if c[2] == by_run[run][0]["cal_adds"]]
        # one sample alone is off by a few percent (measured: 1.38-1.52 against 1.423): the
        # fastest of several is not
        k_ratio = robust.calib_ratio(np.array([c[0] for c in near]),
                                       np.array([c[1] for c in near]),
                                       float(by_run[run][0]["cal_adds"])) \
            if len(near) >= CALIB_MIN_SAMPLES else math.nan
        for row in by_run[run]:
            row["calib_ratio"] = k_ratio if math.isfinite(k_ratio) else fallback


def _run_segment(cmd: list[str], seg: Segment, reps: int, max_reps: int, watchdog_s: float,
                 on_kernel: Callable[[], None]) -> tuple[int | None, float, str]:
    """Run one harness process to its end, feeding its lines to a parser.

    Returns (returncode, seconds of silence if the watchdog killed it else 0, stderr text).
    The watchdog kills the child when it prints nothing for watchdog_s seconds: its own
    per-kernel timer has then failed (e.g. the kernel blocked SIGALRM).
    """
    parser = StreamParser(seg, reps, max_reps, cmd[0], on_kernel)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    out_buf, err_buf = b"", b""
    silent_for = 0.0
    last_output = time.monotonic()
    try:
        while sel.get_map():
            remaining = last_output + watchdog_s - time.monotonic()
            if remaining <= 0:
                silent_for = time.monotonic() - last_output
                proc.kill()
                break
            for key, _ in sel.select(timeout=remaining):
                data = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                if not data:
                    sel.unregister(key.fileobj)
                elif key.data == "err":
                    err_buf = (err_buf + data)[-_STDERR_CAP:]
                else:
                    last_output = time.monotonic()
                    out_buf += data
                    *lines, out_buf = out_buf.split(b"\n")
                    for line in lines:
                        parser.feed(line.decode("utf-8", errors="replace"))
    except BaseException:
        proc.kill()
        raise
    finally:
        sel.close()
        returncode = proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return (None if silent_for else returncode), silent_for, err_buf.decode(errors="replace")


def run_batch(
    so_path: Path,
    n_kernels: int,
    *,
    reps: int,
    warmup: int,
    cpu: int | None,
    timeout_s: float,
    clock: str = "auto",
    harness_bin: Path | None = None,
    progress: Callable[[int], None] | None = None,
    watchdog_margin_s: float = WATCHDOG_MARGIN_S,
    calib_adds: int | None = None,
    call_us: int = 0,
    max_reps: int = 0,
    stable_tol: float = 0.005,
    budget_ms: float = 0.0,
    calib_every: int = 8,
    kcalib_adds: int = 20_000,
    indices: Sequence[int] | None = None,
    map_pages: int = 0,
    map_fill: int = 0,
) -> BatchResult:
    """Measure kernels 0..n_kernels-1 of a batch .so; survive kernels that kill the harness.

    Each kernel gets at least ``reps`` repetitions; with ``max_reps`` > ``reps`` the harness
    goes on, doubling, until the first half and all of them give estimates within
    ``stable_tol``, or until ``max_reps`` or ``budget_ms`` (harness/papi_bench.c). ``call_us``
    (0: off) scales each kernel's iterations so that a long call lasts about that long.
    timeout_s is the harness's own per-kernel limit (warm-up and repetitions together); a child
    silent for 2 * timeout_s + watchdog_margin_s is killed and its kernel in flight recorded as
    a "hang".  progress(n_finished) is called after each kernel, measured or failed.
    cpu None lets the harness pick the last CPU this process may run on. ``indices`` measures
    only those kernels of the batch, in that order (default: all of them). ``map_pages`` > 0:
    pages mapped on demand per kernel, filled with ``map_fill`` (blocks as written; rows
    then have ``pages``).
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, not {clock!r}")
    if reps < 1 or warmup < 0 or n_kernels < 0 or timeout_s <= 0:
        raise ValueError("need reps >= 1, warmup >= 0, n_kernels >= 0, timeout_s > 0")
    binary = Path(harness_bin) if harness_bin is not None else build_harness(_default_build_dir())
    watchdog_s = 2 * timeout_s + watchdog_margin_s
    finished = 0

    def on_kernel() -> None:
        nonlocal finished
        finished += 1
        if progress is not None:
            progress(finished)

    result: BatchResult | None = None
    stderr_parts: list[str] = []
    todo = list(range(n_kernels)) if indices is None else [int(i) for i in indices]
    if any(not 0 <= i < n_kernels for i in todo):
        raise ValueError(f"kernel indices outside 0..{n_kernels - 1}: {todo}")
    while True:
        contiguous = not todo or todo == list(range(todo[0], todo[0] + len(todo)))
        part = todo if contiguous else todo[:MAX_LISTED_KERNELS]
        where = (["--start", str(todo[0] if todo else n_kernels), "--count", str(len(todo))]
                 if contiguous else ["--kernels", ",".join(map(str, part))])
        seg = Segment(order=part)
        cmd = [str(binary), "--so", str(so_path), "--reps", str(reps), "--warmup", str(warmup),
               "--timeout-ms", str(max(1, round(timeout_s * 1000))), "--clock", clock, *where]
        cmd += ["--cpu", str(cpu)] if cpu is not None else []
        cmd += ["--calib-adds", str(calib_adds)] if calib_adds is not None else []
        cmd += ["--call-us", str(int(call_us))] if call_us > 0 else []
        cmd += ["--max-reps", str(max(reps, max_reps)), "--stable-ppm",
                str(round(stable_tol * 1e6)), "--budget-ms", str(round(budget_ms)),
                "--calib-every", str(calib_every), "--kcalib-adds", str(kcalib_adds)]
        if map_pages > 0:
            cmd += ["--map-pages", str(int(map_pages)), "--map-fill", str(int(map_fill))]
        returncode, silent_for, err = _run_segment(cmd, seg, reps, max_reps, watchdog_s,
                                                   on_kernel)
        if err:
            stderr_parts.append(err)

        if seg.clock is None or seg.calib_before is None:
            # It died before measuring anything: the harness or the .so is at fault, not a kernel.
            how = f"silent for {silent_for:.1f} s" if returncode is None else \
                _describe_exit(returncode)
            raise HarnessError(f"{binary} on {so_path} failed before measuring ({how}): "
                               f"{err.strip()}")
        if result is None:
            result = BatchResult(clock=seg.clock, insn_source=seg.insn_source or "",
                                 calib_before=seg.calib_before, calib_after=seg.calib_before)
        elif (seg.clock, seg.insn_source) != (result.clock, result.insn_source):
            raise HarnessError(f"clock changed between harness restarts: {seg.clock} "
                               f"({seg.insn_source}) after {result.clock} ({result.insn_source})")
        # the process's own calibrations (the fastest of 7 long chains each, after a warm-up):
        # the less disturbed of the two
        _assign_ratios(seg, max(seg.calib_before, seg.calib_after or seg.calib_before))
        result.rows.extend(seg.rows)
        result.failures.update(seg.failures)
        if seg.calib_after is not None:
            result.calib_after = seg.calib_after

        if seg.done:
            if returncode != 0:
                raise HarnessError(f"{binary}: done line but {_describe_exit(returncode or 0)}")
            if not (todo := todo[len(part):]):
                break
            continue
        # Abnormal end: blame the kernel in flight and go on after it.  When no kernel was in
        # flight (it died after the last one) the restart with --count 0 only recalibrates.
        if seg.next_index is not None:
            if returncode is None:
                reason = f"hang: no output for {silent_for:.1f} s, harness killed"
            else:
                reason = f"harness crashed: {_describe_exit(returncode)}"
            result.failures[seg.next_index] = reason
            on_kernel()
            todo = todo[seg.pos + 1:]
        else:
            todo = todo[len(part):]
        result.restarts += 1
        if result.restarts > n_kernels + 1:
            raise HarnessError(f"{binary} keeps dying on {so_path}: {err.strip()}")

    assert result is not None
    result.stderr = "".join(stderr_parts)[-_STDERR_CAP:]
    return result
