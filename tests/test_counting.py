"""Exact block occurrences (cpumap.evaluate.counting, harness/gdb_count.py) on fixtures with known
control flow, flow-conservation derivation checked against breaking on every block."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cfg_util import build, marker_count

from cpumap import cli
from cpumap.evaluate import blocks, counting

FLAGS = [["-O0"], ["-O2"], ["-O3", "-march=x86-64-v3"]]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "".join(f))
def test_nested_loops_exact(tmp_path, flags):
    exe = build(tmp_path, ["nested.c"], flags, "nested")
    bl = blocks.extract_blocks(exe, "kernel_nested")
    res = counting.count(exe, "kernel_nested", bl, ["7", "5"], plain=False)
    full = counting.count(exe, "kernel_nested", bl, ["7", "5"], all_blocks=True, plain=False)
    flow = counting.count(exe, "kernel_nested", bl, ["7", "5"], trips=False, plain=False)
    assert res.counts == full.counts == flow.counts
    assert "trip" not in flow.method.values()
    assert marker_count(bl, res.counts, "$0x1111") == 7       # first invocation only
    assert marker_count(bl, res.counts, "$0x2222") == 35
    assert res.counts[0] == 1
    assert set(full.method.values()) == {"breakpoint"}
    assert "derived" in res.method.values() and res.hits <= flow.hits < full.hits
    if flags != ["-O0"]:  # -O0 keeps i and j in memory: no induction register
        # the inner loop is one block stepping a register: counted per entry, not iteration
        assert "trip" in res.method.values() and res.hits < 35
    assert flow.hits == sum(flow.counts[v] for v, m in flow.method.items() if m == "breakpoint")


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "".join(f))
def test_data_dependent_branch_exact_and_args_unexpanded(tmp_path, flags):
    exe = build(tmp_path, ["branch.c"], flags, "branch")
    arg = "a b  $HOME; `id` 'q' \"x\" * ~ end "
    bl = blocks.extract_blocks(exe, "kernel_branch")
    res = counting.count(exe, "kernel_branch", bl, [arg], plain=False)
    full = counting.count(exe, "kernel_branch", bl, [arg], all_blocks=True, plain=False)
    assert res.counts == full.counts
    assert marker_count(bl, res.counts, "$0x3333") == arg.count(" ")
    assert marker_count(bl, res.counts, "$0x4444") == len(arg) - arg.count(" ")


@pytest.mark.parametrize("n", [0, 1, 6, 13])
def test_switch_fallthrough_exact(tmp_path, n):
    exe = build(tmp_path, ["switch.s", "switch_main.c"], ["-O1"], "switch")
    bl = blocks.extract_blocks(exe, "kernel_sw")
    res = counting.count(exe, "kernel_sw", bl, [str(n)], plain=False)
    full = counting.count(exe, "kernel_sw", bl, [str(n)], all_blocks=True, plain=False)
    assert res.counts == full.counts
    r = [i & 3 for i in range(n, 0, -1)]
    expected = [1, n, sum(x != 1 for x in r), sum(x not in (1, 2) for x in r),
                r.count(0), sum(x in (0, 1) for x in r), sum(x in (0, 1, 2) for x in r), n, 1]
    expected[-1] = 1 if n > 0 else 1  # sw_done: reached once either way
    assert [res.counts[b.block_id] for b in bl] == expected
    assert res.by_address == {b.address: c for b, c in zip(bl, expected, strict=True)}


def _switch_blocks() -> list[blocks.Block]:
    """kernel_sw's CFG without a binary (block ids as in switch.s)."""
    succ = {0: [1, 8], 1: [2, 5], 2: [3, 6], 3: [4, 7], 4: [5], 5: [6], 6: [7], 7: [1, 8],
            8: []}
    return [blocks.Block(v, v, v + 1, ["x"], ["90"], [""], "", s, exits=(v == 8))
            for v, s in succ.items()]


def test_plan_and_derivation_without_gdb():
    bl = _switch_blocks()
    plan = counting.plan_breakpoints(bl)
    # 9 blocks, cycle space of the loop: the four case/chain choices and the trip count
    assert len(plan) == 4 and 0 not in plan and 8 not in plan
    n = 13
    r = [i & 3 for i in range(n, 0, -1)]
    truth = [1, n, sum(x != 1 for x in r), sum(x not in (1, 2) for x in r), r.count(0),
             sum(x in (0, 1) for x in r), sum(x in (0, 1, 2) for x in r), n, 1]
    derived = counting.derive_counts(bl, {v: truth[v] for v in plan})
    assert [derived[v] for v in range(9)] == truth
    # counts that break conservation are caught, never turned into numbers
    bad = dict(enumerate(truth))
    bad[4] += 1
    with pytest.raises(counting.CountError, match="contradict"):
        counting.derive_counts(bl, bad)


def test_open_cfg_breaks_on_every_block():
    bl = _switch_blocks()
    bl[3].open_end = True
    assert counting.plan_breakpoints(bl) == list(range(9))


def _leftover(exe: Path) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.readlink(d / "exe") == str(exe.resolve()):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def test_hanging_program_is_killed_and_named(tmp_path):
    exe = build(tmp_path, ["hang.c"], ["-O1"], "hangprog")
    with pytest.raises(counting.CountError, match=r"hangprog.*kernel_hang.*killed"):
        counting.count(exe, "kernel_hang", None, [], timeout=3, plain=False)
    assert _leftover(exe) == []


def test_function_never_called(tmp_path):
    exe = build(tmp_path, ["nested.c"], ["-O1"], "nested")
    # too few arguments: main returns before calling the kernel
    with pytest.raises(counting.CountError, match="never called"):
        counting.count(exe, "kernel_nested", None, ["3"], plain=False)


def test_cli_count_blocks(tmp_path, capsys):
    exe = build(tmp_path, ["nested.c"], ["-O2"], "nested")
    assert cli.main(["count-blocks", "--json", str(exe), "--function", "kernel_nested",
                     "--", "4", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    bl = blocks.extract_blocks(exe, "kernel_nested")
    counts = {r["block_id"]: r["occurrences"] for r in out["blocks"]}
    assert marker_count(bl, counts, "$0x2222") == 12
    assert {r["address"] for r in out["blocks"]} == {b.address for b in bl}
    assert all(r["n_insns"] == bl[r["block_id"]].n_insns for r in out["blocks"])
    assert out["plain_seconds"] > 0 and out["breakpoint_hits"] > 0
    # text output: address, instruction count and occurrences per block
    assert cli.main(["count-blocks", str(exe), "--function", "kernel_nested", "--", "4",
                     "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + len(bl)
    assert lines[1].split()[:3] == [hex(bl[0].address), str(bl[0].n_insns), "1"]


def test_cli_bad_input_exits_2(tmp_path, capsys):
    exe = build(tmp_path, ["nested.c"], ["-O2"], "nested")
    assert cli.main(["count-blocks", str(exe), "--function", "kernel_nope"]) == 2
    assert "kernel_nope" in capsys.readouterr().err
    assert cli.main(["count-blocks", str(tmp_path / "missing"), "--function", "f"]) == 2
    assert cli.main(["count-blocks", str(exe)]) == 2


@pytest.mark.parametrize("flags", [["-O1"], ["-O2"], ["-O2", "-no-pie", "-fno-pic"],
                                   ["-O3", "-march=native"]], ids=lambda f: "".join(f))
def test_jump_table_switch_exact(tmp_path, flags):
    exe = build(tmp_path, ["jumptable.c"], flags, "jt")
    bl = blocks.extract_blocks(exe, "kernel_jt")
    # the indirect jmp keeps the CFG open (every block counted), its table gives the leaders
    assert any(b.open_end for b in bl)
    n = 30
    res = counting.count(exe, "kernel_jt", bl, [str(n)], plain=False)
    assert set(res.method.values()) == {"breakpoint"}
    r = [i % 7 for i in range(n)]
    for k in range(6):
        assert marker_count(bl, res.counts, f"$0x5{k}, %r11d") == r.count(k), k
    assert marker_count(bl, res.counts, "$0x56, %r11d") == r.count(5) + r.count(6)
