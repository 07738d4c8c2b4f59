"""Tests of cpumap.store.files: atomic writes and checked Parquet reads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from cpumap.store import files as io


def leftovers(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.startswith(".")]


def test_write_text_and_json_atomic(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "dir" / "out.json"
    io.write_json_atomic({"b": 1, "a": [1, 2]}, target)
    assert json.loads(target.read_text()) == {"a": [1, 2], "b": 1}
    assert target.read_text().index('"a"') < target.read_text().index('"b"')  # sorted keys
    io.write_text_atomic("hello\n", target)
    assert target.read_text() == "hello\n"
    assert not leftovers(target.parent)


def test_failed_write_keeps_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    io.write_json_atomic({"v": 1}, target)
    with pytest.raises(TypeError):
        io.write_json_atomic({"v": object()}, target)
    assert json.loads(target.read_text()) == {"v": 1}
    assert not leftovers(tmp_path)


def test_parquet_round_trip(tmp_path: Path) -> None:
    df = pd.DataFrame({"name": ["a", "b"], "x": [1.5, 2.5]})
    path = io.write_parquet_atomic(df, tmp_path / "t.parquet")
    pd.testing.assert_frame_equal(io.read_parquet_checked(path), df)
    assert not leftovers(tmp_path)


def test_tsv(tmp_path: Path) -> None:
    path = io.write_tsv_atomic(pd.DataFrame({"a": [1], "b": ["x y"]}), tmp_path / "t.tsv")
    assert path.read_text() == "a\tb\n1\tx y\n"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_parquet_names_the_file(tmp_path: Path, damage: str) -> None:
    path = io.write_parquet_atomic(pd.DataFrame({"x": range(100)}), tmp_path / "d.parquet")
    data = path.read_bytes()
    path.write_bytes(
        {"truncate": data[: len(data) - 20], "garbage": b"x" * 64, "empty": b""}[damage]
    )
    with pytest.raises(io.CorruptFileError, match=re.escape(str(path))):
        io.read_parquet_checked(path)
    with pytest.raises(io.CorruptFileError, match=re.escape(str(path))):
        io.read_parquet_schema_checked(path)


def test_missing_parquet_is_not_corrupt(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        io.read_parquet_checked(tmp_path / "nope.parquet")
