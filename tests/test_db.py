"""Tests of cpumap.store.db: the append-only Parquet measurement database."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from cpumap.store import db
from cpumap.store.files import CorruptFileError

PARAMS = {"unroll_size": 200, "total_insn": 200000, "min_reps": 3}


def make_rows(
    batch_id: str,
    kernels: dict[str, list[float]],
    *,
    machine_id: str = "amd-test-f19-m11-00000000",
    params: dict | None = None,
    harness_version: str = "1",
    status: str = "ok",
) -> pd.DataFrame:
    """Rows as campaign.measure_batch makes them: one per repetition, tsc-calibrated clock."""
    params = PARAMS if params is None else params
    now = pd.Timestamp("2026-01-02T03:04:05.123456Z")
    rows = []
    for kernel, cpis in kernels.items():
        n_insns = sum(int(p.partition("*")[2] or 1) for p in kernel.split())
        for rep, cpi in enumerate(cpis):
            instances = 200_000
            cycles = cpi * instances
            rows.append(
                {
                    "machine_id": machine_id,
                    "host": "testhost",
                    "backend": "native",
                    "kernel_id": hashlib.sha256(kernel.encode()).hexdigest()[:16],
                    "kernel": kernel,
                    "n_insns": n_insns,
                    "params_id": db.params_id(params),
                    "params": db.canonical_json(params),
                    "harness_version": harness_version,
                    "batch_id": batch_id,
                    "rep": rep,
                    "status": status,
                    "error": "" if status == "ok" else "SIGILL",
                    "clock": "tsc-calibrated",
                    "insn_source": "derived",
                    # f1 runs `instances` instances plus the call overhead, f2 twice as many
                    "ticks1": int((cycles + 1000 + rep) / 1.7),
                    "ticks2": int((cycles + 1000 + rep) / 1.7) + int(cycles / 1.7),
                    "cycles1": -1,
                    "cycles2": -1,
                    "calib_ratio": 1.7,
                    "instances": instances,
                    "instructions": n_insns * instances,
                    "cycles": cycles,
                    "cycles_per_instance": cpi,
                    "timestamp": now,
                }
            )
    return pd.DataFrame(rows)


def test_schema_has_the_contract_columns() -> None:
    assert db.COLUMNS == [
        "machine_id", "host", "backend", "kernel_id", "kernel", "n_insns", "params_id",
        "params", "harness_version", "batch_id", "rep", "status", "error", "clock",
        "insn_source", "ticks1", "ticks2", "cycles1", "cycles2", "calib_ratio", "instances",
        "instructions", "cycles", "cycles_per_instance", "timestamp", "cal1", "cal2",
        "cal_adds", "stable", "role", "round", "local_ratio", "run_ratio_low",
    ]  # fmt: skip
    assert str(db.SCHEMA.field("timestamp").type) == "timestamp[us, tz=UTC]"


def test_append_load_round_trip(tmp_path: Path) -> None:
    rows = make_rows("singletons-0000-aaaaaaaa", {"ADD_R64_R64": [0.25, 0.26, 0.25]})
    part = db.append(tmp_path / "db", rows)
    assert part == tmp_path / "db" / "part-singletons-0000-aaaaaaaa.parquet"
    loaded = db.load(tmp_path / "db")
    assert list(loaded.columns) == db.COLUMNS
    assert len(loaded) == 3
    pd.testing.assert_series_equal(
        loaded["cycles_per_instance"], rows["cycles_per_instance"], check_names=False
    )
    assert loaded["ticks2"].tolist() == rows["ticks2"].tolist()
    assert loaded["timestamp"].iloc[0] == pd.Timestamp("2026-01-02T03:04:05.123456Z")
    assert str(loaded["timestamp"].dt.tz) == "UTC"


def test_rows_survive_a_rerun(tmp_path: Path) -> None:
    d = tmp_path / "db"
    db.append(d, make_rows("singletons-0000-aaaaaaaa", {"A": [1.0, 1.0]}))
    db.append(d, make_rows("singletons-0001-bbbbbbbb", {"B": [2.0, 2.0]}))
    # An interrupted writer leaves a dot-file behind; it is not a part.
    (d / ".part-singletons-0002-cccccccc.parquet.123.tmp").write_bytes(b"partial")
    with pytest.raises(FileExistsError, match="part-singletons-0000-aaaaaaaa"):
        db.append(d, make_rows("singletons-0000-aaaaaaaa", {"A": [9.0]}))
    loaded = db.load(d)
    assert sorted(loaded["kernel"].unique()) == ["A", "B"]
    assert loaded.loc[loaded.kernel == "A", "cycles_per_instance"].tolist() == [1.0, 1.0]
    # A deliberate replacement rewrites only its own part.
    db.append(d, make_rows("singletons-0000-aaaaaaaa", {"A": [3.0]}), replace=True)
    loaded = db.load(d)
    assert loaded.loc[loaded.kernel == "A", "cycles_per_instance"].tolist() == [3.0]
    assert loaded.loc[loaded.kernel == "B", "cycles_per_instance"].tolist() == [2.0, 2.0]


def test_corrupt_part_is_named(tmp_path: Path) -> None:
    d = tmp_path / "db"
    db.append(d, make_rows("good", {"A": [1.0]}))
    bad = db.append(d, make_rows("bad", {"B": [1.0]}))
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])  # truncated
    with pytest.raises(CorruptFileError, match=re.escape(str(bad))):
        db.load(d)
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(CorruptFileError, match="part-bad.parquet"):
        db.measured_keys(d, "amd-test-f19-m11-00000000", db.params_id(PARAMS), "1")


def test_part_with_wrong_columns_is_rejected(tmp_path: Path) -> None:
    d = tmp_path / "db"
    d.mkdir()
    pd.DataFrame({"x": [1]}).to_parquet(d / "part-alien.parquet")
    with pytest.raises(CorruptFileError, match="part-alien.parquet.*missing columns"):
        db.load(d)


def test_measured_keys(tmp_path: Path) -> None:
    d = tmp_path / "db"
    mid = "amd-test-f19-m11-00000000"
    ok = make_rows("b0", {"A": [1.0, 1.0], "B": [2.0]})
    failed = make_rows("b1", {"C": [5.0]}, status="failed")
    other_params = make_rows("b2", {"D": [1.0]}, params={"unroll_size": 100})
    other_machine = make_rows("b3", {"E": [1.0]}, machine_id="intel-x-f6-m8f-11111111")
    other_harness = make_rows("b4", {"F": [1.0]}, harness_version="2")
    # a batch's noise monitor is no measurement of its kernel
    monitor = make_rows("b5", {"G": [1.0], "A": [1.0]}).assign(role=["monitor", "kernel"])
    for rows in (ok, failed, other_params, other_machine, other_harness, monitor):
        db.append(d, rows)
    keys = db.measured_keys(d, mid, db.params_id(PARAMS), "1")
    assert keys == set(ok["kernel_id"])
    assert db.measured_keys(tmp_path / "nothing-here", mid, "x", "1") == set()


def test_load_filters_machine_and_handles_missing_dir(tmp_path: Path) -> None:
    d = tmp_path / "db"
    db.append(d, make_rows("b0", {"A": [1.0]}))
    db.append(d, make_rows("b1", {"B": [1.0]}, machine_id="other"))
    assert db.load(d, machine_id="other")["kernel"].tolist() == ["B"]
    empty = db.load(tmp_path / "missing")
    assert empty.empty and list(empty.columns) == db.COLUMNS


def test_params_id() -> None:
    a = db.params_id({"a": 1, "b": [1, 2]})
    assert a == db.params_id({"b": [1, 2], "a": 1})
    assert re.fullmatch(r"[0-9a-f]{12}", a)
    assert a != db.params_id({"a": 2, "b": [1, 2]})


def test_batch_key() -> None:
    k = db.batch_key(3, ["A", "B"])
    assert re.fullmatch(r"0003-[0-9a-f]{8}", k)
    assert k == db.batch_key(3, ["A", "B"])
    assert k != db.batch_key(3, ["A", "C"])


def test_schema_mismatch_and_conform(tmp_path: Path) -> None:
    rows = make_rows("b0", {"A": [1.0]})
    with pytest.raises(db.SchemaMismatchError, match="extra"):
        db.append(tmp_path, rows.assign(bogus=1))
    with pytest.raises(db.SchemaMismatchError, match="missing"):
        db.append(tmp_path, rows.drop(columns=["ticks1"]))
    # A failed kernel has no timing columns: conform adds them as nulls.
    failed = rows[["machine_id", "kernel_id", "kernel", "batch_id", "status", "timestamp"]]
    conformed = db.conform(failed.assign(status="failed", rep=-1, error="SIGILL"))
    assert list(conformed.columns) == db.COLUMNS
    assert np.isnan(conformed["ticks1"].iloc[0])
    path = db.append(tmp_path, conformed)
    assert db.load_parts([path])["error"].tolist() == ["SIGILL"]


def test_invalid_batch_id(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid batch id"):
        db.append(tmp_path, make_rows("../escape", {"A": [1.0]}))


def test_parts_written_before_the_optional_columns_still_load(tmp_path: Path) -> None:
    """A part of the schema before cal1/cal2/cal_adds/stable/role (an archived results
    directory) reads with their defaults: role 'kernel', the others null."""
    rows = make_rows("b0", {"A": [1.0, 1.1]})
    old = db.to_table(rows).drop_columns(list(db.OPTIONAL))
    path = tmp_path / "part-b0.parquet"
    pq.write_table(old, path)
    back = db.load(tmp_path)
    assert list(back.columns) == db.COLUMNS
    assert back["role"].tolist() == ["kernel", "kernel"]
    assert back["cal1"].isna().all() and back["stable"].isna().all()
    assert db.measured_keys(tmp_path, rows.machine_id[0], rows.params_id[0], "1") == {
        rows.kernel_id[0]}


def test_the_kernel_index_finds_the_parts_that_hold_a_kernel(tmp_path: Path) -> None:
    from cpumap.store import kernel_index

    d, index = tmp_path / "db", tmp_path / "work" / "kernel-index.parquet"
    kid = {k: make_rows("x", {k: [1.0]}).kernel_id[0] for k in ("A", "B", "C")}
    db.append(d, make_rows("singletons-0000-aaaaaaaa", {"A": [1.0], "B": [2.0]}))
    db.append(d, make_rows("palmed-pairs001-bbbbbbbb", {"A": [1.0, 1.0]}))
    db.append(d, make_rows(f"{db.REPEAT_PREFIX}validation-s1-cccccccc", {"A": [1.1]}))

    def names(k: str, **kw: str) -> list[str]:
        return [p.name for p in kernel_index.parts_holding(d, kid[k], index, **kw)]

    assert names("A") == ["part-palmed-pairs001-bbbbbbbb.parquet",
                          f"part-{db.REPEAT_PREFIX}validation-s1-cccccccc.parquet",
                          "part-singletons-0000-aaaaaaaa.parquet"]
    assert names("A", skip_batches=db.REPEAT_PREFIX) == [
        "part-palmed-pairs001-bbbbbbbb.parquet", "part-singletons-0000-aaaaaaaa.parquet"]
    assert names("B") == ["part-singletons-0000-aaaaaaaa.parquet"]
    assert names("C") == []
    assert index.is_file()
    # a part written later is read once and added; a part replaced on purpose is read again
    db.append(d, make_rows("palmed-core001-dddddddd", {"C": [3.0]}))
    assert names("C") == ["part-palmed-core001-dddddddd.parquet"]
    db.append(d, make_rows("singletons-0000-aaaaaaaa", {"C": [3.0, 3.0, 3.0]}), replace=True)
    assert names("B") == []
    assert names("C") == ["part-palmed-core001-dddddddd.parquet",
                          "part-singletons-0000-aaaaaaaa.parquet"]
    stored = pq.read_table(index).to_pandas()
    assert sorted(set(stored.part)) == sorted(p.name for p in db.part_paths(d))
    # the index is derived data: a damaged one is rebuilt, one that cannot be written is
    # only not kept
    index.write_bytes(b"not parquet")
    assert names("A", skip_batches=db.REPEAT_PREFIX) == ["part-palmed-pairs001-bbbbbbbb.parquet"]
    assert len(pq.read_table(index)) == len(stored)
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert [p.name for p in kernel_index.parts_holding(d, kid["B"], blocked / "index")] == []
    assert [p.name for p in kernel_index.parts_holding(d, kid["C"], blocked / "index")] == [
        "part-palmed-core001-dddddddd.parquet", "part-singletons-0000-aaaaaaaa.parquet"]


def test_parts_written_before_a_time_are_left_out_on_request(tmp_path: Path) -> None:
    import os
    import time

    d = tmp_path / "db"
    old = db.append(d, make_rows("singletons-0000-aaaaaaaa", {"A": [1.0]}))
    new = db.append(d, make_rows("singletons-0001-bbbbbbbb", {"B": [1.0]}))
    now = time.time()
    hour_ago = now - 3600
    os.utime(old, (hour_ago, hour_ago))
    assert db.part_paths(d, modified_since=now - 600) == [new]
    # within the margin (coarse file times) a part still counts
    assert db.part_paths(d, modified_since=hour_ago + db.MODIFIED_MARGIN_S / 2) == [old, new]
    assert [p for p, _ in db.iter_parts(d, ["kernel"], modified_since=now - 600)] == [new]
    assert db.part_paths(d) == [old, new]
