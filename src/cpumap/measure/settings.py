"""The measuring settings (config key ``bench``) as one typed, immutable object.

The validated config's ``bench`` mapping is turned into a :class:`BenchSettings` once, where it
enters the package (a workflow script, the CLI), and travels as that object through the
campaign, the generator, the harness supervision and the database keys. Every default lives
here, once: a key missing from a mapping means the same thing everywhere (the schema,
workflow/schemas/config.schema.yaml, describes each key).

What a measurement *means* (the generator's parameters, warm-up, the call length, the
repetition and stability rule) is hashed into each row's ``params_id``
(:meth:`BenchSettings.measurement_params`); where it is taken (the CPU), how long a batch or a
kernel may run, the clock choice, the batching and the noise monitor are not, so that rows
measured on another core or with another batch size are reused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cpumap.measure.asmgen import GenParams


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """Config key ``bench`` (workflow/schemas/config.schema.yaml describes every field)."""

    unroll_size: int = 200
    total_insn: int = 20_000
    call_us: int = 20
    min_reps: int = 16
    max_reps: int = 1024
    stable_tol: float = 0.005
    budget_ms: float = 5.0
    calib_every: int = 16
    kcalib_adds: int = 50_000
    rounds: int = 3
    max_rounds: int = 8
    settle_s: float = 10.0
    round_gap_ms: float = 300.0
    warmup: int = 2
    arena_bytes: int = 4096
    batch_size: int = 300
    cpu: int | None = None
    timeout_s: float = 10.0
    clock: str = "auto"
    remeasure: bool = False
    monitor: bool = True

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> BenchSettings:
        """Settings from a config mapping; absent keys take the defaults, unknown keys are an
        error that names them (a typo must not silently measure with a default)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown bench setting(s): {', '.join(unknown)}")
        return cls()._with(values)

    def replace(self, **changes: Any) -> BenchSettings:
        """A copy with some fields changed (e.g. ``cpu`` for one measuring thread)."""
        return self._with(changes)

    def _with(self, changes: Mapping[str, Any]) -> BenchSettings:
        conv: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name not in changes:
                continue
            v = changes[f.name]
            if f.name == "cpu":
                conv[f.name] = None if v is None else int(v)
            elif f.type in ("int", int):
                conv[f.name] = int(v)
            elif f.type in ("float", float):
                conv[f.name] = float(v)
            elif f.type in ("bool", bool):
                conv[f.name] = bool(v)
            else:
                conv[f.name] = str(v)
        return dataclasses.replace(self, **conv)

    @property
    def gen_params(self) -> GenParams:
        return GenParams(self.unroll_size, self.total_insn, self.arena_bytes)

    def measurement_params(self) -> dict[str, Any]:
        """Everything that changes what a measurement means; hashed into ``params_id``."""
        return self.gen_params.as_dict() | {
            "warmup": self.warmup, "rounds": self.rounds, "call_us": self.call_us,
            "min_reps": self.min_reps, "max_reps": max(self.min_reps, self.max_reps),
            "stable_tol": self.stable_tol, "calib_every": self.calib_every,
            "kcalib_adds": self.kcalib_adds}

    def harness_args(self) -> dict[str, Any]:
        """Keyword arguments of :func:`cpumap.measure.harness.run_batch` (one round)."""
        return {"reps": self.min_reps, "max_reps": self.max_reps, "warmup": self.warmup,
                "cpu": self.cpu, "timeout_s": self.timeout_s, "clock": self.clock,
                "call_us": self.call_us, "stable_tol": self.stable_tol,
                "budget_ms": self.budget_ms, "calib_every": self.calib_every,
                "kcalib_adds": self.kcalib_adds}


def bench_settings(bench: BenchSettings | Mapping[str, Any] | None) -> BenchSettings:
    """The settings object of ``bench``: the object itself, or one built from a mapping
    (library entry points accept both; the mapping form is read once, here)."""
    if bench is None:
        return BenchSettings()
    if isinstance(bench, BenchSettings):
        return bench
    return BenchSettings.from_mapping(bench)
