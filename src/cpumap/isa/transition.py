"""Legacy-SSE and 256-bit AVX forms in one instruction stream: which forms are which, and how
many switches between the two a loop body makes.

On Zen 2 and Zen 3 (AMD's software optimisation guide; measured on a Milan guest: ``ADDPD xmm``
x 4 with one ``VSHUFPD ymm`` 344 cycles per instance, its parts 0.5 each) a legacy-SSE
instruction after a VEX.256 one, with the upper halves of the ymm registers dirty, and the
VEX.256 instruction after it take a micro-fault each that saves or restores the upper halves.
On Zen 4 the same kernel runs at its parts' speed (2.2 cycles). No resource model of
multisets can express it: it depends on the order of the instructions, and its cost is a
hundred times an instruction's. So the catalogue stage measures it on the host
(:mod:`cpumap.measure.transition`); where it exists, the model never mixes the two families
in a kernel and predictions add the measured cost per switch.

A form's family comes from the catalogue's encoding and operands: ``sse`` for a legacy-encoded
form with an xmm register, ``avx`` for a VEX or EVEX form of 256 or 512 bits with a vector
register (it leaves the upper halves dirty). Everything else (general-purpose, VEX.128 forms
that zero the upper halves, mask destinations, MMX, x87) is in neither and never switches.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SSE = "sse"
AVX = "avx"


def operands(value: Any) -> list[dict[str, Any]]:
    """A catalogue row's operand list (stored as JSON text; empty for none)."""
    if isinstance(value, str):
        return json.loads(value) if value.strip() else []
    return list(value or [])


def vector_widths(ops: Any) -> set[int]:
    """The widths in bits of a catalogue row's vector register operands (``ops``)."""
    return {int(o.get("width", 0)) for o in operands(ops)
            if o.get("kind") == "reg" and o.get("cls") == "VEC"}


def vector_length(ops: Any) -> int:
    """The vector length in bits of a form with a vector register (0 without one): its widest
    vector register or memory operand. The length, not only the registers: a narrowing
    conversion such as VCVTPD2PS xmm, m256 is VEX.256 with an xmm register alone (a Sapphire
    Rapids guest took 200 cycles per switch beside legacy SSE, as for a ymm form); a mask
    destination (VFPCLASSPD k, m256) has no vector register: 0."""
    ops = operands(ops)
    widths = vector_widths(ops)
    if not widths:
        return 0
    return max(widths | {int(o.get("width", 0)) for o in ops if o.get("kind") == "mem"})


def vector_lengths(forms: Any) -> dict[str, int]:
    """Form name -> ``vector_length`` of every catalogue row (a DataFrame with ``name``,
    ``operands``) that has a vector register."""
    out = {}
    for name, ops in zip(forms["name"], forms["operands"], strict=True):
        if length := vector_length(ops):
            out[str(name)] = length
    return out


#: Vector length (bits) from which a form switches an Intel core to its 512-bit mode.
WIDE_BITS = 512


def carriers(forms: Any, bits: int = WIDE_BITS) -> list[str]:
    """The forms of at least ``bits`` bits (512: the 512-bit mode's; 256: the dirty-upper
    state's, ``cpumap.model.palmed.dirty``) of a catalogue table (``name``, ``operands``,
    ``category``) with register operands only and not register moves: those a mode's probe
    may add to kernels (``cpumap.model.palmed.wide``). A memory form would add a load, or a
    store, to every kernel it measures; a move may be eliminated at renaming, and then no
    wide μop is in flight: on Zen 4 ``MULSD xmm`` x 16 took 8.0 cycles beside two ``VMOVAPD
    zmm, zmm`` (6 a cycle, renamed away), as alone, and 16.1 beside two ``VPADDQ zmm``."""
    return sorted(str(name) for name, ops, kind
                  in zip(forms["name"], forms["operands"], forms["category"], strict=True)
                  if vector_length(ops) >= bits and kind != "move"
                  and all(o.get("kind") != "mem" for o in operands(ops)))


def plain_forms(forms: Any) -> set[str]:
    """Forms of a catalogue table (``name``, ``mem``, ``implicit``) with register and
    immediate operands only, no implicit one: the pair candidates' preferred kind
    (``cpumap.model.palmed.pair_candidates``; a memory form also uses a load or store port)."""
    implicit = forms["implicit"].fillna("").map(lambda v: bool(v) and bool(json.loads(v)))
    return {str(n) for n in forms.loc[~forms["mem"].astype(bool) & ~implicit, "name"]}


def mixes_512(kernel: Iterable[str], lengths: Mapping[str, int]) -> bool:
    """Whether a kernel holds a 512-bit vector form beside a narrower vector form
    (``lengths``: ``vector_lengths``). On Intel cores port 1 takes no vector μops while
    512-bit μops are in flight, so the narrow forms' uses depend on the rest of the kernel
    (``cpumap.model.palmed.wide``)."""
    ws = [lengths.get(f, 0) for f in kernel]
    return any(w >= WIDE_BITS for w in ws) and any(0 < w < WIDE_BITS for w in ws)


def family(encoding: str, ops: Any) -> str | None:
    """``sse``, ``avx`` or None for a catalogue row's ``encoding`` and ``operands`` (``ops``)."""
    ops = operands(ops)
    if encoding == "LEGACY" and 128 in vector_widths(ops):
        return SSE
    # a mask destination (VFPCLASSPD k, m256) leaves no vector register dirty and never paid
    if encoding in ("VEX", "EVEX") and vector_length(ops) >= 256:
        return AVX
    return None


def families(forms: Any) -> dict[str, str]:
    """Form name -> family of every catalogue row (a DataFrame with ``name``, ``encoding``,
    ``operands``) in one of the two families."""
    out = {}
    for name, encoding, operands in zip(forms["name"], forms["encoding"], forms["operands"],
                                        strict=True):
        fam = family(str(encoding), operands)
        if fam is not None:
            out[str(name)] = fam
    return out


def switches(sequence: Sequence[str], fams: Mapping[str, str]) -> int:
    """Switches between the families in ``sequence`` (form names) executed as a loop body:
    the last instruction of one iteration is followed by the first of the next."""
    seq = [fams[f] for f in sequence if f in fams]
    if not seq:
        return 0
    return sum(1 for a, b in zip(seq, seq[1:] + seq[:1], strict=True) if a != b)


def mixes(forms: Iterable[str], fams: Mapping[str, str]) -> bool:
    """Whether forms of both families are among ``forms``."""
    return len({fams[f] for f in forms if f in fams}) > 1
