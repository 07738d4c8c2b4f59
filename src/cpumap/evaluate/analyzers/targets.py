"""Which machine model the external analyzers simulate: the host's, unless the config says.

Why: llvm-mca and OSACA each model a list of CPUs, and comparing them with measurements of
another CPU tests the wrong model (a Zen 3 host evaluated against ``-mcpu=znver4`` and
OSACA's ``ZEN4`` data: every analyzer's figures compared Zen 3 timings with Zen 4 tables).
The config's ``evaluate.llvm_mca.cpu`` and ``evaluate.osaca.arch`` are ``auto`` by default: the
target follows the microarchitecture in the machine description (``machine.json``: ``uarch``,
from CPUID family and model). A host neither tool knows gets a documented fallback and a
warning that names it: llvm-mca ``native`` (LLVM's own host detection, which knows more CPUs
than our table) and, for OSACA, the newest model of the host's vendor (``ZEN4`` for AMD,
``SPR`` for Intel; another vendor: ``ZEN4``). An explicit value is used as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

AUTO = "auto"

#: cpumap's microarchitecture names (cpumap.host.cpuid) -> llvm-mca -mcpu (LLVM 19).
LLVM_CPU: dict[str, str] = {
    "zen": "znver1", "zen+": "znver1", "zen2": "znver2", "zen3": "znver3", "zen4": "znver4",
    "zen5": "znver5",
    "skylake": "skylake", "kabylake": "skylake", "cometlake": "skylake",
    "skylake-x": "skylake-avx512", "cascadelake": "cascadelake", "cooperlake": "cooperlake",
    "cannonlake": "cannonlake", "icelake": "icelake-client", "icelake-x": "icelake-server",
    "icelake-d": "icelake-server", "tigerlake": "tigerlake", "rocketlake": "rocketlake",
    "alderlake": "alderlake", "raptorlake": "raptorlake", "meteorlake": "meteorlake",
    "sapphirerapids": "sapphirerapids", "emeraldrapids": "emeraldrapids",
}

#: cpumap's microarchitecture names -> OSACA 0.7 machine models (osaca/data/*.yml).
OSACA_ARCH: dict[str, str] = {
    "zen": "ZEN1", "zen+": "ZEN1", "zen2": "ZEN2", "zen3": "ZEN3", "zen4": "ZEN4",
    "skylake-x": "SKX", "cascadelake": "CSX", "cooperlake": "CSX", "icelake": "ICL",
    "icelake-x": "ICX", "icelake-d": "ICX", "sapphirerapids": "SPR", "emeraldrapids": "SPR",
}
OSACA_FALLBACK = {"amd": "ZEN4", "hygon": "ZEN4", "intel": "SPR"}


@dataclass(frozen=True)
class Target:
    """One analyzer's target: the value passed to the tool and how it was chosen."""

    value: str
    how: str  # "config" | "host" | "fallback"
    warning: str = ""

    def describe(self) -> str:
        return {"config": "set in the config", "host": "the host's microarchitecture",
                "fallback": "fallback"}[self.how]


def _uarch(machine: Mapping) -> tuple[str, str]:
    """(microarchitecture name or "", vendor) from a machine description."""
    u = machine.get("uarch")
    name = (u.get("name") if isinstance(u, Mapping) else u) or ""
    return str(name).removeprefix("dhyana-"), str(machine.get("vendor") or "")


def _target(configured: str, machine: Mapping, table: Mapping[str, str], tool: str,
            fallback: str, why: str, key: str) -> Target:
    if configured != AUTO:
        return Target(configured, "config")
    name, _ = _uarch(machine)
    if name in table:
        return Target(table[name], "host")
    return Target(fallback, "fallback",
                  f"{tool}: no machine model for microarchitecture {name or 'unknown'!r} of "
                  f"{machine.get('machine_id', 'this host')}; using {fallback} ({why}); set "
                  f"{key} to choose")


def llvm_mca_cpu(configured: str, machine: Mapping) -> Target:
    """The ``-mcpu`` for llvm-mca on this machine (see the module docstring)."""
    return _target(configured, machine, LLVM_CPU, "llvm-mca", "native",
                   "LLVM's own host detection", "evaluate.llvm_mca.cpu")


def osaca_arch(configured: str, machine: Mapping) -> Target:
    """The ``--arch`` for OSACA on this machine (see the module docstring)."""
    arch = OSACA_FALLBACK.get(_uarch(machine)[1], "ZEN4")
    return _target(configured, machine, OSACA_ARCH, "osaca", arch, "the newest of its vendor",
                   "evaluate.osaca.arch")
