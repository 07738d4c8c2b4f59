"""Forms outside what Palmed measures, and how they still join the model.

Palmed's kernels assume that copies of a form run independently. Forms whose every kernel is
a dependence chain (implicit or fixed registers read and written, the flags of ADC, shifts by
CL) break that assumption, and a few forms of real code cannot be measured at all (LEAVE).
``modelable`` sorts the catalogue's forms and says why each one is left out; the chain forms
come back as approximations on a resource of their own (``add_chain_forms``), the
unmeasurable ones as the forms they do the work of (``add_decomposed_forms``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from cpumap.isa import transition, x86
from cpumap.measure.asmgen import parse_canonical
from cpumap.model import resmodel


def modelable(forms: pd.DataFrame, names: list[str]) -> tuple[list[str], dict[str, str]]:
    """Forms Palmed can model, and the reason for each one left out.

    A resource model describes dependency-free throughput. Forms that write registers
    implicitly (RDX:RAX of MUL and DIV, ...) or read and write the flags (ADC, RCL) form a
    dependence chain in every kernel that contains them, so their cycles are a latency, and
    in company they can even fault (MUL leaves RDX:RAX such that DIV overflows): they stay out.
    """
    info = forms.set_index("name")
    kept, left = [], {}
    for n in names:
        row = info.loc[n]
        implicit = json.loads(row.implicit) if row.implicit else []
        # RSP of pushes and pops: the stack engine renames it, and the generator restores it
        # around each loop body (asmgen.stack_frame): no chain
        written = [r for r, acc in implicit if "w" in acc and r != "RSP"]
        # an operand fixed to a register that the form reads and writes (the accumulator
        # forms ADD AL,imm8 ..., XCHG r32,EAX): no generator can give each instance its own,
        # so every kernel is a chain through it (ADD_AL_I8 1 cycle alone on Zen 4, 4 a cycle
        # as ADD r8,imm8) and, as a basic instruction, it defined a "resource" that any form
        # writing RAX in the same kernel broke (measured 2x faster than predicted)
        fixed = [o["cls"] for o in transition.operands(row.operands)
                 if o.get("kind") == "fixed" and set(o.get("access", "")) >= {"r", "w"}]
        if written:
            left[n] = f"writes {'/'.join(written)} implicitly (dependence chain)"
        elif fixed:
            left[n] = f"reads and writes {'/'.join(fixed)}, a fixed operand (dependence chain)"
        elif bool(row.reads_flags) and bool(row.writes_flags):
            left[n] = "reads and writes the flags (dependence chain)"
        elif x86.shifts_by_cl(n):
            # a count of 0 leaves the flags unchanged, so the flags output depends on the flags
            # input (iced-x86 lists no flags read): a chain through the flags, and CMOVcc after
            # it measured 125x slower than both forms in sequence on Zen 4
            left[n] = "shift or rotate by CL: keeps the flags on a zero count (dependence chain)"
        else:
            kept.append(n)
    return kept, left


#: The end of ``modelable``'s reason for a form whose kernels are latency-bound chains.
CHAIN = "(dependence chain)"


def add_chain_forms(model: resmodel.ResourceModel, left: Mapping[str, str],
                    measure: Callable[[list[str]], list[float]],
                    log: Callable[[str], None]) -> dict[str, str]:
    """Forms left out of Palmed as dependence chains (MUL/DIV's RDX:RAX, ADC's flags, shifts
    by CL), added to the model as approximations: each on a resource of its own, used for
    its measured singleton cycles.

    In a kernel of copies of such a form every copy waits for the previous one, so its
    singleton is a latency; a resource of that size says "one chain link per instance, in
    parallel with everything else", right for the chain itself, blind to the ports the form
    shares with others, and wrong where two chain forms feed each other. Hence approximate:
    ``provenance.approximate`` names each form and why, and every prediction of a kernel
    that holds one says so. Forms whose singleton did not measure stay not modelled.
    """
    chains = sorted(f for f, why in left.items() if why.endswith(CHAIN))
    out: dict[str, str] = {}
    if not chains:
        return out
    for form, cycles in zip(chains, measure(chains), strict=True):
        if not (cycles > 0 and math.isfinite(cycles)):
            continue
        resource = resmodel.CHAIN + form
        model.resources.append(resource)
        model.rho[form] = {resource: float(cycles)}
        out[form] = (f"{left[form]}: predicted from its own measured cycles "
                     f"({cycles:.3f}) on a resource of its own")
    model.provenance["approximate"] = {**model.approximate, **out}
    log(f"approximate (dependence chains, their measured cycles): {len(out)} forms")
    return out


#: Forms the harness cannot measure, predicted as the forms they do the work of (what the
#: CPU's documentation says they decode to): LEAVE is ``mov %rbp, %rsp; pop %rbp``.
DECOMPOSED = {"LEAVE": ("MOV_R64_R64", "POP_R64"), "LEAVE_OPC9": ("MOV_R64_R64", "POP_R64")}


def add_flags_chain(model: resmodel.ResourceModel, forms: pd.DataFrame,
                    singletons: Mapping[str, float], tol: float,
                    log: Callable[[str], None]) -> dict[str, float]:
    """The chain through the flags, recorded in the model for its predictions
    (``provenance.flags_chain``, read by ``resmodel.flags_chain``).

    A form that writes part of the status flags may have to merge its result with the flags
    before it (``ROL r64, imm8`` writes CF and OF: 0.98 cycles a copy alone on Cascade Lake,
    0.50 beside ADD), so in a loop of such forms every copy waits for the previous one,
    unless a form that writes all of them and reads none (``breaks_flags`` in the catalogue:
    ADD, CMP, ...) runs in between. Palmed's resources cannot say that: a resource the size
    of the chain slows the kernels that break it, one the size of the ports misses the chain
    (``ROL_R64_I8*4`` 3.91 cycles measured, 2.21 predicted). So the model keeps both: the
    resources, and the *links*, forms whose kernel alone is slower than their resources by
    more than twice the noise, each with its time alone (a link of the chain); a kernel
    without a breaker takes at least the sum of its links. Which partial writers chain is
    the host's (INC writes all but CF and runs 4 a cycle alone on Cascade Lake): the
    measurement decides, the flags only say who may. The chain forms outside Palmed that
    read and write the flags (ADC, shifts by CL) are links of their measured time.
    """
    info = forms.set_index("name")
    flags = {f: (bool(info.at[f, "writes_flags"]), bool(info.at[f, "breaks_flags"]))
             for f in model.rho if f in info.index}
    breakers = sorted(f for f, (_, breaks) in flags.items() if breaks)
    links: dict[str, float] = {}
    for f, (writes, breaks) in sorted(flags.items()):
        if not writes or breaks:
            continue
        chain = sum(v for r, v in model.rho[f].items() if r.startswith(resmodel.CHAIN))
        bound = max((v for r, v in model.rho[f].items() if not r.startswith(resmodel.CHAIN)),
                    default=0.0)
        alone = chain if chain > 0 else singletons.get(f, math.nan)
        if math.isfinite(alone) and alone > bound * (1 + 2 * tol) + 1e-12:
            links[f] = float(alone)
    if links:
        model.provenance["flags_chain"] = {"links": links, "breakers": breakers}
    log(f"flags chain: {len(links)} links ({', '.join(list(links)[:6])}"
        f"{' ...' if len(links) > 6 else ''}), {len(breakers)} forms that break it")
    return links


def add_decomposed_forms(model: resmodel.ResourceModel) -> dict[str, str]:
    """Unmeasurable forms of real code (``DECOMPOSED``) whose parts the model holds: their
    uses are the parts' summed, ``provenance.approximate`` says so. Without them a block with
    a function epilogue could not be predicted at all."""
    out = {}
    for form, parts in DECOMPOSED.items():
        if form in model.rho or not all(p in model.rho for p in parts):
            continue
        uses: dict[str, float] = {}
        for part in parts:
            for r, v in model.rho[part].items():
                uses[r] = uses.get(r, 0.0) + v
        model.rho[form] = uses
        out[form] = f"not measurable here; predicted as {' + '.join(parts)}"
    model.provenance["approximate"] = {**model.approximate, **out}
    return out


def add_issue_width(model: resmodel.ResourceModel, meas: Mapping[str, float],
                    singletons: Mapping[str, float], tol: float,
                    log: Callable[[str], None]) -> dict[str, Any]:
    """The host's issue width, recorded in the model for its predictions
    (``provenance.issue``, read by ``resmodel.issue_width``): the rate of the fastest form
    alone, in instructions a cycle, where no kernel the build measured ran faster than that
    by more than ``tol``.

    Why the condition: a front end that caps every kernel caps the fastest forms alone
    (``NOP``, the moves and zero idioms renaming removes: 6 a cycle on the Emerald
    Rapids-class guest) and every mix of them with the rest at the same rate. Where some mix
    runs faster than any form alone, the fastest form's limit is its ports, and nothing
    measured says how fast kernels mixing more kinds run: no bound then (a simulated core
    without a front end). Why the form alone and not the fastest kernel: the kernels of a
    few instructions that ran fastest are the least certain (on that guest, default run of
    2026-12-06: 10 of its 78,000 measured kernels at 6.04-6.20 a cycle, four instructions
    each, 100 at 6.00 or more; the fastest form alone 5.999).
    """
    alone = [(-1.0 / t, f) for f, t in singletons.items()
             if f in model.rho and math.isfinite(t) and t > 0]
    if not alone:
        return {}
    neg, form = min(alone)
    width = -neg
    best, best_text, over = 0.0, "", 0
    for text, m in meas.items():
        if not (math.isfinite(m) and m > 0):
            continue
        rate = sum(parse_canonical(text).values()) / m
        over += rate > width
        if rate > best:
            best, best_text = rate, text
    if best > width * (1 + tol):
        log(f"issue width: none (a measured kernel ran {best:.4g} instructions a cycle, "
            f"{best_text}; the fastest form alone {width:.4g}, {form})")
        return {}
    record = {"width": width, "form": form, "fastest_kernel": best_text,
              "fastest_rate": best, "over": over}
    model.provenance["issue"] = record
    log(f"issue width: {width:.4g} instructions a cycle ({form} alone); the fastest measured "
        f"kernel {best:.4g} ({best_text}), {record['over']} measured kernels above the width")
    return dict(record)
