"""Roofline (seed 004): compute and bandwidth ceilings, kernel points and roofline plots.

Modules: ``flops`` (operations and bytes of one instruction, from iced-x86), ``peak``
(theoretical peaks from a documented per-microarchitecture table), ``ceilings`` (compute
ceilings measured with generated kernels), ``sweep`` (bandwidth by working-set sweep,
harness/bw_sweep.c, plateau detection), ``points`` (kernel points of the real-kernel suite),
``plots`` (matplotlib figures), ``report`` (the HTML section of the report).
"""
