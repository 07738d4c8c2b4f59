"""cpumap: measure and model how the host CPU executes x86-64 code.

The package holds all the logic; the Snakemake workflow under ``workflow/`` only wires its
functions together. Its subpackages are the pipeline's floors, each importing only from the
floors below it (tests/test_imports.py checks it; docs/architecture.md draws it):

=========  =================================================================================
store      result files written atomically, the Parquet measurement database, archive, merge
host       the machine description (machine.json) and the machine id
isa        instruction forms (iced-x86) and the host's catalogue of them
measure    kernels -> cycles: settings, generator, harness, smoke run, campaigns, backends
model      resource models: the format, Palmed's inference, its pipeline jobs, validation,
           simulated machines (truth for the inference)
evaluate   real code: the kernel suite, basic blocks, gdb counts, Cachegrind, analyzers,
           lifting and metrics, the HTML report
roofline   compute and bandwidth ceilings, kernel points, roofline plots
cli        the ``cpumap`` command
=========  =================================================================================
"""

__version__ = "0.1.0"
