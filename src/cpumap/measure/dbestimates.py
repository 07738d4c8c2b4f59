"""The estimates of a whole measurement database, read one part at a time, and kept.

Every pipeline job that asks a ``Measurer`` for kernels (Palmed's stages, ``fit_model``, the
validation, the native analyzer, the latencies) starts by estimating every kernel of the
database (``aggregate_db``), while it holds the measuring slot, and each paid it again
although a part never changes once written: on the Emerald Rapids-class guest, beside a
model fit on the other vCPU, 33-48 s for a default run's database (103 MB, 13,790 kernels)
and 520 s for a full profile's (1.1 GB, 460,515 kernels). So what each part gives is kept
beside the database, in ``db/.estimates`` (hidden: archives leave it out; derived, safe to
delete): its calibration samples, its kernels, its kernels' estimates and the rows of the
host monitor's kernels (the kernels most parts share); the same reads then took 0.7-1.8 s
and 6.6 s (``benchmarks/db_read.py``). A kept file is used only for the same part (name,
size, modification time), the same machine, parameters and harness, the same estimating
code (a digest of ``estimate`` and ``robust``) and, for the estimates, the same clock ratios
of the part's batches; anything else, or a file that cannot be read, is made again from the
rows. The table is the same either way (``tests/test_estimate.py``; both databases above).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from cpumap.measure import estimate, robust
from cpumap.store import db
from cpumap.store.files import read_parquet_checked, write_parquet_atomic

#: The columns the calibration of a batch needs (estimate.batch_ratios), read in a first pass.
CAL_COLUMNS = ["machine_id", "batch_id", "params_id", "harness_version", "kernel", "cal1",
               "cal2", "cal_adds", "timestamp"]
#: Where a database keeps what its parts' estimates took (hidden from archives).
KEPT_DIR = ".estimates"


def calibration(part: pd.DataFrame) -> pd.DataFrame:
    """The rows of a part that carry a calibration sample, in the columns the clock ratio of
    a batch needs (estimate.batch_ratios)."""
    return part.loc[part.cal1.notna(), CAL_COLUMNS]


def _code_digest() -> str:
    h = hashlib.sha256()
    for module in (estimate, robust):
        h.update(Path(str(module.__file__)).read_bytes())
    return h.hexdigest()[:16]


_CODE = _code_digest()


class _Kept:
    """The kept files of one database: read if they match, written (atomically) if not."""

    def __init__(self, db_dir: Path, key: dict[str, str], use: bool = True) -> None:
        self.dir = Path(db_dir) / KEPT_DIR
        self.key = key
        self.use = use

    def path(self, part: Path, kind: str, *extra: object) -> Path:
        st = part.stat()
        ident = json.dumps([part.name, st.st_size, st.st_mtime_ns, self.key, _CODE, *extra],
                           sort_keys=True, default=str)
        digest = hashlib.sha256(ident.encode()).hexdigest()[:20]
        return self.dir / f"{part.stem}.{kind}.{digest}.parquet"

    def read(self, path: Path) -> pd.DataFrame | None:
        if not (self.use and path.is_file()):
            return None
        try:
            return read_parquet_checked(path)
        except Exception:  # noqa: BLE001 - a kept file that cannot be read is made again
            return None

    def write(self, path: Path, frame: pd.DataFrame) -> None:
        """Keep ``frame``; the part's older files of the same kind go (another part state)."""
        if not self.use:
            return
        try:
            self.dir.mkdir(exist_ok=True)
            write_parquet_atomic(frame, path)
            stem, kind = path.name.split(".")[:2]
            for old in self.dir.glob(f"{stem}.{kind}.*.parquet"):
                if old != path:
                    old.unlink(missing_ok=True)
        except OSError:
            pass  # a database on a read-only medium: estimated, not kept

    def frames(self, paths: list[Path], make: Callable[[], list[pd.DataFrame]],
               ) -> list[pd.DataFrame]:
        """The kept frames at ``paths``, or (when any is missing or unreadable) those
        ``make`` gives, kept there."""
        got = [self.read(p) for p in paths]
        if any(g is None for g in got):
            got = make()
            for path, frame in zip(paths, got, strict=True):
                self.write(path, frame)
        return got

    def index(self, part: Path) -> list[pd.DataFrame]:
        """[calibration core, its (kernel, batch_id, monitor) triples] of one part:
        ``monitor`` where the kernel has rows in the part's monitor role."""
        def make() -> list[pd.DataFrame]:
            rows = db.read_part(part, [*CAL_COLUMNS, "role"], **self.key)
            watched = set(rows.kernel[rows.role == "monitor"].astype(str))
            kernels = rows[["kernel", "batch_id"]].astype(str).drop_duplicates() \
                .reset_index(drop=True)
            kernels["monitor"] = kernels.kernel.isin(watched)
            return [estimate.calibration_core(calibration(rows)), kernels]

        return self.frames([self.path(part, "cal"), self.path(part, "kernels")], make)

    def _all_rows(self, part: Path, kernels: pd.DataFrame, redo: bool = False) -> pd.DataFrame:
        """All the part's rows, its monitor's kept on the way (``rows``) where they are not
        (or, ``redo``, could not be read)."""
        rows = db.read_part(part, None, **self.key)
        path = self.path(part, "monitor")
        if kernels.monitor.any() and (redo or not path.is_file()):
            self.write(path, rows[rows.kernel.isin(set(kernels.kernel[kernels.monitor]))])
        return rows

    def rows(self, part: Path, kernels: pd.DataFrame, wanted: set[str]) -> pd.DataFrame:
        """The part's rows of the ``wanted`` kernels. Those shared with other parts are
        nearly always the host monitor's (in every batch): its rows are kept apart, so that
        they are read without the whole part."""
        if not wanted <= set(kernels.kernel[kernels.monitor]):
            rows = self._all_rows(part, kernels)
        elif (rows := self.read(self.path(part, "monitor"))) is None:
            rows = self._all_rows(part, kernels, redo=True)
        return rows[rows.kernel.isin(wanted)]

    def estimates(self, part: Path, kernels: pd.DataFrame,
                  ratios: dict[tuple[str, str], float], stable_tol: float) -> pd.DataFrame:
        """``estimate.aggregate`` of all the part's rows alone (each kernel's estimate depends
        only on its own rows and its batch's clock ratio)."""
        batches = set(kernels.batch_id)
        own = sorted((k, v) for k, v in ratios.items() if k[0] in batches)
        return self.frames(
            [self.path(part, "estimates", stable_tol, own)],
            lambda: [estimate.aggregate(self._all_rows(part, kernels), stable_tol, ratios)])[0]


def aggregate_db(db_dir: Path, machine_id: str, params_id: str, harness_version: str,
                 stable_tol: float, kept: bool = True,
                 ) -> tuple[pd.DataFrame, set[str], pd.DataFrame]:
    """``estimate.aggregate`` of a database's rows of one machine, parameter set and harness,
    every kernel text with a row (failed ones too), and the calibration samples the clock
    ratios need (``estimate.calibration_core``), one part at a time.

    The same table as aggregating all rows at once (each kernel's estimate depends only on its
    own rows and its batch's clock ratio), in the memory of the largest part: all rows at once
    took 2.7 GB for the 1.25 million rows of a default run, tens of GB for a full profile.
    First pass: each part's calibration samples and kernels; second pass: each part's
    estimates, kept for the kernels found in no other part, and those of the others from all
    their rows together at the end. Both passes read a part's kept files where they match
    (``kept``; without it, nothing is read from them or written to them).
    """
    key = {"machine_id": machine_id, "params_id": params_id,
           "harness_version": harness_version}
    store = _Kept(db_dir, key, kept)
    parts = db.part_paths(db_dir, skip_batches=db.REPEAT_PREFIX)
    cal_rows: list[pd.DataFrame] = []
    index: list[pd.DataFrame] = []
    for part in parts:
        cal_part, kernels = store.index(part)
        cal_rows.append(cal_part)
        index.append(kernels)
    cal = estimate.calibration_core(pd.concat(cal_rows) if cal_rows
                                    else calibration(db.empty_frame()))
    ratios = estimate.batch_ratios(cal)
    parts_of = pd.concat([k.drop_duplicates("kernel").assign(part=i)
                          for i, k in enumerate(index)]) if index else pd.DataFrame(
        {"kernel": [], "part": []})
    counts = parts_of["kernel"].value_counts()
    shared = set(counts.index[counts > 1])
    out: list[pd.DataFrame] = []
    later: list[pd.DataFrame] = []
    for part, kernels in zip(parts, index, strict=True):
        mine = set(kernels["kernel"])
        if mine - shared:
            agg = store.estimates(part, kernels, ratios, stable_tol)
            out.append(agg[~agg.kernel.astype(str).isin(shared)] if shared else agg)
        if mine & shared:
            later.append(store.rows(part, kernels, mine & shared))
    if later:
        out.append(estimate.aggregate(pd.concat(later), stable_tol, ratios))
    out = [a for a in out if len(a)]
    agg = pd.concat(out, ignore_index=True) if out else estimate.aggregate(
        db.empty_frame(), stable_tol, ratios)
    return agg, set(counts.index.astype(str)), cal


def monitor_db(db_dir: Path, machine_id: str, stable_tol: float,
               kept: bool = True) -> pd.DataFrame:
    """``estimate.monitor_table`` of a database's rows of one machine, one part at a time:
    the monitor's rows and the calibration samples are all it keeps (and keeps beside the
    database, as ``aggregate_db`` does)."""
    store = _Kept(db_dir, {"machine_id": machine_id}, kept)
    mon: list[pd.DataFrame] = []
    cal: list[pd.DataFrame] = []
    for part in db.part_paths(db_dir):
        def make(part: Path = part) -> list[pd.DataFrame]:
            every = db.read_part(part, None, **store.key)
            return [every[every.role == "monitor"],
                    estimate.calibration_core(calibration(every))]

        rows, samples = store.frames([store.path(part, "watch"), store.path(part, "watchcal")],
                                     make)
        mon.append(rows)
        cal.append(samples)
    if not mon:
        return estimate.monitor_table(db.empty_frame(), stable_tol)
    return estimate.monitor_table(pd.concat(mon), stable_tol,
                                  estimate.batch_ratios(pd.concat(cal)))
