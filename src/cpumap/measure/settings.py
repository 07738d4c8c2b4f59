"""The measuring settings (config key ``bench``) as one typed, immutable object.

The validated config's ``bench`` mapping is turned into a :class:`BenchSettings` once, where it
enters the package (a workflow script, the CLI), and travels as that object through the
campaign, the generator, the harness supervision and the database keys. Every default lives
here, once: a key missing from a mapping means the same thing everywhere.

What a measurement *means* (the generator's parameters, warm-up, rounds, the call-length cap)
is hashed into each row's ``params_id`` (:meth:`BenchSettings.measurement_params`); where it is
taken (the CPU), how long a batch may run, the clock choice and the batching are not, so that
rows measured on another core or with another batch size are reused.
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
    total_insn: int = 200_000
    num_measures: int = 10
    rounds: int = 5
    max_call_ms: float = 1.0
    warmup: int = 2
    arena_bytes: int = 4096
    batch_size: int = 300
    cpu: int | None = None
    timeout_s: float = 10.0
    clock: str = "auto"
    remeasure: bool = False

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

    def repetitions(self) -> tuple[int, int]:
        """(repetitions per round, rounds): ``num_measures`` spread over ``rounds`` passes.

        On a shared host, interference comes in bursts (a neighbour's load on the SMT sibling, a
        frequency change) lasting longer than one kernel's repetitions: measured here, a burst
        doubled the cycles of ten kernels in a row. Passing over the whole batch several times
        puts each kernel's repetitions far apart in time, so one burst spoils a minority of
        them and the median ignores it.
        """
        total = self.num_measures
        rounds = max(1, min(self.rounds, total))
        return -(-total // rounds), rounds

    @property
    def max_call_us(self) -> int:
        return int(self.max_call_ms * 1000)

    def measurement_params(self) -> dict[str, Any]:
        """Everything that changes what a measurement means; hashed into ``params_id``."""
        _reps, rounds = self.repetitions()
        return self.gen_params.as_dict() | {"warmup": self.warmup, "rounds": rounds,
                                            "max_call_ms": self.max_call_ms}


def bench_settings(bench: BenchSettings | Mapping[str, Any] | None) -> BenchSettings:
    """The settings object of ``bench``: the object itself, or one built from a mapping
    (library entry points accept both; the mapping form is read once, here)."""
    if bench is None:
        return BenchSettings()
    if isinstance(bench, BenchSettings):
        return bench
    return BenchSettings.from_mapping(bench)
