"""OSACA (static port-model analyzer; its machine model follows the host, ``targets``).

Blocks go in batches to :mod:`cpumap.evaluate.analyzers.osaca_worker` (one Python process loads
OSACA's machine model once and analyses many blocks); the worker streams one result line per
block, so a crash or a hang is blamed on the block in flight and the rest of the batch is run
again; a block gets ``timeout_s`` (the first also ``startup_s``), so a hang costs one allowance.

OSACA's machine files are incomplete: ZEN4 in OSACA 0.7.1 has no data for ``nop`` (alignment
padding in nearly every compiled loop), the ``xor`` zeroing idiom, ``vzeroupper`` or
``imul r64, r64``, so in strict mode it fails on nearly every kernel. ``ignore_unknown`` (OSACA's
``--ignore-unknown``) counts such instructions as free instead; the block is then ``ok`` and
its ``error`` column lists what was ignored, so the report can say how often that happened.
"""

from __future__ import annotations

import json
import sys

from cpumap.evaluate.analyzers.base import (
    BatchError,
    BatchStats,
    BlockInput,
    Result,
    run_batched,
    run_streaming,
)

NAME = "osaca"


class Osaca:
    name = NAME

    def __init__(self, arch: str, command: list[str] | None = None,
                 timeout_s: float = 30.0, startup_s: float = 30.0, batch_size: int = 200,
                 ignore_unknown: bool = False):
        self.arch, self.ignore_unknown = arch, bool(ignore_unknown)
        self.command = command or [sys.executable, "-m", "cpumap.evaluate.analyzers.osaca_worker"]
        self.timeout_s, self.startup_s = float(timeout_s), float(startup_s)
        self.batch_size = int(batch_size)
        self.stats = BatchStats()

    def describe(self) -> str:
        try:
            from osaca.osaca import get_version
            version = get_version()
        except Exception:  # noqa: BLE001 - the version is informative only
            version = "?"
        mode = ("instructions without data count as free (--ignore-unknown)"
                if self.ignore_unknown else "a block with an instruction without data fails")
        return (f"OSACA {version} --arch {self.arch} (AT&T); cycles = max(port pressure, "
                f"loop-carried dependency); {mode}")

    def _call(self, blocks: list[BlockInput]) -> dict[tuple[str, int], Result]:
        out = {b.key: Result(cycles=0.0) for b in blocks if not b.insns}
        todo = [b for b in blocks if b.insns]
        if not todo:
            return out
        payload = json.dumps([{"key": list(b.key), "insns": list(b.insns)} for b in todo])
        flags = ["--ignore-unknown"] if self.ignore_unknown else []
        res = run_streaming([*self.command, "--arch", self.arch, *flags], payload,
                            self.startup_s + self.timeout_s, self.timeout_s)
        for line in res.stdout.splitlines():
            try:
                item = json.loads(line)
                key = (str(item["key"][0]), int(item["key"][1]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError):
                continue
            if item.get("status") == "ok" and item.get("cycles") is not None:
                ignored = item.get("ignored") or []
                note = (f"ignored (no {self.arch} data): " + "; ".join(ignored)) if ignored else ""
                out[key] = Result(cycles=float(item["cycles"]), error=note,
                                  seconds=float(item["seconds"]))
            else:
                out[key] = Result(status="failed", error=f"osaca: {item.get('error', '')}",
                                  seconds=float(item.get("seconds", 0.0)))
        missing = [b for b in todo if b.key not in out]
        if missing:
            # the worker stopped early: the first unanswered block was in flight
            why = (f"timed out (no answer within {self.timeout_s:g} s)"
                   if res.status == "timeout" else res.describe())
            raise BatchError(f"osaca: {why}", {missing[0].key: f"osaca: {why}"}, out)
        return out

    def predict(self, blocks: list[BlockInput]) -> dict[tuple[str, int], Result]:
        return run_batched(blocks, self._call, self.batch_size, self.stats)
