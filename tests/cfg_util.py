"""Helpers shared by the block, counting and suite tests: build the C/asm fixtures of
tests/fixtures/cfg and compute leaders independently with GNU objdump."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

CFG = Path(__file__).parent / "fixtures" / "cfg"


def build(tmp: Path, sources: list[str], flags: list[str], name: str) -> Path:
    out = tmp / name
    subprocess.run(["gcc", *flags, "-o", str(out), *[str(CFG / s) for s in sources]],
                   check=True, capture_output=True, text=True)
    return out


_CF = re.compile(r"^(j[a-z]+|call[a-z]*|ret[a-z]*|loop[a-z]*|jrcxz|ud2|hlt|int3)$")


def objdump_leaders(binary: Path, function: str) -> set[int]:
    """Leaders from GNU objdump's disassembly (an independent disassembler)."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-M", "suffix",
                           str(binary)], check=True, capture_output=True, text=True).stdout
    m = re.search(rf"^[0-9a-f]+ <{re.escape(function)}>:\n(.*?)(?:\n\n|\Z)", text, re.S | re.M)
    assert m, f"{function} not in objdump output"
    insns = []
    for line in m.group(1).splitlines():
        parts = line.split("\t")
        if len(parts) < 2 or not parts[0].strip().endswith(":"):
            continue
        addr = int(parts[0].strip()[:-1], 16)
        fields = parts[1].split()
        mnem = fields[0] if fields else ""
        if mnem in ("notrack", "bnd", "rep", "repz", "repnz") and len(fields) > 1:
            mnem = fields[1]
        target = None
        tm = re.search(r"\b([0-9a-f]+) <", parts[1])
        if tm:
            target = int(tm.group(1), 16)
        insns.append((addr, mnem, target))
    start = insns[0][0]
    end_m = re.search(rf"^([0-9a-f]+) <{re.escape(function)}>", text, re.M)
    assert end_m
    addrs = {a for a, _, _ in insns}
    leaders = {start}
    for k, (_, mnem, target) in enumerate(insns):
        if _CF.match(mnem) and not mnem.startswith("nop"):
            if k + 1 < len(insns):
                leaders.add(insns[k + 1][0])
            if target is not None and target in addrs and not mnem.startswith("call"):
                leaders.add(target)
    return leaders


def marker_count(blocks, counts: dict[int, int], marker: str) -> int:
    """Executions of the instructions mentioning ``marker``: sum over the blocks holding one."""
    return sum(counts[b.block_id] * sum(marker in i for i in b.insns) for b in blocks)
