"""Theoretical floating-point peaks: the catalogue's forms x a documented pipe table.

The peak is derived, never typed in: for a form, flops per instruction come from the form
itself (cpumap.roofline.flops: vector width, precision, FMA = 2) and instructions per cycle
from the microarchitecture's floating-point pipes in ``FP_PIPES`` -- how many pipes execute
the operation and how wide their data path is (an operation wider than the data path
occupies a pipe for width / path cycles: Zen 4 runs a 512-bit FMA as two 256-bit halves).
The peak of a precision is the best form of the catalogue that this CPU can run, and the
result records which table row and which form gave it, so a reader can check both.

Sources of the rows (the vendors' optimization manuals; uops.info's measured tables agree):
  [AMD-Z2]  AMD, "Software Optimization Guide for AMD Family 17h Models 30h and Greater
            Processors" (pub. 56305), section 2.12 Floating-Point Unit.
  [AMD-Z3]  AMD, "Software Optimization Guide for AMD EPYC 7003 Processors" (pub. 56665),
            section 2.12 Floating-Point Unit.
  [AMD-Z4]  AMD, "Software Optimization Guide for the AMD Zen4 Microarchitecture" (pub. 57647
            rev. 1.00), section 2.11 Floating-Point Unit: four pipes, FP0/FP1 multiply and
            FMA, FP2/FP3 add, 256-bit data path, 512-bit operations issued as two 256-bit ops.
  [AMD-Z5]  AMD, "Software Optimization Guide for the AMD Zen5 Microarchitecture" (pub.
            58455), section 2.11: the same four pipes with a 512-bit data path (desktop and
            server parts; mobile Zen 5 keeps 256 bits).
  [INTEL]   Intel, "Intel 64 and IA-32 Architectures Optimization Reference Manual" (248966),
            chapters on Skylake server / Ice Lake / Sapphire Rapids: two FMA units (ports 0
            and 1, fused to 512 bits on p0, plus p5 on parts with a second 512-bit FMA) that
            also execute adds and multiplies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from cpumap.isa.x86 import FormSpec
from cpumap.roofline.flops import FlopInfo, flops_of_form


@dataclass(frozen=True)
class FpPipes:
    """Floating-point execution resources of one microarchitecture (see the module sources).

    fma: pipes that execute FMA (and multiplies); add: pipes that execute adds and are NOT
    the FMA pipes (0 when adds run on the FMA pipes); path_bits: data-path width of a pipe;
    max_bits: widest vector the core executes; source: where the row comes from.
    """

    fma: int
    add: int
    path_bits: int
    max_bits: int
    source: str


FP_PIPES: dict[str, FpPipes] = {
    "zen2": FpPipes(2, 2, 256, 256, "[AMD-Z2] 2 FMA/FMUL pipes + 2 FADD pipes, 256-bit"),
    "zen3": FpPipes(2, 2, 256, 256, "[AMD-Z3] 2 FMA/FMUL pipes + 2 FADD pipes, 256-bit"),
    "zen4": FpPipes(2, 2, 256, 512, "[AMD-Z4] FP0/FP1 FMA/FMUL + FP2/FP3 FADD, 256-bit data "
                    "path, 512-bit ops as two 256-bit halves"),
    "zen5": FpPipes(2, 2, 512, 512, "[AMD-Z5] 2 FMA/FMUL pipes + 2 FADD pipes, 512-bit data "
                    "path"),
    "haswell": FpPipes(2, 0, 256, 256, "[INTEL] FMA on ports 0 and 1, 256-bit"),
    "skylake": FpPipes(2, 0, 256, 256, "[INTEL] FMA/add/mul on ports 0 and 1, 256-bit"),
    "skylake-x": FpPipes(2, 0, 512, 512, "[INTEL] 512-bit FMA on p0 (p0+p1 fused) and p5"),
    "cascadelake": FpPipes(2, 0, 512, 512, "[INTEL] 512-bit FMA on p0 (fused) and p5"),
    "icelake-x": FpPipes(2, 0, 512, 512, "[INTEL] 512-bit FMA on p0 (fused) and p5"),
    "sapphirerapids": FpPipes(2, 0, 512, 512, "[INTEL] 512-bit FMA on p0 (fused) and p5"),
}


#: L1 data loads per cycle and their widest width, per microarchitecture (the same sources
#: as FP_PIPES): the read bandwidth limit the CPU implies for a kernel of a given load width.
L1_LOADS: dict[str, tuple[int, int, str]] = {
    "zen2": (2, 256, "[AMD-Z2] two 256-bit loads per cycle"),
    "zen3": (3, 256, "[AMD-Z3] three loads per cycle, two of them 256-bit"),
    "zen4": (3, 256, "[AMD-Z4] three loads per cycle, two of them 256-bit (512-bit as two)"),
    "zen5": (4, 512, "[AMD-Z5] four loads per cycle, two of them 512-bit"),
    "haswell": (2, 256, "[INTEL] two 256-bit loads per cycle"),
    "skylake": (2, 256, "[INTEL] two 256-bit loads per cycle"),
    "skylake-x": (2, 512, "[INTEL] two 512-bit loads per cycle"),
    "cascadelake": (2, 512, "[INTEL] two 512-bit loads per cycle"),
    "icelake-x": (2, 512, "[INTEL] two 512-bit loads per cycle"),
    "sapphirerapids": (3, 512, "[INTEL] three loads per cycle, two of them 512-bit"),
}


def l1_read_limit(uarch: str, kernel_bits: int = 256) -> dict | None:
    """Bytes per cycle the L1 allows a read kernel of ``kernel_bits``-wide loads: the wide
    loads per cycle (at most two on every row above) x the narrower of the two widths. None
    for a microarchitecture without a row."""
    if uarch not in L1_LOADS:
        return None
    loads, bits, source = L1_LOADS[uarch]
    wide = min(loads, 2)
    return {"uarch": uarch, "bytes_per_cycle": wide * min(bits, kernel_bits) / 8,
            "loads_per_cycle": wide, "load_bits": min(bits, kernel_bits), "source": source}


def issue_rate(pipes: FpPipes, info: FlopInfo) -> float:
    """Instructions per cycle the table allows for one form: its pipes / cycles per op."""
    n = pipes.fma if info.kind in ("fma", "mul") or pipes.add == 0 else pipes.add
    if info.kind not in ("fma", "mul", "add"):
        return 0.0
    bits = max(info.vector_bits, 1)
    if bits > pipes.max_bits:
        return 0.0
    return n / max(1.0, bits / pipes.path_bits)


@dataclass(frozen=True)
class Peak:
    """A theoretical peak and how it was derived."""

    precision: str
    flops_per_cycle: float
    form: str
    flops_per_insn: int
    insns_per_cycle: float
    uarch: str
    table_row: dict
    mix: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def theoretical_peaks(uarch: str, forms: Iterable[tuple[str, FormSpec]],
                      usable: Mapping[str, bool] | None = None) -> dict[str, dict[str, Peak]]:
    """Per precision: the best FMA-only peak and the best FMA + separate-adder peak.

    ``forms`` are (name, spec) of the catalogue's measurable forms; ``usable`` optionally
    filters them (e.g. register-only forms).  Returns {precision: {"fma": Peak,
    "fma+add": Peak}}; "fma+add" exists only when the table has adders beside the FMA pipes
    (Zen): FMA pipes full of the widest FMA and add pipes full of the widest add.
    """
    if uarch not in FP_PIPES:
        raise KeyError(f"no floating-point pipe table for microarchitecture {uarch!r}; "
                       f"known: {', '.join(sorted(FP_PIPES))}")
    pipes = FP_PIPES[uarch]
    row = {"uarch": uarch} | asdict(pipes)
    best: dict[tuple[str, str], tuple[float, str, FlopInfo, float]] = {}
    for name, spec in forms:
        if usable is not None and not usable.get(name, True):
            continue
        info = flops_of_form(spec)
        if info.kind not in ("fma", "add") or info.masked or spec.mem:
            continue
        rate = issue_rate(pipes, info)
        value = info.flops * rate
        key = (info.precision, info.kind)
        # ties: the widest form (the "widest FMA form x its issue rate"), then the 231
        # operand order compilers emit, add before sub, then the shortest name (VEX before
        # its _EVEX twin)
        def rank(v: float, n: str, i: FlopInfo) -> tuple:
            mnem = n.split("_")[0]
            return (round(v, 9), i.flops, "231" in n, "SUB" not in mnem, -len(n), n)

        if key not in best or rank(value, name, info) > rank(*best[key][:3]):
            best[key] = (value, name, info, rate)
    out: dict[str, dict[str, Peak]] = {}
    for (prec, kind), (value, name, info, rate) in best.items():
        if kind != "fma":
            continue
        out.setdefault(prec, {})["fma"] = Peak(prec, value, name, info.flops, rate, uarch, row)
        add = best.get((prec, "add"))
        if pipes.add and add:
            a_value, a_name, a_info, a_rate = add
            out[prec]["fma+add"] = Peak(prec, value + a_value, f"{name} + {a_name}",
                                        info.flops, rate + a_rate, uarch, row,
                                        mix=f"{rate:g} x {name} + {a_rate:g} x {a_name} per cycle")
    return out
