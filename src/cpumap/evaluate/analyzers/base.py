"""What every analyzer shares: the block as analyzers see it, the subprocess wrapper, batching.

Every analyzer is given the *same* instruction list for a block (DESIGN §9): the block's
instructions re-rendered in AT&T syntax from their bytes (iced-x86's GAS formatter, with
RIP-relative operands kept relative), without the terminating control-flow instruction when
``drop_terminator`` is set (as BHive and Palmed measure blocks: a branch is not part of the
steady-state body, and our generator cannot measure one). Rendering from the bytes rather than
reusing a disassembler's text keeps one source of truth and avoids syntax that GNU as or
llvm-mc reject.

External tools run through :func:`run_tool` (argument lists, a time limit, the whole process
group killed on time-out) and are driven in batches by :func:`run_batched`: a batch whose call
fails is split until the failing blocks are isolated, so one block that crashes or hangs an
analyzer costs that block only, with the error recorded, and the run goes on.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import iced_x86 as ix
import pandas as pd

__all__ = [
    "BatchError",
    "predict_blocks",
    "BlockInput",
    "PREDICTION_COLUMNS",
    "Result",
    "ToolResult",
    "block_inputs",
    "render_att",
    "run_batched",
    "run_streaming",
    "run_tool",
]

#: Columns of evaluate/predictions/<analyzer>/<benchmark>.parquet (CONTRACTS).
PREDICTION_COLUMNS = ["benchmark", "block_id", "analyzer", "cycles", "status", "error",
                      "seconds"]


@functools.lru_cache(maxsize=1)
def _formatter() -> ix.Formatter:
    f = ix.Formatter(ix.FormatterSyntax.GAS)
    f.space_after_operand_separator = True
    # `0x10(%rip)` rather than the absolute target: assemblers then keep the RIP-relative
    # load the compiler emitted instead of an absolute-address one
    f.rip_relative_addresses = True
    f.branch_leading_zeros = False  # "jne 0xb", as objdump and llvm-mc write targets
    f.uppercase_hex = False
    return f


def render_att(hexes: Sequence[str], address: int) -> list[str]:
    """AT&T text of each instruction given as hex bytes, decoded at its real address."""
    out = []
    ip = int(address)
    for h in hexes:
        data = bytes.fromhex(h)
        ins = ix.Decoder(64, data, ip=ip).decode()
        if ins.code == ix.Code.INVALID or ins.len != len(data):
            raise ValueError(f"bytes {h} at {ip:#x} are not one instruction")
        out.append(_formatter().format(ins))
        ip += len(data)
    return out


@dataclass(frozen=True)
class BlockInput:
    """One block as every analyzer receives it."""

    benchmark: str
    block_id: int
    insns: tuple[str, ...]  # AT&T text, terminator dropped if so configured
    forms: tuple[str, ...]  # catalogue form of each of those instructions, "" when none
    n_insns: int  # instructions of the whole block, terminator included
    error: str = ""  # why the block could not be prepared (every analyzer fails it with this)
    code: bytes = b""  # the machine code of ``insns`` (the block as written)

    @property
    def key(self) -> tuple[str, int]:
        return (self.benchmark, self.block_id)


def block_inputs(blocks: pd.DataFrame, drop_terminator: bool = True) -> list[BlockInput]:
    """Analyzer inputs of a blocks table (columns of evaluate/blocks/<benchmark>.parquet)."""
    out = []
    for row in blocks.sort_values(["benchmark", "block_id"]).itertuples(index=False):
        hexes, forms = list(row.hexes), list(row.forms)
        try:
            insns = render_att(hexes, int(row.address))
        except ValueError as exc:
            out.append(BlockInput(str(row.benchmark), int(row.block_id), (), (),
                                  int(row.n_insns), f"cannot render the block: {exc}"))
            continue
        if drop_terminator and row.terminator and insns:
            insns, forms, hexes = insns[:-1], forms[:-1], hexes[:-1]
        out.append(BlockInput(str(row.benchmark), int(row.block_id), tuple(insns),
                              tuple(str(f) for f in forms), int(row.n_insns),
                              code=bytes.fromhex("".join(hexes))))
    return out


@dataclass
class Result:
    """One analyzer's answer for one block."""

    cycles: float = float("nan")
    status: str = "ok"  # ok | failed
    error: str = ""
    seconds: float = 0.0


def failed(error: str, seconds: float = 0.0) -> Result:
    return Result(status="failed", error=error, seconds=seconds)


@dataclass
class ToolResult:
    """Outcome of one external-tool call."""

    status: str  # ok (exit 0) | error (non-zero exit) | crashed (signal) | timeout
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        """One-line reason for a call that did not succeed."""
        tail = (self.stderr.strip().splitlines() or [""])[-1][:300]
        if self.status == "timeout":
            return f"timed out after {self.seconds:.1f} s"
        if self.status == "crashed":
            sig = -int(self.returncode or 0)
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            return f"crashed ({name})" + (f": {tail}" if tail else "")
        return f"exit code {self.returncode}" + (f": {tail}" if tail else "")


def run_tool(cmd: Sequence[str], timeout_s: float, stdin: str | None = None,
             env: dict[str, str] | None = None) -> ToolResult:
    """Run an analyzer; never raises for the tool's own failures.

    The tool runs in a new session so that on time-out the whole process group (the tool and
    anything it started) is killed, not only the direct child.
    """
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env=env)
    except OSError as exc:
        return ToolResult("error", None, "", f"cannot start {cmd[0]}: {exc}", 0.0)
    try:
        out, err = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return ToolResult("timeout", None, out or "", err or "", time.monotonic() - t0)
    rc = proc.returncode
    status = "ok" if rc == 0 else ("crashed" if rc < 0 else "error")
    return ToolResult(status, rc, out, err, time.monotonic() - t0)


def run_streaming(cmd: Sequence[str], stdin: str, first_timeout_s: float,
                  line_timeout_s: float) -> ToolResult:
    """Run a tool that prints one line per item, allowing ``line_timeout_s`` between lines
    (``first_timeout_s`` for the first, which includes start-up): a hang on one item is cut
    after that item's allowance, not after the whole batch's. stdout holds the lines printed
    before the tool ended or was killed."""
    import selectors
    import tempfile

    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as fin, tempfile.TemporaryFile("w+") as ferr:
        fin.write(stdin)
        fin.seek(0)
        try:
            proc = subprocess.Popen(list(cmd), stdin=fin, stdout=subprocess.PIPE, stderr=ferr,
                                    start_new_session=True)
        except OSError as exc:
            return ToolResult("error", None, "", f"cannot start {cmd[0]}: {exc}", 0.0)
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        chunks: list[bytes] = []
        deadline = time.monotonic() + first_timeout_s
        timed_out = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                timed_out = True
                break
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                break
            chunks.append(data)
            if b"\n" in data:
                deadline = time.monotonic() + line_timeout_s
        sel.close()
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        rc = proc.wait()
        proc.stdout.close()
        ferr.seek(0)
        err = ferr.read()
    out = b"".join(chunks).decode(errors="replace")
    seconds = time.monotonic() - t0
    if timed_out:
        return ToolResult("timeout", None, out, err, seconds)
    status = "ok" if rc == 0 else ("crashed" if rc < 0 else "error")
    return ToolResult(status, rc, out, err, seconds)


class BatchError(Exception):
    """A batch call failed.

    ``blamed`` names the blocks known to be at fault (with their error); ``done`` holds results
    of blocks the call finished before failing. With nothing blamed, the batch is split in two
    and each half retried, down to single blocks, which then fail with ``message``.
    """

    def __init__(self, message: str, blamed: dict[tuple[str, int], str] | None = None,
                 done: dict[tuple[str, int], Result] | None = None):
        super().__init__(message)
        self.message = message
        self.blamed = blamed or {}
        self.done = done or {}


@dataclass
class BatchStats:
    calls: int = 0
    failed_calls: int = 0
    notes: list[str] = field(default_factory=list)
    #: where run_batched reports progress (blocks done, left, rate), every PROGRESS_S seconds
    log: Callable[[str], None] | None = None


#: Seconds between two progress lines of run_batched (a whole corpus takes OSACA an hour).
PROGRESS_S = 10.0


def run_batched(blocks: Sequence[BlockInput],
                call: Callable[[list[BlockInput]], dict[tuple[str, int], Result]],
                batch_size: int = 500, stats: BatchStats | None = None,
                ) -> dict[tuple[str, int], Result]:
    """Results of every block, calling ``call`` on batches and isolating failing blocks."""
    stats = stats if stats is not None else BatchStats()
    results: dict[tuple[str, int], Result] = {}
    todo = [list(blocks[i:i + batch_size]) for i in range(0, len(blocks), batch_size)]
    t0 = last = time.monotonic()
    while todo:
        now = time.monotonic()
        if stats.log and now - last >= PROGRESS_S:
            last = now
            done = len(results)
            stats.log(f"{done}/{len(blocks)} blocks, {len(blocks) - done} left, "
                      f"{done / max(now - t0, 1e-9):.1f} blocks/s")
        batch = todo.pop()
        if not batch:
            continue
        stats.calls += 1
        try:
            results.update(call(batch))
        except BatchError as exc:
            stats.failed_calls += 1
            results.update(exc.done)
            for key, err in exc.blamed.items():
                results[key] = failed(err)
            rest = [b for b in batch if b.key not in results]
            if not rest:
                continue
            if exc.blamed or exc.done:
                todo.append(rest)  # progress was made: retry the others as one batch
            elif len(rest) == 1:
                results[rest[0].key] = failed(exc.message)
            else:
                half = len(rest) // 2
                todo += [rest[half:], rest[:half]]
    return results


def predict_blocks(analyzer, blocks: Sequence[BlockInput]) -> dict[tuple[str, int], Result]:
    """``analyzer.predict`` on the blocks that could be prepared, each distinct block once (a
    corpus holds the same block in many applications: BHive's 303,978 rows are 38,683
    blocks); the others fail with the reason they could not."""
    first: dict[tuple, BlockInput] = {}
    for b in blocks:
        if not b.error:
            first.setdefault((b.insns, b.forms, b.code), b)
    got = analyzer.predict(list(first.values())) if first else {}
    out = {b.key: got.get(first[(b.insns, b.forms, b.code)].key, failed("no result"))
           for b in blocks if not b.error}
    out.update({b.key: failed(b.error) for b in blocks if b.error})
    return out
