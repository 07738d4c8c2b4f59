"""How quiet the host was over a run: the noise monitor of every measuring batch, as a table,
a summary line and a report section.

Every native measuring batch measures reference kernels first, in every round
(cpumap.measure.quiet.MONITOR_KERNELS: ADD_R64_R64 on all four integer ALUs, MOV_R64_M64 on
the load pipes; rows with role ``monitor``). Their estimates are what the CPU does and should
not move; their median calls are what the neighbours let them do. ``noise`` (how much
slower than the undisturbed one the typical call ran) over time tells a user whether a
surprising model or evaluation figure came from a bad day on the host rather than from the
model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from cpumap.evaluate.report import esc, figure_html, table_html  # noqa: E402
from cpumap.measure.quiet import MONITOR_KERNELS  # noqa: E402


def _one(table: pd.DataFrame) -> dict[str, Any]:
    est = table["cycles_per_instance_est"].astype(float)
    noise = table["noise"].astype(float)
    return {"batches": int(len(table)), "kernel": str(table["kernel"].iat[0]),
            "estimate_min": float(est.min()), "estimate_max": float(est.max()),
            "estimate_spread": float(est.max() / est.min() - 1),
            "noise_median": float(noise.median()), "noise_max": float(noise.max()),
            "noisy_batches": int((noise > 0.10).sum()),
            "first": str(table["timestamp"].min()), "last": str(table["timestamp"].max())}


def summary(table: pd.DataFrame) -> dict[str, Any]:
    """Batches, the estimate's range and the noise's median and maximum over a run, of the
    integer-add monitor (the keys at the top) and of each monitor (``monitors``)."""
    if table.empty:
        return {"batches": 0}
    kernels = list(dict.fromkeys(table["kernel"]))
    main = MONITOR_KERNELS[0] if MONITOR_KERNELS[0] in kernels else kernels[0]
    return _one(table[table["kernel"] == main]) | {
        "monitors": {k: _one(table[table["kernel"] == k]) for k in kernels}}


def summary_line(s: Mapping[str, Any]) -> str:
    """One sentence for a text report (and one more per further monitor)."""
    if not s.get("batches"):
        return "Host noise: no monitor measurement (simulated machine, or bench.monitor off)."
    line = (f"Host noise over {s['batches']} measuring batches ({s['kernel']}): the typical "
            f"call ran {100 * s['noise_median']:.1f} % slower than the estimate (median; "
            f"worst batch {100 * s['noise_max']:.1f} %, {s['noisy_batches']} batches over "
            f"10 %), while the estimate itself stayed within {100 * s['estimate_spread']:.2f} %"
            f" ({s['estimate_min']:.4f}-{s['estimate_max']:.4f} cycles).")
    for k, m in s.get("monitors", {}).items():
        if k != s["kernel"]:
            line += (f" {k}: typical call {100 * m['noise_median']:.1f} % slow (worst batch "
                     f"{100 * m['noise_max']:.1f} %), estimate within "
                     f"{100 * m['estimate_spread']:.2f} % ({m['estimate_min']:.4f}-"
                     f"{m['estimate_max']:.4f} cycles).")
    return line


def _plot(table: pd.DataFrame, main: str) -> str:
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 4.6), sharex=True)
    one = table[table["kernel"] == main]
    t = pd.to_datetime(one["timestamp"])
    a1.plot(t, one["cycles_per_instance_median"], "o-", ms=3, lw=1, color="#c44",
            label="from the median calls")
    a1.plot(t, one["cycles_per_instance_est"], "o-", ms=3, lw=1, color="#248",
            label="estimate")
    a1.set_ylabel(f"{main}\ncycles per instance")
    a1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    a1.grid(True, alpha=.3)
    for (kernel, g), color in zip(table.groupby("kernel", sort=False), ("#c44", "#484", "#848"),
                                  strict=False):
        a2.plot(pd.to_datetime(g["timestamp"]), 100 * g["noise"].astype(float), "o-", ms=3,
                lw=1, color=color, label=kernel)
    a2.set_ylabel("noise, %")
    a2.set_xlabel("time (UTC)")
    a2.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    a2.grid(True, alpha=.3)
    fig.autofmt_xdate()
    return figure_html(fig, "The noise monitors of every measuring batch: the integer-add "
                       "monitor's estimate (what the CPU does) and the value of its median "
                       "calls (what the host let it do); noise: how much slower each "
                       "monitor's typical call ran")


def section_html(table: pd.DataFrame) -> str:
    """The report section (an HTML fragment whose <h2> is its title)."""
    s = summary(table)
    parts = ["<h2>How quiet the host was</h2>", f"<p>{esc(summary_line(s))}</p>"]
    if s.get("batches"):
        parts.append(_plot(table, s["kernel"]))
        shown = table[["timestamp", "batch_id", "kernel", "reps", "cycles_per_instance_est",
                       "rel_uncertainty", "cycles_per_instance_median", "noise"]].copy()
        shown["timestamp"] = shown["timestamp"].astype(str)
        parts.append(table_html(shown, pct=("rel_uncertainty", "noise"), digits=4))
    return "\n".join(parts) + "\n"
