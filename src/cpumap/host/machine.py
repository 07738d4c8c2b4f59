"""Describe the host CPU and give it a stable machine id.

Results are partitioned by machine id (``results/<machine_id>/``), so the id must
name the *kind* of machine, not the host: two identical nodes must share an id
(their measurements can be merged), and two VMs that expose different
instruction sets must not (their catalogues differ). The id is therefore made
of the vendor, the microarchitecture that the CPUID family/model fields name,
the raw family/model in hex, and a short hash of the ISA flag set::

    amd-zen4-f19-m11-1a2b3c4d

Under a hypervisor the family/model fields are whatever the hypervisor chooses
to expose (this project's reference KVM guest reports family 0x19 model 0x11, a
Zen 4 signature, on a Zen 5 host). We do not guess beyond that evidence: the id
uses what CPUID says, and ``describe()`` records the raw CPUID leaves, the
hypervisor, and a caveat, so that a reader can tell.

Everything here is best effort: a probe that fails records ``None`` and the
reason, and never stops the pipeline.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import platform
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from cpumap import __version__

__all__ = [
    "REQUIRED_KEYS",
    "cache_info",
    "counters_info",
    "cpuid",
    "cpuid_snapshot",
    "decode_signature",
    "describe",
    "identity",
    "isa_hash",
    "machine_id",
    "parse_cpuinfo",
    "simulated_machine_id",
    "tsc_info",
    "uarch_name",
    "virtualisation_info",
    "write_machine_json",
]

SCHEMA_VERSION = 1

#: Top-level keys that every machine.json carries.
REQUIRED_KEYS: tuple[str, ...] = (
    "schema_version",
    "cpumap_version",
    "machine_id",
    "host",
    "vendor",
    "vendor_id",
    "family",
    "model",
    "stepping",
    "microcode",
    "model_name",
    "uarch",
    "cpuid",
    "isa_flags",
    "isa_hash",
    "caches",
    "cores",
    "virtualisation",
    "counters",
    "tsc",
    "os",
    "kernel",
    "toolchain",
)

_PROC_CPUINFO = Path("/proc/cpuinfo")
_SYS_CPU = Path("/sys/devices/system/cpu")

_VENDORS = {
    "AuthenticAMD": "amd",
    "GenuineIntel": "intel",
    "HygonGenuine": "hygon",
    "CentaurHauls": "centaur",
    "  Shanghai  ": "zhaoxin",
}

_HYPERVISOR_SIGNATURES = {
    "KVMKVMKVM": "KVM",
    "Microsoft Hv": "Microsoft Hyper-V",
    "VMwareVMware": "VMware",
    "XenVMMXenVMM": "Xen",
    "TCGTCGTCGTCG": "QEMU TCG",
    "VBoxVBoxVBox": "VirtualBox",
    "bhyve bhyve": "bhyve",
    "ACRNACRNACRN": "ACRN",
    " lrpepyh  vr": "Parallels",
    "QNXQVMBSQG": "QNX",
}

# Flags that /proc/cpuinfo shows but that are not instruction-set features:
# Linux-synthesised words (behaviour the kernel detected or decided), power and
# thermal management, virtualisation-control features and mitigations. They are
# left out of the ISA hash so that a kernel upgrade or a different mitigation
# setting does not change the machine id. They are still listed in machine.json.
_NON_ISA_FLAGS = frozenset(
    """
    cxmmx k6_mtrr cyrix_arr centaur_mcr constant_tsc up art arch_perfmon pebs bts
    rep_good acc_power nopl xtopology tsc_reliable nonstop_tsc cpuid extd_apicid amd_dcm
    aperfmperf rapl nonstop_tsc_s3 tsc_known_freq ring3mwait cpuid_fault cpb epb cat_l3
    cat_l2 cdp_l3 invpcid_single hw_pstate proc_feedback sme pti kernel_ibrs intel_ppin
    cdp_l2 ssbd mba sev ibrs ibpb stibp zen l1tf_pteinv ibrs_enhanced amd_lbr_v2
    tpr_shadow vnmi flexpriority ept vpid ept_ad vmcall xenpv pvunlock user_shstk
    flush_l1d retpoline retpoline_amd rsb_ctxsw use_ibpb use_ibrs_fw spec_store_bypass_disable
    ls_cfg_ssbd virt_ssbd mds_clear_cpu_buf msr_spec_ctrl amd_ssbd amd_ibrs amd_ibpb
    amd_stibp amd_stibp_always_on amd_ppin amd_psfd ibpb_brtype sbpb ibrs_enh
    dtherm ida arat pln pts hwp hwp_notify hwp_act_window hwp_epp hwp_pkg_req hfi
    pfthreshold avic v_vmsave_vmload vgif v_spec_ctrl vmcb_clean flushbyasid decodeassists
    pausefilter npt lbrv svm_lock nrip_save tsc_scale x2avic tce perfctr_core perfctr_nb
    perfctr_llc perfctr_l2 bpext cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local
    pdcm xtpr tm tm2 est ds_cpl dtes64 acpi ht pbe ss tsc_adjust
    tsc_deadline_timer x2apic apic osvw wdt topoext nodeid_msr ibs
    overflow_recov succor smca sev_es sme_coherent debug_swap
    """.split()
)


# --------------------------------------------------------------------------- helpers


def _run(args: list[str], timeout: float = 30.0) -> tuple[int | None, str, str | None]:
    """Run a command; returns (returncode, stdout+stderr text, error). Never raises."""
    if shutil.which(args[0]) is None:
        return None, "", f"{args[0]} not found on PATH"
    try:
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, "", f"{type(exc).__name__}: {exc}"
    return proc.returncode, (proc.stdout or "") + (proc.stderr or ""), None


def _first_line(text: str) -> str | None:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _to_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value.strip(), 0)
    except ValueError:
        return None


# --------------------------------------------------------------------------- /proc/cpuinfo


def parse_cpuinfo(text: str | None = None) -> dict[str, Any]:
    """Parse /proc/cpuinfo (or ``text``): the first processor's fields plus topology counts.

    Returns a dict with ``fields`` (first block, raw strings), ``n_processors``,
    ``n_sockets`` and ``n_cores`` (unique physical id/core id pairs).
    """
    if text is None:
        text = _read_text(_PROC_CPUINFO) or ""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current[key.strip()] = value.strip()
    if current:
        blocks.append(current)
    procs = [b for b in blocks if "processor" in b]
    first = procs[0] if procs else (blocks[0] if blocks else {})
    sockets = {b.get("physical id") for b in procs if "physical id" in b}
    cores = {(b.get("physical id"), b.get("core id")) for b in procs if "core id" in b}
    return {
        "fields": first,
        "n_processors": len(procs),
        "n_sockets": len(sockets) or None,
        "n_cores": len(cores) or None,
    }


def identity(cpuinfo_text: str | None = None) -> dict[str, Any]:
    """The few fields the machine id is made of, read cheaply from /proc/cpuinfo.

    Used by the Snakefile at parse time, where running compilers or PAPI would
    slow down every invocation.
    """
    info = parse_cpuinfo(cpuinfo_text)
    f = info["fields"]
    vendor_id = f.get("vendor_id", "unknown")
    return {
        "vendor_id": vendor_id,
        "vendor": _vendor_short(vendor_id),
        "family": _to_int(f.get("cpu family")),
        "model": _to_int(f.get("model")),
        "stepping": _to_int(f.get("stepping")),
        "model_name": f.get("model name"),
        "isa_flags": sorted(set(f.get("flags", "").split())),
    }


def _vendor_short(vendor_id: str) -> str:
    if vendor_id in _VENDORS:
        return _VENDORS[vendor_id]
    short = re.sub(r"[^a-z0-9]+", "", vendor_id.lower())
    return short or "unknown"


# --------------------------------------------------------------------------- CPUID


class _NativeCode:
    """Tiny machine-code helpers (cpuid, rdtsc) run through ctypes from an executable page.

    This avoids compiling a helper program just to read CPUID. The bytes were
    assembled and checked with iced-x86; both functions follow the SysV ABI
    (rbx is callee-saved and cpuid clobbers it, hence the push/pop).
    """

    # void cpuid(uint32_t leaf, uint32_t subleaf, uint32_t out[4])
    #   push %rbx; mov %rdx,%r8; mov %edi,%eax; mov %esi,%ecx; cpuid;
    #   mov %eax,(%r8); mov %ebx,4(%r8); mov %ecx,8(%r8); mov %edx,12(%r8); pop %rbx; ret
    CPUID = bytes.fromhex("53 4989d0 89f8 89f1 0fa2 418900 41895804 41894808 4189500c 5b c3")
    # uint64_t rdtsc(void): rdtsc; shl $32,%rdx; or %rdx,%rax; ret
    RDTSC = bytes.fromhex("0f31 48c1e220 4809d0 c3")

    _instance: _NativeCode | None = None
    _error: str | None = None

    def __init__(self) -> None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise OSError(f"not an x86-64 host ({platform.machine()})")
        prot = mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
        self._buf = mmap.mmap(-1, mmap.PAGESIZE, prot=prot)
        self._buf.write(self.CPUID)
        self._buf.seek(64)
        self._buf.write(self.RDTSC)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self._buf))
        out_t = ctypes.POINTER(ctypes.c_uint32 * 4)
        self._cpuid = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, out_t)(base)
        self._rdtsc = ctypes.CFUNCTYPE(ctypes.c_uint64)(base + 64)

    @classmethod
    def get(cls) -> _NativeCode | None:
        if cls._instance is None and cls._error is None:
            try:
                cls._instance = cls()
            except (OSError, ValueError, TypeError) as exc:  # e.g. W^X policy forbids PROT_EXEC
                cls._error = f"{type(exc).__name__}: {exc}"
        return cls._instance

    def cpuid(self, leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
        out = (ctypes.c_uint32 * 4)()
        self._cpuid(leaf, subleaf, ctypes.byref(out))
        return (out[0], out[1], out[2], out[3])

    def rdtsc(self) -> int:
        return int(self._rdtsc())


def cpuid(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int] | None:
    """Execute CPUID(leaf, subleaf) in this process; ``None`` when it cannot be run here."""
    native = _NativeCode.get()
    return None if native is None else native.cpuid(leaf, subleaf)


def decode_signature(eax: int) -> tuple[int, int, int]:
    """(family, model, stepping) from CPUID leaf 1 EAX, with the extended fields applied."""
    stepping = eax & 0xF
    base_model = (eax >> 4) & 0xF
    base_family = (eax >> 8) & 0xF
    ext_model = (eax >> 16) & 0xF
    ext_family = (eax >> 20) & 0xFF
    family = base_family + ext_family if base_family == 0xF else base_family
    model = (ext_model << 4) | base_model if base_family in (0x6, 0xF) else base_model
    return family, model, stepping


def _regs_str(regs: tuple[int, int, int, int]) -> str:
    return struct.pack("<4I", *regs).decode("latin-1")


def cpuid_snapshot() -> dict[str, Any]:
    """Raw CPUID leaves that identify the CPU and its features, as hex strings.

    Leaf 1 EBX bits 31..24 (the initial APIC id of whichever CPU ran the query)
    are masked, so that the snapshot does not depend on where it ran.
    """
    native = _NativeCode.get()
    if native is None:
        return {"available": False, "method": None, "error": _NativeCode._error, "leaves": {}}
    leaves: dict[str, list[str]] = {}

    def grab(leaf: int, sub: int = 0) -> tuple[int, int, int, int]:
        regs = native.cpuid(leaf, sub)
        if leaf == 1:
            regs = (regs[0], regs[1] & 0x00FFFFFF, regs[2], regs[3])
        leaves[f"0x{leaf:08x}.{sub}"] = [f"0x{r:08x}" for r in regs]
        return regs

    max_basic, b, c, d = grab(0)
    vendor = struct.pack("<3I", b, d, c).decode("latin-1")
    sig = grab(1)
    family, model, stepping = decode_signature(sig[0])
    if max_basic >= 7:
        grab(7, 0)
        grab(7, 1)
    if max_basic >= 0xD:
        grab(0xD, 1)
    tsc_leaf = grab(0x15) if max_basic >= 0x15 else None
    max_ext = grab(0x80000000)[0]
    brand = None
    if max_ext >= 0x80000001:
        grab(0x80000001)
    if max_ext >= 0x80000004:
        brand = "".join(_regs_str(grab(leaf)) for leaf in (0x80000002, 0x80000003, 0x80000004))
        brand = brand.replace("\x00", "").strip()
    if max_ext >= 0x80000008:
        grab(0x80000008)
    hv_vendor = None
    hv_timing = None
    if (sig[2] >> 31) & 1:  # hypervisor-present bit: leaves 0x4000_00xx are meaningful
        hv_max, hb, hc, hd = grab(0x40000000)
        hv_vendor = _regs_str((hb, hc, hd, 0)).replace("\x00", "")
        if 0x40000010 <= hv_max < 0x40010000:
            hv_timing = grab(0x40000010)
    return {
        "available": True,
        "method": "cpuid instruction executed via ctypes from an anonymous executable page",
        "error": None,
        "vendor_id": vendor,
        "family": family,
        "model": model,
        "stepping": stepping,
        "signature_eax": f"0x{sig[0]:08x}",
        "brand": brand,
        "hypervisor_signature": hv_vendor,
        "tsc_leaf_0x15": None if tsc_leaf is None else list(tsc_leaf[:3]),
        "hypervisor_timing_leaf": None if hv_timing is None else list(hv_timing[:2]),
        "leaves": leaves,
    }


# --------------------------------------------------------------------------- microarchitecture

# AMD ranges follow the kernel's Zen generation detection (arch/x86/kernel/cpu/amd.c).
_AMD_UARCH: dict[int, list[tuple[int, int, str]]] = {
    0x17: [
        (0x00, 0x07, "zen"),
        (0x08, 0x0F, "zen+"),
        (0x10, 0x17, "zen"),
        (0x18, 0x1F, "zen+"),
        (0x20, 0x2F, "zen"),
        (0x30, 0x4F, "zen2"),
        (0x50, 0x5F, "zen"),
        (0x60, 0x7F, "zen2"),
        (0x90, 0x91, "zen2"),
        (0xA0, 0xAF, "zen2"),
    ],
    0x19: [
        (0x00, 0x0F, "zen3"),
        (0x10, 0x1F, "zen4"),
        (0x20, 0x5F, "zen3"),
        (0x60, 0xAF, "zen4"),
    ],
    0x1A: [
        (0x00, 0x2F, "zen5"),
        (0x40, 0x4F, "zen5"),
        (0x60, 0x7F, "zen5"),
    ],
}

# Intel family 6 model numbers (Intel SDM vol. 4 and the kernel's intel-family.h).
_INTEL_FAM6: dict[int, str] = {
    0x4E: "skylake",
    0x5E: "skylake",
    0x55: "skylake-x",  # refined by stepping below (Cascade Lake, Cooper Lake)
    0x8E: "kabylake",
    0x9E: "kabylake",  # Kaby/Coffee/Whiskey Lake share the Skylake core
    0xA5: "cometlake",
    0xA6: "cometlake",
    0x66: "cannonlake",
    0x7D: "icelake",
    0x7E: "icelake",
    0x6A: "icelake-x",
    0x6C: "icelake-d",
    0x8C: "tigerlake",
    0x8D: "tigerlake",
    0xA7: "rocketlake",
    0x97: "alderlake",
    0x9A: "alderlake",
    0xB7: "raptorlake",
    0xBA: "raptorlake",
    0xBF: "raptorlake",
    0x8F: "sapphirerapids",
    0xCF: "emeraldrapids",
    0xAA: "meteorlake",
    0xAC: "meteorlake",
}


def uarch_name(
    vendor: str, family: int | None, model: int | None, stepping: int | None = None
) -> str | None:
    """Microarchitecture named by a (vendor, family, model) signature, or None if unknown."""
    if family is None or model is None:
        return None
    if vendor in ("amd", "hygon"):
        for lo, hi, name in _AMD_UARCH.get(family, []):
            if lo <= model <= hi:
                return name if vendor == "amd" else f"dhyana-{name}"
        return None
    if vendor == "intel" and family == 6:
        name = _INTEL_FAM6.get(model)
        if model == 0x55 and stepping is not None:
            if stepping >= 10:
                return "cooperlake"
            if stepping >= 5:
                return "cascadelake"
        return name
    return None


def isa_hash(flags: list[str] | set[str]) -> str:
    """Short hash of the instruction-set flags (non-ISA kernel flags left out)."""
    isa = sorted(set(flags) - _NON_ISA_FLAGS)
    return hashlib.sha256("\n".join(isa).encode()).hexdigest()[:8]


def machine_id(desc: dict[str, Any] | None = None) -> str:
    """Stable id of the machine *kind* described by ``desc`` (``identity()`` by default).

    Depends only on the vendor, CPUID family/model/stepping and the ISA flags:
    never on the host name, the kernel's synthetic flags, or the time.
    """
    if desc is None:
        desc = identity()
    vendor = desc.get("vendor") or _vendor_short(desc.get("vendor_id", "unknown"))
    family, model = desc.get("family"), desc.get("model")
    digest = isa_hash(desc.get("isa_flags", []))
    name = uarch_name(vendor, family, model, desc.get("stepping"))
    if name is not None and family is not None and model is not None:
        return f"{vendor}-{name.replace('+', 'p')}-f{family:x}-m{model:x}-{digest}"
    fam = "x" if family is None else str(family)
    mod = "x" if model is None else str(model)
    return f"{vendor}-fam{fam}-mod{mod}-{digest}"


def simulated_machine_id(mapping: str | Path | None, noise: float = 0.0, seed: int = 0) -> str:
    """Machine id of the simulated backend: named after the mapping file and its content.

    Changing the mapping content, the noise or the seed gives a different id, so
    simulated results never mix with each other or with native ones.
    """
    h = hashlib.sha256()
    stem = "none"
    if mapping is not None:
        p = Path(mapping)
        stem = re.sub(r"[^A-Za-z0-9]+", "-", p.stem).strip("-").lower() or "mapping"
        h.update(p.read_bytes())
    h.update(json.dumps({"noise": float(noise), "seed": int(seed)}, sort_keys=True).encode())
    return f"sim-{stem}-{h.hexdigest()[:8]}"


# --------------------------------------------------------------------------- caches, cores


def cache_info(root: Path | None = None) -> list[dict[str, Any]]:
    """Caches of cpu0 from sysfs: level, type, size in bytes, line size, ways, sharing CPUs."""
    root = root or _SYS_CPU / "cpu0" / "cache"
    out: list[dict[str, Any]] = []
    for idx in sorted(root.glob("index*"), key=lambda p: int(p.name[5:] or 0)):
        size_text = _read_text(idx / "size")
        size = None
        if size_text:
            m = re.fullmatch(r"(\d+)\s*([KMG]?)", size_text)
            if m:
                size = (
                    int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]
                )
        shared = _read_text(idx / "shared_cpu_list")
        out.append(
            {
                "index": idx.name,
                "level": _to_int(_read_text(idx / "level")),
                "type": _read_text(idx / "type"),
                "size_bytes": size,
                "size_text": size_text,
                "line_bytes": _to_int(_read_text(idx / "coherency_line_size")),
                "ways": _to_int(_read_text(idx / "ways_of_associativity")),
                "sets": _to_int(_read_text(idx / "number_of_sets")),
                "shared_cpu_list": shared,
                "shared_cpus": _count_cpu_list(shared),
            }
        )
    return out


def _count_cpu_list(text: str | None) -> int | None:
    if not text:
        return None
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            n += (int(hi) - int(lo) + 1) if hi else 1
        except ValueError:
            return None
    return n


def _cores(info: dict[str, Any]) -> dict[str, Any]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "logical_cpus": info["n_processors"] or os.cpu_count(),
        "physical_cores": info["n_cores"],
        "sockets": info["n_sockets"],
        "cpus_in_affinity": affinity,
    }


# --------------------------------------------------------------------------- virtualisation


def _lscpu() -> dict[str, str]:
    rc, out, _ = _run(["lscpu"])
    if rc != 0:
        return {}
    fields: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def virtualisation_info(
    flags: list[str], cpuid_snap: dict[str, Any], lscpu: dict[str, str]
) -> dict[str, Any]:
    """Whether we run under a hypervisor, which one, and the evidence for it."""
    evidence: list[str] = []
    vendor = None
    virtualised = "hypervisor" in flags
    if virtualised:
        evidence.append("/proc/cpuinfo flags include 'hypervisor' (CPUID.1:ECX[31])")
    sig = cpuid_snap.get("hypervisor_signature")
    if sig:
        vendor = _HYPERVISOR_SIGNATURES.get(sig.strip(), sig.strip())
        evidence.append(f"CPUID 0x40000000 signature {sig!r}")
    if lscpu.get("Hypervisor vendor"):
        vendor = vendor or lscpu["Hypervisor vendor"]
        evidence.append(f"lscpu Hypervisor vendor: {lscpu['Hypervisor vendor']}")
    hv_type = _read_text(Path("/sys/hypervisor/type"))
    if hv_type:
        vendor = vendor or hv_type
        evidence.append(f"/sys/hypervisor/type: {hv_type}")
    for name in ("sys_vendor", "product_name"):
        dmi = _read_text(Path("/sys/class/dmi/id") / name)
        if dmi:
            evidence.append(f"dmi {name}: {dmi}")
    return {
        "virtualised": virtualised or vendor is not None,
        "hypervisor_vendor": vendor,
        "virtualisation_type": lscpu.get("Virtualization type"),
        "evidence": evidence,
    }


# --------------------------------------------------------------------------- counters


def counters_info() -> dict[str, Any]:
    """Can the harness count cycles and instructions here? PAPI presets and perf settings.

    The decisive evidence is whether PAPI lists PAPI_TOT_CYC and PAPI_TOT_INS as
    available: a KVM guest without a virtual PMU reports hardware counters in
    its header but 0 available preset events.
    """
    paranoid = _to_int(_read_text(Path("/proc/sys/kernel/perf_event_paranoid")))
    result: dict[str, Any] = {
        "available": False,
        "papi_avail": shutil.which("papi_avail"),
        "papi_available_presets": None,
        "papi_hw_counters": None,
        "papi_tot_cyc": False,
        "papi_tot_ins": False,
        "perf_event_paranoid": paranoid,
        "evidence": "",
    }
    parts: list[str] = []
    rc, out, err = _run(["papi_avail", "-a"], timeout=60)
    if err is not None:
        parts.append(f"papi_avail not run: {err}")
    else:
        m = re.search(r"Of\s+(\d+)\s+available events", out)
        presets = int(m.group(1)) if m else None
        if presets is None:
            presets = len(re.findall(r"^\s*PAPI_\w+\s+0x[0-9a-f]+", out, re.M | re.I))
        hw = re.search(r"Number Hardware Counters\s*:\s*(\d+)", out)
        result["papi_available_presets"] = presets
        result["papi_hw_counters"] = int(hw.group(1)) if hw else None
        result["papi_tot_cyc"] = re.search(r"^\s*PAPI_TOT_CYC\s", out, re.M) is not None
        result["papi_tot_ins"] = re.search(r"^\s*PAPI_TOT_INS\s", out, re.M) is not None
        parts.append(
            f"papi_avail -a (exit {rc}): {presets} available preset events, "
            f"PAPI_TOT_CYC {'listed' if result['papi_tot_cyc'] else 'absent'}, "
            f"PAPI_TOT_INS {'listed' if result['papi_tot_ins'] else 'absent'}, "
            f"header reports {result['papi_hw_counters']} hardware counters"
        )
    parts.append(f"perf_event_paranoid={paranoid}")
    if paranoid is not None and paranoid > 2:
        parts.append("(>2: unprivileged perf events disabled)")
    result["available"] = bool(result["papi_tot_cyc"] and result["papi_tot_ins"])
    result["evidence"] = "; ".join(parts)
    return result


# --------------------------------------------------------------------------- TSC


def _measure_tsc_mhz(interval_s: float = 0.05) -> float | None:
    native = _NativeCode.get()
    if native is None:
        return None
    t0, c0 = time.perf_counter_ns(), native.rdtsc()
    time.sleep(interval_s)
    t1, c1 = time.perf_counter_ns(), native.rdtsc()
    return round((c1 - c0) * 1e3 / (t1 - t0), 1) if t1 > t0 else None


def tsc_info(
    fields: dict[str, str], flags: list[str], cpuid_snap: dict[str, Any]
) -> dict[str, Any]:
    """TSC frequency and how it was obtained, without reading the kernel log.

    Preference: CPUID leaf 0x15 (crystal ratio, Intel), the hypervisor timing
    leaf 0x40000010, then /proc/cpuinfo's "cpu MHz" when the kernel knows the
    TSC frequency (``tsc_known_freq``) and no cpufreq driver changes "cpu MHz".
    BogoMIPS/2 (the TSC-calibrated delay loop) and a 50 ms rdtsc-vs-clock
    measurement are recorded as cross-checks.
    """
    sources: dict[str, float | None] = {
        "cpuid_0x15": None,
        "cpuid_0x40000010": None,
        "proc_cpuinfo_cpu_mhz": None,
        "bogomips_half": None,
        "measured_rdtsc_vs_clock": None,
    }
    leaf15 = cpuid_snap.get("tsc_leaf_0x15")
    if leaf15 and leaf15[0] and leaf15[1] and leaf15[2]:
        sources["cpuid_0x15"] = round(leaf15[2] * leaf15[1] / leaf15[0] / 1e6, 3)
    hv = cpuid_snap.get("hypervisor_timing_leaf")
    if hv and hv[0]:
        sources["cpuid_0x40000010"] = round(hv[0] / 1e3, 3)
    try:
        sources["proc_cpuinfo_cpu_mhz"] = float(fields["cpu MHz"])
    except (KeyError, ValueError):
        pass
    try:
        sources["bogomips_half"] = round(float(fields["bogomips"]) / 2, 3)
    except (KeyError, ValueError):
        pass
    sources["measured_rdtsc_vs_clock"] = _measure_tsc_mhz()
    has_cpufreq = (_SYS_CPU / "cpu0" / "cpufreq").exists()
    invariant = "constant_tsc" in flags and "nonstop_tsc" in flags
    mhz, method = None, None
    if sources["cpuid_0x15"]:
        mhz, method = sources["cpuid_0x15"], "CPUID leaf 0x15 (TSC/crystal ratio x crystal)"
    elif sources["cpuid_0x40000010"]:
        mhz, method = sources["cpuid_0x40000010"], "CPUID leaf 0x40000010 (hypervisor timing)"
    elif sources["proc_cpuinfo_cpu_mhz"] and "tsc_known_freq" in flags and not has_cpufreq:
        mhz = sources["proc_cpuinfo_cpu_mhz"]
        method = "/proc/cpuinfo cpu MHz (flag tsc_known_freq, no cpufreq driver)"
    elif sources["measured_rdtsc_vs_clock"]:
        mhz = sources["measured_rdtsc_vs_clock"]
        method = "measured: rdtsc ticks over a 50 ms sleep against CLOCK_MONOTONIC"
    return {
        "mhz": mhz,
        "method": method,
        "invariant": invariant,
        "tsc_known_freq": "tsc_known_freq" in flags,
        "cpufreq_driver": has_cpufreq,
        "sources": sources,
    }


# --------------------------------------------------------------------------- OS, toolchain


def _os_release() -> dict[str, str | None]:
    text = _read_text(Path("/etc/os-release")) or ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip().strip('"')
    return {
        "pretty_name": fields.get("PRETTY_NAME"),
        "id": fields.get("ID"),
        "version_id": fields.get("VERSION_ID"),
        "version_codename": fields.get("VERSION_CODENAME"),
    }


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _papi_version() -> str | None:
    rc, out, _ = _run(["papi_version"])
    if rc == 0:
        m = re.search(r"PAPI Version:\s*(\S+)", out)
        if m:
            return m.group(1)
    rc, out, _ = _run(["dpkg-query", "-W", "-f=${Version}", "libpapi-dev"])
    return f"libpapi-dev {out.strip()}" if rc == 0 and out.strip() else None


def _toolchain() -> dict[str, str | None]:
    def tool(args: list[str]) -> str | None:
        rc, out, _ = _run(args)
        return _first_line(out) if rc == 0 else None

    return {
        "gcc": tool(["gcc", "--version"]),
        "as": tool(["as", "--version"]),
        "gdb": tool(["gdb", "--version"]),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "iced_x86": _dist_version("iced-x86"),
        "capstone": _dist_version("capstone"),
        "snakemake": _dist_version("snakemake"),
        "papi": _papi_version(),
    }


# --------------------------------------------------------------------------- describe


def describe() -> dict[str, Any]:
    """Everything known about this machine that a measurement may depend on.

    The result is JSON-serialisable. ``machine_id`` is included and depends on
    a subset of the fields only (see ``machine_id``).
    """
    info = parse_cpuinfo()
    fields = info["fields"]
    ident = identity(_read_text(_PROC_CPUINFO))
    snap = cpuid_snapshot()
    lscpu = _lscpu()
    flags = ident["isa_flags"]
    vendor = ident["vendor"]
    family, model, stepping = ident["family"], ident["model"], ident["stepping"]
    # /proc/cpuinfo and CPUID should agree; if not, say so rather than pick silently.
    disagreement = None
    if snap.get("available") and (snap["family"], snap["model"]) != (family, model):
        disagreement = (
            f"/proc/cpuinfo family/model {family}/{model} != CPUID {snap['family']}/{snap['model']}"
        )
    virt = virtualisation_info(flags, snap, lscpu)
    name = uarch_name(vendor, family, model, stepping)
    caveat = None
    if virt["virtualised"]:
        caveat = (
            "family/model/stepping are the values the hypervisor "
            f"({virt['hypervisor_vendor'] or 'unknown'}) exposes to this guest; the host chip "
            "may be another generation, so 'name' is what these CPUID fields denote, not a "
            "statement about the silicon"
        )
    desc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "cpumap_version": __version__,
        "host": socket.gethostname(),
        "vendor": vendor,
        "vendor_id": ident["vendor_id"],
        "family": family,
        "model": model,
        "stepping": stepping,
        "family_hex": None if family is None else f"0x{family:x}",
        "model_hex": None if model is None else f"0x{model:x}",
        "microcode": fields.get("microcode"),
        "model_name": ident["model_name"],
        "uarch": {
            "name": name,
            "basis": (
                f"{vendor} family 0x{family:x} model 0x{model:x} looked up in cpumap's table"
                if name and family is not None and model is not None
                else "signature not in cpumap's table"
            ),
            "caveat": caveat,
            "cpuinfo_cpuid_disagreement": disagreement,
        },
        "cpuid": snap,
        "isa_flags": flags,
        "isa_hash": isa_hash(flags),
        "non_isa_flags_excluded_from_hash": sorted(set(flags) & _NON_ISA_FLAGS),
        "caches": cache_info(),
        "cores": _cores(info),
        "virtualisation": virt,
        "counters": counters_info(),
        "tsc": tsc_info(fields, flags, snap),
        "os": _os_release(),
        "kernel": {
            "release": platform.release(),
            "version": platform.version(),
            "machine": platform.machine(),
        },
        "toolchain": _toolchain(),
    }
    desc["machine_id"] = machine_id(desc)
    return desc


def write_machine_json(
    path: str | Path, machine_config: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Describe this machine and write it as JSON (atomically); returns the description.

    ``machine_config`` is the ``machine:`` section of the workflow config. With
    the simulated backend the file still describes the host (where the
    pipeline ran), but ``machine_id`` is the simulated machine's id and the
    host's own id is kept as ``host_machine_id``.
    """
    from cpumap.store.files import write_json_atomic  # local import: keep this module light

    desc = describe()
    if machine_config is not None:
        desc["backend"] = dict(machine_config)
        if machine_config.get("backend") == "simulated":
            desc["host_machine_id"] = desc["machine_id"]
            desc["machine_id"] = simulated_machine_id(
                machine_config.get("mapping"),
                machine_config.get("noise", 0.0),
                machine_config.get("seed", 0),
            )
    write_json_atomic(desc, path)
    return desc


def main(argv: list[str] | None = None) -> int:
    """``python -m cpumap.host.machine [--id]``: print the description (or only the id)."""
    args = sys.argv[1:] if argv is None else argv
    if "--id" in args:
        print(machine_id())
    else:
        print(json.dumps(describe(), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
