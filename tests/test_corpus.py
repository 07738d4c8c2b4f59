"""A BHive-format block corpus: blocks in, metrics against the two ground truths (exact
figures on hand-made blocks and predictions)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cpumap.evaluate import corpus, report
from cpumap.evaluate.analyzers import block_inputs

ADD = "4801d8"        # addq %rbx, %rax
IMUL = "480fafc3"     # imulq %rbx, %rax


@pytest.fixture()
def sources(tmp_path):
    d = tmp_path / "corpus" / "sources"
    d.mkdir(parents=True)
    (d / "app.csv").write_text(f"{ADD},3\n{ADD}{IMUL},1\n4889,1\n")
    (d / "lib.goto.csv").write_text(f"{IMUL},2\n")
    return d.parent


def test_corpus_blocks_in_the_suites_columns(sources, catalogue):
    src = corpus.corpus_sources(sources)
    assert list(src) == ["app", "lib"]  # OpenBLAS's .goto dropped
    blocks = corpus.corpus_blocks(src, catalogue)
    app = blocks[blocks.benchmark == "app"].set_index("block_id")
    assert list(app.loc[1, "hexes"]) == [ADD, IMUL]
    assert list(app.loc[1, "forms"]) == ["ADD_R64_R64", "IMUL_R64_R64"]
    assert app.frequency.tolist() == [3.0, 1.0, 1.0]
    inputs = {b.key: b for b in block_inputs(blocks)}
    assert inputs[("app", 1)].insns == ("add %rbx, %rax", "imul %rbx, %rax")
    assert inputs[("app", 1)].code == bytes.fromhex(ADD + IMUL)
    assert "cannot render" in inputs[("app", 2)].error  # 48 89: a truncated mov
    with pytest.raises(ValueError, match="no <application>.csv"):
        corpus.corpus_sources(sources / "sources" / "nothing")


def _pred(analyzer: str, cycles: dict[tuple[str, int], float]) -> pd.DataFrame:
    return pd.DataFrame([{"benchmark": b, "block_id": i, "analyzer": analyzer, "cycles": c,
                          "status": "ok" if c == c else "failed", "error": "", "seconds": 0.0}
                         for (b, i), c in cycles.items()])


def test_metrics_against_each_truth_per_application(sources, catalogue, tmp_path):
    blocks = corpus.corpus_blocks(corpus.corpus_sources(sources), catalogue)
    nan = math.nan
    preds = pd.concat([
        _pred("written", {("app", 0): 1.0, ("app", 1): 4.0, ("app", 2): nan, ("lib", 0): 1.0}),
        _pred("native", {("app", 0): 0.25, ("app", 1): 1.0, ("app", 2): nan, ("lib", 0): 1.0}),
        _pred("model", {("app", 0): 0.5, ("app", 1): 4.0, ("app", 2): nan, ("lib", 0): nan}),
    ])
    m = corpus.metrics_table(blocks, preds).set_index(["truth", "analyzer", "application"])
    row = m.loc[("written", "model", "all")]
    # app 0: IPC 1 measured, 2 predicted (+100 %); app 1: exact; lib 0: not predicted
    assert (row.blocks, row.measured, row.predicted, row.compared) == (4, 3, 2, 2)
    assert row.coverage == pytest.approx(2 / 3)
    assert row.rms_rel_error_ipc == pytest.approx(math.sqrt((1.0 + 0.0) / 2))
    assert row.mape_ipc == pytest.approx(0.5)
    # weighted by frequency 3 and 1
    assert row.mape_weighted == pytest.approx(3 / 4)
    assert row.rms_weighted == pytest.approx(math.sqrt(3 / 4))
    assert row.kendall_tau == pytest.approx(1.0)
    # the other truth is an analyzer of this one, and the reverse
    assert m.loc[("written", "native", "app")].compared == 2
    assert m.loc[("native", "written", "all")].compared == 3
    assert ("native", "native", "all") not in m.index
    # on the blocks every analyzer answered (app 0 and 1): the same blocks for all
    common = m.loc[("written", "native", corpus.COMMON)]
    assert common.compared == 2 and m.loc[("written", "model", corpus.COMMON)].compared == 2
    # the report section: the tables and one plot per analyzer against the block as written
    html = report.corpus_section(blocks, preds, corpus.metrics_table(blocks, preds),
                                 [{"analyzer": "model", "description": "d", "blocks": 4,
                                   "failed_blocks": 2, "seconds": 0.1,
                                   "errors": {"x": 2}}], "data/x", tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["model.png", "native.png"]
    assert html.startswith("<h2>Real basic blocks (BHive corpus)</h2>")
    assert html.count("data:image/png;base64,") == 2  # native and model against written
    assert "x (2)" in html


def test_shards_split_distinct_blocks_and_merge_back():
    """Every block lands in exactly one shard, the copies of one block in one shard, and the
    merged table and metadata equal one job's."""
    codes = [bytes([i, i + 1]) for i in range(40)] * 2  # each block in two applications
    shards = [corpus.shard_of(c, 4) for c in codes]
    assert set(shards) == {0, 1, 2, 3}
    assert shards[:40] == shards[40:]
    rows = pd.DataFrame({"benchmark": ["a"] * 40 + ["b"] * 40, "block_id": list(range(80)),
                         "cycles": [float(i) for i in range(80)]})
    parts = [rows[[s == k for s in shards]] for k in range(4)]
    metas = [{"analyzer": "native", "description": "d", "blocks": len(p),
              "failed_blocks": 1, "seconds": 1.5 * (k + 1), "errors": {"SIGSEGV": 1},
              "notes": {}} for k, p in enumerate(parts)]
    df, meta = corpus.merge_shards(parts[::-1], metas)
    pd.testing.assert_frame_equal(df, rows)
    assert meta["blocks"] == 80 and meta["failed_blocks"] == 4
    assert meta["seconds"] == pytest.approx(15.0) and meta["shard_seconds_max"] == 6.0
    assert meta["errors"] == {"SIGSEGV": 4} and meta["shards"] == 4
