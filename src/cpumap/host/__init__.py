"""The machine being measured: its description (machine.json) and its id.

The id names the microarchitecture that CPUID denotes plus a hash of the ISA flags, never the
host name, so identical nodes share one results folder. ``cpuid`` (raw CPUID, the
microarchitecture table), ``sysinfo`` (caches, cores, virtualisation, counters, TSC, toolchain)
and ``machine`` (machine.json, the ids). May import ``store`` only.
"""
