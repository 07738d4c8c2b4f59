"""The resource model (DESIGN §8): abstract resources and each form's use of them.

A form i uses ``rho[i][r] >= 0`` cycles of resource r per instance; a kernel K (form i
``sigma(K, i)`` times) needs ``max_r sum_i sigma(K, i) * rho[i][r]`` cycles: every resource
can serve one unit per cycle and the most used one is the bottleneck.

File format (JSON, written atomically, keys sorted, floats rounded to ``DIGITS`` decimals so that
rebuilding a model from the same measurements gives a byte-identical file)::

    {
      "format": "cpumap-resource-model",
      "version": 1,
      "resources": ["R00", "R01", ...],           # order is meaningful (table columns)
      "rho": {"FORM": {"R00": 0.5, ...}, ...},     # zero uses are omitted
      "provenance": {...}                         # free-form: machine, stages, kernels...
    }
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cpumap.measure.asmgen import parse_canonical
from cpumap.store.files import write_json_atomic

__all__ = [
    "DIGITS",
    "FORMAT",
    "ResourceModel",
    "load",
    "predict",
    "save",
]

FORMAT = "cpumap-resource-model"
VERSION = 1
#: Decimals kept in files: far below measurement noise, and stable across rebuilds.
DIGITS = 9


@dataclass
class ResourceModel:
    """Resources, each form's use of them, and how the model was obtained."""

    resources: list[str]
    rho: dict[str, dict[str, float]]
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def forms(self) -> list[str]:
        return sorted(self.rho)

    def validate(self) -> None:
        """Raise ValueError on unknown resources, negative or non-finite uses."""
        known = set(self.resources)
        if len(known) != len(self.resources):
            raise ValueError("duplicate resource names")
        for form, uses in self.rho.items():
            for r, v in uses.items():
                if r not in known:
                    raise ValueError(f"form {form!r} uses unknown resource {r!r}")
                if not (math.isfinite(v) and v >= 0):
                    raise ValueError(f"form {form!r}: use of {r!r} must be finite and >= 0")

    def to_dict(self) -> dict[str, Any]:
        rho = {
            form: {r: round(float(v), DIGITS) for r, v in uses.items() if round(v, DIGITS) > 0}
            for form, uses in self.rho.items()
        }
        return {"format": FORMAT, "version": VERSION, "resources": list(self.resources),
                "rho": rho, "provenance": self.provenance}

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], source: str = "<model>") -> ResourceModel:
        if not isinstance(obj, Mapping) or obj.get("format") != FORMAT:
            raise ValueError(f"{source}: format: expected {FORMAT!r}")
        if obj.get("version") != VERSION:
            raise ValueError(f"{source}: version: expected {VERSION}, got {obj.get('version')!r}")
        for key, typ in (("resources", list), ("rho", dict)):
            if not isinstance(obj.get(key), typ):
                raise ValueError(f"{source}: {key}: missing or not a {typ.__name__}")
        model = cls(resources=[str(r) for r in obj["resources"]],
                    rho={str(f): {str(r): float(v) for r, v in uses.items()}
                         for f, uses in obj["rho"].items()},
                    provenance=dict(obj.get("provenance") or {}))
        try:
            model.validate()
        except ValueError as exc:
            raise ValueError(f"{source}: rho: {exc}") from exc
        return model

    def table(self) -> pd.DataFrame:
        """Readable mapping: one row per form, one column per resource, plus the predicted
        cycles of the form alone and its bottleneck resource."""
        rows = []
        for form in self.forms:
            row: dict[str, Any] = {"form": form}
            row.update({r: self.rho[form].get(r, 0.0) for r in self.resources})
            cyc, bott = predict(self, {form: 1})
            row["cycles"] = cyc
            row["bottleneck"] = bott
            rows.append(row)
        return pd.DataFrame(rows, columns=["form", *self.resources, "cycles", "bottleneck"])


def predict(model: ResourceModel, kernel: Mapping[str, int] | str) -> tuple[float, str | None]:
    """Predicted cycles of one kernel instance and the bottleneck resource.

    ``kernel`` is a multiset (form -> count) or its canonical text. Unknown forms raise KeyError
    rather than being ignored: silently dropping an instruction would under-predict. Ties go to
    the first resource in model order, so the answer is deterministic.
    """
    k = parse_canonical(kernel) if isinstance(kernel, str) else kernel
    for form in k:
        if form not in model.rho:
            raise KeyError(f"form {form!r} is not in the resource model")
    best, bottleneck = 0.0, None
    for r in model.resources:
        load = sum(n * model.rho[f].get(r, 0.0) for f, n in k.items())
        if load > best:
            best, bottleneck = load, r
    return best, bottleneck


def save(model: ResourceModel, path: str | Path) -> Path:
    """Write the model atomically (sorted keys, rounded floats: reproducible bytes)."""
    model.validate()
    return write_json_atomic(model.to_dict(), path)


def load(path: str | Path) -> ResourceModel:
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON: {exc}") from exc
    return ResourceModel.from_dict(obj, str(p))
