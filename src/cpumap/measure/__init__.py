"""Kernels (multisets of forms) to cycles: every measurement of the project comes through here.

``settings`` (config key ``bench`` as a typed object), ``asmgen`` (Pipedream-style generator:
canonical kernel text, register pools, unrolled n/2n loops, one shared object per batch),
``harness`` (builds and supervises harness/papi_bench.c), ``smoke`` (the catalogue's one-run
check), ``campaign`` (plans and batches, DB rows of a measured batch), ``backend`` (the
``Measurer``: answers from the DB or measures, natively or on a simulated machine, which is
passed in: see ``backend.Simulator``). May import ``store``, ``host`` and ``isa``.
"""
