"""How much real code a resource model can answer for: the suite's executed instructions and
the blocks of a basic-block corpus (BHive's sources), and what is missing, named.

A model that lacks one form of a block cannot predict the block: dropping the instruction
would under-predict, so coverage is counted per block. Two figures, because they answer
different questions:

- **suite**: the share of each benchmark's *executed* instructions (occurrences from gdb x
  instructions of the block, terminators left out as every analyzer sees the block without
  its branch) that lie in blocks whose every form is modelled;
- **corpus**: per application, the share of blocks (weighted by the corpus's frequency column)
  whose every instruction maps to a modelled form.

Beside each, the share the model analyzer still predicts with a flag (``share_flagged``): a
block whose missing instructions are all forms the catalogue excludes (CPUID's VM exit, x87,
LEAVE...) and that holds at least one modelled form is predicted from the rest, as a lower
bound with a note (``cpumap.evaluate.analyzers.internal.ModelAnalyzer``), never a hole; a form
the catalogue measures but the model lacks, or one the catalogue has not, stays a hole.

Each missing instruction is named with why: the form is not in the model, the catalogue
excludes it (its reason), or the catalogue has no such form (iced-x86's code name).
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from cpumap.isa import transition, x86
from cpumap.isa.catalogue import Catalogue

__all__ = ["Coverage", "corpus_coverage", "predicted_with_flag", "read_corpus",
           "suite_coverage"]


def predicted_with_flag(lacking: Iterable[str], n_forms: int, excluded: Container[str]) -> bool:
    """Whether the model analyzer predicts a block all the same, from its other forms, with a
    note: of its ``n_forms`` instructions (or distinct forms), those the model lacks
    (``lacking``) are all excluded by the catalogue with a reason, and at least one is
    modelled. One rule for the analyzer and for the coverage that reports on it."""
    lacking = list(lacking)
    return bool(lacking) and len(lacking) < n_forms and all(f in excluded for f in lacking)


@dataclass
class Coverage:
    """Covered and total weight of one application or benchmark, and what was missing."""

    name: str
    covered: float = 0.0
    total: float = 0.0
    blocks: int = 0
    blocks_covered: int = 0
    #: blocks predicted with a flag (every missing instruction excluded by the catalogue)
    flagged: float = 0.0
    blocks_flagged: int = 0
    #: "FORM (why)" -> weight of the blocks it kept from being predicted
    missing: Counter = field(default_factory=Counter)
    #: blocks holding both legacy-SSE and 256-bit AVX forms (``cpumap.isa.transition``:
    #: on Zen 2/3 each switch between them costs a micro-fault), and their weight
    mixing_blocks: int = 0
    mixing_weight: float = 0.0

    def add(self, weight: float, missing: list[str], mixes: bool = False,
            flagged: bool = False) -> None:
        """One block of this weight, predicted unless something in it is ``missing``;
        ``flagged``: predicted all the same, from its other forms, with a note."""
        self.blocks += 1
        self.total += weight
        if mixes:
            self.mixing_blocks += 1
            self.mixing_weight += weight
        if missing:
            for why in set(missing):
                self.missing[why] += weight
            if flagged:
                self.blocks_flagged += 1
                self.flagged += weight
        else:
            self.blocks_covered += 1
            self.covered += weight

    @property
    def share(self) -> float:
        return self.covered / self.total if self.total > 0 else float("nan")

    @property
    def share_flagged(self) -> float:
        """Predicted at all: fully modelled, or flagged (see the module docstring)."""
        return (self.covered + self.flagged) / self.total if self.total > 0 else float("nan")

    def row(self, top: int = 5) -> dict[str, Any]:
        return {"name": self.name, "share": self.share, "share_flagged": self.share_flagged,
                "blocks": self.blocks, "blocks_covered": self.blocks_covered,
                "sse_avx_mixing": self.mixing_blocks,
                "top_missing": "; ".join(f"{k} {v / self.total:.2%}"
                                         for k, v in self.missing.most_common(top))}


class _Forms:
    """Machine code -> the forms of its instructions, each distinct block decoded once."""

    def __init__(self, catalogue: Catalogue, modelled: Iterable[str]):
        self.cat = catalogue
        self.modelled = set(modelled)
        self.fams = transition.families(catalogue.df)
        self.excluded = {f for f, row in catalogue.by_name.items() if row.status != "ok"}
        self.cache: dict[str, tuple[list[str], bool, bool]] = {}

    def why(self, form: str, code: str) -> str:
        if not form:
            return f"{code} (not in the catalogue)"
        row = self.cat.by_name[form]
        if row.status != "ok":
            return f"{form} (excluded: {row.reason})"
        return f"{form} (not modelled)"

    def _block(self, hexes: str) -> tuple[list[str], bool, bool]:
        """(why each instruction the model does not hold is missing, whether the block holds
        legacy-SSE and 256-bit AVX forms both, whether it is predicted with a flag), decoded
        once per distinct block."""
        hit = self.cache.get(hexes)
        if hit is None:
            insns = x86.decode_all(bytes.fromhex(hexes))
            forms = [self.cat.by_key.get(x86.form_key(ins), "") for ins in insns]
            lacking = [f for f in forms if f not in self.modelled]
            flagged = predicted_with_flag(lacking, len(forms), self.excluded)
            hit = self.cache[hexes] = (
                [self.why(form, x86.CODE_NAMES[ins.code])
                 for ins, form in zip(insns, forms, strict=True) if form not in self.modelled],
                transition.mixes(forms, self.fams), flagged)
        return hit

    def missing(self, hexes: str) -> list[str]:
        """Why each instruction of the block the model does not hold is missing."""
        return self._block(hexes)[0]

    def mixes(self, hexes: str) -> bool:
        """Whether the block holds legacy-SSE and 256-bit AVX forms both."""
        return self._block(hexes)[1]

    def flagged(self, hexes: str) -> bool:
        """Whether the model analyzer predicts the block with a flag (module docstring)."""
        return self._block(hexes)[2]


def read_corpus(path: Path | str) -> list[tuple[str, float]]:
    """``hex,frequency`` lines of a BHive source file (malformed lines raise, naming them)."""
    out = []
    with open(path, newline="", encoding="utf-8") as handle:
        for number, row in enumerate(csv.reader(handle), 1):
            if not row:
                continue
            try:
                out.append((row[0].strip(), float(row[1])))
                bytes.fromhex(row[0])
            except (IndexError, ValueError) as exc:
                raise ValueError(f"{path}:{number}: expected hex,frequency: {exc}") from exc
    return out


def corpus_coverage(sources: Mapping[str, Path], catalogue: Catalogue,
                    modelled: Iterable[str]) -> list[Coverage]:
    """One Coverage per application (``sources``: name -> CSV), frequency-weighted blocks."""
    forms = _Forms(catalogue, modelled)
    out = []
    for name, path in sources.items():
        cov = Coverage(name)
        for hexes, freq in read_corpus(path):
            cov.add(freq, forms.missing(hexes), forms.mixes(hexes), forms.flagged(hexes))
        out.append(cov)
    return out


def suite_coverage(blocks: pd.DataFrame, counts: pd.DataFrame,
                   modelled: Iterable[str], catalogue: Catalogue) -> list[Coverage]:
    """One Coverage per benchmark: executed instructions in blocks the model predicts.

    ``blocks``: the suite's block tables (evaluate/blocks/*.parquet, with ``hexes`` and
    ``terminator``); ``counts``: their occurrences (evaluate/counts/*.parquet).
    """
    forms = _Forms(catalogue, modelled)
    occ = counts.set_index(["benchmark", "block_id"]).occurrences
    out: dict[str, Coverage] = {}
    for b in blocks.itertuples(index=False):
        n = int(occ.get((b.benchmark, b.block_id), 0))
        hexes = list(b.hexes)
        if b.terminator and hexes:
            hexes = hexes[:-1]  # the block as every analyzer sees it
        cov = out.setdefault(b.benchmark, Coverage(b.benchmark))
        # a block that never runs weighs nothing (it still counts as a block predicted or not)
        code = "".join(hexes)
        cov.add(n * len(hexes), forms.missing(code) if hexes else [],
                forms.mixes(code) if hexes else False, bool(hexes) and forms.flagged(code))
    return [out[k] for k in sorted(out)]


def summary(items: list[Coverage]) -> Coverage:
    """All items together (weights summed)."""
    total = Coverage("all")
    for c in items:
        total.covered += c.covered
        total.total += c.total
        total.blocks += c.blocks
        total.blocks_covered += c.blocks_covered
        total.flagged += c.flagged
        total.blocks_flagged += c.blocks_flagged
        total.missing.update(c.missing)
        total.mixing_blocks += c.mixing_blocks
        total.mixing_weight += c.mixing_weight
    return total
