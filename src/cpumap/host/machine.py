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
Zen 4 signature, on a Zen 5 host; another reports family 6 model 0xA7, Rocket Lake,
with the AMX and AVX512-FP16 flags of Sapphire Rapids). We do not guess beyond the
evidence: the id uses what CPUID says, corrected only where the ISA flags prove the
signature's generation wrong (``resolve_uarch``: a hypervisor can hide features, not
add them), and ``describe()`` records the raw CPUID leaves, the hypervisor, the basis of
the name and a caveat, so that a reader can tell.

Everything here is best effort: a probe that fails records ``None`` and the
reason, and never stops the pipeline.

This module owns the machine id and the description as a whole: parsing
/proc/cpuinfo (``parse_cpuinfo``, ``identity``), ``isa_hash``, ``machine_id``,
``simulated_machine_id``, ``describe()``, ``write_machine_json()`` and the
``python -m cpumap.host.machine [--id]`` entry point.  The probes it assembles
live below it: raw CPUID and the microarchitecture table in
``cpumap.host.cpuid``, the sysfs/tool probes (caches, cores, virtualisation,
counters, TSC, OS, toolchain) in ``cpumap.host.sysinfo``.  Their public
functions are re-exported here (``__all__``) so that ``machine`` stays the one
entry point for callers.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import socket
import sys
from pathlib import Path
from typing import Any

from cpumap import __version__
from cpumap.host.cpuid import (
    cpuid,
    cpuid_snapshot,
    decode_signature,
    resolve_uarch,
    uarch_name,
)
from cpumap.host.sysinfo import (
    _cores,
    _lscpu,
    _os_release,
    _read_text,
    _to_int,
    _toolchain,
    cache_info,
    counters_info,
    tsc_info,
    virtualisation_info,
)

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
    "resolve_uarch",
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

_VENDORS = {
    "AuthenticAMD": "amd",
    "GenuineIntel": "intel",
    "HygonGenuine": "hygon",
    "CentaurHauls": "centaur",
    "  Shanghai  ": "zhaoxin",
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


# --------------------------------------------------------------------------- machine id


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
    name, _ = resolve_uarch(vendor, family, model, desc.get("stepping"),
                            desc.get("isa_flags", []))
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
    name, basis = resolve_uarch(vendor, family, model, stepping, flags)
    caveat = None
    if virt["virtualised"]:
        caveat = (
            "family/model/stepping are the values the hypervisor "
            f"({virt['hypervisor_vendor'] or 'unknown'}) exposes to this guest; the host chip "
            "may be another generation, so 'name' is what these CPUID fields and ISA flags "
            "denote (see 'basis'), not a statement about the silicon"
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
            "basis": basis,
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
