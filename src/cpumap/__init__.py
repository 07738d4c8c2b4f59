"""cpumap: measure and model the throughput of x86-64 instructions on the host CPU.

The package holds all the logic; the Snakemake workflow under ``workflow/`` only
wires its functions together (see README.md).
"""

__version__ = "0.1.0"
