"""Function names as users have them: gcc's clones, C++ names, and suggestions when none fits.

A user asks for ``kernel_gemm``; gcc emitted ``kernel_gemm.constprop.0`` (or ``.isra.0``,
``.part.0``, with a ``.cold`` part beside it), and a C++ compiler ``_ZN2ns6kernelEPdi``. The
symbol table holds the compiler's names, so an exact lookup fails on exactly the functions
people most want to look at. :func:`resolve_function` accepts, in this order and only when the
answer is unambiguous:

1. the symbol itself;
2. the demangled name (``ns::kernel(double*, int)``) or the demangled name without its
   parameter list (``ns::kernel``);
3. a clone of the name (``NAME.<suffix>``, never a ``.cold`` part, which is not the function's
   entry), or a symbol or demangled name that starts with the name;

and says which symbol it took and why. Otherwise :class:`FunctionNotFound` lists the closest
names (clones first, then by difflib's similarity), demangled names shown beside the symbol.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.elffile import ELFFile

__all__ = ["FunctionNotFound", "Resolved", "demangle", "function_symbols", "resolve_function"]

#: gcc/clang suffixes of function clones and split parts (``foo.constprop.0``, ``foo.cold``).
CLONE = re.compile(r"\.(constprop|isra|part|cold|lto_priv|clone|specialized|llvm)(\.\d+)*")


class FunctionNotFound(ValueError):
    """No function symbol of that name in the binary (the message lists the closest)."""


@dataclass(frozen=True)
class Resolved:
    """The symbol to use for what the user asked, and a note when it is not the same name."""

    symbol: str
    note: str = ""


def demangle(name: str) -> str:
    """The C++ name of an Itanium-mangled symbol (``_Z...``), else the name itself."""
    if not name.startswith("_Z"):
        return name
    import cxxfilt

    mangled, dot, clone = name.partition(".")  # a clone keeps its suffix: f(int).constprop.0
    try:
        return cxxfilt.demangle(mangled) + dot + clone
    except cxxfilt.InvalidName:
        return name


def function_symbols(binary: Path | str | ELFFile) -> dict[str, tuple[int, int]]:
    """Defined function symbols of the ELF (``.symtab`` first, then ``.dynsym``): name ->
    (address, size). ``binary``: a path, or an ELF file already open."""
    if not isinstance(binary, ELFFile):
        with open(binary, "rb") as handle:
            return function_symbols(ELFFile(handle))
    out: dict[str, tuple[int, int]] = {}
    for secname in (".symtab", ".dynsym"):
        sec = binary.get_section_by_name(secname)
        if sec is None:
            continue
        for sym in sec.iter_symbols():
            if sym["st_info"]["type"] == "STT_FUNC" and sym["st_shndx"] != "SHN_UNDEF" \
                    and sym.name:
                out.setdefault(sym.name, (int(sym["st_value"]), int(sym["st_size"])))
    return out


def _base(name: str) -> str:
    """The name without clone suffixes (``foo.constprop.0`` -> ``foo``)."""
    m = CLONE.search(name)
    return name[:m.start()] if m else name


def _entry(name: str) -> bool:
    """A symbol that is a function's entry (not a ``.cold`` split part)."""
    return ".cold" not in name


def _unique(cands: list[str]) -> str | None:
    return cands[0] if len(set(cands)) == 1 else None


def resolve_function(binary: Path | str, name: str) -> Resolved:
    """The symbol of ``binary`` meant by ``name`` (module docstring); FunctionNotFound (with
    suggestions) when there is none or several fit."""
    syms = function_symbols(binary)
    if name in syms:
        return Resolved(name)
    plain = {s: demangle(s) for s in syms}
    nop = {s: d.split("(")[0] for s, d in plain.items()}
    for table, how in ((plain, "demangled"), (nop, "demangled")):
        hit = _unique([s for s, d in table.items() if d == name and _entry(s)])
        if hit:
            return Resolved(hit, f"{name!r} is {hit!r} ({how} {plain[hit]!r})")
    clones = sorted(s for s in syms if _entry(s) and s != name
                    and (_base(s) == name or _base(nop[s]) == name))
    if len(clones) == 1:
        return Resolved(clones[0], f"{name!r} is the compiler's clone {clones[0]!r}")
    prefixed = sorted(s for s in syms if _entry(s)
                      and (s.startswith(name) or plain[s].startswith(name)))
    if len(prefixed) == 1 and not clones:
        return Resolved(prefixed[0], f"{name!r} taken as {prefixed[0]!r} (the only function "
                                     "whose name starts with it)")
    close = clones or prefixed[:10]
    if not close:
        by_shown = {plain[s]: s for s in syms}
        close = [by_shown[d] for d in difflib.get_close_matches(name, list(by_shown), 8, 0.5)]
    hint = ", ".join(s if plain[s] == s else f"{s} ({plain[s]})" for s in close)
    if clones or prefixed:
        raise FunctionNotFound(f"{name!r} is ambiguous in {binary}: {hint}")
    if not syms:
        raise FunctionNotFound(f"no function {name!r} in {binary}: it has no function symbols "
                               "(stripped?)")
    if hint:
        raise FunctionNotFound(f"no function {name!r} in {binary}; closest: {hint}")
    largest = sorted(syms, key=lambda s: -syms[s][1])[:8]
    raise FunctionNotFound(f"no function {name!r} in {binary}; its largest functions: "
                           + ", ".join(s if plain[s] == s else f"{s} ({plain[s]})"
                                       for s in largest))
