"""Our own two analyzers: the resource model, and native measurement of the block's multiset.

Both see a block as the multiset of the catalogue forms of its instructions (terminator dropped
as for every analyzer): order and dependences are ignored, as Palmed and Pipedream define a
kernel. An instruction without a catalogue form, or a form the model lacks, makes the block
fail with that reason, named; a form the catalogue excludes (it cannot be measured here) is
left out of the model's prediction with a note (the native measurement fails on it).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pandas as pd

from cpumap.evaluate.analyzers.base import BlockInput, Result, failed
from cpumap.evaluate.coverage import predicted_with_flag
from cpumap.isa.catalogue import Catalogue
from cpumap.measure import asmgen, blockgen
from cpumap.model import resmodel


def multiset(block: BlockInput) -> tuple[dict[str, int], str]:
    """(form -> count, error): error names the instructions that have no catalogue form."""
    missing = [ins for ins, f in zip(block.insns, block.forms, strict=True) if not f]
    if missing:
        return {}, "no catalogue form for: " + "; ".join(missing[:5])
    return dict(Counter(block.forms)), ""


class ModelAnalyzer:
    """Predictions of a resource model (model.json): max over resources of the summed uses.

    A block holding a form the catalogue excludes (one that cannot be measured here: CPUID, a
    VM exit; x87 forms; POPF...; ``forms`` gives the catalogue's statuses and reasons) is still
    predicted, from its other instructions, and the prediction carries a note naming what was
    left out and why (a lower bound: those instructions cost something). A block holding a
    form the catalogue measures but this model lacks fails: that is a hole of the model, not
    of the machine. Forms the model holds approximately (dependence chains) are noted too.
    """

    name = "model"

    def __init__(self, model: resmodel.ResourceModel, forms: pd.DataFrame | None = None):
        self.model = model
        self.excluded: dict[str, str] = {}
        if forms is not None:
            bad = forms[forms["status"] != "ok"]
            self.excluded = {str(n): str(r or s) for n, s, r in
                             zip(bad["name"], bad["status"], bad["reason"], strict=True)}

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
            holes = [f for f in lacking if f not in self.excluded]
            if lacking and not predicted_with_flag(lacking, len(k), self.excluded):
                out[b.key] = failed("form(s) not in the model: " + ", ".join(holes or lacking))
                continue
            notes = [f"{f} left out (excluded: {self.excluded[f]})" for f in lacking]
            notes += [f"{f} approximate ({self.model.approximate[f]})"
                      for f in sorted(k) if f in self.model.approximate]
            kept = {f: n for f, n in k.items() if f in self.model.rho}
            cycles, _ = resmodel.predict(self.model, kept) if kept else (0.0, None)
            # a host that pays for switching between legacy SSE and 256-bit AVX: the block's
            # own switches (in its order, run as a loop) at the measured cost
            switches, extra = resmodel.switching(self.model, kept, b.forms)
            if switches:
                cycles += extra
                notes.append(f"{switches} SSE/AVX switches per iteration: {extra:.1f} cycles "
                             "added (the cost measured on this host)")
            out[b.key] = Result(cycles=float(cycles), seconds=time.monotonic() - t0,
                                error=("approximate: " + "; ".join(notes)) if notes else "")
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

    def kernel(self, b: BlockInput) -> tuple[str, str]:
        """(the kernel text to measure for the block, or "" with why it cannot be)."""
        k, err = multiset(b)
        if not err:
            bad = [f for f in sorted(k) if self.status.get(f) != "ok"]
            if bad:
                err = "; ".join(
                    f"form {f} excluded: {self.reason.get(f) or 'not in the catalogue'}"
                    for f in bad)
        if err:
            return "", err
        return (asmgen.canonical(k) if k else ""), ""

    def predict(self, blocks: list[BlockInput]) -> dict[tuple[str, int], Result]:
        out: dict[tuple[str, int], Result] = {}
        wanted: dict[tuple[str, int], str] = {}
        for b in blocks:
            kern, err = self.kernel(b)
            if err:
                out[b.key] = failed(err)
            elif not kern:
                out[b.key] = Result(cycles=0.0)
            else:
                wanted[b.key] = kern
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
        return self.measurer.errors(kernels)


class WrittenAnalyzer(NativeAnalyzer):
    """Measures each block as written, BHive's method without counters
    (:mod:`cpumap.measure.blockgen`: the block's own bytes in the harness's n/2n loops, its
    registers and chains as the compiler left them, pages mapped on first touch). The
    ground truth of "how long does this block take"; blocks that cannot run as written fail
    with the reason, blocks that fault with their signal."""

    name = "written"

    def __init__(self, measurer, forms: pd.DataFrame, stage: str = "evaluate-written",
                 log: Callable[[str], None] | None = None):
        super().__init__(measurer, forms, stage, log)
        self.catalogue = Catalogue(forms)

    def describe(self) -> str:
        return ("the block as written, BHive-style (its own bytes in the harness's n/2n loops, "
                f"registers at {blockgen.BLOCK_INIT:#x}, pages mapped on first touch)")

    def kernel(self, b: BlockInput) -> tuple[str, str]:
        if not b.code:
            return "", ""  # nothing but the dropped terminator: no cycles
        prepared = blockgen.prepare(b.code, self.catalogue)
        return ("", prepared.error) if prepared.error else (prepared.text, "")
