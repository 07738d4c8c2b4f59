"""cpumap.store.archive: archive and restore results/, verified; re-deriving everything from raw
rows."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_db import make_rows

from cpumap import cli
from cpumap.store import archive, db
from cpumap.store.files import CorruptFileError

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
MID = "amd-test-f19-m11-00000000"


def make_results(root: Path) -> Path:
    """A small results tree: two DB parts, a machine description, a model, work and temp files."""
    mdir = root / MID
    db.append(mdir / "db", make_rows("singletons-0000-aaaaaaaa", {"A": [1.0, 1.1], "B": [2.0]}))
    db.append(mdir / "db", make_rows("palmed002-bbbbbbbb", {"A*2 B": [3.0]}))
    (mdir / "machine.json").write_text(json.dumps({"machine_id": MID}) + "\n")
    (mdir / "model").mkdir()
    (mdir / "model" / "model.json").write_text('{"rho": {}}\n')
    (mdir / "bench" / "singletons" / "work" / "0000").mkdir(parents=True)
    (mdir / "bench" / "singletons" / "work" / "0000" / "batch.s").write_text("nop\n")
    (mdir / "model" / "work-validation").mkdir()
    (mdir / "model" / "work-validation" / "x.so").write_bytes(b"\0")
    (mdir / "db" / ".part-c.parquet.1234.tmp").write_bytes(b"half a part")
    return mdir


def run_cli(*argv: str) -> int:
    return cli.main(list(argv))


def test_archive_restore_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "results"
    make_results(src)
    out = tmp_path / "backup.tar.gz"
    manifest = archive.archive(src, out)
    paths = [e["path"] for e in manifest["files"]]
    assert paths == [f"{MID}/db/part-palmed002-bbbbbbbb.parquet",
                     f"{MID}/db/part-singletons-0000-aaaaaaaa.parquet",
                     f"{MID}/machine.json", f"{MID}/model/model.json"]  # no work, no temp
    assert manifest["machines"] == [MID] and manifest["db_rows"] == 4
    assert archive.read_manifest(out) == manifest
    with tarfile.open(out) as tar:
        assert tar.getnames()[0] == archive.MANIFEST

    dest = tmp_path / "restored"
    summary = archive.restore(out, dest)
    assert summary["files"] == 4 and summary["machines"] == [MID]
    for rel in paths:
        assert (dest / rel).read_bytes() == (src / rel).read_bytes()
    # one common modification time: Snakemake sees the restored tree as up to date
    assert len({(dest / rel).stat().st_mtime_ns for rel in paths}) == 1
    assert not [p for p in dest.iterdir() if p.name.startswith(".")]  # staging removed
    pd.testing.assert_frame_equal(db.load(dest / MID / "db"), db.load(src / MID / "db"))

    # existing results are never overwritten without --force, and stay intact
    (dest / MID / "model" / "model.json").write_text("edited\n")
    with pytest.raises(archive.ArchiveError, match=f"already has results for {MID}"):
        archive.restore(out, dest)
    assert run_cli("restore", str(out), "--into", str(dest)) == 2
    assert (dest / MID / "model" / "model.json").read_text() == "edited\n"
    assert run_cli("restore", str(out), "--into", str(dest), "--force") == 0
    assert (dest / MID / "model" / "model.json").read_text() == '{"rho": {}}\n'


@pytest.mark.parametrize("suffix", [".tar", ".tar.xz"])
def test_cli_archive_other_compressions(tmp_path: Path, suffix: str) -> None:
    make_results(tmp_path / "results")
    out = tmp_path / f"b{suffix}"
    assert run_cli("--results", str(tmp_path / "results"), "archive", str(out)) == 0
    assert run_cli("restore", str(out), "--into", str(tmp_path / "r")) == 0
    assert (tmp_path / "r" / MID / "machine.json").is_file()
    assert run_cli("--results", str(tmp_path / "results"), "archive",
                   str(tmp_path / "b.zip")) == 2


def _rewrite(src: Path, dst: Path, edit) -> None:
    """Copy an archive member by member; ``edit(name, data)`` returns new bytes or None (drop)."""
    with tarfile.open(src) as tin, tarfile.open(dst, "w:gz") as tout:
        for member in tin:
            data = tin.extractfile(member).read() if member.isfile() else b""
            new = edit(member.name, data)
            if new is None:
                continue
            member.size = len(new)
            tout.addfile(member, io.BytesIO(new))


def test_checksum_mismatch_names_the_file_and_restores_nothing(tmp_path: Path, capsys) -> None:
    make_results(tmp_path / "results")
    good = tmp_path / "good.tar.gz"
    archive.archive(tmp_path / "results", good)
    part = f"{MID}/db/part-singletons-0000-aaaaaaaa.parquet"

    bad = tmp_path / "bad.tar.gz"
    _rewrite(good, bad, lambda n, d: d[:-1] + bytes([d[-1] ^ 1]) if n.endswith(part) else d)
    with pytest.raises(archive.ChecksumError, match=re.escape(part)):
        archive.restore(bad, tmp_path / "r1")
    assert not (tmp_path / "r1" / MID).exists()
    assert run_cli("restore", str(bad), "--into", str(tmp_path / "r1")) == 2
    assert f"checksum mismatch for {part}" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "r1").iterdir()] == []  # no staging left behind

    missing = tmp_path / "missing.tar.gz"
    _rewrite(good, missing, lambda n, d: None if n.endswith(part) else d)
    with pytest.raises(archive.ChecksumError, match="missing from the archive"):
        archive.restore(missing, tmp_path / "r2")

    def add_members(src: Path, dst: Path, name: str) -> None:
        with tarfile.open(src) as tin:
            members = [(m, tin.extractfile(m).read()) for m in tin]
        with tarfile.open(dst, "w:gz") as tout:
            for m, data in members:
                tout.addfile(m, io.BytesIO(data))
            info = tarfile.TarInfo(name)
            info.size = 1
            tout.addfile(info, io.BytesIO(b"x"))

    extra = tmp_path / "extra.tar.gz"
    add_members(good, extra, f"results/{MID}/extra.txt")
    with pytest.raises(archive.ChecksumError, match=f"{MID}/extra.txt.*not in its manifest"):
        archive.restore(extra, tmp_path / "r2")
    unsafe = tmp_path / "unsafe.tar.gz"
    add_members(good, unsafe, "results/../../evil")
    with pytest.raises(archive.ArchiveError, match="unexpected member"):
        archive.restore(unsafe, tmp_path / "r3")
    assert not (tmp_path / "evil").exists()


def test_corrupt_part_stops_the_archive(tmp_path: Path) -> None:
    mdir = make_results(tmp_path / "results")
    part = mdir / "db" / "part-palmed002-bbbbbbbb.parquet"
    part.write_bytes(part.read_bytes()[:100])
    out = tmp_path / "b.tar.gz"
    with pytest.raises(CorruptFileError, match=re.escape(str(part))):
        archive.archive(tmp_path / "results", out)
    assert not out.exists() and not list(tmp_path.glob(".b.tar.gz*"))


# --------------------------------------------------------------------------- pipeline


def _run_key(key: str) -> bool:
    """Statistics of the run itself, not of the model: times and kernels measured now."""
    return "seconds" in key or key in ("measured_now", "measured_by_job")


def _run_values(node, inside: bool = False) -> list[float]:
    """Values of the run statistics in a stats.json tree."""
    if isinstance(node, dict):
        return [v for k, sub in node.items() for v in _run_values(sub, inside or _run_key(k))]
    if isinstance(node, list):
        return [v for sub in node for v in _run_values(sub, inside)]
    return [node] if inside and isinstance(node, int | float) else []


def _stripped_json(path: Path) -> object:
    """A JSON file without the run statistics (keys of ``_run_key``)."""
    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if not _run_key(k)}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node
    return strip(json.loads(path.read_text()))


def _run_tokens(stats: Path) -> set[str]:
    """How the run statistics of a stats.json may be printed in a report."""
    tokens: set[str] = set()
    for v in _run_values(json.loads(stats.read_text())):
        tokens |= {str(v)} if isinstance(v, int) else {repr(v)} | {
            f"{v:.{d}f}" for d in range(1, 5)}
    return tokens


def assert_equal_content(a: Path, b: Path) -> None:
    """Two derivations of one file agree apart from the run's own statistics: in JSON the
    keys of ``_run_key``; in text, word for word, and a number may differ only where each
    side prints one of its own run statistics (from the stats.json beside it)."""
    if a.suffix == ".json":
        assert _stripped_json(a) == _stripped_json(b), a.name
        return
    number = re.compile(r"(\d+(?:\.\d+)?(?:e[+-]?\d+)?)")
    pa, pb = number.split(a.read_text()), number.split(b.read_text())
    assert pa[::2] == pb[::2], f"{a.name}: text differs"
    ta, tb = _run_tokens(a.parent / "stats.json"), _run_tokens(b.parent / "stats.json")
    for x, y in zip(pa[1::2], pb[1::2], strict=True):
        assert x == y or (x in ta and y in tb), f"{a.name}: {x} != {y}"


RAW = ("machine.json", "bin", "isa", "db", "bench/singletons/plan.json")


def _simulated_config(tmp_path: Path, name: str, results: Path, **extra) -> Path:
    cfg = yaml.safe_load((ROOT / "config" / "simulated.yaml").read_text())
    cfg["results_dir"] = str(results)
    cfg.update(extra)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _snakemake(cfg: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([SNAKEMAKE, "--cores", "2", "--configfile", str(cfg), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)


def test_restored_archive_rederives_everything_without_measuring(tmp_path: Path) -> None:
    """config/simulated.yaml end to end; archive; restore elsewhere; keep only the raw data;
    rerun with measure: false: nothing is measured and every derived file comes back
    byte-identical (run statistics such as LP seconds aside, which are equal in content)."""
    orig = tmp_path / "a" / "results"
    proc = _snakemake(_simulated_config(tmp_path, "a", orig))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (mdir,) = orig.iterdir()
    out = tmp_path / "a.tar.gz"
    assert run_cli("--results", str(orig), "archive", str(out)) == 0
    restored = tmp_path / "b" / "results"
    assert run_cli("restore", str(out), "--into", str(restored)) == 0
    rdir = restored / mdir.name

    derived = []
    for path in sorted(p for p in rdir.rglob("*") if p.is_file()):
        rel = path.relative_to(rdir).as_posix()
        if not any(rel == r or rel.startswith(r + "/") for r in RAW):
            derived.append(rel)
            path.unlink()
    assert "model/model.json" in derived and "bench/singletons/singletons.tsv" in derived
    parts = {p.name: p.read_bytes() for p in (rdir / "db").glob("*.parquet")}

    cfg = _simulated_config(tmp_path, "b", restored, measure=False)
    proc = _snakemake(cfg)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in (rdir / "db").glob("*.parquet")} == parts
    assert "measured now 0" in (rdir / "logs" / "fit_model.log").read_text()
    identical, equal = [], []
    for rel in derived:
        if rel.startswith("logs/"):
            continue  # logs say when and how long: not results
        a, b = mdir / rel, rdir / rel
        assert b.is_file(), f"{rel} was not re-derived"
        if a.read_bytes() == b.read_bytes():
            identical.append(rel)
        else:
            assert_equal_content(a, b)
            equal.append(rel)
    assert {"model/model.json", "model/mapping.tsv", "bench/singletons/singletons.tsv",
            "bench/singletons/summary.tsv"} <= set(identical)
    stages = {f"model/stages/{s}.json" for s in ("pairs", "basic", "core", "mapping")}
    assert stages <= set(derived)
    assert set(equal) <= {"model/stats.json", "model/report.md"} | stages, equal

    # measuring off and a kernel missing from the database: the job fails naming it
    lost = sorted((rdir / "db").glob("part-palmed*.parquet"))[0]
    lost_kernels = db.load_parts([lost])["kernel"]
    lost.unlink()
    proc = _snakemake(cfg, "--forcerun", "fit_model")
    assert proc.returncode != 0
    log = (rdir / "logs" / "fit_model.log").read_text()
    assert "measuring is off (measure: false)" in log
    assert any(k in log for k in lost_kernels), log[-2000:]
    assert not (rdir / "db" / lost.name).exists()
    (single,) = (rdir / "db").glob("part-singletons-*.parquet")
    single_kernels = set(db.load_parts([single])["kernel"])
    single.unlink()
    proc = _snakemake(cfg, "--forcerun", "singleton_summary")
    assert proc.returncode != 0
    (mlog,) = (rdir / "logs" / "measure").glob("singletons-*.log")
    text = mlog.read_text()
    assert "measuring is off (measure: false)" in text
    assert any(k in text for k in single_kernels)
    assert not single.exists()
