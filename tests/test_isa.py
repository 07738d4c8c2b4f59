"""The catalogue: exclusions with reasons, unique names, and name -> asm -> bytes -> form."""

from __future__ import annotations

import random

import pytest

from cpumap.isa import catalogue as isa
from cpumap.isa import x86


def test_names_unique_and_reasons_recorded(catalogue_df):
    df = catalogue_df
    assert df.name.is_unique
    assert (df.loc[df.status != "ok", "reason"] != "").all()
    assert (df.loc[df.status == "ok", "reason"] == "").all()
    assert (df.status == "ok").sum() > 3000


@pytest.mark.parametrize("name,reason", [
    ("JMP_R64", "control flow"),
    ("LEAVE", "RSP from RBP"),
    ("POPFQ", "RFLAGS from the stack"),
    ("HLT", "privileged"),
    ("FADD_M32", "x87"),
    ("CPUID", "VM exit"),
    ("BTC_M16_R16", "bit-string addressing"),
    ("BT_M64_R64", "bit-string addressing"),
])
def test_known_exclusions(catalogue, name, reason):
    row = catalogue.by_name[name]
    assert row.status == "excluded"
    assert reason in row.reason


def test_bit_tests_on_memory_only_with_an_immediate_offset(catalogue_df):
    """A register bit offset addresses memory outside the operand; an immediate one does not
    (the offset is taken modulo the operand width), and register operands are harmless."""
    bits = catalogue_df[catalogue_df.mnemonic.isin(["BT", "BTC", "BTR", "BTS"])]
    mem_reg = bits.name.str.fullmatch(r"BT[CRS]?_M\d+_R\d+")
    assert mem_reg.sum() == 12
    assert (bits[mem_reg].reason.str.startswith("bit-string addressing")).all()
    assert (bits[~mem_reg].status == "ok").all(), bits[~mem_reg & (bits.status != "ok")]


def test_pushes_and_pops_are_measurable(catalogue):
    for name in ("PUSH_R64", "POP_R64", "PUSH_I32", "PUSH_M64", "POP_M64", "PUSHFQ"):
        assert catalogue.by_name[name].status == "ok", name


def test_operands_of_common_forms(catalogue):
    spec = catalogue.spec("ADD_R64_R64")
    assert [(o.kind, o.cls, o.width, o.access) for o in spec.operands] == [
        ("reg", "GPR", 64, "rw"), ("reg", "GPR", 64, "r")]
    spec = catalogue.spec("MOV_M64_R64")
    assert spec.operands[0].kind == "mem" and spec.operands[0].access == "w"
    spec = catalogue.spec("DIV_R64")
    assert dict(spec.implicit) == {"RAX": "rw", "RDX": "rw"}
    spec = catalogue.spec("VFMADD231PD_ZMM_ZMM_ZMM")
    assert spec.encoding == "EVEX"
    assert [o.access for o in spec.operands] == ["rw", "r", "r"]


def test_forms_that_write_every_flag_and_read_none_break_the_flags_chain(catalogue_df):
    """iced-x86's flags decide (undefined flags count as written: the hardware writes them);
    a shift by CL keeps the flags on a zero count, so it reads them whatever iced says."""
    row = catalogue_df.set_index("name")
    breaks = {n: bool(row.at[n, "breaks_flags"]) for n in (
        "ADD_R64_R64", "CMP_R64_I8", "AND_R64_R64", "IMUL_R64_R64", "SAR_R64_I8",
        "ROL_R64_I8", "INC_R64", "ADC_R64_R64", "SHR_R64_CL", "CMOVE_R64_R64", "MOV_R64_R64")}
    assert breaks == {"ADD_R64_R64": True, "CMP_R64_I8": True, "AND_R64_R64": True,
                      "IMUL_R64_R64": True, "SAR_R64_I8": True, "ROL_R64_I8": False,
                      "INC_R64": False, "ADC_R64_R64": False, "SHR_R64_CL": False,
                      "CMOVE_R64_R64": False, "MOV_R64_R64": False}
    assert row.at["ROL_R64_I8", "writes_flags"] and not row.at["ROL_R64_I8", "reads_flags"]


def test_round_trip_sample(catalogue_df, catalogue):
    """name -> AT&T text -> GNU as bytes -> decoded form, for a random sample of forms."""
    ok = catalogue_df[(catalogue_df.status == "ok") & (catalogue_df.gas == "same")]
    sample = random.Random(7).sample(sorted(ok.name), 150)
    for name in sample:
        text = catalogue.by_name[name].att_example
        assert catalogue.resolve(text) == name, text
        # and the bytes the generator emits decode to the same form
        spec = catalogue.spec(name)
        instr = x86.instantiate(spec, [x86.reg_name(o.cls, o.width, i + 1) if o.kind == "reg"
                                       else None for i, o in enumerate(spec.operands)], 64)
        (dec,) = x86.decode_all(x86.encode(instr))
        assert x86.form_key(dec) == (spec.code, spec.mem)


def test_resolve_att_and_names(catalogue, host):
    assert catalogue.resolve("addq %rax, %rbx") == "ADD_R64_R64"
    assert catalogue.resolve("add_r64_r64") == "ADD_R64_R64"
    assert catalogue.resolve("vaddpd %ymm0, %ymm1, %ymm2") == "VADDPD_YMM_YMM_YMM"
    assert catalogue.resolve("{vex} vaddpd %ymm0, %ymm1, %ymm2") == "VADDPD_YMM_YMM_YMM"
    assert catalogue.resolve("movq 8(%rsi), %rax") == "MOV_R64_M64"


def test_resolve_evex_pseudo_prefix(catalogue, host):
    """{evex} picks the EVEX form of an instruction; on a host without AVX512VL (Zen 3) the
    same text must still be recognised as that form, and refused with the reason."""
    text = "{evex} vaddpd %ymm0, %ymm1, %ymm2"
    if "avx512vl" in isa.host_flags(host):
        assert catalogue.resolve(text) == "VADDPD_YMM_YMM_YMM_EVEX"
    else:
        with pytest.raises(isa.UnknownInstruction,
                           match=r"form VADDPD_YMM_YMM_YMM_EVEX, excluded here: .*AVX512"):
            catalogue.resolve(text)


@pytest.mark.parametrize("text", ["frobnicate %rax", "jmp *%rax", ".byte 0x90",
                                  "addq %rax, %rbx; ud2", "nop\nnop"])
def test_resolve_rejects(catalogue, text):
    with pytest.raises(isa.UnknownInstruction):
        catalogue.resolve(text)
