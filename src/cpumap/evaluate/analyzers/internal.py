"""Our own two analyzers: the resource model, and native measurement of the block's multiset.

Both see a block as the multiset of the catalogue forms of its instructions (terminator dropped
as for every analyzer): order and dependences are ignored, as Palmed and Pipedream define a
kernel. An instruction without a catalogue form, or a form the model lacks or the catalogue
excludes, makes the block fail with that reason, named.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pandas as pd

from cpumap.evaluate.analyzers.base import BlockInput, Result, failed
from cpumap.measure import asmgen
from cpumap.model import resmodel
from cpumap.store import db


def multiset(block: BlockInput) -> tuple[dict[str, int], str]:
    """(form -> count, error): error names the instructions that have no catalogue form."""
    missing = [ins for ins, f in zip(block.insns, block.forms, strict=True) if not f]
    if missing:
        return {}, "no catalogue form for: " + "; ".join(missing[:5])
    return dict(Counter(block.forms)), ""


class ModelAnalyzer:
    """Predictions of a resource model (model.json): max over resources of the summed uses."""

    name = "model"

    def __init__(self, model: resmodel.ResourceModel):
        self.model = model

    def describe(self) -> str:
        return (f"cpumap resource model ({len(self.model.resources)} resources, "
                f"{len(self.model.rho)} forms)")

    def predict(self, blocks: list[BlockInput]) -> dict[tuple[str, int], Result]:
        out = {}
        for b in blocks:
            t0 = time.monotonic()
            k, err = multiset(b)
            if err:
                out[b.key] = failed(err)
                continue
            lacking = sorted(f for f in k if f not in self.model.rho)
            if lacking:
                out[b.key] = failed("form(s) not in the model: " + ", ".join(lacking))
                continue
            cycles, _ = resmodel.predict(self.model, k) if k else (0.0, None)
            out[b.key] = Result(cycles=float(cycles), seconds=time.monotonic() - t0)
        return out


class NativeAnalyzer:
    """Measures each block's multiset with our generator and harness (rows go to the DB).

    ``measurer`` is a :class:`cpumap.measure.backend.Measurer`: kernels already in the database
    with the same parameters are answered from it, the rest measured as one batch. A kernel that
    fails to generate or to run is looked up in the database for its recorded reason.
    """

    name = "native"

    def __init__(self, measurer, forms: pd.DataFrame, stage: str = "evaluate",
                 log: Callable[[str], None] | None = None):
        self.measurer = measurer
        self.status = dict(zip(forms["name"], forms["status"], strict=True))
        self.reason = dict(zip(forms["name"], forms["reason"], strict=True))
        self.stage = stage
        self.log = log or (lambda _m: None)

    def describe(self) -> str:
        return "native measurement of the block's multiset of forms (cpumap generator + harness)"

    def predict(self, blocks: list[BlockInput]) -> dict[tuple[str, int], Result]:
        out: dict[tuple[str, int], Result] = {}
        wanted: dict[tuple[str, int], str] = {}
        for b in blocks:
            k, err = multiset(b)
            if not err:
                bad = [f for f in sorted(k) if self.status.get(f) != "ok"]
                if bad:
                    err = "; ".join(
                        f"form {f} excluded: {self.reason.get(f) or 'not in the catalogue'}"
                        for f in bad)
            if err:
                out[b.key] = failed(err)
            elif not k:
                out[b.key] = Result(cycles=0.0)
            else:
                wanted[b.key] = asmgen.canonical(k)
        if wanted:
            kernels = sorted(set(wanted.values()))
            t0 = time.monotonic()
            got = self.measurer.measure(kernels, stage=self.stage)
            per = (time.monotonic() - t0) / len(kernels)
            errors = self._errors([k for k in kernels if k not in got])
            for key, kern in wanted.items():
                if kern in got:
                    out[key] = Result(cycles=float(got[kern]), seconds=per)
                else:
                    out[key] = failed("measurement failed: "
                                      + errors.get(kern, "no ok repetition"), per)
        return out

    def _errors(self, kernels: list[str]) -> dict[str, str]:
        if not kernels:
            return {}
        rows = db.load(self.measurer.db_dir, machine_id=self.measurer.machine_id)
        rows = rows[rows.kernel.isin(kernels) & (rows.status == "failed")]
        return dict(zip(rows.kernel, rows.error, strict=True))
