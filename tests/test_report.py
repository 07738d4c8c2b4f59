"""The self-contained HTML report: every analyzer has a row, plots are embedded, extra sections."""

from __future__ import annotations

import base64
import re

import pandas as pd

from cpumap.evaluate import lift as evaluate
from cpumap.evaluate import report


def _inputs():
    rows = []
    for i, (m, p) in enumerate([(1.0, 1.2), (2.0, 1.9), (3.0, 3.6)]):
        for a, pred, st in (("llvm-mca", p, "ok"), ("native", m, "ok" if i else "discarded")):
            rows.append({"benchmark": f"k{i}.O2", "kernel": f"k{i}", "flagset": "O2",
                         "analyzer": a, "blocks": 2, "failed_blocks": 0 if st == "ok" else 1,
                         "status": st, "error": "" if st == "ok" else "block 1: boom <x>",
                         "instructions": 100, "measured_cycles": 100 / m,
                         "ipc_measured": m, "ipc_predicted": pred if st == "ok" else float("nan"),
                         "d1_miss_rate": 0.0, "cachegrind": "ok", "cachegrind_error": "",
                         "excluded": "", "eligible": True, "rel_error_ipc": (pred - m) / m})
    kernels = pd.DataFrame(rows)
    metrics = evaluate.metrics_table(kernels, ["native", "llvm-mca"])
    status = evaluate.analyzer_status(["model", "native", "llvm-mca", "osaca"],
                                      {"native": {"description": "ours"},
                                       "llvm-mca": {"description": "llvm"}}, False)
    preds = pd.DataFrame({"benchmark": ["k0.O2", "k0.O2"], "block_id": [0, 1],
                          "analyzer": ["native", "native"], "cycles": [1.0, float("nan")],
                          "status": ["ok", "failed"], "error": ["", "boom"],
                          "seconds": [0.0, 0.0]})
    return kernels, metrics, status, preds


def test_report_is_self_contained_with_a_row_per_analyzer(tmp_path):
    kernels, metrics, status, preds = _inputs()
    frag = tmp_path / "roofline.html"
    frag.write_text("<h2>Roofline</h2><p>ceilings here</p>")
    out = report.write_report(
        tmp_path / "index.html", title="t", header={"machine id": "m"}, metrics=metrics,
        kernels=kernels, predictions=preds, analyzers=status, notes=["a note"],
        extra_sections=[report.fragment_section(frag)], plots=tmp_path / "plots")
    html = out.read_text()
    assert not re.search(r'(src|href)="(https?:|//)', html)  # nothing fetched from elsewhere
    assert "<script" not in html and "<link" not in html
    # one embedded plot per analyzer that ran
    assert html.count('src="data:image/png;base64,') == 2
    # the same plots as files for snakemake --report, the same bytes as embedded
    pngs = sorted(tmp_path.joinpath("plots").glob("*.png"))
    assert len(pngs) == 2
    for png in pngs:
        assert base64.b64encode(png.read_bytes()).decode() in html
    for name in ("uiCA", "IACA", "Ithemal", "Gus"):
        assert f'<tr class="unavailable"><td>{name}</td>' in html
        assert report.esc(status[name]["reason"]) in html
    assert "not run: model.enabled is false" in html
    # llvm-mca over all flag sets: 3 of 3 kernels, coverage 100 %
    m = re.search(r"<td>llvm-mca</td><td>all</td><td>ran</td>(.*?)</tr>", html)
    assert m and re.findall(r'class="num">([^<]*)<', m.group(1))[:3] == ["3", "3", "100.0 %"]
    assert re.search(r"<td>native</td><td>all</td><td>ran</td><td class=\"num\">3</td>"
                     r"<td class=\"num\">2</td><td class=\"num\">66.7 %</td>", html)
    assert 'title="block 1: boom &lt;x&gt;"' in html  # errors escaped
    assert '<section id="roofline"><h2>Roofline</h2><p>ceilings here</p></section>' in html
    assert '<a href="#roofline">Roofline</a>' in html


def test_residency_note_names_unchecked_and_excluded():
    note = report.residency_note({"miss_threshold": 0.15, "cachegrind": {"ok": 2,
                                                                           "unsupported": 1},
                                  "excluded_not_l1": {"big.O2": 0.31},
                                  "residency_unchecked": {"x.O3-native": "valgrind cannot run "
                                                          "this binary (AVX-512 / EVEX code)"}})
    assert note == ("L1 residency (Cachegrind, warm cache, D1 misses of the kernel function): "
                    "2 benchmarks checked; 1 excluded above 15 % (big.O2 31.0 %); 1 not checked "
                    "because Valgrind 3.19 cannot run AVX-512 code (x.O3-native); they are "
                    "kept.")


def test_kernel_details_list_executed_blocks_with_each_answer(tmp_path):
    kernels, metrics, status, preds = _inputs()
    blocks = pd.DataFrame({"benchmark": ["k0.O2", "k0.O2"], "block_id": [0, 1],
                           "insns": [["add %rax, %rbx"], ["vaddpd %ymm0, %ymm1, %ymm2"]]})
    counts = pd.DataFrame({"benchmark": ["k0.O2", "k0.O2"], "block_id": [0, 1],
                           "occurrences": [1, 0]})
    html = report.build_report(title="t", header={}, metrics=metrics, kernels=kernels,
                               predictions=preds, analyzers=status, blocks=blocks,
                               counts=counts)
    assert "<details><summary>k0.O2: 1 executed blocks of 2</summary>" in html
    assert ('<tr><td class="num">0</td><td class="num">1</td><td><code>add %rax, %rbx</code>'
            '</td><td class="num">1.00</td></tr>') in html
    assert "vaddpd" not in html  # block 1 never runs
