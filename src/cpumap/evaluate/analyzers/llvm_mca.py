"""llvm-mca: LLVM's machine-code analyzer, many blocks per call.

Each block becomes one ``# LLVM-MCA-BEGIN`` / ``# LLVM-MCA-END`` region of one input file, so a
call costs about a millisecond a block. llvm-mca simulates the region as the body of a loop run
``iterations`` times; the steady-state cycles of one execution are taken as the difference
between a run of 2N and a run of N iterations, divided by N, so that the pipeline fill and drain
of the simulation cancel (the same n/2n principle as our own measurements).

A parse error names its line, which names its block: that block fails with the message and the
rest is run again. Failures without a line (an instruction without scheduling data, a crash, a
hang) are isolated by splitting the batch.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

from cpumap.evaluate.analyzers.base import (
    BatchError,
    BatchStats,
    BlockInput,
    Result,
    run_batched,
    run_tool,
)

NAME = "llvm-mca"
_LINE_ERR = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):\d+: error: (?P<msg>.*)$", re.M)


def region_source(blocks: list[BlockInput]) -> tuple[str, dict[int, tuple[str, int]]]:
    """The llvm-mca input of a batch and the block each source line belongs to."""
    lines = []
    owner: dict[int, tuple[str, int]] = {}
    for i, b in enumerate(blocks):
        lines.append(f"# LLVM-MCA-BEGIN b{i}")
        for ins in b.insns:
            lines.append(ins)
            owner[len(lines)] = b.key
        lines.append("# LLVM-MCA-END")
    return "\n".join(lines) + "\n", owner


class LlvmMca:
    """Runs ``command`` (llvm-mca-19 by default) with ``-mcpu=<cpu>`` (by default ``native``,
    LLVM's host detection; the pipeline passes the host's own, ``targets.llvm_mca_cpu``)."""

    name = NAME

    def __init__(self, command: str | list[str] = "llvm-mca-19", cpu: str = "native",
                 iterations: int = 100, timeout_s: float = 60.0, batch_size: int = 500):
        self.command = [command] if isinstance(command, str) else list(command)
        self.cpu, self.iterations = cpu, int(iterations)
        self.timeout_s, self.batch_size = float(timeout_s), int(batch_size)
        self.stats = BatchStats()

    def describe(self) -> str:
        return (f"{' '.join(self.command)} -mcpu={self.cpu}; cycles = (C(2N) - C(N)) / N with "
                f"N = {self.iterations} iterations")

    def _run(self, src: Path, iterations: int) -> dict:
        cmd = [*self.command, f"-mcpu={self.cpu}", "-json", f"-iterations={iterations}",
               str(src)]
        res = run_tool(cmd, self.timeout_s)
        if res.status != "ok":
            raise _CallFailed(res.describe(), res.stderr)
        try:
            return json.loads(res.stdout)
        except json.JSONDecodeError as exc:
            raise _CallFailed(f"unreadable JSON output: {exc}", "") from exc

    def _call(self, blocks: list[BlockInput]) -> dict[tuple[str, int], Result]:
        empty = {b.key: Result(cycles=0.0) for b in blocks if not b.insns}
        todo = [b for b in blocks if b.insns]
        if not todo:
            return empty
        text, owner = region_source(todo)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="cpumap-mca-") as d:
            src = Path(d) / "blocks.s"
            src.write_text(text)
            try:
                one = self._run(src, self.iterations)
                two = self._run(src, 2 * self.iterations)
            except _CallFailed as exc:
                blamed: dict[tuple[str, int], str] = {}
                for m in _LINE_ERR.finditer(exc.stderr):
                    key = owner.get(int(m.group("line")))
                    if key is not None and key not in blamed:
                        blamed[key] = f"llvm-mca: {m.group('msg')}"
                raise BatchError(f"llvm-mca: {exc.message}", blamed, empty) from None
        per_block = (time.monotonic() - t0) / len(todo)
        cyc1 = _region_cycles(one)
        cyc2 = _region_cycles(two)
        out = dict(empty)
        for i, b in enumerate(todo):
            name = f"b{i}"
            if name not in cyc1 or name not in cyc2:
                out[b.key] = Result(status="failed", error="llvm-mca: no result for the region",
                                    seconds=per_block)
                continue
            cycles = (cyc2[name] - cyc1[name]) / self.iterations
            out[b.key] = Result(cycles=cycles, seconds=per_block)
        return out

    def predict(self, blocks: list[BlockInput]) -> dict[tuple[str, int], Result]:
        return run_batched(blocks, self._call, self.batch_size, self.stats)


class _CallFailed(Exception):
    def __init__(self, message: str, stderr: str):
        super().__init__(message)
        self.message, self.stderr = message, stderr


def _region_cycles(report: dict) -> dict[str, float]:
    return {r["Name"]: float(r["SummaryView"]["TotalCycles"])
            for r in report.get("CodeRegions", []) if "SummaryView" in r}
