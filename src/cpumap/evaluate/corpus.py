"""Real basic blocks at scale: a BHive-format corpus, every analyzer on every block, compared
with two ground truths measured here.

A corpus directory holds one ``<application>.csv`` per application (optionally under
``sources/``), ``hex,frequency`` lines (BHive's format: the block's machine code without its
final branch, and its static frequency in the application). The pipeline's default reads the
vendored sample (``data/bhive-sample``); ``corpus.dir`` points at a whole corpus.

Two ground truths, as the field uses them:

- **written**: the block as written (BHive's method, :mod:`cpumap.measure.blockgen`), its
  registers, dependences and loop-carried chains as the compiler left them;
- **native**: the block's multiset of forms through our generator (Palmed's definition of a
  block's throughput: no dependences, every form at its throughput).

Per ground truth, analyzer and application (and over all applications): blocks, blocks with
both a measurement and a prediction, coverage, RMS relative error of IPC, MAPE of IPC,
Kendall's tau of the IPC ranking, unweighted and weighted by the blocks' frequency (RMS and
MAPE; Kendall's tau has no frequency-weighted form here: the pairwise weights of 38,000 blocks
cost 10^9 pairs, and scipy's weightedtau weighs ranks, not blocks).
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from cpumap.evaluate.coverage import read_corpus
from cpumap.isa import x86

__all__ = ["COMMON", "TRUTHS", "corpus_blocks", "corpus_sources", "merge_shards",
           "metrics_table", "shard_of"]

#: The analyzers that are ground truths: measured here, on this CPU.
TRUTHS = ("written", "native")
#: The metrics' "application" of the blocks every analyzer answered (all applications).
COMMON = "all, blocks every analyzer answered"


def corpus_sources(directory: str | Path) -> dict[str, Path]:
    """Application -> CSV file of a corpus directory (``sources/*.csv`` or ``*.csv``; the
    ``.goto`` of OpenBLAS's file names dropped)."""
    d = Path(directory)
    base = d / "sources" if (d / "sources").is_dir() else d
    files = sorted(base.glob("*.csv"))
    if not files:
        raise ValueError(f"{d}: no <application>.csv files (BHive's hex,frequency format)")
    return {p.stem.removesuffix(".goto"): p for p in files}


def corpus_blocks(sources: dict[str, Path], catalogue) -> pd.DataFrame:
    """The blocks table of a corpus, in the columns of the suite's blocks tables (so that
    every analyzer reads it), plus ``frequency`` and ``code``: one row per block and
    application (``block_id``: the line in the application's file)."""
    rows = []
    for app, path in sources.items():
        for i, (hexes, freq) in enumerate(read_corpus(path)):
            # an invalid instruction or an empty line stays in the table: the analyzers say
            # so (render_att)
            decoded = x86.instruction_hexes(bytes.fromhex(hexes))
            parts = [h for _, h in decoded] or [hexes]
            forms = [catalogue.by_key.get(x86.form_key(ins), "") for ins, _ in decoded] or [""]
            rows.append({"benchmark": app, "function": "", "block_id": i, "address": 0,
                         "end": len(hexes) // 2, "n_insns": len(parts), "insns": [],
                         "hexes": parts, "forms": forms, "terminator": "",
                         "frequency": float(freq), "code": hexes})
    return pd.DataFrame(rows)


def _metrics(truth: np.ndarray, pred: np.ndarray, n: np.ndarray, w: np.ndarray) -> dict:
    ok = np.isfinite(truth) & np.isfinite(pred) & (truth > 0) & (pred > 0)
    if not ok.any():
        return {"compared": 0, "rms_rel_error_ipc": math.nan, "mape_ipc": math.nan,
                "kendall_tau": math.nan, "rms_weighted": math.nan, "mape_weighted": math.nan}
    ipc_t, ipc_p = n[ok] / truth[ok], n[ok] / pred[ok]
    rel = (ipc_p - ipc_t) / ipc_t
    wk = w[ok] if w[ok].sum() > 0 else np.ones(int(ok.sum()))
    tau = kendalltau(ipc_t, ipc_p).statistic if ok.sum() > 1 else math.nan
    return {"compared": int(ok.sum()), "rms_rel_error_ipc": float(np.sqrt(np.mean(rel ** 2))),
            "mape_ipc": float(np.mean(np.abs(rel))), "kendall_tau": float(tau),
            "rms_weighted": float(np.sqrt(np.average(rel ** 2, weights=wk))),
            "mape_weighted": float(np.average(np.abs(rel), weights=wk))}


def metrics_table(blocks: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """Per ground truth, analyzer (the other truth included) and application, and over
    ``all`` applications: blocks, predicted (the analyzer answered), measured (the truth
    did), compared (both), coverage (compared / measured) and the error metrics; and over the
    blocks every analyzer answered (``COMMON``), where analyzers are compared on the same
    blocks."""
    wide = predictions.pivot_table(index=["benchmark", "block_id"], columns="analyzer",
                                   values="cycles", aggfunc="first")
    base = blocks.set_index(["benchmark", "block_id"])[["n_insns", "frequency"]].join(wide)
    analyzers = [a for a in predictions.analyzer.unique()]
    rows = []
    # the blocks every analyzer answered: the same blocks for all, where coverages differ
    common = base[base[analyzers].gt(0).all(axis=1)] if analyzers else base.iloc[:0]
    for truth in [t for t in TRUTHS if t in base]:
        for a in [x for x in analyzers if x != truth]:
            for app, g in [("all", base), (COMMON, common), *base.groupby(level="benchmark")]:
                t = g[truth].to_numpy("float64")
                p = g[a].to_numpy("float64")
                measured = int(np.isfinite(t).sum())
                m = _metrics(t, p, g.n_insns.to_numpy("float64"),
                             g.frequency.to_numpy("float64"))
                rows.append({"truth": truth, "analyzer": a, "application": app,
                             "blocks": int(len(g)), "measured": measured,
                             "predicted": int(np.isfinite(p).sum()),
                             "coverage": m["compared"] / measured if measured else math.nan}
                            | m)
    cols = ["truth", "analyzer", "application", "blocks", "measured", "predicted", "compared",
            "coverage", "rms_rel_error_ipc", "mape_ipc", "kendall_tau", "rms_weighted",
            "mape_weighted"]
    return pd.DataFrame(rows, columns=cols)


def shard_of(code: bytes, shards: int) -> int:
    """The shard of a block: a hash of its bytes, so that the copies of one block in several
    applications land in one job (measured once) and a block keeps its shard from run to
    run."""
    return zlib.crc32(code) % shards


def merge_shards(tables: Sequence[pd.DataFrame], metas: Sequence[Mapping]
                 ) -> tuple[pd.DataFrame, dict]:
    """One analyzer's predictions and metadata from those of its shards: the rows in block
    order; counts, seconds and calls summed; the most frequent errors and notes over all."""
    df = pd.concat(list(tables), ignore_index=True).sort_values(
        ["benchmark", "block_id"], kind="stable").reset_index(drop=True)
    meta = dict(metas[0]) if metas else {}
    for key in ("blocks", "failed_blocks", "ok_with_notes", "seconds", "calls",
                "failed_calls"):
        if any(key in m for m in metas):
            meta[key] = sum(m.get(key, 0) for m in metas)
    for key in ("errors", "notes"):
        total: Counter = Counter()
        for m in metas:
            total.update(m.get(key) or {})
        meta[key] = dict(total.most_common(20))
    meta["shards"] = len(metas)
    meta["shard_seconds_max"] = max((float(m.get("seconds", 0)) for m in metas), default=0.0)
    return df, meta
