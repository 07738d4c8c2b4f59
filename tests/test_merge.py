"""cpumap.store.merge: databases of several nodes or machines merge into one, without duplicates."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from test_db import PARAMS, make_rows

from cpumap import cli
from cpumap.measure import estimate
from cpumap.measure.backend import Measurer
from cpumap.store import db, merge
from cpumap.store.files import CorruptFileError, write_table_atomic

MID = "amd-test-f19-m11-00000000"
OTHER = "intel-test-f6-m8f-11111111"
PART = "singletons-0000-aaaaaaaa"


def node(root: Path, host: str, ts: str, kernels: dict, machine_id: str = MID,
         batch: str = PART) -> Path:
    """results/<id>/ of one node: its machine.json and one part of the shared plan."""
    rows = make_rows(batch, kernels, machine_id=machine_id)
    rows["host"] = host
    rows["timestamp"] = pd.Timestamp(ts)
    mdir = root / machine_id
    db.append(mdir / "db", rows)
    (mdir / "machine.json").write_text(json.dumps({"machine_id": machine_id}) + "\n")
    return root


def test_two_nodes_of_one_machine_merge_and_the_model_uses_all_rows(tmp_path: Path) -> None:
    # the undisturbed (fastest) calls of A are node2's, those of B node1's: estimates that
    # come out right only if both nodes' rows are read
    a = node(tmp_path / "a", "node1", "2026-01-01T00:00:00Z", {"A": [1.2, 1.2], "B": [2.0]})
    b = node(tmp_path / "b", "node2", "2026-01-01T00:00:07Z", {"A": [1.0, 1.0], "B": [2.2]})
    dest = tmp_path / "results"
    rep = merge.merge([a, b], dest)
    # node1's part keeps its name (Snakemake finds the planned batch); node2's same-named part
    # is stored beside it under a name derived from its rows
    assert [Path(p).name for p in rep.parts_copied] == [f"part-{PART}.parquet"]
    (written,) = rep.parts_written
    assert re.fullmatch(rf"part-{PART}\.m[0-9a-f]{{8}}\.parquet", Path(written).name)
    assert rep.rows_added == {MID: 6} and rep.rows_duplicate == 0
    assert (dest / MID / "db" / f"part-{PART}.parquet").read_bytes() == \
        (a / MID / "db" / f"part-{PART}.parquet").read_bytes()
    assert (dest / MID / "machine.json").is_file()
    rows = db.load(dest / MID / "db", machine_id=MID)
    assert sorted(rows.host.unique()) == ["node1", "node2"] and len(rows) == 6
    agg = estimate.aggregate(rows).set_index("kernel")
    assert agg.loc["A", "reps"] == 4
    assert agg.loc["A", "cycles_per_instance_est"] == pytest.approx(1.0, rel=1e-4)

    # the model's measurer reads every part of the machine id
    measurer = Measurer({"machine_id": MID}, pd.DataFrame(), PARAMS, dest / MID / "db",
                        tmp_path / "work", measure=False)
    # (make_rows stores PARAMS as they are, harness "1": point the measurer at those rows)
    measurer.params_id, measurer.version = db.params_id(PARAMS), "1"
    assert measurer.known() == {"A": pytest.approx(1.0, rel=1e-4),
                                "B": pytest.approx(2.0, rel=1e-4)}

    # merging the same sources again adds nothing and writes nothing
    before = sorted(p.name for p in (dest / MID / "db").iterdir())
    again = merge.merge([a, b, dest], dest)
    assert again.rows_added == {} and again.rows_duplicate == 12
    assert again.parts_copied == [] and again.parts_written == []
    assert sorted(p.name for p in (dest / MID / "db").iterdir()) == before


def test_same_rows_under_another_name_are_duplicates(tmp_path: Path) -> None:
    a = node(tmp_path / "a", "node1", "2026-01-01T00:00:00Z", {"A": [1.0], "B": [2.0]})
    dest = tmp_path / "results"
    merge.merge([a], dest)
    # a copy of node1's part under another file name, plus one genuinely new row
    rows = db.load(a / MID / "db")
    extra = make_rows(PART, {"C": [3.0]})
    extra["host"], extra["timestamp"] = "node1", pd.Timestamp("2026-01-01T00:00:00Z")
    c = tmp_path / "c" / MID / "db"
    c.mkdir(parents=True)
    both = pd.concat([rows, extra], ignore_index=True)
    write_table_atomic(db.to_table(both), c / "part-copied.parquet")
    rep = merge.merge([c], dest)
    assert rep.rows_added == {MID: 1} and rep.rows_duplicate == 2
    assert sorted(db.load(dest / MID / "db").kernel) == ["A", "B", "C"]


def test_machine_ids_stay_apart(tmp_path: Path) -> None:
    a = node(tmp_path / "a", "n1", "2026-01-01T00:00:00Z", {"A": [1.0]})
    b = node(tmp_path / "b", "n2", "2026-01-01T00:00:00Z", {"A": [5.0]}, machine_id=OTHER)
    dest = tmp_path / "results"
    # sources may name a results dir, a machine dir or a db dir
    rep = merge.merge([a, b / OTHER / "db"], dest)
    assert rep.rows_added == {MID: 1, OTHER: 1}
    assert db.load(dest / MID / "db").cycles_per_instance.tolist() == [1.0]
    assert db.load(dest / OTHER / "db").cycles_per_instance.tolist() == [5.0]
    assert db.load(dest / MID / "db", machine_id=OTHER).empty


def test_a_corrupt_part_stops_the_merge_with_its_path(tmp_path: Path, capsys) -> None:
    a = node(tmp_path / "a", "n1", "2026-01-01T00:00:00Z", {"A": [1.0]})
    b = node(tmp_path / "b", "n2", "2026-01-02T00:00:00Z", {"A": [1.0]})
    bad = b / MID / "db" / f"part-{PART}.parquet"
    bad.write_bytes(bad.read_bytes()[:-20])
    dest = tmp_path / "results"
    with pytest.raises(CorruptFileError, match=re.escape(str(bad))):
        merge.merge([a, b], dest)
    assert not dest.exists()  # nothing written before every part was read
    assert cli.main(["merge", str(a), str(b), "--into", str(dest)]) == 1
    assert str(bad) in capsys.readouterr().err


def test_cli_merge(tmp_path: Path, capsys) -> None:
    a = node(tmp_path / "a", "n1", "2026-01-01T00:00:00Z", {"A": [1.0], "B": [1.0]})
    assert cli.main(["--results", str(tmp_path / "r"), "merge", str(a), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows_added"] == {MID: 2}
    assert cli.main(["merge", str(tmp_path / "nowhere"), "--into", str(tmp_path / "r")]) == 2
