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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "CPUMAP_MEASURE_LOCK"
FIRST_ENV = "CPUMAP_MEASURE_FIRST"


class _Holding:
    """This process's hold on one lock file: its descriptor and how many users nest in it.
    A forked child starts without it (its parent's record lock is not its own)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.depth = 0
        self.pid: int | None = None

    def enter(self, take: Callable[[], int]) -> None:
        """Count one more user; the first takes the lock (``take`` returns its descriptor)."""
        if self.pid != os.getpid():
            self.fd, self.depth, self.pid = None, 0, os.getpid()
        if self.depth == 0:
            self.fd = take()
        self.depth += 1

    def leave(self) -> None:
        self.depth -= 1
        if self.depth == 0:
            fd, self.fd = self.fd, None
            if fd is not None:
                os.close(fd)  # closing releases the process's record lock


_slot, _gate = _Holding(), _Holding()
_waited = [0.0]  # seconds this process waited for the slot
# the threads of one process share its record locks (the roofline's compute ceilings measure
# on every CPU from one thread each): the count of their users is kept under this mutex
_mutex = threading.Lock()


def _open(lock: Path) -> int:
    lock.parent.mkdir(parents=True, exist_ok=True)
    return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def _locked(lock: Path, how: int) -> int:
    """A new descriptor of ``lock`` holding a record lock of kind ``how``."""
    fd = _open(lock)
    try:
        fcntl.lockf(fd, how)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
    try:
        os.close(_locked(gate, fcntl.LOCK_EX | fcntl.LOCK_NB))
    except OSError:
        return True
    return False


def waited_s() -> float:
    """Seconds this process has waited for the slot so far (for its log)."""
    return _waited[0]


def _acquire(lock: Path) -> int:
    t0 = time.monotonic()
    fd = _locked(lock, fcntl.LOCK_EX)
    try:
        # a job that does not measure first gives the slot back to a first job's batch,
        # also one that began while this process waited (the gate's exclusive lock is
        # granted once no batch holds it, and given back at once)
        gate = gate_path(lock)
        while not _first() and _gate_busy(gate):
            fcntl.lockf(fd, fcntl.LOCK_UN)
            os.close(_locked(gate, fcntl.LOCK_EX))
            fcntl.lockf(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    _waited[0] += time.monotonic() - t0
    return fd


def _enter(lock: Path) -> None:
    """Take the slot unless this process holds it already; count the nesting."""
    with _mutex:
        _slot.enter(lambda: _acquire(lock))


def _leave() -> None:
    with _mutex:
        _slot.leave()


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
        _gate.enter(lambda: _locked(gate_path(lock), fcntl.LOCK_SH))
    try:
        yield
    finally:
        with _mutex:
            _gate.leave()


def lock_path(machine_dir: Path) -> Path:
    """The lock of one host's measurements under a machine's results. Per host: identical
    cluster nodes share a machine id, and so a directory, but not a core."""
    return (Path(machine_dir) / f".measure-{socket.gethostname()}.lock").resolve()


def join_job(snakemake, whole: bool, first: bool = False) -> None:  # noqa: ANN001
    """Name the lock of the job's results directory and host (:func:`lock_path`), unless the
    config's ``measuring_lock`` is false. ``whole``: the job times code outside the harness's
    rounds (the bandwidth sweep, all cores at once) and takes the slot for its whole life (the
    kernel gives it back at exit). Otherwise each timed run takes it around itself
    (:func:`held`): a round of :mod:`cpumap.measure.batch`, a suite driver's process.
    ``first``: a job of the model's chain, whose batches others do not interrupt (:func:`batch`).
    (``snakemake``: the script's Snakemake object.)"""
    if not snakemake.config.get("measuring_lock", True):
        return
    lock = lock_path(Path(snakemake.config["results_dir"]) / snakemake.wildcards.mid)
    use(lock, first=first)
    if whole:
        _enter(lock)
        if _waited[0] >= 1.0:
            print(f"measuring slot taken after {_waited[0]:.1f} s", flush=True)
