"""Faults: a killed run resumes without re-measuring, damaged parts are named, bad configs are
rejected with the key named. (Analyzer crashes and hangs: tests/test_analyzers.py.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cpumap.model import portmap
from cpumap.store import db

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def _run(cfg: Path, *extra: str, timeout: int = 900) -> subprocess.CompletedProcess:
    # extra arguments (targets among them) first: --configfile takes several values
    return subprocess.run([SNAKEMAKE, *extra, "--cores", "2", "--configfile", str(cfg)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_killed_run_resumes_without_remeasuring(tmp_path: Path, host: dict) -> None:
    """SIGKILL of Snakemake, its job and the harness in the middle of a measuring batch; the
    resumed run measures only the batches not stored, and the stored parts stay untouched."""
    forms = [ln.split("#")[0].strip() for ln in
             (ROOT / "config" / "quick_forms.txt").read_text().splitlines()]
    forms = [f for f in forms if f][:12]
    quick = tmp_path / "forms.txt"
    quick.write_text("\n".join(forms) + "\n")
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    results = tmp_path / "results"
    cfg["results_dir"] = str(results)
    cfg["catalogue"]["smoke_run"] = False
    cfg["selection"] = {"forms": "quick", "quick_list": str(quick)}
    # long calls, so that a batch measures for seconds and the kill lands inside one
    # max_rounds = rounds: no extra passes for unsettled kernels, so every kernel has exactly
    # one repetition per round whatever the neighbours do
    cfg["bench"] |= {"batch_size": 4, "min_reps": 1, "max_reps": 1, "rounds": 5,
                     "max_rounds": 5, "total_insn": 100_000_000, "call_us": 0}
    cfg["model"]["enabled"] = False
    cfgfile = tmp_path / "config.yaml"
    cfgfile.write_text(yaml.safe_dump(cfg))
    mdir = results / host["machine_id"]
    target = str(mdir / "bench" / "singletons" / "summary.tsv")
    cmd = [SNAKEMAKE, target, "--cores", "2", "--configfile", str(cfgfile)]
    out = open(tmp_path / "killed-run.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    logs = mdir / "logs" / "measure"
    killed = None
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            stored = {p.name for p in (mdir / "db").glob("part-*.parquet")}
            for log in sorted(logs.glob("singletons-*.log")) if logs.is_dir() else []:
                batch = log.stem
                if f"part-{batch}.parquet" not in stored and \
                        "measuring" in log.read_text() and stored:
                    killed = batch
                    break
            if killed:
                time.sleep(0.5)  # the harness is measuring now
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None and killed is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        out.close()
    assert killed, ("the run ended before a batch could be interrupted: "
                    + (tmp_path / "killed-run.log").read_text()[-3000:])
    time.sleep(0.5)
    parts = sorted((mdir / "db").glob("*.parquet"))
    assert f"part-{killed}.parquet" not in {p.name for p in parts}
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in parts}
    rows_before = db.load(mdir / "db")  # every stored part is complete and readable
    assert len(rows_before) > 0
    # nothing half-written can pass for a part: temporary files are hidden and never loaded
    assert all(p.name.startswith(".") for p in (mdir / "db").iterdir()
               if p.name not in before)

    # resume: release the killed run's lock (Snakemake's procedure), run again
    unlock = _run(cfgfile, "--unlock", target)
    assert unlock.returncode == 0, unlock.stderr[-2000:]
    proc2 = _run(cfgfile, target)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes())
             for p in (mdir / "db").glob("*.parquet")}
    assert {k: after[k] for k in before} == before  # stored parts untouched
    rows = db.load(mdir / "db")
    rows = rows[rows.role == "kernel"]  # without each batch's noise monitor
    # every form measured exactly once: repetitions 0-4 (one per round) in one batch
    assert sorted(rows.kernel.unique()) == sorted(forms)
    reps = rows.groupby("kernel")["rep"].apply(lambda s: sorted(s.tolist())).to_dict()
    assert reps == {f: [0, 1, 2, 3, 4] for f in forms}
    assert (rows.groupby("kernel")["batch_id"].nunique() == 1).all()
    resumed = proc2.stdout + proc2.stderr
    assert f"batch={killed.removeprefix('singletons-')}" in resumed
    for name in before:
        assert f"batch={name.removeprefix('part-singletons-').removesuffix('.parquet')}" \
            not in resumed


def test_model_killed_mid_fit_resumes_from_stored_kernels(tmp_path: Path) -> None:
    """SIGKILL in the middle of Palmed's core mapping, which stores a part per measurement
    round (config/simulated.yaml): the resumed run measures no stored kernel again, the core
    job measures exactly the rows of its new parts, and no stored part changes."""
    cfg = yaml.safe_load((ROOT / "config" / "simulated.yaml").read_text())
    cfg["results_dir"] = str(tmp_path / "results")
    cfgfile = tmp_path / "config.yaml"
    cfgfile.write_text(yaml.safe_dump(cfg))
    out = open(tmp_path / "killed-run.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([SNAKEMAKE, "--cores", "2", "--configfile", str(cfgfile)], cwd=ROOT,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    killed = False
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            dbs = list((tmp_path / "results").glob("*/db"))
            if dbs and len(list(dbs[0].glob("part-palmed-core*.parquet"))) >= 3:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.05)
    finally:
        if proc.poll() is None and not killed:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        out.close()
    assert killed, (tmp_path / "killed-run.log").read_text()[-3000:]
    (mdir,) = (tmp_path / "results").iterdir()
    assert not (mdir / "model" / "model.json").exists()
    before = {p.name: p.read_bytes() for p in (mdir / "db").glob("*.parquet")}
    db.load(mdir / "db")  # every stored part is complete
    assert _run(cfgfile, "--unlock").returncode == 0
    proc2 = _run(cfgfile)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    after = {p.name: p.read_bytes() for p in (mdir / "db").glob("*.parquet")}
    assert {k: after[k] for k in before} == before
    core_log = (mdir / "logs" / "palmed" / "core.log").read_text()
    measured_now = int(re.search(r"core: measured now (\d+)", core_log).group(1))
    new = [mdir / "db" / k for k in after if k not in before]
    new_core = [p for p in new if p.name.startswith("part-palmed-core")]
    # a simulated kernel is one row: the resumed core job measured exactly its new parts'
    # kernels, and no kernel stored before the kill was measured again by any job
    assert measured_now == len(db.load_parts(new_core)) > 0
    stored = set(db.load_parts([mdir / "db" / k for k in before])["kernel"])
    # (the held-out kernels measured a second time on purpose, the run-to-run floor, aside)
    first = [p for p in new if not p.name.startswith("part-repeat-")]
    assert len(first) < len(new)
    assert not stored & set(db.load_parts(first)["kernel"])
    stats = json.loads((mdir / "model" / "stats.json").read_text())
    assert stats["measured_by_job"]["core"] == measured_now
    assert measured_now < stats["kernels"]["core"]


@pytest.fixture(scope="module")
def small_simulated(tmp_path_factory) -> tuple[Path, Path]:
    """A finished run of a small simulated machine: (config file, machine directory)."""
    tmp = tmp_path_factory.mktemp("faults-sim")
    mapping = tmp / "toy.json"
    mapping.write_text(json.dumps(portmap.synthetic_mapping(n_ports=6, n_forms=16, seed=1)))
    cfg = yaml.safe_load((ROOT / "config" / "simulated.yaml").read_text())
    cfg["results_dir"] = str(tmp / "results")
    cfg["machine"]["mapping"] = str(mapping)
    cfg["bench"]["batch_size"] = 4
    cfg["model"]["validation_kernels"] = 20
    cfgfile = tmp / "config.yaml"
    cfgfile.write_text(yaml.safe_dump(cfg))
    proc = _run(cfgfile)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (mdir,) = (tmp / "results").iterdir()
    return cfgfile, mdir


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_damaged_part_is_reported_with_its_path(small_simulated, damage: str) -> None:
    cfgfile, mdir = small_simulated
    part = sorted((mdir / "db").glob("part-singletons-*.parquet"))[0]
    good = part.read_bytes()
    try:
        part.write_bytes(good[: len(good) // 2] if damage == "truncate" else b"PAR1" + b"x" * 64)
        proc = _run(cfgfile, "--forcerun", "singleton_summary")
        assert proc.returncode != 0
        log = (mdir / "logs" / "singleton_summary.log").read_text()
        assert f"corrupt or unreadable file {part}" in log
        # the damaged part is still there for the user to restore, not deleted or replaced
        assert part.read_bytes() != good and part.exists()
    finally:
        part.write_bytes(good)
    proc = _run(cfgfile, "--forcerun", "singleton_summary")
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize(("patch", "named"), [
    ({"bench": {"unrol_size": 100}}, "'unrol_size' was unexpected"),
    ({"bench": {"min_reps": "ten"}}, "instance['bench']['min_reps']"),
    ({"measure": "no"}, "instance['measure']"),
    ({"machine": {"backend": "simulated", "mapping": None}}, "instance['machine']['mapping']"),
])
def test_malformed_config_is_rejected_naming_the_key(tmp_path: Path, patch: dict,
                                                     named: str) -> None:
    cfgfile = tmp_path / "bad.yaml"
    cfgfile.write_text(yaml.safe_dump(patch))
    proc = _run(cfgfile, "-n", timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "Error validating config file" in out
    assert named in out, out[-3000:]
    assert not re.search(r"^rule \w+:", out, re.M)  # rejected before any job was planned
