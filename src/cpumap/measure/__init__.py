"""Kernels (multisets of forms) to cycles: every measurement of the project comes through here.

``settings`` (config key ``bench`` as a typed object), ``asmgen`` (Pipedream-style generator:
canonical kernel text, register pools, unrolled n/2n loops, one shared object per batch),
``harness`` (builds and supervises harness/papi_bench.c), ``estimate`` (from raw repetitions to
one value per kernel with its uncertainty, robust to a noisy neighbour), ``smoke`` (the
catalogue's one-run check), ``campaign`` (which kernels, in which batches), ``batch`` (one
batch: prepare, measure in rounds, DB rows, the noise monitor), ``backend`` (the ``Measurer``:
answers from the DB or measures, natively or on a simulated machine, which is passed in: see
``backend.Simulator``). May import ``store``, ``host`` and ``isa``.
"""
