#!/usr/bin/env python3
"""Narrow vector forms beside one 512-bit form at several densities: the 512-bit mode's data.

For each narrow form F and 512-bit carrier Z, measures ``F*n Z`` for every n of ``--counts``
and prints the cycles per copy of F (the kernel's time / n), beside F and Z alone; then the
form's time in the mode as the probe takes it (``palmed.wide.mode_kernels``: the difference
of two dense kernels per added copy). Why: on Cascade Lake which narrow forms slow down
depends on the carrier (a 512-bit FP form wakes port 5's FMA unit for narrow FP μops, an
integer one does not) and, for 256-bit forms, on how dense the 512-bit μops are
(``palmed.states``, docs/model.md "The 512-bit mode"). Measured fresh (nothing read from or
written to a results database), with the pipeline's harness and estimator.

    .venv/bin/python benchmarks/mode_density.py \\
        --forms MULSD_XMM_XMM,VPADDD_XMM_XMM_XMM,VPMULLD_YMM_YMM_YMM \\
        --carriers VADDPD_ZMM_ZMM_ZMM,VPADDQ_ZMM_ZMM_ZMM --counts 1,2,4,8,16,32
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forms", required=True, help="narrow vector forms, comma-separated")
    ap.add_argument("--carriers", required=True, help="512-bit forms, comma-separated")
    ap.add_argument("--counts", default="1,2,4,8,16,32",
                    help="copies of the form per carrier, comma-separated")
    args = ap.parse_args(argv)
    from cpumap.host import machine
    from cpumap.isa import catalogue as isa
    from cpumap.measure import harness
    from cpumap.measure.asmgen import kernel_key
    from cpumap.measure.backend import Measurer
    from cpumap.measure.settings import BenchSettings
    from cpumap.model.palmed import PalmedConfig
    from cpumap.model.palmed.kernels import _text
    from cpumap.model.palmed.wide import mode_kernels, time_in_mode

    forms, carriers = args.forms.split(","), args.carriers.split(",")
    counts = [int(c) for c in args.counts.split(",")]
    host = machine.describe()
    tmp = Path(tempfile.mkdtemp(prefix="cpumap-mode-"))
    cat = isa.build_catalogue(host, tmp / "isa", smoke_run=False)
    known = set(cat["name"])
    unknown = [f for f in [*forms, *carriers] if f not in known]
    if unknown:
        print(f"mode_density: not in this host's catalogue: {', '.join(unknown)}",
              file=sys.stderr)
        return 2
    m = Measurer(host, cat, BenchSettings(), tmp / "db", tmp / "work",
                 harness_bin=harness.build_harness(tmp / "bin"))
    alone = m.measure([*forms, *carriers], "mode-density")
    t = {f: alone[kernel_key(f)] for f in [*forms, *carriers]}
    cfg = PalmedConfig()
    pairs = {(f, z): mode_kernels(f, z, t, cfg) for f in forms for z in carriers}
    kernels = [f"{f}*{n} {z}" for f in forms for z in carriers for n in counts]
    kernels += [_text(k) for pair in pairs.values() for k in pair]
    t0 = time.perf_counter()
    got = m.measure(kernels, "mode-density")
    print(f"{host.get('machine_id', '?')}: {len(kernels) + len(t)} kernels in "
          f"{time.perf_counter() - t0:.1f} s; cycles per copy of the form at n copies "
          "per carrier")
    print("form, carrier, alone (form / carrier), " + ", ".join(f"n={n}" for n in counts)
          + ", in the mode (mode_kernels)")
    for (f, z), pair in pairs.items():
        per = [got[kernel_key(f"{f}*{n} {z}")] / n for n in counts]
        mode = time_in_mode(f, pair, {_text(k): got[_text(k)] for k in pair})
        print(f"{f}, {z}, {t[f]:.3f} / {t[z]:.3f}, " + ", ".join(f"{v:.3f}" for v in per)
              + (f", {mode:.3f}" if mode is not None else ", failed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
