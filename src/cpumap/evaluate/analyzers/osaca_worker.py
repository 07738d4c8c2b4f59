"""OSACA on many blocks in one process.

``python -m cpumap.evaluate.analyzers.osaca_worker --arch ZEN4``

Reads a JSON list ``[{"key": [benchmark, block_id], "insns": [AT&T text, ...]}, ...]`` on stdin
and prints one JSON line per block as soon as it is analysed (``key``, ``status``, ``cycles``,
``error``, ``seconds``), so that when OSACA crashes or hangs on a block the caller knows which
blocks finished and which one was in flight. Loading OSACA's machine model takes about half a
second; doing it once per batch instead of once per block is the point of this worker.

The prediction is OSACA's own: max(the most loaded port of its optimal port assignment, the
longest loop-carried dependency). An instruction OSACA has no throughput data for makes the
block fail, unless ``--ignore-unknown`` (OSACA's own option) is given: the instruction then
costs nothing, and the result line lists it under ``ignored`` so that the caller can say so.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def analyse(insns: list[str], arch: str, parser, model,
            ignore_unknown: bool = False) -> tuple[float, list[str]]:
    """(cycles, instructions without data that were counted as free)."""
    from osaca.semantics import ArchSemantics, KernelDG
    from osaca.semantics.isa_semantics import INSTR_FLAGS

    kernel = parser.parse_file("\n".join(insns) + "\n")
    kernel = [ins for ins in kernel if ins.mnemonic is not None]
    semantics = ArchSemantics(parser, model)
    semantics.normalize_instruction_forms(kernel)
    semantics.add_semantics(kernel)
    semantics.assign_optimal_throughput(kernel)
    unknown = [ins.line.strip() for ins in kernel if INSTR_FLAGS.TP_UNKWN in ins.flags]
    if unknown and not ignore_unknown:
        raise LookupError(f"no {arch} throughput data for: {'; '.join(unknown[:5])}")
    dg = KernelDG(kernel, parser, model, semantics, timeout=10)
    tp = max(ArchSemantics.get_throughput_sum(kernel) or [0.0])
    deps = dg.get_loopcarried_dependencies()
    lcd = max((float(d["latency"]) for d in deps.values()), default=0.0) if deps else 0.0
    return max(float(tp), lcd), unknown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", required=True, help="OSACA machine model, e.g. ZEN3, ZEN4")
    ap.add_argument("--ignore-unknown", action="store_true")
    args = ap.parse_args(argv)
    from osaca.osaca import get_asm_parser
    from osaca.semantics import MachineModel

    parser = get_asm_parser(args.arch, "ATT")
    model = MachineModel(arch=args.arch)
    for item in json.load(sys.stdin):
        t0 = time.monotonic()
        out = {"key": item["key"], "status": "ok", "cycles": None, "error": "", "ignored": []}
        try:
            out["cycles"], out["ignored"] = analyse(item["insns"], args.arch, parser, model,
                                                    args.ignore_unknown)
        except Exception as exc:  # noqa: BLE001 - every OSACA failure is recorded per block
            out["status"] = "failed"
            out["error"] = f"{type(exc).__name__}: {exc}"[:500]
        out["seconds"] = time.monotonic() - t0
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
