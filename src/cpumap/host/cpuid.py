"""Raw CPUID of this host and the microarchitecture a CPUID signature names.

This module owns everything that needs the CPUID instruction itself or the
(vendor, family, model) -> microarchitecture table: the native code stub that
runs CPUID and RDTSC in-process (``_NativeCode``), ``cpuid``, the leaf 1
signature decoder, the ``cpuid_snapshot`` recorded in machine.json, and
``uarch_name``.  It is kept apart from ``cpumap.host.machine`` because it is
the only code here that executes machine code (an executable page through
ctypes) and because the uarch table is reference data that grows with every new
CPU generation; ``cpumap.host.sysinfo`` (RDTSC for the TSC frequency) and
``cpumap.host.machine`` (the id) import from it, never the reverse.
"""

from __future__ import annotations

import ctypes
import mmap
import platform
import struct
from typing import Any

__all__ = [
    "cpuid",
    "cpuid_snapshot",
    "decode_signature",
    "resolve_uarch",
    "uarch_name",
]


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


# ISA features that only some generations have, newest signature first: (vendor, the
# /proc/cpuinfo flag, the generations that have it, oldest first). A hypervisor can hide a
# feature of the silicon but cannot add one the execution units lack, so a flag that the
# family/model's generation never had proves that signature wrong, and the oldest generation
# that has the flag is the nearest the evidence allows. Seen on a KVM guest: family 6 model
# 0xA7 (Rocket Lake) with amx_tile and avx512_fp16, which a dependent-chain probe also shows
# to be a Golden Cove core (`add $1, %reg` chains renamed at ~0.2 cycles per add).
_FEATURE_GENERATIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("intel", "amx_tile", ("sapphirerapids", "emeraldrapids")),
    ("intel", "avx512_fp16", ("sapphirerapids", "emeraldrapids")),
    ("amd", "avx512f", ("zen4", "zen5")),
)


def resolve_uarch(vendor: str, family: int | None, model: int | None,
                  stepping: int | None, flags: list[str] | set[str]) -> tuple[str | None, str]:
    """(microarchitecture, basis): the signature's name unless the ISA flags refute it.

    Why: under a hypervisor family/model are whatever it chooses to expose, and a wrong name
    sends llvm-mca, OSACA and the roofline's reference table to another CPU. The flags are the
    better evidence where they disagree (see ``_FEATURE_GENERATIONS``).
    """
    name = uarch_name(vendor, family, model, stepping)
    if name is not None and family is not None and model is not None:
        basis = f"{vendor} family 0x{family:x} model 0x{model:x} looked up in cpumap's table"
    else:
        basis = "signature not in cpumap's table"
    have = set(flags)
    for who, flag, owners in _FEATURE_GENERATIONS:
        if who == vendor and flag in have and (name or "").removeprefix("dhyana-") not in owners:
            was = f"{name!r}" if name else "an unknown generation"
            return owners[0], (f"{basis} gives {was}, which never had the ISA flag {flag!r} "
                               f"that this CPU reports; {owners[0]} is the first generation "
                               f"with it")
    return name, basis
