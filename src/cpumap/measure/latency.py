"""Latencies of instruction forms, uops.info style: one dependence chain per (input -> output).

A *chain* is a block of ``LINKS`` instances of one form in which every instance reads, through
the operand pair measured, what the previous one wrote; the block is measured as written
(:mod:`cpumap.measure.blockgen`: the harness's n/2n loops, registers at ``BLOCK_INIT``, pages
mapped on first touch), so its cycles per link are the latency of that pair: a chain has no
parallelism to hide it, and the other inputs are registers no instance writes. Rows go to the
database like every measurement (kernel text ``BLOCK:<hex>``).

Pairs, for a form of the catalogue (instances built by the generator's own
``x86.instantiate`` from the form's operands, never from text):

* ``Rk->Rk``: an operand read and written (the destination of two-operand forms);
* ``Ri->Rk``: a register read and a register written of the same class (three-operand VEX
  forms), the other sources on registers no instance writes (never the same register as the
  chain's, which would make ``vpxor %ymm0, %ymm0, %ymm0`` a zero idiom);
* ``implicit``: a register the form reads and writes implicitly or through an operand the
  encoding fixes (MUL's RAX, ``add $1, %al``), its explicit operands kept off the chain;
* ``flags->flags``: a form that reads and writes the flags and has no register chain (CMC);
* ``mem->mem (through memory)``: a read-modify-write of memory, every instance on the same
  address (``add %rcx, (%rbx)``): load, operation, store and forwarding to the next load;
* ``mem->Rk (load-use)``: a plain load (MOV, MOVZX, MOVSX from memory into a 32/64-bit
  register) whose address register is its destination: a pointer chase, the fill of every
  mapped page being ``BLOCK_INIT`` itself;
* ``store->load``: a 64-bit store followed by the reload of the same address, the round trip
  through store-to-load forwarding (other stores of 64 bits or more: that reload and a move
  back to the stored register's class close their chain);
* pairs across register classes (``vmovq %xmm0, %rax``, compares into the flags or a mask
  register, a vector load's address into its data) and the address -> output of loads whose
  value is no address: a round trip closed by canonical moves (and ``and $0; add`` back to
  the address), :mod:`cpumap.measure.roundtrip`, which also says how a round trip is shared
  out.

A form with none of these (stores, forms with nothing read and written) gets a reason
instead; ``latency_rows`` reports it as such.
"""

from __future__ import annotations

from collections.abc import Iterable

from cpumap.isa import x86
from cpumap.measure import roundtrip
from cpumap.measure.chainregs import (
    LINKS,
    Chain,
    build_regs,
    implicit_rw,
    label,
    repeated,
    swapped,
)

__all__ = ["LINKS", "MEMORY_FORMS", "Chain", "chains", "latency_rows"]

#: The forms whose chains give the loop predictor its memory latencies: load-use and the
#: store-forwarding round trip.
MEMORY_FORMS = ("MOV_R64_M64", "MOV_M64_R64")
#: Plain loads whose destination can be their own address (a pointer chase).
_LOADS = {"MOV", "MOVZX", "MOVSX", "MOVSXD"}
#: The pair text of a read-modify-write chain through memory (the loop predictor's key).
THROUGH_MEMORY = "(through memory)"


def chains(name: str, cat) -> tuple[list[Chain], str]:
    """The chains of form ``name`` of the catalogue ``cat`` (module docstring), or none and
    why."""
    if name not in cat.by_name or cat.by_name[name].status != "ok":
        return [], f"{name} is not an ok form of the catalogue"
    spec, mnemonic = cat.spec(name), cat.by_name[name].mnemonic
    ops = spec.operands
    regs_ops = [k for k, o in enumerate(ops) if o.kind == "reg"]
    writes = [k for k in regs_ops if "w" in ops[k].access]
    reads = [k for k in regs_ops if "r" in ops[k].access]
    mem = [k for k, o in enumerate(ops) if o.kind == "mem"]
    base = "RBX" if not any(r == "RBX" for r, _a in spec.implicit) else "RSI"
    out: list[Chain] = []
    for w in writes:
        for r in reads:
            if ops[r].cls != ops[w].cls or (r != w and ops[w].access == "rw"):
                continue
            swap = r != w  # a write-only output: alternate two registers
            regs = build_regs(spec, {r, w}, swap)
            if regs is None or base.lower() in {str(x).lower() for x in regs if x}:
                continue
            pair = f"{label(spec, r)}->{label(spec, w)}"
            try:
                if swap:
                    two = (x86.encode(x86.instantiate(spec, regs, 0, base=base))
                           + x86.encode(x86.instantiate(spec, swapped(spec, regs, {r, w}), 0,
                                                        base=base)))
                    code = two * (LINKS // 2)
                else:
                    code = repeated(spec, regs, base)
                out.append(Chain(name, pair, code, LINKS))
            except x86.FormError:
                continue
    # registers read and written that the encoding fixes (MUL's RAX, ADD_RAX_I32's RAX)
    own_rw = sorted(implicit_rw(spec) | {x86.full_register(o.cls) for o in ops
                                         if o.kind == "fixed" and o.access == "rw"})
    if not out and own_rw:
        regs = build_regs(spec, set())
        if regs is not None:
            out.append(Chain(name, f"implicit {'/'.join(own_rw)}",
                             repeated(spec, regs, base), LINKS))
    if not out and spec.reads_flags and spec.writes_flags and not mem:
        regs = build_regs(spec, set())
        if regs is not None:
            out.append(Chain(name, "flags->flags", repeated(spec, regs, base), LINKS))
    if mem and ops[mem[0]].access == "rw":
        # a read-modify-write of one address: each instance loads what the previous stored
        regs = build_regs(spec, set())
        if regs is not None:
            out.append(Chain(name, f"{ops[mem[0]].label}->{ops[mem[0]].label} "
                                   f"{THROUGH_MEMORY}", repeated(spec, regs, base), LINKS))
    if mem and mnemonic == "LEA" and len(writes) == 1:
        w = writes[0]
        dst = x86.reg_name("GPR", ops[w].width, 0)
        regs = [dst if k == w else None for k in range(len(ops))]
        out.append(Chain(name, f"address->{label(spec, w)}",
                         repeated(spec, regs, x86.full_register(dst), 8), LINKS))
    # a pointer chase needs the whole address loaded: 32- or 64-bit loads (a 16-bit load of
    # BLOCK_INIT is 0x4000, below the lowest address a page can be mapped at)
    if mem and mnemonic in _LOADS and len(writes) == 1 and ops[writes[0]].cls == "GPR" \
            and ops[writes[0]].width >= 32 and ops[mem[0]].width >= 32 \
            and "w" not in ops[mem[0]].access:
        w = writes[0]
        dst = x86.reg_name("GPR", ops[w].width, 0)
        regs = [dst if k == w else None for k in range(len(ops))]
        out.append(Chain(name, f"{ops[mem[0]].label}->{label(spec, w)} (load-use)",
                         repeated(spec, regs, x86.full_register(dst)), LINKS))
    if name == roundtrip.STORE:
        forwarding = roundtrip.forwarding_chain(cat)
        if forwarding is not None:
            out.append(forwarding)
    out += roundtrip.cross_chains(name, cat)
    out += roundtrip.load_chains(name, cat, any("load-use" in c.pair for c in out))
    out += roundtrip.store_chains(name, cat)
    if out:
        return out, ""
    if mem and ops[mem[0]].access == "w":
        return [], "a store of an immediate, of fewer than 64 bits or of more than one " \
                   "register: its latency shows only in store-to-load forwarding (measured for " \
                   "MOV_M64_R64)"
    return [], "no input -> output pair: nothing read and written, across register " \
               "classes or through memory"


def latency_rows(measurer, cat, names: Iterable[str], stage: str = "latency") -> list[dict]:
    """Every chain of the forms measured; one row per chain, or one row with the reason for a
    form without a chain; a chain whose measurement failed is a failed row.

    A round-trip chain's row keeps the measured round trip (``round_trip``, cycles per link)
    and its latency is the round trip minus the shares of its back path: half the canonical
    round trip of a hub move, a REBASE form's own chain (measured here too, when not asked
    for)."""
    todo: list[Chain] = []
    rows: list[dict] = []
    for name in sorted(set(names)):
        got, why = chains(name, cat)
        if why:
            rows.append({"form": name, "pair": "", "latency": float("nan"), "status": "none",
                         "error": why, "kernel": "", "round_trip": float("nan")})
        todo += got
    own = {b: roundtrip.own_chain(b, cat) for b in sorted({b for c in todo for b in c.back})}
    extra = [c for c in own.values() if c is not None]
    texts = list(dict.fromkeys(c.text for c in todo + extra))
    measured = measurer.measure(texts, stage=stage) if todo else {}
    errors = measurer.errors([t for t in texts if t not in measured])
    share = {b: float(measured[c.text]) / c.links / (2 if c.split else 1)
             for b, c in own.items() if c is not None and c.text in measured}
    for c in todo:
        cyc = measured.get(c.text)
        trip = float(cyc) / c.links if cyc is not None else float("nan")
        error = "" if cyc is not None else errors.get(c.text, "no ok repetition")
        lost = [b for b in c.back if b not in share]
        if cyc is not None and lost:
            error = f"the own chain of {', '.join(lost)} (its share) was not measured"
        if error:
            lat = float("nan")
        elif c.split:
            lat = trip / 2
        else:
            lat = trip - sum(share[b] for b in c.back)
        rows.append({"form": c.form, "pair": c.pair, "latency": lat,
                     "status": "failed" if error else "ok", "error": error,
                     "kernel": c.text, "round_trip": trip if c.back or c.split
                     else float("nan")})
    return rows
