"""The roofline section of the report (report/index.html): HTML with the figures inlined.

``section_html`` returns one self-contained fragment whose first <h2> is the section title
(cpumap.evaluate.report.fragment_section reads it); the figures are the PNGs of plots.all_plots,
embedded as data URIs, so the report stays one file.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from pathlib import Path

import pandas as pd


def _img(path: Path, caption: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(caption)}" '
            f'style="max-width:100%"><figcaption>{html.escape(caption)}</figcaption></figure>')


def _f(x, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def peak_rows(ceil: Mapping) -> list[list[str]]:
    rows = []
    for prec, d in sorted(ceil["compute"].get("peaks", {}).items()):
        for kind, rec in d.items():
            t = rec["theoretical"]
            rows.append([prec, kind, html.escape(rec["variant"]),
                         _f(rec["measured_flops_per_cycle"]), _f(t["flops_per_cycle"], 1),
                         f"{rec['fraction']:.1%}",
                         html.escape(f"{t['form']}: {t['flops_per_insn']} flops x "
                                     f"{t['insns_per_cycle']:g}/cycle; "
                                     f"{t['table_row']['source']}")])
    return rows


def bandwidth_rows(ceil: Mapping) -> list[list[str]]:
    rows = []
    for scope, kinds in sorted(ceil["bandwidth"].items()):
        for kind, rec in sorted(kinds.items()):
            for lv in rec["levels"]:
                rows.append([scope.replace("_", " "), kind, lv["label"],
                             _f(lv["bytes_per_cycle"]), _f(lv["gbs"], 1),
                             f"{min(lv['sizes']) // 1024}–{max(lv['sizes']) // 1024} KiB "
                             f"({len(lv['sizes'])})", f"{lv['agreement']:.0%}"])
            if rec["check"].get("problems"):
                rows.append([scope.replace("_", " "), kind, "check",
                             html.escape("; ".join(rec["check"]["problems"])), "", "", ""])
    return rows


def point_rows(points: pd.DataFrame) -> list[list[str]]:
    rows = []
    for _, p in points.sort_values(["kernel", "flagset", "state", "n"]).iterrows():
        if p["status"] != "ok":
            rows.append([html.escape(p["benchmark"]), str(p["n"]), p["state"], p["status"],
                         html.escape(str(p.get("reason", ""))[:160]), "", "", "", ""])
            continue
        perf = p["perf_q"]["median"] if isinstance(p.get("perf_q"), dict) else None
        rows.append([html.escape(p["benchmark"]), str(p["n"]), p["state"], p["count_source"],
                     str(int(p["flops"])), _f(p["flops"] / p["n"], 3),
                     _f(p.get("intensity_core"), 4),
                     _f(p.get("intensity_mem"), 4) if p.get("intensity_mem") else "—",
                     _f(perf, 3)])
    return rows


def section_html(ceil: Mapping, points: pd.DataFrame | None, plots_dir: Path,
                 checks: list[dict] | None = None) -> str:
    """The report section: what was measured, the tables, the figures and what they show."""
    plots_dir = Path(plots_dir)
    clock = ceil["clock"]
    parts = ["<h2>Roofline</h2>",
             "<p>Compute ceilings are generated kernels measured by the cpumap harness; "
             "bandwidth ceilings come from a working-set sweep (harness/bw_sweep.c: read, "
             "write, copy, triad, non-temporal write; one core and all cores at once); kernel "
             "points from the real-kernel suite. "
             f"Clock: {html.escape(clock['kind'])} — {html.escape(clock['cycles'])}; TSC "
             f"{_f(clock['tsc_mhz'], 1)} MHz, core clock estimate "
             f"{_f(clock['core_ghz_estimate'], 3)} GHz (compute runs) / "
             f"{_f(clock['core_ghz_estimate_sweep'], 3)} GHz (sweep).</p>",
             "<h3>Peak flops per cycle, measured vs theoretical (one core)</h3>",
             _table(["precision", "peak", "best variant", "measured", "theoretical",
                     "fraction", "derivation"], peak_rows(ceil)),
             _img(plots_dir / "compute_ceilings.png",
                  "Compute ceilings per variant (one core, all cores) and theoretical peaks."),
             "<h3>Bandwidth plateaus</h3>",
             f"<p>{html.escape(ceil['bytes_convention'])}.</p>",
             _table(["scope", "kind", "level", "B/cycle", "GB/s", "working sets", "fit"],
                    bandwidth_rows(ceil)),
             ]
    if (plots_dir / "bandwidth_sweep.png").exists():
        parts.append(_img(plots_dir / "bandwidth_sweep.png",
                          "Bandwidth over the working set; shaded: detected plateaus; dotted: "
                          "cache capacities (per thread)."))
    if checks:
        parts.append("<h3>Checks</h3><ul>" + "".join(
            f"<li>{'✔' if c['ok'] else '✘'} {html.escape(c['text'])}</li>" for c in checks)
            + "</ul>")
    if points is not None and len(points):
        parts += ["<h3>Kernel points</h3>",
                  "<p>Flops exact from the executed instructions (FMA = 2); core-side bytes "
                  "from the executed loads and stores; memory-side bytes from Callgrind's cache "
                  "simulation (no hardware counters on this machine); cycles: K native "
                  "repetitions.</p>",
                  _table(["benchmark", "n", "state", "counts", "flops", "flops/n",
                          "I core", "I mem", "flop/cycle (median)"], point_rows(points))]
        for name, cap in (("roofline_mem", "Roofline, memory-side view (simulated DRAM "
                           "traffic)."),
                          ("roofline_core", "Roofline, core-side view."),
                          ("intensity_vs_size", "Memory-side intensity over problem size."),
                          ("performance_vs_size", "Performance over problem size.")):
            if (plots_dir / f"{name}.png").exists():
                parts.append(_img(plots_dir / f"{name}.png", cap))
    return "\n".join(parts) + "\n"
