"""The measuring slot (cpumap.measure.slot): one process of a host times code at a time, a
nested use takes it once, a forked worker does not inherit it, and it is given back however
the holder ends. Checked with real processes and non-blocking lock attempts, never timing."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cpumap.measure import slot

PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    print("busy")
else:
    print("free")
"""


def probe(lock: Path) -> str:
    """What another process finds: the slot free or busy (without waiting)."""
    return subprocess.run([sys.executable, "-c", PROBE, str(lock)], capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()


@pytest.fixture
def lock(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "m" / ".measure-host.lock"
    monkeypatch.setenv(slot.ENV, str(path))
    return path


def test_held_excludes_other_processes_and_nests(lock):
    with slot.held():
        assert probe(lock) == "busy"
        with slot.held():  # a nested round of the same process: no self-deadlock
            assert probe(lock) == "busy"
        assert probe(lock) == "busy"  # the outer use still holds it
    assert probe(lock) == "free"


def _child_view(path: str, out) -> None:  # noqa: ANN001 - a multiprocessing pipe end
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        out.send("busy")
    else:
        out.send("free")


def test_a_forked_worker_does_not_hold_its_parents_slot(lock):
    """A worker forked while the parent measures (the compile-ahead or LP pool) finds the slot
    busy, and it cannot keep it after the parent lets go."""
    ctx = multiprocessing.get_context("fork")
    with slot.held():
        recv, send = ctx.Pipe(duplex=False)
        worker = ctx.Process(target=_child_view, args=(str(lock), send))
        worker.start()
        assert recv.recv() == "busy"
        worker.join(timeout=60)
        keeper = ctx.Process(target=__import__("time").sleep, args=(30,))
        keeper.start()  # alive, with the parent's descriptor, after the parent's release
    try:
        assert probe(lock) == "free"
    finally:
        keeper.kill()
        keeper.join()


def test_the_slot_is_given_back_when_its_holder_dies(lock):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import os, sys; from cpumap.measure import slot\n"
         "with slot.held():\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, slot.ENV: str(lock)})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert probe(lock) == "busy"
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert probe(lock) == "free"


def test_threads_of_one_process_share_the_slot_and_give_it_back_once(lock):
    """Two threads measuring at once (the compute ceilings on every CPU) hold the slot as
    one process, and it is free only after the last of them."""
    import threading

    inside, leave = threading.Barrier(3), threading.Event()

    def work() -> None:
        with slot.held():
            inside.wait(timeout=60)
            leave.wait(timeout=60)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait(timeout=60)
    assert probe(lock) == "busy"
    leave.set()
    for t in threads:
        t.join(timeout=60)
    assert probe(lock) == "free"


def test_without_a_lock_named_held_does_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(slot.ENV, raising=False)
    with slot.held():
        pass
    assert list(tmp_path.iterdir()) == []


class _Job:
    """The parts of Snakemake's script object that join_job reads."""

    def __init__(self, root: Path, lock_on: bool = True):
        self.config = {"results_dir": str(root), "measuring_lock": lock_on}
        self.wildcards = type("W", (), {"mid": "m"})()


def test_join_job_holds_for_a_whole_job_and_not_for_a_round_by_round_one(tmp_path):
    """Run in fresh interpreters: join_job names the lock for the process and its children,
    and takes it for life only for a job that times code outside the harness's rounds."""
    code = ("import sys, json; sys.path.insert(0, {tests!r}); from test_slot import _Job, probe\n"
            "from cpumap.measure import slot\n"
            "from pathlib import Path\n"
            "slot.join_job(_Job(Path({root!r}), sys.argv[2] == 'on'), whole=sys.argv[1] == '1')\n"
            "lock = slot.lock_path(Path({root!r}) / 'm')\n"
            "print(json.dumps([str(slot.path()), probe(lock) if lock.exists() else 'none']))\n")
    code = code.format(tests=str(Path(__file__).parent), root=str(tmp_path))

    def run(whole: int, on: str) -> list:
        env = {k: v for k, v in os.environ.items() if k != slot.ENV}
        proc = subprocess.run([sys.executable, "-c", code, str(whole), on], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        import json

        return json.loads(proc.stdout)

    lock = str(slot.lock_path(tmp_path / "m"))
    assert run(0, "on") == [lock, "none"]   # round by round: named, taken by each round
    assert run(1, "off") == ["None", "none"]  # measuring_lock false: no lock at all
    assert run(1, "on") == [lock, "busy"]   # a whole job: its own from the start


def test_the_cli_holds_the_slot_of_its_results_while_it_times_outside_the_harness(
        tmp_path, monkeypatch):
    """``cpumap roofline`` and ``cpumap analyze`` time code outside the harness's rounds
    (sweep, kernel points, a function's calls): the CLI's context holds the pipeline's lock of
    the same results and host for those blocks, and gives it back after."""
    from cpumap.cli.context import Context

    monkeypatch.delenv(slot.ENV, raising=False)
    ctx = Context(tmp_path / "results")
    ctx._desc = {"machine_id": "m"}
    lock = slot.lock_path(ctx.root)
    with ctx.timing():
        assert os.environ[slot.ENV] == str(lock)
        assert probe(lock) == "busy"
    assert probe(lock) == "free"


WAITER = """
import sys
from cpumap.measure import slot
print("started", flush=True)
with slot.held():
    print("got", flush=True)
"""


def _waiter(lock: Path, first: bool) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != slot.FIRST_ENV}
    env[slot.ENV] = str(lock)
    if first:
        env[slot.FIRST_ENV] = "1"
    proc = subprocess.Popen([sys.executable, "-c", WAITER], env=env, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "started"
    return proc


def _line_within(proc: subprocess.Popen, seconds: float) -> str:
    import select

    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    return proc.stdout.readline().strip() if ready else ""


def test_a_first_jobs_batch_keeps_the_others_out_of_its_gaps(lock, monkeypatch):
    """Between two rounds of a batch of the model's chain (the slot free, the gate held) a job
    that does not measure first does not take the slot; it does once the batch ends. Another
    first job is not kept out by the gate (the slot alone orders the chain's jobs)."""
    monkeypatch.setenv(slot.FIRST_ENV, "1")
    with slot.batch():
        with slot.held():  # a round
            pass
        other = _waiter(lock, first=False)
        chain = _waiter(lock, first=True)
        try:
            assert _line_within(chain, 60) == "got"
            # the slot is free, yet the other job waits at the gate (its line never comes
            # while the batch lasts: a slow host only makes the check weaker, never red)
            assert _line_within(other, 1.0) == ""
            assert other.poll() is None
        except BaseException:
            other.kill()
            raise
    assert _line_within(other, 60) == "got"
    assert other.wait(60) == 0 and chain.wait(60) == 0


def test_a_job_holding_the_slot_when_a_first_batch_begins_keeps_it_to_its_end(lock):
    """No process waits for the gate while it holds the slot (no deadlock): a job measuring
    for its whole life when a chain batch begins keeps the slot, and the batch waits for it."""
    with slot.held():  # this process: not first, holding the slot
        env = {**os.environ, slot.FIRST_ENV: "1"}
        code = ("from cpumap.measure import slot\nprint('started', flush=True)\n"
                "with slot.batch():\n    with slot.held():\n        print('got', flush=True)\n")
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout.readline().strip() == "started"
        assert _line_within(proc, 1.0) == ""
    assert _line_within(proc, 60) == "got"
    assert proc.wait(60) == 0


def test_a_suite_driver_holds_the_slot_while_it_runs_and_not_in_the_pauses(
        lock, tmp_path, monkeypatch):
    """suite.run_driver: each driver process runs with the slot held; the pauses between
    processes (for a neighbour's burst to pass) leave it to other jobs."""
    from cpumap.evaluate import suite

    views = tmp_path / "views"
    driver = tmp_path / "driver"
    # a driver whose processes never agree (1,000, 1,100, ... cycles), so every pause is taken
    driver.write_text(f"""#!{sys.executable}
import fcntl, json, os, pathlib
views = pathlib.Path({str(views)!r})
fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    view = "free"
except OSError:
    view = "busy"
k = len(views.read_text().split()) if views.exists() else 0
views.write_text((views.read_text() if views.exists() else "") + view + "\\n")
m = 1000.0 + 100.0 * k
print(json.dumps({{"kernel": "k", "n": 1, "reps": 1, "clock": "tsc-calibrated",
                  "cycles_per_tick": 1.0, "ticks": [m], "cycles": [m],
                  "bytes_footprint": 8, "checksum": 0.0}}))
""")
    driver.chmod(0o755)
    lock.parent.mkdir(parents=True, exist_ok=True)
    in_pauses: list[str] = []
    monkeypatch.setattr(suite, "time", SimpleNamespace(
        sleep=lambda s: in_pauses.append(probe(lock))))  # suite's own pauses only
    rec = suite.run_driver(driver, [], 60, processes=2, max_processes=4)
    assert rec["processes"] == 4 and not rec["settled"]
    assert views.read_text().split() == ["busy"] * 4
    assert in_pauses == ["free"] * 2
    assert probe(lock) == "free"
