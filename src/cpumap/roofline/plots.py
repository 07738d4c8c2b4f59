"""Roofline figures (matplotlib, PNG and SVG): ceilings, sweeps and kernel points.

Roofline plots follow seed 004: log-log, performance (flops per cycle) over operational
intensity (flops per byte); horizontal compute ceilings and unit-slope bandwidth ceilings;
one series per implementation (``<kernel>.<flagset>``, one cache state) with its problem sizes
joined by a line; equal problem sizes of different implementations joined by dashed lines;
at each point a box from the first to the third quartile of the K repetitions' performance
and whiskers to their minimum and maximum (intensity is exact, so boxes are vertical).
The title says which bytes the intensity counts (memory-side from a cache simulation, or
core-side from the executed instructions).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from pathlib import Path

import matplotlib
import matplotlib.legend

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

SVG_META = {"Date": None}
MARKERS = "osD^v<>ph*"
LEVEL_COLORS = {"L1": "#1b9e77", "L2": "#d95f02", "L3": "#7570b3", "DRAM": "#e7298a"}
KIND_COLORS = {"read": "#1f77b4", "write": "#ff7f0e", "copy": "#2ca02c", "triad": "#d62728",
               "ntwrite": "#9467bd"}


def save(fig, out_dir: Path, name: str) -> list[Path]:
    """Write ``name``.png and ``name``.svg (no timestamp in the SVG: reproducible bytes)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    plt.rcParams["svg.hashsalt"] = "cpumap"
    # every legend (also those kept with add_artist) counts for the tight bounding box
    extra = [c for ax in fig.axes for c in ax.get_children()
             if isinstance(c, matplotlib.legend.Legend)] + list(fig.texts)
    fig.savefig(paths[0], dpi=110, bbox_inches="tight", bbox_extra_artists=extra)
    fig.savefig(paths[1], bbox_inches="tight", bbox_extra_artists=extra, metadata=SVG_META)
    plt.close(fig)
    return paths


# ----------------------------------------------------------------------------- ceilings


def compute_ceilings(ceil: Mapping, precision: str = "dp") -> list[tuple[str, float]]:
    """(label, flops/cycle) of the compute ceilings drawn on roofline plots."""
    out = []
    variants = {v["variant"]: v for v in ceil["compute"]["variants"] if v.get("status") == "ok"}
    for name, label in ((f"avx512-{precision}-fma", "AVX-512 FMA"),
                        (f"avx2-{precision}-fma", "AVX2 FMA"),
                        (f"scalar-{precision}-add+mul", "scalar add+mul")):
        v = variants.get(name)
        if v and "one_core" in v:
            out.append((f"{label}, 1 core", v["one_core"]["flops_per_cycle"]))
    best_all = max((v["all_cores"]["flops_per_cycle"], k) for k, v in variants.items()
                   if "all_cores" in v and v["precision"] == precision and
                   v["operation"] == "fma") if variants else None
    if best_all:
        n = variants[best_all[1]]["all_cores"]["cores"]
        out.append((f"FMA, {n} cores", best_all[0]))
    return out


def bandwidth_ceilings(ceil: Mapping, view: str) -> list[tuple[str, float]]:
    """(label, bytes/cycle) of the bandwidth ceilings for a view (mem: DRAM-side, core)."""
    bw = ceil.get("bandwidth", {})
    out = []
    read1 = {lv["label"]: lv["bytes_per_cycle"] for lv in
             bw.get("one_core", {}).get("read", {}).get("levels", [])}
    labels = ("DRAM", "L3") if view == "mem" else ("L1", "L2", "L3", "DRAM")
    for lab in labels:
        if lab in read1:
            out.append((f"{lab} read, 1 core", read1[lab]))
    readn = {lv["label"]: lv["bytes_per_cycle"] for lv in
             bw.get("all_cores", {}).get("read", {}).get("levels", [])}
    if "DRAM" in readn:
        out.append((f"DRAM read, {bw['all_cores']['read']['threads']} cores", readn["DRAM"]))
    return out


def _draw_ceilings(ax, ceil: Mapping, view: str, xlim: tuple[float, float]) -> list:
    """Draw the compute and bandwidth ceilings; return their legend handles."""
    xs = np.logspace(math.log10(xlim[0]), math.log10(xlim[1]), 200)
    peaks: list[tuple[str, float]] = []
    for label, p in compute_ceilings(ceil):  # equal ceilings (within 2 %) share one line
        same = [i for i, (_l, q) in enumerate(peaks) if abs(q / p - 1) < 0.02]
        if same:
            peaks[same[0]] = (f"{peaks[same[0]][0]} = {label}", peaks[same[0]][1])
        else:
            peaks.append((label, p))
    top = max((p for _l, p in peaks), default=1.0)
    handles = []
    for i, (label, p) in enumerate(peaks):
        h = ax.axhline(p, color="0.3", lw=1.2 if i == 0 else 0.8, ls="-" if i == 0 else ":",
                       label=f"{label}: {p:.1f} flop/cycle")
        handles.append(h)
    for label, b in bandwidth_ceilings(ceil, view):
        color = LEVEL_COLORS.get(label.split()[0], "0.5")
        (h,) = ax.plot(xs, np.minimum(b * xs, top), color=color, lw=1.0,
                       ls="--" if "cores" in label else "-", label=f"{label}: {b:.2f} B/cycle")
        handles.append(h)
    return handles


# ----------------------------------------------------------------------------- roofline


def _intensity_col(view: str) -> str:
    return "intensity_mem" if view == "mem" else "intensity_core"


def roofline(points: pd.DataFrame, ceil: Mapping, out_dir: Path, name: str, title: str,
             view: str = "mem") -> list[Path]:
    """One roofline plot of ``points`` (rows of points.parquet, decoded) in one view."""
    col = _intensity_col(view)
    df = points[(points.status == "ok")].copy() if "status" in points else points.copy()
    df = df[df[col].notna() & (df[col] > 0) & df["perf_q"].notna()]
    fig, ax = plt.subplots(figsize=(7.6, 5.6))
    ax.set_xscale("log")
    ax.set_yscale("log")
    if len(df):
        lo = float(df[col].min()) / 4
        hi = max(float(df[col].max()) * 4, 8.0)
    else:
        lo, hi = 1 / 64, 64.0
    xlim = (min(lo, 1 / 32), hi)
    ceiling_handles = _draw_ceilings(ax, ceil, view, xlim)
    series = sorted(df.groupby(["benchmark", "state"]).groups) if len(df) else []
    colors = [plt.get_cmap("tab20")(i) for i in range(20)] if len(series) > 10 else \
        plt.rcParams["axes.prop_cycle"].by_key()["color"]
    series_labels = {f"{b} ({st})" for b, st in series}
    for (bench, state), color, marker in zip(series, itertools.cycle(colors),
                                             itertools.cycle(MARKERS)):
        s = df[(df.benchmark == bench) & (df.state == state)].sort_values("n")
        x = s[col].to_numpy(float)
        med = np.array([q["median"] for q in s["perf_q"]])
        ax.plot(x, med, color=color, marker=marker, ms=4, lw=1.2, label=f"{bench} ({state})")
        for xi, q in zip(x, s["perf_q"], strict=True):
            w = 1.06
            ax.add_patch(plt.Rectangle((xi / w, q["q1"]), xi * w - xi / w,
                                       max(q["q3"] - q["q1"], 1e-12), fill=False,
                                       ec=color, lw=0.8))
            ax.plot([xi, xi], [q["min"], q["q1"]], color=color, lw=0.6)
            ax.plot([xi, xi], [q["q3"], q["max"]], color=color, lw=0.6)
    # equal problem sizes across implementations of one kernel: dashed
    if len(df):
        for _key, g in df.groupby(["kernel", "n", "state"]):
            if len(g) < 2:
                continue
            g = g.sort_values(col)
            ax.plot(g[col], [q["median"] for q in g["perf_q"]], color="0.55", lw=0.7,
                    ls="--", zorder=0)
    ax.set_xlim(*xlim)
    ax.set_xlabel("operational intensity [flop/byte] ("
                  + ("memory-side bytes, Callgrind cache simulation" if view == "mem"
                     else "core-side bytes, executed loads and stores") + ")")
    ax.set_ylabel("performance [flop/cycle]")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    # legends outside the axes, right: they never hide a point
    if ceiling_handles:
        ax.add_artist(ax.legend(handles=ceiling_handles, fontsize=7, loc="upper left",
                                bbox_to_anchor=(1.01, 1.0), title="ceilings (measured)",
                                title_fontsize=7))
    if series:
        ax.legend(handles=[h for h in ax.get_lines() if h.get_label() in series_labels],
                  fontsize=7, loc="lower left", bbox_to_anchor=(1.01, 0.0),
                  ncol=1 if len(series) < 12 else 2, title="implementation (cache state)",
                  title_fontsize=7)
    fig.text(0.01, -0.01, "boxes: quartiles of the K repetitions' performance, whiskers: "
             "min/max; solid lines: one implementation over n;\ndashed grey: equal n across "
             "implementations; points without memory-side bytes (all data cached, or no "
             "simulation) are left out of the memory-side view",
             fontsize=7, color="0.35", va="top")
    return save(fig, out_dir, name)


def versus_size(points: pd.DataFrame, out_dir: Path, name: str, title: str,
                what: str = "intensity", view: str = "mem") -> list[Path]:
    """Intensity (or performance with min-max bars) over the data footprint: one panel per
    kernel, one colour per implementation (flag set), solid warm, dashed cold."""
    df = points[points.status == "ok"].copy() if "status" in points else points.copy()
    col = _intensity_col(view)
    kernels = sorted(df["kernel"].unique()) if len(df) else [""]
    fig, axes = plt.subplots(1, len(kernels), figsize=(5.0 * len(kernels), 4.4),
                             squeeze=False)
    flagsets = sorted(df["flagset"].unique()) if len(df) else []
    colors = dict(zip(flagsets, plt.rcParams["axes.prop_cycle"].by_key()["color"],
                      strict=False))
    for ax, kernel in zip(axes[0], kernels, strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        for (fs, state), s in (df[df.kernel == kernel].groupby(["flagset", "state"])
                               if len(df) else []):
            s = s.sort_values("n")
            x = s["bytes_footprint"].to_numpy(float)
            style = {"color": colors.get(fs), "ls": "-" if state == "warm" else "--",
                     "marker": "o" if state == "warm" else "s", "ms": 4,
                     "label": f"{fs} ({state})"}
            if what == "intensity":
                y = s[col].to_numpy(float)
                ok = np.isfinite(y) & (y > 0)
                ax.plot(x[ok], y[ok], **style)
            else:
                q = list(s["perf_q"])
                y = np.array([v["median"] for v in q])
                err = np.array([[v["median"] - v["min"] for v in q],
                                [v["max"] - v["median"] for v in q]])
                ax.errorbar(x, y, yerr=err, capsize=2, **style)
        ax.set_title(kernel, fontsize=10)
        ax.set_xlabel("data footprint [bytes]")
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("operational intensity [flop/byte] (memory-side)"
                          if what == "intensity"
                          else "performance [flop/cycle] (median, min-max bars)")
    fig.suptitle(title, fontsize=10)
    return save(fig, out_dir, name)


# ----------------------------------------------------------------------------- ceilings plots


def sweep_plot(ceil: Mapping, out_dir: Path, name: str = "bandwidth_sweep") -> list[Path]:
    """Bytes per cycle over the working set, per access kind, one panel per scope."""
    bw = ceil["bandwidth"]
    scopes = [s for s in ("one_core", "all_cores") if s in bw]
    fig, axes = plt.subplots(1, len(scopes), figsize=(6.2 * len(scopes), 4.6), sharey=True,
                             squeeze=False)
    for ax, scope in zip(axes[0], scopes, strict=True):
        for kind, rec in sorted(bw[scope].items()):
            sw = sorted(rec["sweep"], key=lambda r: r["bytes"])
            x = [r["bytes"] for r in sw]
            ax.plot(x, [r["bytes_per_cycle"] for r in sw], marker="o", ms=3,
                    color=KIND_COLORS.get(kind), label=kind)
            for lv in rec["levels"]:
                ax.plot([min(lv["sizes"]), max(lv["sizes"])], [lv["bytes_per_cycle"]] * 2,
                        color=KIND_COLORS.get(kind), lw=4, alpha=0.3)
                if kind == "read":
                    ax.text(math.sqrt(min(lv["sizes"]) * max(lv["sizes"])),
                            lv["bytes_per_cycle"] * 1.08, lv["label"], ha="center",
                            fontsize=8, color=KIND_COLORS["read"])
        threads = next(iter(bw[scope].values()))["threads"]
        for c in ceil.get("caches", []):
            share = c["bytes"] / max(1, min(threads, c["shared_cpus"]))
            ax.axvline(share, color="0.6", lw=0.8, ls=":")
            ax.text(share, 0.01, f" L{c['level']}", fontsize=7, color="0.4", va="bottom",
                    transform=ax.get_xaxis_transform())
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("working set per thread [bytes]")
        ax.set_title(f"{scope.replace('_', ' ')} ({threads} thread{'s' if threads > 1 else ''})"
                     ", best of K", fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
    axes[0][0].set_ylabel("bytes per cycle (all threads; core-side, STREAM counting)")
    axes[0][-1].legend(fontsize=8)
    return save(fig, out_dir, name)


def compute_plot(ceil: Mapping, out_dir: Path, name: str = "compute_ceilings") -> list[Path]:
    """Measured flops/cycle per compute variant (one core, all cores) and theoretical peaks."""
    comp = ceil["compute"]
    vs = [v for v in comp["variants"] if v.get("status") == "ok"]
    fig, ax = plt.subplots(figsize=(11, 4.6))
    labels = [v["variant"] for v in vs]
    x = np.arange(len(vs))
    one = [v.get("one_core", {}).get("flops_per_cycle", 0) for v in vs]
    alln = [v.get("all_cores", {}).get("flops_per_cycle", 0) for v in vs]
    ax.bar(x - 0.2, one, 0.4, label="1 core (best of K)", color="#4c72b0")
    if any(alln):
        ax.bar(x + 0.2, alln, 0.4, label="all cores (sum)", color="#dd8452")
    for prec, d in comp.get("theoretical", {}).items():
        for kind, p in d.items():
            ax.axhline(p["flops_per_cycle"], ls="--", lw=0.8,
                       color="#c44e52" if prec == "dp" else "#8172b2")
            ax.text(len(vs) - 0.5, p["flops_per_cycle"], f"theory {prec} {kind} (1 core)",
                    fontsize=7, ha="right", va="bottom")
    ax.set_xticks(x, labels, rotation=75, fontsize=7)
    ax.set_yscale("log", base=2)
    ax.set_ylabel("flops per cycle")
    ax.set_title("compute ceilings: generated kernels (cpumap harness), theoretical peaks "
                 "from the FP pipe table", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return save(fig, out_dir, name)


def all_plots(ceil: Mapping, points: pd.DataFrame | None, out_dir: Path) -> list[Path]:
    """Every figure of the roofline stage; returns the written paths."""
    paths = sweep_plot(ceil, out_dir) if ceil.get("bandwidth") else []
    paths += compute_plot(ceil, out_dir)
    if points is None or not len(points):
        paths += roofline(pd.DataFrame(columns=["status", "perf_q", "intensity_mem"]), ceil,
                          out_dir, "roofline_mem", "roofline (no kernel points)", "mem")
        return paths
    ok = points[points.status == "ok"]
    paths += roofline(ok, ceil, out_dir, "roofline_mem",
                      "all kernels: memory-side view (Callgrind cache simulation)", "mem")
    paths += roofline(ok, ceil, out_dir, "roofline_core",
                      "all kernels: core-side view (executed loads and stores)", "core")
    for kernel, g in ok.groupby("kernel"):
        paths += roofline(g, ceil, out_dir, f"roofline_{kernel}_mem",
                          f"{kernel}: memory-side view", "mem")
        paths += roofline(g, ceil, out_dir, f"roofline_{kernel}_core",
                          f"{kernel}: core-side view", "core")
    paths += versus_size(ok, out_dir, "intensity_vs_size",
                         "operational intensity (memory-side) over problem size", "intensity")
    paths += versus_size(ok, out_dir, "performance_vs_size",
                         "performance over problem size", "performance")
    return paths
