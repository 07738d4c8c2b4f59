"""The simulated-machine pipeline through a real one-machine Slurm and profiles/slurm.

The test starts its own munged, slurmctld and slurmd (Debian packages; scripts/install-slurm.sh
installs them) with a slurm.conf, munge key, state and spool directories in a temporary
directory, on free ports, runs Snakemake with ``--workflow-profile profiles/slurm``, and stops
every daemon it started. It needs root (slurmd starts jobs as their user); CI runs as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel", "srun")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="needs root: the test starts slurmd, which runs jobs as their user (CI runs as root)")


def _which(name: str) -> str | None:
    """Path of a Slurm or munge program; daemons live in /usr/sbin, often not on PATH."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_line() -> str:
    """``NodeName=... CPUs=... RealMemory=...`` of this machine, as slurmd -C reports it."""
    out = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True,
                         check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("NodeName="))
    return line


def _wait(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def local_slurm(base: Path) -> Iterator[dict]:
    """A one-node Slurm cluster on this machine; yields the environment that talks to it."""
    missing = [d for d in DAEMONS if _which(d) is None]
    if missing:
        pytest.fail(f"Slurm is not installed (missing {', '.join(missing)}): run "
                    "scripts/install-slurm.sh")
    base.mkdir(parents=True, exist_ok=True)
    munge = base / "munge"
    munge.mkdir(mode=0o700)
    for d in ("state", "spool", "log", "bin"):
        (base / d).mkdir()
    key = munge / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o400)
    sock = munge / "munge.sock"
    node = _node_line()
    name = re.match(r"NodeName=(\S+)", node).group(1)
    node = re.sub(r"\s*UpTime=\S+", "", node)
    conf = base / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=cpumaptest",
        f"SlurmctldHost={name}(127.0.0.1)",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
        "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={base / 'state'}", f"SlurmdSpoolDir={base / 'spool'}",
        f"SlurmctldPidFile={base / 'slurmctld.pid'}", f"SlurmdPidFile={base / 'slurmd.pid'}",
        f"SlurmctldLogFile={base / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={base / 'log' / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        # whole cores are allocated: a job asking for one CPU owns one core
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        # no slurmdbd: no accounting, so the profile asks squeue for job states
        "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none", "MpiDefault=none", "ReturnToService=2",
        "MinJobAge=3600",  # finished jobs stay visible to squeue (status checks, this test)
        f"{node} NodeAddr=127.0.0.1 State=UNKNOWN",
        f"PartitionName=debug Nodes={name} Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n")
    env = dict(os.environ, SLURM_CONF=str(conf))
    # The jobstep plugin removes SLURM_* variables (SLURM_CONF too) before its inner srun; a
    # cluster keeps slurm.conf in /etc/slurm, this test keeps it in a temporary directory, so
    # srun is reached through a wrapper that sets it again.
    wrapper = base / "bin" / "srun"
    wrapper.write_text(f"#!/bin/sh\nexport SLURM_CONF={conf}\nexec {_which('srun')} \"$@\"\n")
    wrapper.chmod(0o755)
    env["PATH"] = f"{base / 'bin'}:{env['PATH']}"
    started: list[subprocess.Popen] = []
    munged_pid = None
    try:
        subprocess.run([_which("munged"), "--force", f"--socket={sock}", f"--key-file={key}",
                        f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
                        f"--seed-file={munge / 'seed'}"], check=True, timeout=30)
        munged_pid = int((munge / "munged.pid").read_text())
        for daemon in ("slurmctld", "slurmd"):
            log = open(base / "log" / f"{daemon}.out", "wb")  # noqa: SIM115 (kept by Popen)
            started.append(subprocess.Popen([_which(daemon), "-D", "-f", str(conf)], env=env,
                                            stdout=log, stderr=subprocess.STDOUT))

        def idle() -> bool:
            for proc in started:
                if proc.poll() is not None:
                    name = Path(proc.args[0]).name
                    tail = (base / "log" / f"{name}.out").read_text()[-2000:]
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                 text=True)
            return out.returncode == 0 and out.stdout.strip() == "idle"

        _wait(idle, 60, "the Slurm node to be idle")
        yield {"env": env, "conf": conf, "base": base,
               "pids": [p.pid for p in started] + [munged_pid]}
    finally:
        subprocess.run(["scancel", "--full", "--quiet", "--cluster=cpumaptest"], env=env,
                       capture_output=True, timeout=30)
        for proc in reversed(started):
            _stop(proc)
        if munged_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(munged_pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                _wait(lambda: not _alive(munged_pid), 20, "munged to stop")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie has exited: only its parent's wait is missing
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[1].startswith("Z"))


def test_simulated_pipeline_through_slurm(tmp_path: Path) -> None:
    cfg = yaml.safe_load((ROOT / "config" / "simulated.yaml").read_text())
    results = tmp_path / "results"
    cfg["results_dir"] = str(results)
    cfg["bench"]["batch_size"] = 10  # 100 forms -> 10 measuring batches
    cfg["model"]["validation_kernels"] = 50
    cfgfile = tmp_path / "config.yaml"
    cfgfile.write_text(yaml.safe_dump(cfg))
    t0 = time.monotonic()
    with local_slurm(tmp_path / "slurm") as cluster:
        proc = subprocess.run(
            [SNAKEMAKE, "--workflow-profile", "profiles/slurm", "--configfile", str(cfgfile),
             "--slurm-logdir", str(tmp_path / "slurm-logs"), "--slurm-keep-successful-logs"],
            cwd=ROOT, env=cluster["env"], capture_output=True, text=True, timeout=900)
        jobs = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%C|%T|%k"],
                              env=cluster["env"], capture_output=True, text=True).stdout
        pids = cluster["pids"]
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    # every daemon the test started is gone
    assert not [p for p in pids if _alive(p)]
    (mdir,) = results.iterdir()
    table = pd.read_csv(mdir / "bench/singletons/singletons.tsv", sep="\t")
    assert len(table) == 100
    assert len(list((mdir / "db").glob("part-singletons-*.parquet"))) == 10
    assert json.loads((mdir / "model/validation.json").read_text())["kernels"] == 50
    # one Slurm job per measuring batch, each batch measured once (not by two jobs)
    logs = sorted((tmp_path / "slurm-logs").glob("rule_measure_batch/**/*.log"))
    assert len(logs) == 10, logs
    ran = [re.findall(r"batch=(\d{4}-[0-9a-f]{8})", log.read_text()) for log in logs]
    assert sorted({b for r in ran for b in r}) == sorted(
        p.name.removeprefix("part-singletons-").removesuffix(".parquet")
        for p in (mdir / "db").glob("part-singletons-*.parquet"))
    assert all(len(set(r)) == 1 for r in ran), ran
    # Palmed's planned kernels: one Slurm job per batch too, none run inside another job
    # (the core and refinement rounds measure inside their stage's job: part-palmed-core*)
    parts = {p.name.removeprefix("part-").removesuffix(".parquet")
             for stage in ("pairs", "mapping")
             for p in (mdir / "db").glob(f"part-palmed-{stage}-*.parquet")}
    logs = sorted((tmp_path / "slurm-logs").glob("rule_palmed_measure/**/*.log"))
    ran = [re.findall(r"pstage=(\w+), batch=(\d{4}-[0-9a-f]{8})", log.read_text())
           for log in logs]
    assert {"pairs", "mapping"} == {p.split("-")[1] for p in parts}, parts
    assert sorted(f"palmed-{s}-{b}" for r in ran for s, b in set(r)) == sorted(parts)
    assert all(len(set(r)) == 1 for r in ran), ran
    assert not list((tmp_path / "slurm-logs").glob("group_model*"))
    states = [line.split("|") for line in jobs.splitlines() if line.strip()]
    assert states and all(cpus == "1" and state == "COMPLETED" for _, cpus, state, _ in states)
    print(f"slurm pipeline: {len(states)} Slurm jobs, {seconds:.0f} s including daemon start")
