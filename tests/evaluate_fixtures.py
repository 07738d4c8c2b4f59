"""Blocks tables for the evaluation tests, built from hand-written assembly.

The suite's own block extractor (cpumap.evaluate.blocks) is another part of the project; these tests
only need a table in its format, so the fixture splits the code itself: a block starts at the
function entry, at every branch target and after every control-flow instruction.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import iced_x86 as ix
import pandas as pd
from elftools.elf.elffile import ELFFile

from cpumap.isa import x86

FIXTURE = Path(__file__).parent / "fixtures" / "evaluate" / "kernel.s"


def assemble(src: Path, workdir: Path) -> tuple[bytes, dict[str, int]]:
    """.text bytes and symbol offsets of an assembly file."""
    obj = workdir / (src.stem + ".o")
    subprocess.run(["as", "--64", "-o", str(obj), str(src)], check=True)
    with open(obj, "rb") as f:
        elf = ELFFile(f)
        text = elf.get_section_by_name(".text").data()
        syms = {s.name: s["st_value"] for s in elf.get_section_by_name(".symtab").iter_symbols()
                if s.name.startswith("kernel_")}
    return text, syms


def blocks_table(benchmark: str, code: bytes, start: int, end: int, catalogue) -> pd.DataFrame:
    """Blocks of code[start:end] (addresses = offsets) in the blocks-parquet format."""
    insns = list(ix.Decoder(64, code[start:end], ip=start))
    leaders = {start}
    for i in insns:
        if i.flow_control != ix.FlowControl.NEXT:
            leaders.add(i.next_ip)
            if i.flow_control in (ix.FlowControl.CONDITIONAL_BRANCH,
                                  ix.FlowControl.UNCONDITIONAL_BRANCH):
                leaders.add(i.near_branch_target)
    rows, cur = [], []
    for n, i in enumerate(insns):
        cur.append(i)
        last = n == len(insns) - 1
        if last or insns[n + 1].ip in leaders:
            term = cur[-1] if cur[-1].flow_control != ix.FlowControl.NEXT else None
            forms = []
            for c in cur:
                key = x86.form_key(c)
                forms.append(catalogue.by_key.get(key, ""))
            rows.append({
                "benchmark": benchmark, "function": "", "block_id": len(rows),
                "address": cur[0].ip, "end": cur[-1].next_ip, "n_insns": len(cur),
                "insns": [x86.att(c) for c in cur],
                "hexes": [code[c.ip:c.next_ip].hex() for c in cur], "forms": forms,
                "terminator": x86.att(term) if term is not None else ""})
            cur = []
    return pd.DataFrame(rows)


def fixture_blocks(catalogue, workdir: Path) -> pd.DataFrame:
    """Blocks of kernel_fix (benchmark fix.O2) and kernel_odd (odd.O2)."""
    code, syms = assemble(FIXTURE, workdir)
    a = blocks_table("fix.O2", code, syms["kernel_fix"], syms["kernel_odd"], catalogue)
    b = blocks_table("odd.O2", code, syms["kernel_odd"], len(code), catalogue)
    return pd.concat([a, b], ignore_index=True)
