"""The self-contained HTML report of the analyzer evaluation (results/<mid>/report/index.html).

One file, no external resources: inline CSS, plots embedded as base64 PNG (matplotlib, Agg), so
it can be mailed or archived with the results. Other stages add their own sections (the
roofline) through ``extra_sections``: a :class:`Section` holds a title and a body of HTML,
:func:`figure_html` embeds a matplotlib figure, :func:`fragment_section` reads an HTML
fragment file written by another rule.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from cpumap.evaluate.corpus import COMMON  # noqa: E402
from cpumap.evaluate.coverage import Coverage  # noqa: E402
from cpumap.evaluate.suite import PROCESS_AGREE  # noqa: E402
from cpumap.store.files import write_bytes_atomic, write_text_atomic  # noqa: E402

__all__ = ["Section", "build_report", "figure_html", "fragment_section", "table_html",
           "write_report"]

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;line-height:1.4}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.sub td{color:#555;font-size:.95em}tr.sub td:first-child{padding-left:1.5em}
tr.unavailable td{color:#777}.fail{color:#a00}.muted{color:#777}
figure{display:inline-block;margin:.5em;text-align:center}figure img{max-width:520px}
figcaption{font-size:.85em;color:#444}code{background:#f6f6f6;padding:0 .2em}
nav a{margin-right:1em}
"""


@dataclass
class Section:
    """A titled part of the report; ``body`` is HTML."""

    title: str
    body: str
    anchor: str = ""

    def slug(self) -> str:
        return self.anchor or re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")


def esc(x) -> str:
    return html.escape(str(x))


def _fmt(v, digits: int = 3, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, float):
        return f"{100 * v:.1f} %" if pct else f"{v:.{digits}f}"
    return esc(v)


def table_html(df: pd.DataFrame, pct: Iterable[str] = (), digits: int = 3,
               row_class: Sequence[str] | None = None) -> str:
    """An HTML table of a data frame; float columns right-aligned, ``pct`` as percentages."""
    pct = set(pct)
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    rows = []
    for i, rec in enumerate(df.itertuples(index=False)):
        cells = []
        for c, v in zip(df.columns, rec, strict=True):
            num = isinstance(v, (int, float)) and not isinstance(v, bool)
            cls = ' class="num"' if num else ""
            cells.append(f"<td{cls}>{_fmt(v, digits, c in pct)}</td>")
        cls = f' class="{row_class[i]}"' if row_class and row_class[i] else ""
        rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def figure_html(fig, caption: str = "", alt: str = "", png: Path | None = None) -> str:
    """A matplotlib figure as an embedded PNG (and closes the figure); with ``png``, the same
    image also written there (the pipeline's plots for ``snakemake --report``)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    if png is not None:
        write_bytes_atomic(buf.getvalue(), png)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    cap = f"<figcaption>{caption}</figcaption>" if caption else ""
    return (f'<figure><img alt="{esc(alt or caption)}" '
            f'src="data:image/png;base64,{data}">{cap}</figure>')


def fragment_section(path: str | Path, title: str | None = None) -> Section:
    """A section from an HTML fragment file (its first <h2> is the title unless given)."""
    text = Path(path).read_text(encoding="utf-8")
    m = re.search(r"<h2[^>]*>(.*?)</h2>", text, re.S | re.I)
    if title is None:
        title = re.sub(r"<[^>]+>", "", m.group(1)).strip() if m else Path(path).stem
    if m:
        text = text[:m.start()] + text[m.end():]
    return Section(title, text)


def scatter_plot(kernels: pd.DataFrame, analyzer: str, png: Path | None = None) -> str:
    """Predicted vs measured IPC of one analyzer's eligible, predicted benchmarks."""
    k = kernels[(kernels.analyzer == analyzer) & kernels.eligible & (kernels.status == "ok")]
    k = k.dropna(subset=["ipc_measured", "ipc_predicted"])
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    if k.empty:
        ax.text(0.5, 0.5, "no predicted kernel", ha="center", va="center",
                transform=ax.transAxes)
    else:
        for fs, g in k.groupby("flagset"):
            ax.scatter(g.ipc_measured, g.ipc_predicted, label=fs, s=22, alpha=.8)
        hi = max(k.ipc_measured.max(), k.ipc_predicted.max()) * 1.1
        ax.plot([0, hi], [0, hi], color="#888", lw=1, ls="--", label="y = x")
        ax.set_xlim(0, hi)
        ax.set_ylim(0, hi)
        ax.set_aspect("equal")
        ax.legend(fontsize=8)
    ax.set_xlabel("measured IPC")
    ax.set_ylabel("predicted IPC")
    ax.set_title(analyzer)
    ax.grid(True, which="both", alpha=.3)
    return figure_html(fig, f"{esc(analyzer)}: predicted vs measured IPC ({len(k)} kernels)",
                       f"{analyzer} scatter plot", png)


def _target_note(target: Mapping | None) -> str:
    """", target znver4 (the host's)": the machine model an external analyzer simulated."""
    if not target:
        return ""
    how = {"host": "the host's", "config": "from the config",
           "fallback": "fallback: no model of this host"}.get(target.get("how", ""), "")
    return f", target {target.get('value', '?')}" + (f" ({how})" if how else "")


def _metrics_section(metrics: pd.DataFrame, analyzers: Mapping[str, Mapping]) -> Section:
    head = ("<tr><th>analyzer</th><th>flag set</th><th>status</th><th>kernels eligible</th>"
            "<th>kernels predicted</th><th>coverage</th><th>RMS rel. error of IPC</th>"
            "<th>MAPE of IPC</th><th>Kendall's τ</th></tr>")
    rows = []
    for name, info in analyzers.items():
        status = info.get("status", "")
        if status != "ran":
            rows.append(f'<tr class="unavailable"><td>{esc(name)}</td><td>—</td>'
                        f'<td>{esc(status)}: {esc(info.get("reason", ""))}</td>'
                        + "<td></td>" * 6 + "</tr>")
            continue
        m = metrics[metrics.analyzer == name]
        for r in m.itertuples(index=False):
            sub = r.flagset != "all"
            cls = ' class="sub"' if sub else ""
            first = "" if sub else esc(name)
            st = "" if sub else "ran" + _target_note(info.get("target"))
            rows.append(
                f"<tr{cls}><td>{first}</td><td>{esc(r.flagset)}</td><td>{st}</td>"
                f'<td class="num">{r.eligible}</td><td class="num">{r.predicted}</td>'
                f'<td class="num">{_fmt(r.coverage, pct=True)}</td>'
                f'<td class="num">{_fmt(r.rms_rel_error_ipc, pct=True)}</td>'
                f'<td class="num">{_fmt(r.mape_ipc, pct=True)}</td>'
                f'<td class="num">{_fmt(r.kendall_tau)}</td></tr>')
    desc = "".join(f"<li><b>{esc(n)}</b>: {esc(i.get('description', ''))}</li>"
                   for n, i in analyzers.items() if i.get("status") == "ran")
    body = (f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
            f"<ul>{desc}</ul>"
            "<p class=\"muted\">Coverage: kernels with a lifted prediction over eligible kernels "
            "(measured, not excluded as non-L1-resident); a kernel is discarded for an analyzer "
            "that fails on any executed block. Errors are relative errors of the predicted "
            "IPC against the measured whole-kernel IPC.</p>")
    return Section("Metrics", body, "metrics")


def _unsettled(r) -> str:
    spread = float(getattr(r, "cycles_spread", math.nan))
    if not spread > PROCESS_AGREE:
        return ""
    return (f' <span class="fail" title="the two fastest driver processes were '
            f'{100 * spread:.1f} % apart">(unsettled)</span>')


def _kernels_section(kernels: pd.DataFrame, analyzers: Sequence[str]) -> Section:
    if kernels.empty:
        return Section("Kernels", "<p>No kernel.</p>", "kernels")
    base = kernels.drop_duplicates("benchmark").set_index("benchmark")
    rows = []
    for bench, r in base.sort_index().iterrows():
        cg = (_fmt(float(r.d1_miss_rate), pct=True) if r.cachegrind == "ok"
              else f'<span class="muted">{esc(r.cachegrind)}: '
                   f'{esc(str(r.cachegrind_error)[:160])}</span>')
        cells = [f"<td>{esc(bench)}</td>", f'<td class="num">{int(r.instructions)}</td>',
                 f'<td class="num">{_fmt(r.measured_cycles, 0)}{_unsettled(r)}</td>',
                 f'<td class="num">{_fmt(r.ipc_measured)}</td>', f"<td>{cg}</td>",
                 f'<td class="fail">{esc(r.excluded)}</td>']
        for a in analyzers:
            k = kernels[(kernels.benchmark == bench) & (kernels.analyzer == a)]
            if k.empty:
                cells.append("<td></td>")
                continue
            k = k.iloc[0]
            if k.status == "ok":
                err = _fmt(k.rel_error_ipc, pct=True)
                cells.append(f'<td class="num">{_fmt(k.ipc_predicted)} ({err})</td>')
            else:
                cells.append(f'<td class="fail" title="{esc(k.error)}">discarded: '
                             f"{k.failed_blocks}/{k.blocks} blocks failed</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    head = ("<tr><th>benchmark</th><th>executed instructions</th><th>measured cycles</th>"
            "<th>measured IPC</th><th>D1 misses (warm, Cachegrind)</th><th>excluded</th>"
            + "".join(f"<th>{esc(a)}: IPC (error)</th>" for a in analyzers) + "</tr>")
    return Section("Kernels", f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody>"
                   "</table><p class=\"muted\">Hover a discarded cell for the first failure."
                   "</p>", "kernels")


def _details_section(blocks: pd.DataFrame, counts: pd.DataFrame, predictions: pd.DataFrame,
                     analyzers: Sequence[str]) -> Section:
    """Per benchmark (collapsed): every executed block with its occurrences, instructions and
    each analyzer's cycles per execution or failure."""
    if blocks is None or blocks.empty:
        return Section("Kernel details", "<p>No blocks.</p>", "details")
    b = blocks.merge(counts[["benchmark", "block_id", "occurrences"]],
                     on=["benchmark", "block_id"], how="left")
    b["occurrences"] = b["occurrences"].fillna(0).astype("int64")
    p = predictions.set_index(["analyzer", "benchmark", "block_id"]).sort_index()
    parts = []
    for bench, g in b.groupby("benchmark", sort=True):
        ex = g[g.occurrences > 0].sort_values("block_id")
        head = ("<tr><th>block</th><th>occurrences</th><th>instructions</th>"
                + "".join(f"<th>{esc(a)} cycles</th>" for a in analyzers) + "</tr>")
        rows = []
        for r in ex.itertuples(index=False):
            code = "<br>".join(esc(i) for i in list(r.insns))
            cells = [f'<td class="num">{int(r.block_id)}</td>',
                     f'<td class="num">{int(r.occurrences)}</td>', f"<td><code>{code}</code></td>"]
            for a in analyzers:
                key = (a, bench, int(r.block_id))
                if key not in p.index:
                    cells.append("<td></td>")
                    continue
                q = p.loc[key]
                q = q.iloc[0] if isinstance(q, pd.DataFrame) else q
                if q.status == "ok":
                    note = f' title="{esc(q.error)}"' if q.error else ""
                    mark = " *" if q.error else ""
                    cells.append(f'<td class="num"{note}>{_fmt(float(q.cycles), 2)}{mark}</td>')
                else:
                    cells.append(f'<td class="fail">{esc(str(q.error)[:200])}</td>')
            rows.append(f"<tr>{''.join(cells)}</tr>")
        parts.append(f"<details><summary>{esc(bench)}: {len(ex)} executed blocks of "
                     f"{len(g)}</summary><table><thead>{head}</thead><tbody>{''.join(rows)}"
                     "</tbody></table></details>")
    return Section("Kernel details", "<p class=\"muted\">Executed blocks of each benchmark "
                   "(instructions as the analyzers saw them; * an analyzer ignored something, "
                   "hover for what).</p>" + "".join(parts), "details")


def _failures_section(predictions: pd.DataFrame) -> Section:
    if predictions.empty:
        return Section("Block failures", "<p>No predictions.</p>", "failures")
    p = predictions.copy()
    summary = (p.groupby("analyzer").agg(blocks=("status", "size"),
                                          ok=("status", lambda s: int((s == "ok").sum())))
               .reset_index())
    summary["failed"] = summary.blocks - summary.ok
    noted = p[(p.status == "ok") & (p.error.fillna("") != "")]
    summary["ok, with something ignored"] = [int((noted.analyzer == a).sum())
                                             for a in summary.analyzer]
    f = p[p.status != "ok"].copy()
    body = table_html(summary)
    if len(noted):
        n = noted.copy()
        n["note"] = n.error.str.slice(0, 140)
        top_n = (n.groupby(["analyzer", "note"]).agg(blocks=("block_id", "size"))
                 .reset_index().sort_values("blocks", ascending=False).head(12))
        body += "<h3>Most frequent notes on ok blocks</h3>" + table_html(top_n)
    if len(f):
        # group errors by their text up to the first ':' detail, keep one example each
        f["reason"] = f.error.str.replace(r"0x[0-9a-f]+", "0x…", regex=True).str.slice(0, 140)
        top = (f.groupby(["analyzer", "reason"]).agg(blocks=("block_id", "size"),
                                                     example=("benchmark", "first"))
               .reset_index().sort_values(["analyzer", "blocks"], ascending=[True, False]))
        top = top.groupby("analyzer").head(12)
        body += "<h3>Most frequent failures</h3>" + table_html(top)
    return Section("Block failures", body, "failures")


def build_report(*, title: str, header: Mapping[str, str], metrics: pd.DataFrame,
                 kernels: pd.DataFrame, predictions: pd.DataFrame,
                 analyzers: Mapping[str, Mapping], notes: Sequence[str] = (),
                 extra_sections: Sequence[Section] = (), blocks: pd.DataFrame | None = None,
                 counts: pd.DataFrame | None = None, plots: Path | None = None) -> str:
    """The whole report as one HTML string; with ``plots``, each analyzer's scatter plot also
    as ``<analyzer>.png`` there.

    ``analyzers``: name -> {"status": "ran" | "not run" | "unavailable", "reason",
    "description"}, in table order. ``extra_sections`` come after the evaluation sections.
    With ``blocks`` (analyzer inputs: benchmark, block_id, insns) and ``counts``, a per-kernel
    details section lists every executed block with each analyzer's answer.
    """
    ran = [n for n, i in analyzers.items() if i.get("status") == "ran"]
    figures = "".join(scatter_plot(kernels, a, plots / f"{a}.png" if plots else None)
                      for a in ran) if len(kernels) else ""
    sections = [
        _metrics_section(metrics, analyzers),
        Section("Predicted vs measured", figures or "<p>No kernel.</p>", "plots"),
        _kernels_section(kernels, ran),
        *([_details_section(blocks, counts, predictions,
                            [a for a in ran if a in set(predictions.analyzer)])]
          if blocks is not None and counts is not None else []),
        _failures_section(predictions),
        *extra_sections,
    ]
    head = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in header.items())
    note = "".join(f"<p>{n}</p>" for n in notes)
    nav = "".join(f'<a href="#{s.slug()}">{esc(s.title)}</a>' for s in sections)
    body = "".join(f'<section id="{s.slug()}"><h2>{esc(s.title)}</h2>{s.body}</section>'
                   for s in sections)
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{esc(title)}</h1><table>{head}</table>{note}<nav>{nav}</nav>{body}"
            "</body></html>\n")


def write_report(path: str | Path, **kwargs) -> Path:
    """Build the report (see :func:`build_report`) and write it atomically."""
    return write_text_atomic(build_report(**kwargs), path)


def sse_avx_note(mixing: Coverage, probe: Mapping) -> str:
    """One paragraph on the blocks that mix legacy SSE and 256-bit AVX (``mixing``: a
    :class:`cpumap.evaluate.coverage.Coverage` of the suite) and what a switch costs on this
    host (``probe``: the catalogue stage's transition probe)."""
    if not probe.get("probed"):
        cost = f"not probed ({esc(str(probe.get('reason', '')))})"
    elif probe.get("penalty"):
        cost = (f"{float(probe['cycles_per_switch']):.0f} cycles per switch, measured "
                f"({esc(str(probe.get('sse_form')))} with {esc(str(probe.get('avx_form')))}); "
                "the model adds it per switch of the block's order")
    else:
        cost = (f"no penalty measured ({esc(str(probe.get('sse_form')))} with "
                f"{esc(str(probe.get('avx_form')))} ran at the speed of their parts)")
    share = mixing.mixing_weight / mixing.total if mixing.total > 0 else 0.0
    return (f"Blocks mixing legacy-SSE and 256-bit AVX forms: {mixing.mixing_blocks} of "
            f"{mixing.blocks} ({100 * share:.1f} % of the executed instructions). "
            f"SSE/AVX switches on this host: {cost}.")


def residency_note(summary: Mapping) -> str:
    """One paragraph on the L1-residency filter, from the metrics summary."""
    thr = 100 * float(summary.get("miss_threshold", 0.15))
    cg = summary.get("cachegrind", {})
    over = summary.get("excluded_not_l1", {})
    unchecked = summary.get("residency_unchecked", {})
    parts = [f"L1 residency (Cachegrind, warm cache, D1 misses of the kernel function): "
             f"{cg.get('ok', 0)} benchmarks checked"]
    if over:
        parts.append(f"{len(over)} excluded above {thr:.0f} % ("
                     + ", ".join(f"{esc(b)} {100 * r:.1f} %" for b, r in sorted(over.items()))
                     + ")")
    else:
        parts.append(f"none above {thr:.0f} %")
    if unchecked:
        avx = [b for b, e in unchecked.items() if "AVX-512" in e]
        other = [b for b in unchecked if b not in avx]
        if avx:
            parts.append(f"{len(avx)} not checked because Valgrind 3.19 cannot run AVX-512 "
                         f"code ({esc(', '.join(sorted(avx)))}); they are kept")
        if other:
            parts.append(f"{len(other)} not checked for another reason "
                         f"({esc(', '.join(sorted(other)))}; see the kernels table)")
    text = "; ".join(parts) + "."
    if summary.get("instructions_checked"):
        text += (f" Executed instructions (gdb block occurrences × block sizes) equal "
                 f"Cachegrind's count for the kernel function in "
                 f"{summary.get('instructions_equal_cachegrind', 0)} of "
                 f"{summary['instructions_checked']} checked benchmarks.")
    unsettled = summary.get("unsettled") or {}
    if unsettled:
        text += (f" Measured cycles never settled for {len(unsettled)} benchmarks (the two "
                 f"fastest driver processes more than {100 * PROCESS_AGREE:g} % apart: "
                 + ", ".join(f"{esc(b)} {100 * v:.1f} %" for b, v in sorted(unsettled.items()))
                 + "); they are kept, their measured IPC is the fastest process's.")
    return text


def density_plot(truth_ipc: pd.Series, pred_ipc: pd.Series, title: str, truth: str,
                 png: Path | None = None) -> str:
    """Predicted vs measured IPC of blocks: points where they are few, a log-density
    hexbin where they are thousands."""
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    n = len(truth_ipc)
    if n == 0:
        ax.text(0.5, 0.5, "no block compared", ha="center", va="center",
                transform=ax.transAxes)
    else:
        hi = float(max(truth_ipc.max(), pred_ipc.max())) * 1.05
        if n > 2000:
            hb = ax.hexbin(truth_ipc, pred_ipc, gridsize=60, bins="log", mincnt=1,
                           extent=(0, hi, 0, hi), cmap="viridis")
            fig.colorbar(hb, ax=ax, label="blocks")
        else:
            ax.scatter(truth_ipc, pred_ipc, s=8, alpha=.5)
        ax.plot([0, hi], [0, hi], color="#888", lw=1, ls="--")
        ax.set_xlim(0, hi)
        ax.set_ylim(0, hi)
        ax.set_aspect("equal")
    ax.set_xlabel(f"measured IPC ({truth})")
    ax.set_ylabel("predicted IPC")
    ax.set_title(title)
    ax.grid(True, alpha=.3)
    return figure_html(fig, f"{esc(title)} against {esc(truth)}: {n} blocks", title, png)


def corpus_section(blocks: pd.DataFrame, predictions: pd.DataFrame, metrics: pd.DataFrame,
                   metas: Sequence[Mapping], directory: str, plots: Path | None = None) -> str:
    """The report's section on a block corpus (an HTML fragment, its first <h2> the title);
    with ``plots``, each density plot also as ``<analyzer>.png`` there."""
    apps = sorted(blocks.benchmark.unique())
    parts = ["<h2>Real basic blocks (BHive corpus)</h2>",
             f"<p>{len(blocks)} blocks ({blocks.code.nunique()} distinct) of {len(apps)} "
             f"applications from <code>{esc(directory)}</code>. Two ground truths measured "
             "here: <b>written</b>, the block as written (BHive's method: its own bytes, "
             "registers and loop-carried chains, pages mapped on first touch), and "
             "<b>native</b>, its multiset of forms through our generator (Palmed's "
             "definition). Coverage: blocks compared / blocks the truth measured. RMS and "
             "MAPE of IPC also weighted by the blocks' frequency; Kendall's tau unweighted."
             "</p>"]
    for m in metas:
        answered = m.get("blocks", 0) - m.get("failed_blocks", 0)
        errors = "; ".join(f"{k} ({v})" for k, v in list((m.get("errors") or {}).items())[:3])
        parts.append(f"<p><b>{esc(m['analyzer'])}</b>: {esc(m.get('description', ''))}; "
                     f"{answered} of {m.get('blocks', 0)} blocks answered in "
                     f"{float(m.get('seconds', 0)):.1f} s"
                     + (f"; most frequent failures: {esc(errors)}" if errors else "") + "</p>")
    pct = ("coverage", "rms_rel_error_ipc", "mape_ipc", "rms_weighted", "mape_weighted")
    for app, title in (("all", "All blocks"),
                       (COMMON, "The blocks every analyzer answered (the same for all)")):
        parts.append(f"<h3>{title}</h3>")
        parts.append(table_html(metrics[metrics.application == app].drop(columns="application"),
                                pct=pct))
    per_app = metrics[(metrics.truth == "written") & ~metrics.application.isin(["all", COMMON])]
    if len(per_app):
        parts.append("<h3>Per application, against the block as written</h3>")
        parts.append(table_html(per_app.drop(columns="truth"), pct=pct))
    wide = predictions.pivot_table(index=["benchmark", "block_id"], columns="analyzer",
                                   values="cycles", aggfunc="first")
    n = blocks.set_index(["benchmark", "block_id"]).n_insns.reindex(wide.index)
    if "written" in wide:
        for a in [c for c in wide.columns if c != "written"]:
            ok = wide.written.gt(0) & wide[a].gt(0)
            parts.append(density_plot(n[ok] / wide.written[ok], n[ok] / wide[a][ok], a,
                                      "written", plots / f"{a}.png" if plots else None))
    return "\n".join(parts) + "\n"
