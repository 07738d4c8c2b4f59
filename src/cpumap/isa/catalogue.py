"""The instruction catalogue of the host: every x86-64 form, measurable or excluded with a reason.

The catalogue is derived, never typed in: iced-x86 lists every encoding; each 64-bit-mode code is
split into its register and memory variants, analysed (operand access, implicit registers, CPUID
features), filtered (privileged, control flow, unsupported by this CPU, needing special state),
checked against GNU ``as`` (does the AT&T text assemble, and to which encoding) and, optionally,
smoke-run in the harness so that forms that fault in user mode are excluded too.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections import defaultdict, namedtuple
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from elftools.elf.elffile import ELFFile
from iced_x86 import Code, OpCodeInfo

from cpumap.isa import x86
from cpumap.isa.x86 import CODE_NAMES, STRING_REASON, FormError, FormSpec

# iced CPUID feature -> /proc/cpuinfo flag; None: part of every x86-64 CPU.
CPUID_FLAGS: dict[str, str | None] = {
    "INTEL8086": None, "INTEL186": None, "INTEL286": None, "INTEL386": None, "INTEL486": None,
    "X64": None, "CPUID": None, "MULTIBYTENOP": None, "PAUSE": None, "SEP": None,
    "TSC": "tsc", "CMOV": "cmov", "CX8": "cx8", "CMPXCHG16B": "cx16", "MMX": "mmx",
    "SSE": "sse", "SSE2": "sse2", "SSE3": "pni", "SSSE3": "ssse3", "SSE4_1": "sse4_1",
    "SSE4_2": "sse4_2", "SSE4A": "sse4a", "POPCNT": "popcnt", "LZCNT": "abm", "AVX": "avx",
    "AVX2": "avx2", "FMA": "fma", "FMA4": "fma4", "F16C": "f16c", "BMI1": "bmi1", "BMI2": "bmi2",
    "ADX": "adx", "AES": "aes", "PCLMULQDQ": "pclmulqdq", "VAES": "vaes",
    "VPCLMULQDQ": "vpclmulqdq", "GFNI": "gfni", "SHA": "sha_ni", "MOVBE": "movbe",
    "RDRAND": "rdrand", "RDSEED": "rdseed", "RDTSCP": "rdtscp", "RDPID": "rdpid",
    "FSGSBASE": "fsgsbase", "CLFSH": "clflush", "CLFLUSHOPT": "clflushopt", "CLWB": "clwb",
    "CLZERO": "clzero", "PREFETCHW": "3dnowprefetch", "XSAVE": "xsave", "XSAVEOPT": "xsaveopt",
    "XSAVEC": "xsavec", "XSAVES": "xsaves", "FXSR": "fxsr", "AVX512F": "avx512f",
    "AVX512VL": "avx512vl", "AVX512BW": "avx512bw", "AVX512DQ": "avx512dq",
    "AVX512CD": "avx512cd", "AVX512ER": "avx512er", "AVX512PF": "avx512pf",
    "AVX512_IFMA": "avx512ifma", "AVX512_VBMI": "avx512vbmi", "AVX512_VBMI2": "avx512_vbmi2",
    "AVX512_VNNI": "avx512_vnni", "AVX512_BITALG": "avx512_bitalg",
    "AVX512_VPOPCNTDQ": "avx512_vpopcntdq", "AVX512_BF16": "avx512_bf16",
    "AVX512_FP16": "avx512_fp16", "AVX512_VP2INTERSECT": "avx512_vp2intersect",
    "AVX512_4FMAPS": "avx512_4fmaps", "AVX512_4VNNIW": "avx512_4vnniw", "AVX_VNNI": "avx_vnni",
    "AVX_IFMA": "avx_ifma", "AVX_NE_CONVERT": "avx_ne_convert", "AVX_VNNI_INT8": "avx_vnni_int8",
    "AVX_VNNI_INT16": "avx_vnni_int16", "MONITOR": "monitor", "MONITORX": "mwaitx",
    "RDPRU": "rdpru", "TBM": "tbm", "XOP": "xop", "LWP": "lwp", "PKU": "pku",
    "WBNOINVD": "wbnoinvd", "MOVDIRI": "movdiri", "MOVDIR64B": "movdir64b",
    "SERIALIZE": "serialize", "WAITPKG": "waitpkg", "CLDEMOTE": "cldemote", "RTM": "rtm",
    "HLE": "hle", "HLE_OR_RTM": "rtm", "INVPCID": "invpcid", "SMAP": "smap", "SYSCALL": "syscall",
    "D3NOW": "3dnow", "D3NOWEXT": "3dnowext", "MCOMMIT": "mcommit", "PTWRITE": "ptwrite",
    "ENQCMD": "enqcmd", "SHA512": "sha512", "SM3": "sm3", "SM4": "sm4", "CMPCCXADD": "cmpccxadd",
    "RAO_INT": "rao_int", "PREFETCHITI": "prefetchiti", "UINTR": "uintr", "HRESET": "hreset",
    "TSXLDTRK": "tsxldtrk", "KL": "kl", "AESKLE": "aeskle", "WIDE_KL": "widekl",
    "AMX_TILE": "amx_tile", "AMX_INT8": "amx_int8", "AMX_BF16": "amx_bf16", "KNC": "knc",
    "CET_SS": "user_shstk", "CET_IBT": "ibt", "PADLOCK_ACE": "ace", "PADLOCK_RNG": "rng",
    "PADLOCK_PHE": "phe", "PADLOCK_PMM": "pmm", "PADLOCK_GMI": "gmi", "PADLOCK_UNDOC": "padlock",
    "AVX512_VP2INTERSECT_": "avx512_vp2intersect", "FRED": "fred", "LKGS": "lkgs",
    "MSRLIST": "msrlist", "WRMSRNS": "wrmsrns", "AMX_FP16": "amx_fp16",
    "AMX_COMPLEX": "amx_complex", "TSE": "tse", "UMOV": "umov", "CYRIX_D3NOW": "cyrix_3dnow",
}
X87_FEATURES = {"FPU", "FPU287", "FPU387", "FPU287XL_ONLY", "FPU387SL_ONLY"}
BASE_FEATURES = {k for k, v in CPUID_FLAGS.items() if v is None}

# Forms whose effect on process state makes them unsafe to run in a loop, by iced mnemonic.
SPECIAL_STATE = {
    "LDMXCSR": "writes MXCSR control state", "VLDMXCSR": "writes MXCSR control state",
    "WRFSBASE": "writes the FS base (breaks thread-local storage)",
    "WRGSBASE": "writes the GS base", "WRPKRU": "writes protection keys",
}

# With UMIP (CR4.UMIP) these fault in user mode and Linux emulates them: ~2,000 cycles each.
UMIP_EMULATED = {"SLDT", "SIDT", "SGDT", "SMSW", "STR"}

COLUMNS = [
    "name", "code", "mem", "mnemonic", "att_template", "att_example", "operands", "extension",
    "category", "encoding", "cpuid", "implicit", "reads_flags", "writes_flags", "breaks_flags",
    "gas", "status", "reason", "spec",
]


#: Columns of booleans.
BOOL_COLUMNS = ("mem", "reads_flags", "writes_flags", "breaks_flags")


def host_flags(machine: dict) -> set[str]:
    """ISA flags of a machine description (machine.json)."""
    return set(machine.get("isa_flags") or machine.get("flags") or [])


def is_virtual(machine: dict) -> bool:
    virt = machine.get("virtualisation")
    if isinstance(virt, dict):
        return bool(virt.get("virtualised"))
    return bool(machine.get("virtualised", False))


def _extension(features: list[str]) -> str:
    specific = [f for f in features if f not in BASE_FEATURES]
    if not specific:
        return "BASE"
    # iced lists e.g. [AVX512VL, AVX512F]: the first is the most specific.
    return specific[0]


def _category(spec: FormSpec, mnemonic: str) -> str:
    """A coarse family for summaries; heuristic on the mnemonic and operand kinds."""
    m = mnemonic.upper()
    regs = [o for o in spec.operands if o.kind == "reg"]
    vec = any(o.cls == "VEC" for o in regs) or any(o.cls == "MMX" for o in regs)
    mem = [o for o in spec.operands if o.kind == "mem"]
    if m.startswith("K") and any(o.cls == "K" for o in regs):
        return "mask"
    if m in ("MOV", "MOVZX", "MOVSX", "MOVSXD") or (
        m.startswith(("VMOV", "MOV")) and (mem or vec)
    ):
        if mem and mem[0].access == "r":
            return "load"
        if mem and "w" in mem[0].access:
            return "store"
        return "move"
    if mem and mem[0].access == "w" and not any("r" in o.access for o in regs):
        return "store"
    if "FMADD" in m or "FMSUB" in m or "FNMADD" in m or "FNMSUB" in m:
        return "fma"
    if re.search(r"(CVT|PMOVSX|PMOVZX)", m):
        return "convert"
    if re.search(r"(SHUF|PERM|UNPCK|ALIGNR|INSERT|EXTRACT|BLEND|BROADCAST|PALIGNR|MOVDDUP|"
                 r"MOVSHDUP|MOVSLDUP|PACK|EXPAND|COMPRESS)", m):
        return "shuffle"
    if m in ("IMUL", "MUL", "MULX") or (not vec and m.startswith("IMUL")):
        return "int-mul"
    if m in ("DIV", "IDIV"):
        return "int-div"
    if m in ("SHL", "SHR", "SAR", "ROL", "ROR", "RCL", "RCR", "SHLD", "SHRD", "SHLX", "SHRX",
             "SARX", "RORX"):
        return "shift"
    if vec:
        if re.search(r"(ADD|SUB)(P|S)(S|D|H)$", m) or "ADDSUB" in m:
            return "fp-add"
        if re.search(r"MUL(P|S)(S|D|H)$", m):
            return "fp-mul"
        if re.search(r"(DIV|SQRT|RCP|RSQRT)", m):
            return "fp-div"
        if re.search(r"(AES|SHA|CLMUL|GF2P8)", m):
            return "crypto"
        if re.search(r"(PS|PD|SS|SD|PH|SH)$", m):
            return "fp-other"
        return "vec-int"
    return "int-alu"


def _static_rows(flags: set[str], virtual: bool) -> list[dict]:
    """One row per (code, variant) valid in 64-bit mode, with status from iced's tables alone."""
    rows = []
    for code, cname in sorted(CODE_NAMES.items()):
        oc = OpCodeInfo(code)
        if not oc.is_instruction or not oc.mode64 or code == Code.INVALID:
            continue
        base = {"code": cname, "mem": False, "status": "excluded", "reason": "",
                "name": cname, "spec": ""}
        if oc.must_be_cpl0 or not oc.cpl3:
            rows.append(base | {"reason": "privileged (CPL0 only)"})
            continue
        if oc.is_input_output:
            rows.append(base | {"reason": "port I/O"})
            continue
        try:
            variants = x86.describe_operands(code)
        except FormError as exc:
            rows.append(base | {"reason": str(exc)})
            continue
        for ops in variants:
            mem = any(o[0] == "mem" for o in ops)
            row = base | {"mem": mem, "name": cname + ("_MEM" if mem and len(variants) > 1
                                                        else "")}
            try:
                spec = x86.analyse(code, mem, ops)
                encoded = x86.encode(spec.extras["instr"])
            except FormError as exc:
                rows.append(row | {"reason": str(exc)})
                continue
            ex = spec.extras
            row |= {
                "name": spec.base_name, "spec": spec.to_json(), "mnemonic": ex["mnemonic"],
                "encoding": spec.encoding, "cpuid": ",".join(ex["cpuid"]),
                "extension": _extension(ex["cpuid"]), "category": _category(spec, ex["mnemonic"]),
                "operands": json.dumps([o.__dict__ for o in spec.operands]),
                "implicit": json.dumps(spec.implicit), "reads_flags": spec.reads_flags,
                "writes_flags": spec.writes_flags, "breaks_flags": ex["breaks_flags"],
                "att_example": x86.att(ex["instr"]),
                "att_template": x86.att_template(ex["instr"], spec),
                "_bytes": encoded,
            }
            row["reason"] = _exclusion(spec, oc, flags, virtual)
            row["status"] = "excluded" if row["reason"] else "ok"
            rows.append(row)
    return rows


#: Stack forms the generator measures: pushes and pops move RSP by a fixed amount, so a
#: kernel's loop body is balanced by one ``lea`` before and one after it (asmgen.stack_frame),
#: the same in f1 and f2, so that the n/2n difference leaves them out. Zen's stack engine
#: tracks RSP in the front end: consecutive pushes do not wait for each other.
STACK_MEASURED = frozenset({"PUSH", "POP", "PUSHF", "PUSHFQ"})
#: Why the other stack forms are not measured.
STACK_EXCLUDED = {
    "POPF": "writes RFLAGS from the stack (trap and direction flags)",
    "POPFQ": "writes RFLAGS from the stack (trap and direction flags)",
    "LEAVE": "sets RSP from RBP (each LEAVE's stack pointer is the previous one's pop)",
    "ENTER": "builds a stack frame from RBP (a chain through RBP and RSP)",
}


#: Why control-flow forms are excluded (the reason starts with it, then the kind of flow).
CONTROL_FLOW = "control flow"
#: Bit tests on memory with the bit offset in a register address the bit string, not the
#: operand: ``btc %ax, (%rbx)`` touches (%rbx) + 2 * (AX >> 4), anywhere within +-4 KiB (r16),
#: +-256 MiB (r32) or the whole address space (r64) of the operand. With the generator's
#: register values the r32/r64 forms fault, and the r16 forms wrote into the harness's own
#: memory once another form moved the offset register (``ADD_AL_I8*5 BTC_M16_R16`` on a
#: Sapphire Rapids-class guest: tick counts of 0xaaaaaaaa........).
BIT_STRING = frozenset({"BT", "BTC", "BTR", "BTS"})
BIT_STRING_REASON = ("bit-string addressing: the register bit offset reaches memory outside "
                     "the operand")


def _exclusion(spec: FormSpec, oc: OpCodeInfo, flags: set[str], virtual: bool) -> str:
    ex = spec.extras
    if ex["flow"] != "NEXT":
        return f"{CONTROL_FLOW} ({ex['flow'].lower()})"
    stack_ok = ex["stack"] and ex["mnemonic"] in STACK_MEASURED
    if ex["stack"] and not stack_ok:
        return STACK_EXCLUDED.get(ex["mnemonic"], "modifies the stack pointer")
    if ex["string"]:
        return STRING_REASON
    if ex["implicit_mem"] and not stack_ok:
        return "implicit memory operand"
    feats = ex["cpuid"]
    if X87_FEATURES & set(feats):
        return "x87 register stack"
    for f in feats:
        if f not in CPUID_FLAGS:
            return f"CPUID feature {f} unknown to cpumap"
        flag = CPUID_FLAGS[f]
        if flag is not None and flag not in flags:
            return f"CPU lacks {f}"
    if oc.is_save_restore:
        return "saves/restores processor state"
    if oc.require_op_mask_register:
        return "needs a non-zero opmask"
    if virtual and oc.intel_vm_exit:
        return "causes a VM exit under a hypervisor"
    if "umip" in flags and ex["mnemonic"] in UMIP_EMULATED:
        return "UMIP: trapped and emulated by the OS kernel (would measure the trap handler)"
    if ex["mnemonic"] in SPECIAL_STATE:
        return SPECIAL_STATE[ex["mnemonic"]]
    if ex["mnemonic"] in BIT_STRING and [o.kind for o in spec.operands] == ["mem", "reg"]:
        return BIT_STRING_REASON
    return ""


def _text_section(obj: Path) -> bytes:
    with open(obj, "rb") as fh:
        return ELFFile(fh).get_section_by_name(".text").data()


def gas_check(rows: list[dict], workdir: Path) -> None:
    """Assemble every candidate's AT&T text with GNU as and record which code it became.

    ``gas`` is ``same`` when as picks the intended encoding, ``other:<CODE>`` when it picks
    another one (the generator emits iced's bytes, so the form stays measurable), or
    ``rejected: <message>`` when as does not accept the text.
    """
    cand = [r for r in rows if r.get("att_example")]
    pending = list(range(len(cand)))
    src = workdir / "gas_check.s"
    obj = workdir / "gas_check.o"
    # One instruction per 16-byte slot, padded with int3: slot k holds candidate pending[k],
    # whatever the instruction is (no separator instruction can be confused with a form).
    for _attempt in range(20):
        lines = [".text"]
        for i in pending:
            lines.append(".balign 16, 0xcc")
            lines.append(cand[i]["att_example"])
        src.write_text("\n".join(lines) + "\n")
        proc = subprocess.run(["as", "--64", "-o", str(obj), str(src)],
                              capture_output=True, text=True)
        if proc.returncode == 0:
            break
        bad: dict[int, str] = {}
        for m in re.finditer(r":(\d+): Error: (.*)", proc.stderr):
            lineno = int(m.group(1))  # line 1 is .text; then pairs (.balign, instruction)
            k = (lineno - 3) // 2
            if 0 <= k < len(pending) and (lineno - 3) % 2 == 0:
                bad.setdefault(pending[k], m.group(2).strip())
        if not bad:
            raise RuntimeError(f"GNU as failed without line errors: {proc.stderr[:500]}")
        for i, msg in bad.items():
            cand[i]["gas"] = f"rejected: {msg}"
        pending = [i for i in pending if i not in bad]
    else:
        raise RuntimeError("GNU as check did not converge")
    text = _text_section(obj)
    for k, i in enumerate(pending):
        row = cand[i]
        slot = x86.decode_all(text[16 * k: 16 * k + 16])
        real = [ins for ins in slot if x86.CODE_NAMES[ins.code] not in ("INT3", "INVALID")]
        if not slot or len(real) != 1 or slot[0] is not real[0]:
            row["gas"] = f"other: {len(real)} instructions"
            continue
        code, mem = x86.form_key(real[0])
        row["gas"] = "same" if (code, mem) == (row["code"], row["mem"]) else f"other:{code}"


def _assign_names(rows: list[dict]) -> None:
    """Make form names unique: the encoding GNU as picks keeps the plain name.

    Other encodings of the same mnemonic and operand kinds get ``_EVEX``/``_VEX`` or, for
    alternative legacy opcodes, ``_OP<hex opcode>``.
    """
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["spec"]:
            groups[r["name"]].append(r)
    taken = {r["name"] for r in rows if not r["spec"]}
    for base, grp in sorted(groups.items()):
        if len(grp) == 1:
            taken.add(base)
            continue
        grp.sort(key=lambda r: (r.get("gas") != "same", r["status"] != "ok", r["code"]))
        encodings = {r["encoding"] for r in grp}
        for i, r in enumerate(grp):
            if i == 0:
                name = base
            else:
                name = base
                if len(encodings) > 1 and r["encoding"] != grp[0]["encoding"]:
                    name = f"{base}_{r['encoding']}"
                if name in taken:
                    op = OpCodeInfo(x86.CODE_BY_NAME[r["code"]]).op_code
                    name = f"{name}_OP{op:02X}"
                k = 2
                while name in taken:
                    name = f"{base}_{k}"
                    k += 1
            r["name"] = name
            taken.add(name)


#: Runs forms once on this CPU and names those that fail: ``(forms, machine, workdir, progress)
#: -> {name: reason}``. The catalogue does not import the measuring code (it sits above this
#: package); the caller passes :class:`cpumap.measure.smoke.SmokeRun`.
SmokeRunner = Callable[[list[tuple[str, FormSpec]], dict, Path, Callable[[str], None]],
                       dict[str, str]]


def build_catalogue(
    machine: dict,
    workdir: Path,
    *,
    smoke_run: bool = True,
    runner: SmokeRunner | None = None,
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Build the host's catalogue; see the module docstring for the steps."""
    say = progress or (lambda _m: None)
    flags = host_flags(machine)
    virtual = is_virtual(machine)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    rows = _static_rows(flags, virtual)
    say(f"catalogue: {len(rows)} forms from iced, {sum(r['status'] == 'ok' for r in rows)} ok")
    gas_check(rows, workdir)
    _assign_names(rows)
    for r in rows:
        enc = r.pop("_bytes", None)
        if r["status"] == "ok" and enc is not None:
            dec = x86.decode_all(enc)
            if len(dec) != 1 or x86.form_key(dec[0]) != (r["code"], r["mem"]):
                r["status"], r["reason"] = "excluded", "iced encoding does not decode back"
    if smoke_run:
        if runner is None:
            raise ValueError("smoke_run needs a runner (cpumap.measure.smoke.SmokeRun)")
        failures = runner(
            [(r["name"], FormSpec.from_json(r["spec"])) for r in rows if r["status"] == "ok"],
            machine, workdir, say)
        for r in rows:
            if r["name"] in failures:
                r["status"], r["reason"] = "excluded", f"faults when run: {failures[r['name']]}"
    df = pd.DataFrame(rows)
    for c in COLUMNS:
        if c not in df:
            df[c] = ""
    df = df[COLUMNS].fillna("")
    for c in BOOL_COLUMNS:
        df[c] = df[c].astype(bool)
    n_ok = int((df.status == "ok").sum())
    say(f"catalogue: {n_ok} ok, {len(df) - n_ok} excluded")
    return df.sort_values("name", kind="stable").reset_index(drop=True)


class UnknownInstruction(ValueError):
    """An instruction the catalogue does not have, or has only as excluded."""


class Catalogue:
    """Loaded catalogue with look-ups by form name and by AT&T text."""

    def __init__(self, df: pd.DataFrame):
        self.df = df
        # the rows as named tuples of plain values, made column by column: itertuples over
        # Arrow-backed string columns (pandas 3) took 0.7 s of every `cpumap` command
        row = namedtuple("Form", df.columns, rename=True)  # type: ignore[misc]
        rows = [row(*values) for values in zip(*(df[c].tolist() for c in df.columns),
                                                strict=True)]
        self.by_name = {r.name: r for r in rows}
        self.by_upper = {n.upper(): n for n in self.by_name}
        self.by_key = {(r.code, bool(r.mem)): r.name for r in rows if r.spec}
        # forms excluded before an operand spec was made (x87's register stack, gathers,
        # privileged forms...) are still named, so that a decoded instruction says why it is
        # left out instead of "not in the catalogue" (and the model analyzer predicts its
        # block from the rest, flagged); a form with a spec keeps its key. Control flow and
        # string forms stay unnamed: blocks end at the one, and a block's `rep movs`/`rep stos`
        # is measured as a whole (evaluate.blocks)
        for r in rows:
            if not r.spec and r.status != "ok" and r.reason != STRING_REASON \
                    and not r.reason.startswith(CONTROL_FLOW):
                self.by_key.setdefault((r.code, bool(r.mem)), r.name)
        self._specs: dict[str, FormSpec] = {}

    @classmethod
    def load(cls, path: Path) -> Catalogue:
        from cpumap.store.files import read_parquet_checked

        return cls(read_parquet_checked(Path(path)))

    def spec(self, name: str) -> FormSpec:
        if name not in self._specs:
            self._specs[name] = FormSpec.from_json(self.by_name[name].spec)
        return self._specs[name]

    def ok(self, name: str) -> bool:
        return self.by_name[name].status == "ok"

    def resolve(self, text: str) -> str:
        """Form name for a form name or an AT&T instruction; raises UnknownInstruction."""
        t = text.strip()
        if t.upper() in self.by_upper:
            name = self.by_upper[t.upper()]
        else:
            name = self._resolve_att(t)
        row = self.by_name[name]
        if row.status != "ok":
            raise UnknownInstruction(f"{text!r} is form {name}, excluded here: {row.reason}")
        return name

    def _resolve_att(self, text: str) -> str:
        if not re.fullmatch(r"[{}A-Za-z0-9_%$(),.\s:*+-]+", text) or "\n" in text or \
                text.lstrip().startswith("."):
            raise UnknownInstruction(f"{text!r} is not an instruction form name or AT&T "
                                     "instruction")
        with tempfile.TemporaryDirectory(prefix="cpumap-att-") as d:
            src, obj = Path(d) / "x.s", Path(d) / "x.o"
            src.write_text(f".text\n{text}\n")
            proc = subprocess.run(["as", "--64", "-o", str(obj), str(src)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                msg = re.sub(r"^.*?Error: ", "", proc.stderr.strip().splitlines()[-1])
                raise UnknownInstruction(f"{text!r} is not a known instruction: {msg}")
            decoded = x86.decode_all(_text_section(obj))
        if len(decoded) != 1:
            raise UnknownInstruction(f"{text!r} is {len(decoded)} instructions, not one")
        ins = decoded[0]
        if ins.op_mask or ins.is_broadcast or ins.memory_index != 0:
            raise UnknownInstruction(f"{text!r}: masking, broadcast and indexed addressing are "
                                     "not separate forms in the catalogue")
        key = x86.form_key(ins)
        if key not in self.by_key:
            raise UnknownInstruction(f"{text!r} ({key[0]}) is not in the catalogue")
        return self.by_key[key]
