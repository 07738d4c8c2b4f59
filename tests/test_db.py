"""Tests of cpumap.store.db: the append-only Parquet measurement database."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cpumap.store import db
from cpumap.store.files import CorruptFileError

PARAMS = {"unroll_size": 200, "total_insn": 200000, "num_measures": 3}


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
        "instructions", "cycles", "cycles_per_instance", "timestamp",
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
    for rows in (ok, failed, other_params, other_machine, other_harness):
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


def test_aggregate() -> None:
    rows = pd.concat(
        [
            make_rows("b0", {"A*2 B": [1.0, 0.8, 1.2, 0.9]}),
            make_rows("b0", {"C": [5.0]}, status="failed"),
        ]
    )
    agg = db.aggregate(rows)
    assert list(agg.columns) == db.AGG_COLUMNS
    assert len(agg) == 1
    row = agg.iloc[0]
    assert row["kernel"] == "A*2 B"
    assert row["n_insns"] == 3
    assert row["reps"] == 4
    assert row["cycles_per_instance_median"] == pytest.approx(0.95)
    # fastest f2 minus fastest f1 (rep 1 has the fastest f1 and f2)
    assert row["cycles_per_instance_min"] == pytest.approx(0.8, abs=1e-4)
    assert row["loops_disagree"] == 0.0 and row["nonlinearity"] == pytest.approx(0, abs=0.01)
    assert row["ipc"] == pytest.approx(3 / 0.95)
    assert row["clock"] == "tsc-calibrated"
    assert db.aggregate(rows[rows.status == "failed"]).empty


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


def test_aggregate_min_is_robust_to_an_interrupted_f1() -> None:
    """An interrupted f1 call makes one difference too small; the min must not follow it."""
    rows = make_rows("b0", {"A": [1.0, 1.0, 1.0]})
    rows.loc[1, "ticks1"] += 50_000  # f1 of rep 1 was interrupted (VM exit, tick, ...)
    rows.loc[1, "cycles_per_instance"] = (
        (rows.loc[1, "ticks2"] - rows.loc[1, "ticks1"]) * 1.7 / rows.loc[1, "instances"])
    row = db.aggregate(rows).iloc[0]
    assert rows["cycles_per_instance"].min() < 0.6
    assert row["cycles_per_instance_min"] == pytest.approx(1.0, abs=1e-4)
    # and that repetition's own value is its f2 loop's speed, 1.0 too (its loops disagree)
    assert row["cycles_per_instance_median"] == pytest.approx(1.0, abs=1e-4)
    assert row["loops_disagree"] == pytest.approx(1 / 3)


def test_loops_at_two_speeds_give_the_faster_loop() -> None:
    """Measured on Zen 4 (ADD m64,r64 x 4 + 10 vector ALU ops): the U-copy loop at 4.0 cycles
    per instance, the 2U-copy loop at 5.4, so f2 - f1 = 6.8, the speed of neither loop."""
    rows = make_rows("b0", {"A": [4.0, 4.0, 4.0]})
    inst = rows["instances"]
    rows["ticks1"] = (4.0 * inst / 1.7).astype("int64")
    rows["ticks2"] = (5.4 * 2 * inst / 1.7).astype("int64")
    rows["cycles_per_instance"] = (rows.ticks2 - rows.ticks1) * 1.7 / inst
    row = db.aggregate(rows).iloc[0]
    assert row["cycles_per_instance_median"] == pytest.approx(4.0, abs=1e-4)
    assert row["cycles_per_instance_min"] == pytest.approx(4.0, abs=1e-4)
    assert row["loops_disagree"] == 1.0
    assert row["nonlinearity"] == pytest.approx(6.8 / 5.4 - 1, abs=1e-4)
    # within LOOPS_AGREE the difference stands (it cancels the call overhead)
    assert db.per_instance(pd.Series([1.0]), pd.Series([1.015]), pd.Series([1.0])).item() == 1.0
