"""The measuring slot: one process times code on this machine at a time.

Two measurements that run at once share the machine's caches and, on a 2-vCPU guest, its
physical core: each slows the other. The pipeline used to keep them apart with Snakemake's
``measure_slots`` resource alone, which a job holds from start to end; but a Palmed stage
alternates measuring rounds with seconds to minutes of linear programs (the quick set's core
mapping: 94 s, of which ~30 s measuring, Emerald Rapids-class guest, 2026-12-01), and while
it solves them no other job could measure. A lock taken around each timed run lets another
job measure during the solving.

The lock is a POSIX record lock (``lockf``) on one file per results directory and host: the kernel
releases it when the process exits, however it exits, and a forked worker (the LP pool, the
compile-ahead worker) does not inherit it, so it cannot keep it past its parent's release.
The file is named by the environment variable ``CPUMAP_MEASURE_LOCK`` (set by each workflow job
for its results directory, :func:`join_job`, and by the CLI for its own), so that the code that
measures need not pass it down; without it, :func:`held` does nothing (unit tests, scripts).
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "CPUMAP_MEASURE_LOCK"
FIRST_ENV = "CPUMAP_MEASURE_FIRST"

_state: dict = {"fd": None, "depth": 0, "waited": 0.0, "pid": None,
                "gate_fd": None, "gate_depth": 0, "gate_pid": None}
# the threads of one process share its record lock (the roofline's compute ceilings measure
# on every CPU from one thread each): the count of its users is kept under this mutex
_mutex = threading.Lock()


def path() -> Path | None:
    value = os.environ.get(ENV)
    return Path(value) if value else None


def use(lock: str | Path, first: bool = False) -> None:
    """Name this process's lock file (and its children's) unless one is named already;
    ``first``: this process measures before the others (the model's chain, :func:`batch`)."""
    os.environ.setdefault(ENV, str(lock))
    if first:
        os.environ[FIRST_ENV] = "1"


def _first() -> bool:
    return os.environ.get(FIRST_ENV) == "1"


def gate_path(lock: Path) -> Path:
    return lock.with_name(lock.name + ".first")


def _gate_busy(gate: Path) -> bool:
    """Whether a first job's batch holds the gate. (This process holds no lock on the gate
    file: closing a descriptor of it would drop those.)"""
    fd = os.open(gate, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _wait_gate(gate: Path) -> None:
    fd = os.open(gate, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)  # granted once no first job's batch holds it
    finally:
        os.close(fd)


def waited_s() -> float:
    """Seconds this process has waited for the slot so far (for its log)."""
    return float(_state["waited"])


def _acquire(lock: Path) -> None:
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    t0 = time.monotonic()
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        # a job that does not measure first gives the slot back to a first job's batch,
        # also one that began while this process waited
        gate = gate_path(lock)
        while not _first() and _gate_busy(gate):
            fcntl.lockf(fd, fcntl.LOCK_UN)
            _wait_gate(gate)
            fcntl.lockf(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    _state.update(fd=fd, waited=_state["waited"] + time.monotonic() - t0)


def _release() -> None:
    fd, _state["fd"] = _state["fd"], None
    if fd is not None:
        os.close(fd)  # closing releases the process's record lock


def _enter(lock: Path) -> None:
    """Take the slot unless this process holds it already; count the nesting. A forked child
    starts without it (its parent's record lock is not its own) and takes it anew."""
    with _mutex:
        if _state["pid"] != os.getpid():
            _state.update(fd=None, depth=0, pid=os.getpid())
        if _state["depth"] == 0:
            _acquire(lock)
        _state["depth"] += 1


def _leave() -> None:
    with _mutex:
        _state["depth"] -= 1
        if _state["depth"] == 0:
            _release()


@contextmanager
def held() -> Iterator[None]:
    """Hold the measuring slot for the block; nested uses take it once."""
    lock = path()
    if lock is None:
        yield
        return
    _enter(lock)
    try:
        yield
    finally:
        _leave()


@contextmanager
def batch() -> Iterator[None]:
    """A batch of rounds of a job that measures first: the gate is held (shared: the chain's
    jobs do not exclude each other here, the slot does) from its first round to its last, so
    that no other job measures in the gaps between them. Does nothing in other processes."""
    lock = path()
    if lock is None or not _first():
        yield
        return
    with _mutex:
        if _state["gate_pid"] != os.getpid():
            _state.update(gate_fd=None, gate_depth=0, gate_pid=os.getpid())
        if _state["gate_depth"] == 0:
            gate = gate_path(lock)
            gate.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(gate, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_SH)
            except BaseException:
                os.close(fd)
                raise
            _state["gate_fd"] = fd
        _state["gate_depth"] += 1
    try:
        yield
    finally:
        with _mutex:
            _state["gate_depth"] -= 1
            if _state["gate_depth"] == 0:
                fd, _state["gate_fd"] = _state["gate_fd"], None
                os.close(fd)


def lock_path(machine_dir: Path) -> Path:
    """The lock of one host's measurements under a machine's results. Per host: identical
    cluster nodes share a machine id, and so a directory, but not a core."""
    return (Path(machine_dir) / f".measure-{socket.gethostname()}.lock").resolve()


def join_job(snakemake, whole: bool, first: bool = False) -> None:  # noqa: ANN001
    """Name the lock of the job's results directory and host (:func:`lock_path`), unless the
    config's ``measuring_lock`` is false. ``whole``: the job times code outside the harness's
    rounds (a driver binary, the bandwidth sweep, all cores at once) and takes the slot for its
    whole life (the kernel gives it back at exit). Otherwise every timed run of the job is a
    round of :mod:`cpumap.measure.batch`, which takes the slot around each (:func:`held`).
    ``first``: a job of the model's chain, whose batches others do not interrupt (:func:`batch`).
    (``snakemake``: the script's Snakemake object.)"""
    if not snakemake.config.get("measuring_lock", True):
        return
    lock = lock_path(Path(snakemake.config["results_dir"]) / snakemake.wildcards.mid)
    use(lock, first=first)
    if whole:
        _enter(lock)
        if _state["waited"] >= 1.0:
            print(f"measuring slot taken after {_state['waited']:.1f} s", flush=True)
