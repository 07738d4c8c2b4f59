"""The harness's output stream, line by line, checked against the contract (CONTRACTS
"Harness CLI") and filed per kernel: kept apart from ``cpumap.measure.harness``, which runs
and supervises the child processes that print it.

A row whose counter fields no clock can produce (a TSC difference above 2^62 ticks, 56 years
at 2.6 GHz, or below the -1 that marks "not counted") means the kernel wrote into the
harness's own memory: that kernel is recorded as failed and the batch goes on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Above this a counter value is impossible (see the module docstring).
IMPOSSIBLE = 1 << 62


class HarnessError(RuntimeError):
    """The harness could not be built or run, or printed something that is not the contract."""


@dataclass
class Segment:
    """What one harness process reported while measuring the kernels of ``order``."""

    order: list[int]
    pos: int = 0  # position in ``order`` of the kernel in flight
    clock: str | None = None
    insn_source: str | None = None
    calib_before: float | None = None
    calib_after: float | None = None
    # the run in flight's iterations per call and pages mapped on demand (--map-pages), when
    # reported: they go on its own rows, since a kernel the order names twice (the monitors
    # at both ends of a long round) runs twice, each run with iterations of its own
    iters: int | None = None
    pages: int | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)  # rows of the kernel in flight
    failures: dict[int, str] = field(default_factory=dict)
    done: bool = False
    n_ok: int = 0
    rejected: int = 0  # kernels the harness reported ok whose rows were impossible

    @property
    def next_index(self) -> int | None:
        """The kernel in flight: the first one neither measured nor failed (None: all done)."""
        return self.order[self.pos] if self.pos < len(self.order) else None


_ROW_INT_FIELDS = ("ticks1", "ticks2", "cycles1", "cycles2", "insns1", "insns2", "cal1", "cal2")


class StreamParser:
    """Checks each line of one child's output against the contract and files it in a Segment."""

    def __init__(self, seg: Segment, reps: int, max_reps: int, where: str,
                 on_kernel: Callable[[], None]) -> None:
        self.seg, self.reps, self.max_reps = seg, reps, max(reps, max_reps)
        self.where, self.on_kernel = where, on_kernel
        self.lineno = 0

    def error(self, line: str, problem: str) -> HarnessError:
        return HarnessError(f"{self.where}: output line {self.lineno} {line!r}: {problem}")

    def feed(self, line: str) -> None:
        self.lineno += 1
        seg = self.seg
        f = line.split("\t")
        try:
            kind = f[0]
            if seg.done:
                raise ValueError("output after the done line")
            if kind == "clock" and len(f) == 3:
                if f[1] not in ("papi", "tsc-calibrated") or f[2] not in ("counted", "derived"):
                    raise ValueError("unknown clock or instruction source")
                seg.clock, seg.insn_source = f[1], f[2]
            elif kind == "calib" and len(f) == 5:
                ratio, ticks, adds = float(f[2]), int(f[3]), int(f[4])
                if not (math.isfinite(ratio) and ratio > 0 and ticks > 0 and adds > 0):
                    raise ValueError("calibration values must be positive")
                if f[1] == "before":
                    seg.calib_before = ratio
                elif f[1] == "after":
                    seg.calib_after = ratio
                else:
                    raise ValueError("calib must be before or after")
            elif kind == "iters" and len(f) == 3:
                self._in_flight(f[1])
                n = int(f[2])
                if n < 1:
                    raise ValueError("iterations must be positive")
                seg.iters = n
            elif kind == "pages" and len(f) == 3 and int(f[2]) >= 0:
                self._in_flight(f[1])
                seg.pages = int(f[2])
            elif kind == "row" and len(f) == 12:
                self._row(f)
            elif kind == "end" and len(f) in (5, 7):
                self._end(f)
            elif kind == "fail" and len(f) == 4:
                index = self._in_flight(f[1])
                if seg.pending:
                    raise ValueError("fail after some rows of the same kernel")
                seg.failures[index] = f[3]
                self._finish_kernel()
            elif kind == "done" and len(f) == 3:
                n_ok, n_failed = int(f[1]), int(f[2])
                if seg.next_index is not None or (n_ok, n_failed) != (
                        seg.n_ok + seg.rejected, len(seg.failures) - seg.rejected):
                    raise ValueError("done does not match the kernels reported")
                if seg.calib_before is None or seg.calib_after is None:
                    raise ValueError("done without both calib lines")
                seg.done = True
            else:
                raise ValueError("unknown record or wrong number of fields")
            if kind != "clock" and seg.clock is None:
                raise ValueError("record before the clock line")
        except ValueError as exc:
            raise self.error(line, str(exc)) from None

    def _in_flight(self, text: str) -> int:
        index = int(text)
        if index != self.seg.next_index:
            raise ValueError(f"kernel {index} reported, kernel {self.seg.next_index} expected")
        return index

    def _row(self, f: list[str]) -> None:
        seg = self.seg
        index = self._in_flight(f[1])
        rep = int(f[3])
        if rep != len(seg.pending):
            raise ValueError(f"repetition {rep} reported, {len(seg.pending)} expected")
        if rep >= self.max_reps:
            raise ValueError(f"more than {self.max_reps} repetitions")
        # run: the kernel's position in the order, which tells its runs apart
        row: dict[str, Any] = {"index": index, "id": f[2], "rep": rep, "run": seg.pos}
        row.update(zip(_ROW_INT_FIELDS, map(int, f[4:12]), strict=True))
        seg.pending.append(row)

    def _end(self, f: list[str]) -> None:
        seg = self.seg
        self._in_flight(f[1])
        n, stable, cal_adds = int(f[2]), int(f[3]), int(f[4])
        if n != len(seg.pending) or not self.reps <= n <= self.max_reps:
            raise ValueError(f"end of {n} repetitions after {len(seg.pending)} rows "
                             f"(expected {self.reps} to {self.max_reps})")
        if stable not in (0, 1) or cal_adds <= 0:
            raise ValueError("bad stability flag or calibration size")
        # the closing calibration sample, after the last repetition (-1: none taken)
        end1, end2 = (int(f[5]), int(f[6])) if len(f) == 7 else (-1, -1)
        bad = next(((k, row[k]) for row in seg.pending for k in _ROW_INT_FIELDS
                    if not -1 <= row[k] < IMPOSSIBLE), None)
        if bad:
            seg.failures[seg.pending[0]["index"]] = (
                f"impossible {bad[0]} {bad[1]:#x}: the kernel wrote into the harness's memory")
            seg.rejected += 1
        else:
            for row in seg.pending:
                row["stable"], row["cal_adds"] = bool(stable), cal_adds
                if seg.iters is not None:
                    row["iters"] = seg.iters
                if seg.pages is not None:
                    row["pages"] = seg.pages
            if seg.pending and 0 < end1 < IMPOSSIBLE and 0 < end2 < IMPOSSIBLE:
                seg.pending[-1]["end1"], seg.pending[-1]["end2"] = end1, end2
            seg.rows.extend(seg.pending)
            seg.n_ok += 1
        seg.pending = []
        self._finish_kernel()

    def _finish_kernel(self) -> None:
        self.seg.pos += 1
        self.seg.iters = self.seg.pages = None
        self.on_kernel()
