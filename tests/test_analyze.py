"""`cpumap analyze` on programs built with plain gcc (no cpumap driver): names as the compiler
left them, repeated string instructions counted as Callgrind counts them, the JSON output, and
the measured cycles of a dependent chain against its physical floor."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cpumap.evaluate import counting, fntime, symbols
from cpumap.store import files as io

FIX = Path(__file__).parent / "fixtures" / "analyze"


@pytest.fixture(scope="module")
def poly(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("analyze") / "poly"
    subprocess.run(["gcc", "-O2", "-o", str(out), str(FIX / "poly.c")], check=True)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory, catalogue_df, host) -> Path:
    root = tmp_path_factory.mktemp("results")
    io.write_parquet_atomic(catalogue_df, root / host["machine_id"] / "isa" / "forms.parquet")
    return root


def callgrind_instructions(binary: Path, function: str, args: list[str]) -> int:
    """Instructions of ``function`` (its calls included) by Callgrind: the independent count."""
    proc = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                           f"--toggle-collect={function}", str(binary), *args],
                          capture_output=True, text=True, check=True)
    return int(re.search(r"Collected\s*:\s*(\d+)", proc.stderr).group(1))


def test_names_users_have(poly, tmp_path):
    got = symbols.resolve_function(poly, "kernel_gemm")  # gcc: kernel_gemm.constprop.0
    assert got.symbol.startswith("kernel_gemm.") and "clone" in got.note
    assert symbols.resolve_function(poly, "kernel_chain") == symbols.Resolved("kernel_chain")
    got = symbols.resolve_function(poly, "kernel_ch")  # an unambiguous prefix, with a note
    assert got.symbol == "kernel_chain" and "starts with" in got.note
    with pytest.raises(symbols.FunctionNotFound, match="ambiguous.*kernel_chain"):
        symbols.resolve_function(poly, "kernel_")  # two functions start with it
    with pytest.raises(symbols.FunctionNotFound, match="closest: kernel_chain"):
        symbols.resolve_function(poly, "kernl_chian")
    exe = tmp_path / "names"
    subprocess.run(["g++", "-O2", "-o", str(exe), str(FIX / "names.cpp")], check=True)
    assert symbols.resolve_function(exe, "ns::scale").symbol == "_ZN2ns5scaleEPdi"
    assert symbols.resolve_function(exe, "ns::twice(long)").symbol == "_ZN2ns5twiceEl"
    with pytest.raises(symbols.FunctionNotFound, match=r"ns::twice\(int\)"):
        symbols.resolve_function(exe, "ns::twice")  # two overloads: both named


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
@pytest.mark.parametrize("n", [41, 0, 1000])
def test_rep_stos_counted_per_iteration_as_callgrind(poly, n):
    res = counting.count(poly, "fill", args=["1", str(n)], plain=False)
    meta = res.meta()
    (rep,) = meta["rep_instructions"]
    assert rep["text"].startswith("rep stos") and rep["executions"] == 1
    assert rep["iterations"] == n and rep["executed"] == n + 1
    assert meta["instructions_executed"] == meta["instructions_static"] + n
    assert meta["instructions_executed"] == callgrind_instructions(poly, "fill", ["1", str(n)])


def run_cli(results: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cpumap.cli", "--results", str(results),
                           "analyze", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_analyze_json(poly, results):
    n = 20000
    proc = run_cli(results, "--json", "--analyzers", "llvm-mca,model", "--reps", "3",
                   str(poly), "--function", "kernel_chain", "--", str(n))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"binary", "function", "symbol", "note", "args", "machine_id", "blocks",
                        "counting", "analyzers", "measured"}
    assert out["symbol"] == "kernel_chain" and out["args"] == [str(n)]
    for b in out["blocks"]:
        assert set(b) == {"block_id", "address", "end", "occurrences", "insns", "forms", "rep",
                          "predictions"}
        assert set(b["predictions"]) == {"llvm-mca"}  # no model in this results directory
    executed = out["counting"]["instructions_executed"]
    assert executed == callgrind_instructions(poly, "kernel_chain", [str(n)])
    loop = max(out["blocks"], key=lambda b: b["occurrences"])
    assert loop["occurrences"] == n and any(i.startswith("imul") for i in loop["insns"])
    mca = out["analyzers"]["llvm-mca"]
    assert mca["status"] == "ok" and mca["blocks_predicted"] == mca["blocks_executed"]
    assert mca["cycles"] == pytest.approx(sum(
        b["occurrences"] * b["predictions"]["llvm-mca"]["cycles"] for b in out["blocks"]))
    assert out["analyzers"]["model"]["status"] == "not run"
    assert "no model" in out["analyzers"]["model"]["reason"]
    m = out["measured"]
    assert m["method"] == fntime.METHOD and len(m["runs"]) == 3
    assert m["cycles"] == min(m["runs"]) and m["cycles_per_tick"] > 0
    # physics: imul r64 (3 cycles, on every x86 core) on every link: at least 3 cycles an
    # iteration, less the method's own uncertainty and 2 % for the clock calibration. The
    # `add $1` after it is not counted: Golden Cove's renamer folds immediate adds (a dependent
    # `add $1, %reg` chain ran at about 0.2 cycles per add on a Sapphire Rapids guest, and this
    # loop at 3.04 cycles). Interference only slows the fastest run down, so the bound is
    # generous.
    floor, chain = 3 * n, 4 * n  # chain: imul + a 1-cycle add, where the add is not folded
    assert m["cycles"] >= 0.98 * floor - m["overhead_spread_cycles"]
    assert m["cycles"] <= 1.5 * chain + m["overhead_spread_cycles"]
    assert m["ipc"] == pytest.approx(executed / m["cycles"])


def test_analyze_bad_input_and_failed_runs(poly, results, tmp_path):
    proc = run_cli(results, str(poly), "--function", "kernl_chian")
    assert proc.returncode == 2 and "closest: kernel_chain" in proc.stderr
    proc = run_cli(results, str(tmp_path / "nope"), "--function", "f")
    assert proc.returncode == 2 and "no such binary" in proc.stderr
    proc = run_cli(results, "--analyzers", "iaca", str(poly), "--function", "fill")
    assert proc.returncode == 2 and "unknown analyzer" in proc.stderr
    static = tmp_path / "poly_static"
    built = subprocess.run(["gcc", "-O2", "-static", "-o", str(static), str(FIX / "poly.c")],
                           capture_output=True)
    if built.returncode == 0:  # a static libc is part of build-essential's libc6-dev
        proc = run_cli(results, "--analyzers", "llvm-mca", str(static), "--function", "fill")
        assert proc.returncode == 1 and "statically linked" in proc.stdout
    # the program fails before calling the function (second argument out of range): exit 1
    proc = run_cli(results, "--analyzers", "llvm-mca", str(poly), "--function", "fill",
                   "--", "1", "5000")
    assert proc.returncode == 1 and "fill was never called" in proc.stderr
