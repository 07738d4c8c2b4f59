"""The Snakemake pipeline end to end on a tiny selection, and its lint."""

from __future__ import annotations

import json
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
    cfg["bench"] |= {"batch_size": 2, "min_reps": 4}
    cfg["model"]["enabled"] = False  # the model stage has its own test below
    # a small suite through every evaluation rule; the roofline has its own tests
    # (kernels: a list, replaced; flagsets: a mapping, merged by Snakemake with the default's 3)
    cfg["suite"]["kernels"] = ["triad", "dot"]
    cfg["evaluate"]["analyzers"] = ["native", "llvm-mca", "osaca"]
    cfg["roofline"]["enabled"] = False
    # the block corpus has its own tests; its native analyzer would measure some of these
    # singletons first (the singleton batches then compile nothing: test_blockgen.py)
    cfg["corpus"]["enabled"] = False
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
    parts = sorted((mdir / "db").glob("part-singletons-*.parquet"))
    assert len(parts) == 2  # batch_size 2 -> two batches, one part each
    # every repetition is stored, at least bench.min_reps per kernel, each part with its
    # batch's noise monitor first (role monitor, not counted as a measurement of its kernel)
    rows = pd.concat(pd.read_parquet(p) for p in parts)
    assert (rows.status == "ok").all()
    kern = rows[rows.role == "kernel"]
    assert table.set_index("kernel").reps.to_dict() == kern.groupby("kernel").size().to_dict()
    assert (table.reps >= 4).all()
    mon = rows[rows.role == "monitor"]
    assert set(mon.kernel) == {"ADD_R64_R64", "MOV_R64_M64"} and mon.batch_id.nunique() == 2
    noise = pd.read_csv(mdir / "monitor/noise.tsv", sep="\t")
    assert len(noise) >= 2 and (noise.cycles_per_instance_est > 0).all()
    metrics = pd.read_csv(mdir / "evaluate/metrics.tsv", sep="\t")
    everything = metrics[metrics.flagset == "all"].set_index("analyzer")
    # triad and dot x 3 flag sets: every analyzer predicts all six
    for analyzer in ("native", "llvm-mca", "osaca"):
        assert everything.loc[analyzer, "eligible"] == 6, metrics
        assert everything.loc[analyzer, "predicted"] == 6, metrics
    report = (mdir / "report/index.html").read_text()
    for unavailable in ("uiCA", "IACA", "Ithemal", "BHive", "Gus"):
        assert unavailable in report
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
    before = kern.groupby("kernel").size().to_dict()
    rows = pd.concat(pd.read_parquet(p) for p in (mdir / "db").glob("part-singletons-*"))
    after = rows[rows.role == "kernel"].groupby("kernel").size().to_dict()
    assert after.pop("IMUL_R64_R64") >= 4 and after == before
    table = pd.read_csv(mdir / "bench/singletons/singletons.tsv", sep="\t")
    assert len(table) == 4


def test_simulated_pipeline_model_rebuilt_from_db(tmp_path):
    """Simulated machine end to end; the model is rebuilt from the DB alone, byte-identical."""
    from cpumap.model import portmap

    mapping = tmp_path / "toy.json"
    mapping.write_text(json.dumps(portmap.synthetic_mapping(n_ports=6, n_forms=24, seed=3)))
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    cfg["machine"] = {"backend": "simulated", "mapping": str(mapping), "noise": 0.0, "seed": 0}
    cfg["selection"]["forms"] = "all"
    cfg["model"] |= {"enabled": True, "validation_kernels": 100}
    cfgfile = tmp_path / "config.yaml"
    cfgfile.write_text(yaml.safe_dump(cfg))
    cmd = [SNAKEMAKE, "--cores", "2", "--configfile", str(cfgfile)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (mdir,) = (tmp_path / "results").iterdir()
    assert mdir.name.startswith("sim-toy-")
    metrics = json.loads((mdir / "model/validation.json").read_text())
    assert metrics["kernels"] == 100
    assert metrics["rms_rel_error_ipc"] <= 0.03 and metrics["kendall_tau"] >= 0.95
    model = (mdir / "model/model.json").read_bytes()
    parts = sorted(p.name for p in (mdir / "db").glob("*.parquet"))
    # rebuild from the raw rows alone: nothing is measured, the model comes out identical
    (mdir / "model/model.json").unlink()
    proc = subprocess.run(cmd + ["--forcerun", "fit_model"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (mdir / "db").glob("*.parquet")) == parts
    assert (mdir / "model/model.json").read_bytes() == model
    assert "measured now 0" in (mdir / "logs/fit_model.log").read_text()
