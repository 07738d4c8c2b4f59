"""Coverage of a model on real code: exact shares on hand-made blocks and counts."""

from __future__ import annotations

import pandas as pd
import pytest

from cpumap.evaluate import coverage

ADD = "4801d8"        # addq %rbx, %rax      ADD_R64_R64
IMUL = "480fafc3"     # imulq %rbx, %rax     IMUL_R64_R64
LEAVE = "c9"          # leave                LEAVE (excluded: RSP from RBP)
JNE = "75f0"          # jne                  the terminator


def test_corpus_coverage_weighs_blocks_by_frequency_and_names_what_is_missing(tmp_path,
                                                                             catalogue):
    src = tmp_path / "app.csv"
    src.write_text(f"{ADD},0.5\n{ADD}{IMUL},0.25\n{LEAVE}{ADD},0.25\n")
    (cov,) = coverage.corpus_coverage({"app": src}, catalogue, {"ADD_R64_R64"})
    assert (cov.blocks, cov.blocks_covered) == (3, 1)
    assert cov.share == pytest.approx(0.5)
    assert cov.missing["IMUL_R64_R64 (not modelled)"] == pytest.approx(0.25)
    assert cov.missing["LEAVE (excluded: sets RSP from RBP (each LEAVE's stack pointer is the "
                       "previous one's pop))"] == pytest.approx(0.25)
    (all_,) = coverage.corpus_coverage({"app": src}, catalogue,
                                       {"ADD_R64_R64", "IMUL_R64_R64"})
    assert all_.share == pytest.approx(0.75)
    # LEAVE is excluded by the catalogue and ADD modelled: the model analyzer predicts that
    # block from ADD with a flag; the IMUL block (a measurable form the model lacks) is a hole
    assert (cov.blocks_flagged, cov.share_flagged) == (1, pytest.approx(0.75))
    assert all_.share_flagged == pytest.approx(1.0)
    (alone,) = coverage.corpus_coverage({"app": src}, catalogue, set())
    assert alone.share_flagged == 0.0  # no modelled form in any block: nothing to predict from
    bad = tmp_path / "bad.csv"
    bad.write_text("zz,1\n")
    with pytest.raises(ValueError, match="bad.csv:1"):
        coverage.read_corpus(bad)


def test_suite_coverage_counts_executed_instructions_without_terminators(catalogue):
    blocks = pd.DataFrame([
        {"benchmark": "k.O2", "block_id": 0, "hexes": [ADD, IMUL, JNE], "terminator": "jne x"},
        {"benchmark": "k.O2", "block_id": 1, "hexes": [LEAVE, ADD], "terminator": ""},
        {"benchmark": "k.O2", "block_id": 2, "hexes": [IMUL], "terminator": ""},
    ])
    counts = pd.DataFrame([
        {"benchmark": "k.O2", "block_id": 0, "occurrences": 100},
        {"benchmark": "k.O2", "block_id": 1, "occurrences": 1},
        {"benchmark": "k.O2", "block_id": 2, "occurrences": 0},  # never runs: no weight
    ])
    (cov,) = coverage.suite_coverage(blocks, counts, {"ADD_R64_R64", "IMUL_R64_R64"},
                                     catalogue)
    # block 0: 100 x 2 instructions (the jne left out) predicted; block 1: 2 not (LEAVE)
    assert cov.total == 202 and cov.covered == 200 and cov.flagged == 2
    assert cov.share == pytest.approx(200 / 202)
    assert [k.split(" ")[0] for k in cov.missing] == ["LEAVE"]
