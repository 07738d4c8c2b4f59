"""Smoke run: every candidate form once, tiny, in the harness, to find forms that fault here.

iced's tables say what an instruction *is*; only running it says whether this process may execute
it (UMIP makes SLDT/SMSW fault, a hypervisor may trap others, a division may overflow with the
generator's register values). Faulting forms are excluded from the catalogue with the signal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cpumap.isa.catalogue import host_flags
from cpumap.isa.x86 import FormSpec
from cpumap.measure import asmgen, harness
from cpumap.measure.settings import BenchSettings

SMOKE_PARAMS = asmgen.GenParams(unroll_size=8, total_insn=64)
CHUNK = 1000


class SmokeRun:
    """The catalogue's smoke runner (:data:`cpumap.isa.catalogue.SmokeRunner`) on this CPU."""

    def __init__(self, harness_bin: Path, bench: BenchSettings | None = None):
        self.harness_bin = Path(harness_bin)
        self.bench = bench or BenchSettings()

    def __call__(self, forms: list[tuple[str, FormSpec]], machine: dict, workdir: Path,
                 progress: Callable[[str], None] | None = None) -> dict[str, str]:
        return smoke_run(forms, machine, workdir, harness_bin=self.harness_bin,
                         bench=self.bench, progress=progress)


def smoke_run(
    forms: list[tuple[str, FormSpec]],
    machine: dict,
    workdir: Path,
    *,
    harness_bin: Path,
    bench: BenchSettings,
    progress: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """Run each form alone once; return {form name: failure reason} for those that fail."""
    say = progress or (lambda _m: None)
    flags = host_flags(machine)
    params = asmgen.GenParams(SMOKE_PARAMS.unroll_size, SMOKE_PARAMS.total_insn,
                              bench.arena_bytes)
    specs = dict(forms)
    failures: dict[str, str] = {}
    runnable = []
    for name, spec in forms:
        try:
            asmgen.plan_pools([spec])
            runnable.append(name)
        except asmgen.KernelError as exc:
            failures[name] = f"cannot generate: {exc}"
    for start in range(0, len(runnable), CHUNK):
        chunk = runnable[start:start + CHUNK]
        asm, _metas = asmgen.generate_batch([{n: 1} for n in chunk], specs, params, flags)
        so = asmgen.compile_batch(asm, Path(workdir) / f"smoke-{start // CHUNK}.so")
        res = harness.run_batch(so, len(chunk), reps=1, warmup=1, cpu=bench.cpu,
                                timeout_s=2.0, clock="tsc", harness_bin=harness_bin)
        for idx, reason in res.failures.items():
            failures[chunk[idx]] = reason
        say(f"smoke run: {min(start + CHUNK, len(runnable))}/{len(runnable)} forms, "
            f"{len(failures)} failing so far")
    return failures
