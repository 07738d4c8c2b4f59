"""What the operating system says about this host: caches, cores, hypervisor, counters, TSC.

This module owns the best-effort probes of ``describe()`` that read sysfs,
/proc, /etc/os-release and the output of tools (lscpu, papi_avail,
papi_version, gcc, as, gdb): cache geometry, core counts, virtualisation
evidence, hardware counter availability, the TSC frequency, and the OS and
toolchain versions, together with the small helpers they share (``_run``,
``_read_text``, ``_to_int``, ``_first_line``).  None of it enters the machine
id, so it is kept apart from ``cpumap.host.machine``, which imports from here;
this module imports only ``cpumap.host.cpuid`` (RDTSC for the TSC
measurement).  A probe that fails records ``None`` and the reason, and never
raises.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from cpumap.host.cpuid import _NativeCode

__all__ = [
    "cache_info",
    "counters_info",
    "tsc_info",
    "virtualisation_info",
]

_SYS_CPU = Path("/sys/devices/system/cpu")

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
