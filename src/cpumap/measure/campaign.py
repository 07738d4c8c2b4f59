"""Measuring campaigns: which kernels to measure, in which batches, and the singleton table.

Running a batch (generation, compilation, the harness's rounds, DB rows) is
:mod:`cpumap.measure.batch`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from cpumap.measure import estimate


def read_form_list(path: Path) -> list[str]:
    """Form names, one per line; '#' starts a comment."""
    names = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def select_forms(forms: pd.DataFrame, selection: Mapping, base: Path | None = None) -> list[str]:
    """Names of the forms a profile measures; a named form missing from the catalogue is an error.

    Forms of the list that this CPU cannot run stay out (they are reported as excluded).
    """
    ok = set(forms.loc[forms.status == "ok", "name"])
    which = selection.get("forms", "quick")
    if which == "all":
        return sorted(ok)
    path = Path(selection.get("quick_list", "config/quick_forms.txt"))
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    names = read_form_list(path)
    known = set(forms["name"])
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{path}: unknown form(s) {', '.join(unknown)}")
    return [n for n in names if n in ok]


def plan_singletons(forms: pd.DataFrame, selection: Mapping, batch_size: int,
                    base: Path | None = None) -> list[list[str]]:
    return batched(select_forms(forms, selection, base), batch_size)


def batched(kernels: Sequence[str], size: int) -> list[list[str]]:
    """The batches of a measuring plan (``{"batches": [[kernel, ...], ...]}``), in order."""
    return [list(kernels[i:i + size]) for i in range(0, len(kernels), max(1, size))]


def read_plan(path: str | Path) -> list[list[str]]:
    """The batches of a plan written by plan_singletons or a Palmed checkpoint."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["batches"]


def singleton_summary(forms: pd.DataFrame, rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary counts by outcome and reason, per-form singleton table).

    A form measured but ``unstable`` (its estimate not settled within the repetition budget,
    cpumap.measure.estimate) is counted as measured and again on its own line."""
    agg = estimate.aggregate(rows[rows.status == "ok"]) if len(rows) else pd.DataFrame()
    rows = rows[rows.role != "monitor"] if "role" in rows else rows
    measured = set(agg["kernel"]) if len(agg) else set()
    failed_rows = rows[(rows.status == "failed") & ~rows.kernel.isin(measured)]
    failed = failed_rows.drop_duplicates("kernel")
    counts = [{"outcome": "measured", "reason": "", "forms": len(measured)}]
    if len(agg) and agg.unstable.any():
        counts.append({"outcome": "measured, unstable", "reason": "estimate not settled within "
                       "the repetition budget", "forms": int(agg.unstable.sum())})
    for reason, n in failed.error.value_counts().items():
        counts.append({"outcome": "failed", "reason": reason, "forms": int(n)})
    excl = forms[forms.status != "ok"]
    for reason, n in excl.reason.value_counts().items():
        counts.append({"outcome": "excluded", "reason": reason, "forms": int(n)})
    summary = pd.DataFrame(counts)
    if len(agg):
        table = agg.merge(forms[["name", "att_template", "extension", "category"]],
                          left_on="kernel", right_on="name", how="left").drop(columns="name")
        table = table.sort_values("kernel").reset_index(drop=True)
    else:
        table = pd.DataFrame()
    return summary, table
