"""Basic-block extraction (cpumap.evaluate.blocks) on fixtures with known leaders."""

from __future__ import annotations

import pytest
from cfg_util import build, objdump_leaders
from elftools.elf.elffile import ELFFile

from cpumap.evaluate import blocks

FLAGS = [["-O0"], ["-O1"], ["-O2"], ["-O3", "-march=x86-64-v3"]]


def _labels(binary, prefix: str) -> set[int]:
    with open(binary, "rb") as handle:
        symtab = ELFFile(handle).get_section_by_name(".symtab")
        return {int(s["st_value"]) for s in symtab.iter_symbols() if s.name.startswith(prefix)}


def test_switch_leaders_are_the_labelled_ones(tmp_path):
    exe = build(tmp_path, ["switch.s", "switch_main.c"], ["-O1"], "switch")
    bl = blocks.extract_blocks(exe, "kernel_sw")
    expected = _labels(exe, "sw_") | _labels(exe, "kernel_sw")
    assert {b.address for b in bl} == expected
    assert len(bl) == 9
    by_addr = {b.address: b for b in bl}
    lab = {}
    with open(exe, "rb") as handle:
        for s in ELFFile(handle).get_section_by_name(".symtab").iter_symbols():
            if s.name.startswith(("sw_", "kernel_sw")):
                lab[s.name] = int(s["st_value"])
    # successors: fall-through into a case, the jump into the middle of the chain, the loop
    ids = {name: by_addr[a].block_id for name, a in lab.items()}
    assert by_addr[lab["sw_loop"]].successors == sorted([ids["sw_l1"], ids["sw_case1"]])
    assert by_addr[lab["sw_case0"]].successors == [ids["sw_case1"]]
    assert by_addr[lab["sw_case3"]].successors == sorted([ids["sw_loop"], ids["sw_done"]])
    assert by_addr[lab["sw_done"]].exits and by_addr[lab["sw_done"]].terminator.startswith("ret")
    assert by_addr[lab["sw_case1"]].terminator == ""  # ends only because a leader follows
    assert not any(b.open_end for b in bl)
    # blocks tile the function exactly
    for a, b in zip(bl, bl[1:], strict=False):
        assert a.end == b.address
    assert [len(b.hexes) for b in bl] == [b.n_insns for b in bl]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "".join(f))
@pytest.mark.parametrize("src,function", [("nested.c", "kernel_nested"),
                                          ("branch.c", "kernel_branch")])
def test_c_fixture_leaders_match_objdump(tmp_path, flags, src, function):
    exe = build(tmp_path, [src], flags, "fx")
    bl = blocks.extract_blocks(exe, function)
    assert {b.address for b in bl} == objdump_leaders(exe, function)
    assert not any(b.open_end for b in bl)


def test_forms_from_the_catalogue(tmp_path, catalogue):
    exe = build(tmp_path, ["switch.s", "switch_main.c"], ["-O1"], "switch")
    bl = blocks.extract_blocks(exe, "kernel_sw", catalogue)
    first = bl[0]
    assert first.insns[0] == "xorl %eax, %eax"
    assert first.forms[0] == catalogue.by_key[("XOR_RM32_R32", False)]
    # control flow has no measurable catalogue form: ""
    assert first.insns[-1].startswith("jle") and first.forms[-1] == ""
    df = blocks.blocks_frame(bl, "sw", "kernel_sw")
    assert blocks.suite_forms([df]) == sorted({f for b in bl for f in b.forms if f})
    ok = blocks.suite_forms([df], catalogue)
    assert catalogue.by_key[("XOR_RM32_R32", False)] in ok
    assert all(catalogue.ok(f) for f in ok)


def test_missing_function_is_named(tmp_path):
    exe = build(tmp_path, ["branch.c"], ["-O1"], "fx")
    with pytest.raises(blocks.FunctionNotFound, match="kernel_nope"):
        blocks.extract_blocks(exe, "kernel_nope")


def test_blocks_table_roundtrip(tmp_path):
    exe = build(tmp_path, ["nested.c"], ["-O2"], "fx")
    bl = blocks.extract_blocks(exe, "kernel_nested")
    path = blocks.write_blocks(bl, "nested", "kernel_nested", tmp_path / "b.parquet")
    from cpumap.store.files import read_parquet_checked

    df = read_parquet_checked(path)
    assert list(df.columns[:10]) == ["benchmark", "function", "block_id", "address", "end",
                                     "n_insns", "insns", "hexes", "forms", "terminator"]
    back = blocks.blocks_from_frame(df)
    assert [(b.address, b.end, b.successors, b.exits) for b in back] == \
        [(b.address, b.end, b.successors, b.exits) for b in bl]
