"""The simulated machine backend: kernels answered exactly from a known mapping.

Measurements come from a port mapping (Mapping3: cycles = optimal port schedule,
``cpumap.model.portmap``) or a resource model (``cpumap.model.resmodel``: cycles = bottleneck
resource), so the inference can be tested deterministically against known truth (DESIGN §8).

Optional multiplicative noise: ``cycles * (1 + noise * z)`` with z standard normal clipped to
[-3, 3], drawn from a generator seeded by sha256(seed, kernel text). Measuring a kernel again
gives the same value (as a measurement database would), while different kernels get
independent noise.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cpumap.host.machine import simulated_machine_id
from cpumap.measure.asmgen import canonical, parse_canonical
from cpumap.model import portmap, resmodel

__all__ = ["SimulatedMachine"]


class SimulatedMachine:
    """A machine whose cycles come from a mapping file (Mapping3 or our resource model)."""

    def __init__(self, mapping_path: str | Path | None = None, noise: float = 0.0, seed: int = 0,
                 *, mapping: Mapping[str, Any] | None = None) -> None:
        if (mapping_path is None) == (mapping is None):
            raise ValueError("give exactly one of mapping_path or mapping")
        self.noise = float(noise)
        self.seed = int(seed)
        if noise < 0:
            raise ValueError("noise must be >= 0")
        source = str(mapping_path) if mapping_path is not None else "<mapping>"
        if mapping_path is not None:
            try:
                obj = json.loads(Path(mapping_path).read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{mapping_path}: not valid JSON: {exc}") from exc
            self.machine_id = simulated_machine_id(mapping_path, self.noise, self.seed)
        else:
            obj = dict(mapping)  # type: ignore[arg-type]
            digest = hashlib.sha256(
                json.dumps([obj, self.noise, self.seed], sort_keys=True).encode()).hexdigest()
            self.machine_id = f"sim-inline-{digest[:8]}"
        self._ports: portmap.PortMapping | None = None
        self._model: resmodel.ResourceModel | None = None
        if isinstance(obj, dict) and obj.get("kind") == "Mapping3":
            self._ports = portmap.PortMapping(portmap.validate_mapping(obj, source), source)
            self.forms: list[str] = list(self._ports.forms)
            self.kind = "Mapping3"
        elif isinstance(obj, dict) and obj.get("format") == resmodel.FORMAT:
            self._model = resmodel.ResourceModel.from_dict(obj, source)
            self.forms = self._model.forms
            self.kind = resmodel.FORMAT
        else:
            raise ValueError(f"{source}: neither a Mapping3 port mapping (kind) nor a "
                             f"{resmodel.FORMAT} (format)")

    def exact(self, kernel: Mapping[str, int] | str) -> float:
        """Noise-free cycles per kernel instance."""
        k = parse_canonical(kernel) if isinstance(kernel, str) else dict(kernel)
        if self._ports is not None:
            return self._ports.cycles(k)
        assert self._model is not None
        return resmodel.predict(self._model, k)[0]

    def _factor(self, text: str) -> float:
        if self.noise == 0.0:
            return 1.0
        digest = hashlib.sha256(f"{self.seed}\0{text}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        z = float(np.clip(rng.standard_normal(), -3.0, 3.0))
        return 1.0 + self.noise * z

    def measure(self, kernels: Iterable[str]) -> list[float]:
        """Cycles per instance of every kernel (canonical text), noisy if configured."""
        out = []
        for text in kernels:
            k = parse_canonical(text)
            out.append(self.exact(k) * self._factor(canonical(k)))
        return out
