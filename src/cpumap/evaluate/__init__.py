"""How good are code analyzers on real code: seed 003's evaluation harness.

``suite`` (the real C kernels and their driver: build, whole-kernel cycles), ``blocks``
(Capstone + pyelftools basic blocks and CFG), ``flow`` (which counts flow conservation
derives, loop trip counts), ``counting`` (exact occurrences with gdb),
``cachegrind`` (warm-cache L1 residency filter), ``analyzers`` (our model, native measurement,
llvm-mca, OSACA; the unavailable ones with reasons), ``lift`` (per-block predictions to whole
kernels, metrics), ``report`` (the self-contained HTML report). May import every floor below:
``store``, ``host``, ``isa``, ``measure``, ``model``.
"""
