"""The Snakemake pipeline end to end on a tiny selection, and its lint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def test_lint_clean():
    proc = subprocess.run([SNAKEMAKE, "--lint"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


def test_tiny_pipeline_and_rerun(tmp_path, host):
    forms = tmp_path / "forms.txt"
    forms.write_text("ADD_R64_R64\nVADDPD_YMM_YMM_YMM  # comment\nMOV_R64_M64\n")
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    cfg["selection"]["quick_list"] = str(forms)
    cfg["bench"] |= {"batch_size": 2, "num_measures": 3}
    cfgfile = tmp_path / "config.yaml"
    cfgfile.write_text(yaml.safe_dump(cfg))
    cmd = [SNAKEMAKE, "--cores", "2", "--configfile", str(cfgfile)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mdir = tmp_path / "results" / host["machine_id"]
    summary = pd.read_csv(mdir / "bench/singletons/summary.tsv", sep="\t")
    assert summary.loc[summary.outcome == "measured", "forms"].item() == 3
    table = pd.read_csv(mdir / "bench/singletons/singletons.tsv", sep="\t")
    assert sorted(table.kernel) == ["ADD_R64_R64", "MOV_R64_M64", "VADDPD_YMM_YMM_YMM"]
    assert (table.reps == 3).all()
    parts = sorted((mdir / "db").glob("part-*.parquet"))
    assert len(parts) == 2  # batch_size 2 -> two batches, one part each
    mtimes = [p.stat().st_mtime_ns for p in parts]
    # nothing to do the second time, and the raw rows are untouched
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr
    assert [p.stat().st_mtime_ns for p in parts] == mtimes
    # a changed selection measures only the new kernel; the summary still covers all four
    forms.write_text("ADD_R64_R64\nVADDPD_YMM_YMM_YMM\nMOV_R64_M64\nIMUL_R64_R64\n")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pd.concat(pd.read_parquet(p) for p in (mdir / "db").glob("part-*.parquet"))
    assert rows.groupby("kernel").size().to_dict() == {
        "ADD_R64_R64": 3, "IMUL_R64_R64": 3, "MOV_R64_M64": 3, "VADDPD_YMM_YMM_YMM": 3}
    table = pd.read_csv(mdir / "bench/singletons/singletons.tsv", sep="\t")
    assert len(table) == 4
