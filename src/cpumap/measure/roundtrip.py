"""Latencies across register classes: chains closed by a second instruction (uops.info's
method), for the pairs no chain of one form can measure.

A form that reads a register of one class and writes another (``vmovq %xmm0, %rax``,
``vpcmpeqb %ymm1, %ymm0, %k0``, ``cmp %rcx, %rax`` into the flags, a vector load's address
into its data) cannot feed itself. Its chain is closed by a *back* path of canonical moves to
the input's class, and only the round trip is measured. Without counters, timing alone cannot
tell how a round trip splits between its two halves: every loop that crosses from one class
to another crosses back, so adding a constant to every move one way and taking it from every
move the other way changes no cycle count of any loop. cpumap fixes that freedom once per
class: the general-purpose registers are the hub, and for each other class (vector, mask, MMX,
the flags) the round trip of its two canonical moves (:data:`HUBS`) counts half for each.
Every other form's latency is its round trip with a canonical back path minus that path's
shares. A loop that crosses with any of these forms and back with any other gets the sum of
their figures, which is the round trip measured up to how the forms' own costs add.

A load whose value is no address (a narrow load, a conversion from memory, a load-op form)
is closed the same way into a general-purpose register and made the address again by
:data:`REBASE`, whose forms count their own chains' latencies.

Rows say so: the pair names its back path, the table keeps the measured round trip.
"""

from __future__ import annotations

from cpumap.isa import x86
from cpumap.measure.chainregs import (
    LINKS,
    Chain,
    banned_registers,
    build_regs,
    free_indices,
    implicit_rw,
    in_use,
    label,
    reg_index,
)

__all__ = ["FORWARDED", "HUBS", "REBASE", "STORE", "VECTOR_LOADS", "cross_chains",
           "forwarding_chain", "hub", "load_chains", "own_chain", "store_chains"]

#: Per class, the candidates (first ok one wins) for its canonical pair of moves:
#: (from a general-purpose register into the class, from the class into one).
HUBS: dict[str, tuple[tuple[str, str], ...]] = {
    "VEC": (("VMOVQ_XMM_R64", "VMOVQ_R64_XMM"), ("MOVQ_XMM_R64", "MOVQ_R64_XMM")),
    "K": (("KMOVQ_K_R64", "KMOVQ_R64_K"),),
    "MMX": (("MOVQ_MM_R64", "MOVQ_R64_MM"),),
    "FLAGS": (("TEST_R64_R64", "SETB_R8"),),
}
#: Loads into a vector register that keep the loaded low 64 bits (so the value, BLOCK_INIT
#: like every word of a mapped page, is a pointer again after the back move).
VECTOR_LOADS = {
    "MOVAPD", "MOVAPS", "MOVUPD", "MOVUPS", "MOVDQA", "MOVDQU", "LDDQU", "MOVQ", "MOVSD",
    "MOVDDUP", "MOVNTDQA", "VMOVAPD", "VMOVAPS", "VMOVUPD", "VMOVUPS", "VMOVDQA", "VMOVDQU",
    "VMOVDQA32", "VMOVDQA64", "VMOVDQU8", "VMOVDQU16", "VMOVDQU32", "VMOVDQU64", "VMOVQ",
    "VMOVSD", "VMOVDDUP", "VMOVNTDQA", "VLDDQU", "VBROADCASTSD", "VPBROADCASTQ",
    "VBROADCASTF128", "VBROADCASTI128", "VBROADCASTF64X2", "VBROADCASTI64X2",
    "VBROADCASTF32X4", "VBROADCASTI32X4", "VBROADCASTF64X4", "VBROADCASTI64X4",
    "VBROADCASTF32X8", "VBROADCASTI32X8"}
#: What makes any general-purpose value the load's address again: ``and $0`` (not a zero
#: idiom: it waits for its input) then ``add`` of a register that holds the sandbox address
#: (BLOCK_INIT); their shares are their own chains' latencies.
REBASE = ("AND_R64_I8", "ADD_R64_R64")
#: The canonical store and reload of the store-forwarding round trip; a store's chain is
#: closed by the reload (FORWARDED: half that round trip) and a move back to its register.
STORE, RELOAD = "MOV_M64_R64", "MOV_R64_M64"
FORWARDED = f"{RELOAD} forwarded"
_FLAGS = -1  # the pseudo-operand index of the flags


def _have(cat, *forms: str) -> bool:
    """Every one of ``forms`` is an ok form of the catalogue."""
    return all(f in cat.by_name and cat.ok(f) for f in forms)


def hub(cat, cls: str) -> tuple[str, str] | None:
    """The canonical (into, out of) moves of ``cls`` this catalogue has, or None."""
    for into, out in HUBS.get(cls, ()):
        if _have(cat, into, out):
            return into, out
    return None


def _step(cat, form: str, dst: int, src: int) -> bytes:
    """One canonical move: its output on register ``dst`` of its class, every input on
    ``src`` (``test %rax, %rax``)."""
    spec = cat.spec(form)
    regs = [x86.reg_name(o.cls, o.width, dst if "w" in o.access else src)
            if o.kind == "reg" else None for o in spec.operands]
    return x86.encode(x86.instantiate(spec, regs, 0))


def _back(cat, src_cls: str, src: int, dst_cls: str, dst: int, spare: int
          ) -> list[tuple[str, bytes]] | None:
    """Canonical moves from register ``src`` of ``src_cls`` to ``dst`` of ``dst_cls``,
    through the spare general-purpose register ``spare`` between two non-GPR classes."""
    if src_cls == "GPR":
        h = hub(cat, dst_cls)
        return None if h is None else [(h[0], _step(cat, h[0], dst, src))]
    h_out = hub(cat, src_cls)
    if h_out is None:
        return None
    if dst_cls == "GPR":
        return [(h_out[1], _step(cat, h_out[1], dst, src))]
    h_in = hub(cat, dst_cls)
    if h_in is None:
        return None
    return [(h_out[1], _step(cat, h_out[1], spare, src)),
            (h_in[0], _step(cat, h_in[0], dst, spare))]


def _gpr_fixed(op: x86.Operand) -> bool:
    """An operand the encoding fixes to a general-purpose register (``cmp $1, %rax``)."""
    return op.kind == "fixed" and x86.full_register(op.cls) in x86.GPR64


def _pairs(spec: x86.FormSpec) -> list[tuple[int, int]]:
    """(input operand, output operand) pairs across classes; ``_FLAGS`` stands for the flags
    where they are the only output (compares) or the only input (SETcc). A read-modify-write
    of memory or of an implicit register (MUL's RAX) has none: its own chain would run beside
    the one measured."""
    ops = spec.operands
    if implicit_rw(spec) or any(o.kind == "mem" and o.access == "rw" for o in ops):
        return []
    reads = [k for k, o in enumerate(ops) if o.kind == "reg" and "r" in o.access]
    writes = [k for k, o in enumerate(ops) if o.kind == "reg" and "w" in o.access]
    pairs = [(r, w) for w in writes for r in reads if ops[r].cls != ops[w].cls]
    if spec.writes_flags and not writes:
        fixed = [k for k, o in enumerate(ops) if _gpr_fixed(o) and o.access == "r"]
        pairs += [(r, _FLAGS) for r in reads + fixed]
    if spec.reads_flags and not reads:
        pairs += [(_FLAGS, w) for w in writes]
    return pairs


def _cls(spec: x86.FormSpec, k: int) -> str:
    if k == _FLAGS:
        return "FLAGS"
    op = spec.operands[k]
    return "GPR" if _gpr_fixed(op) else op.cls


def _index(spec: x86.FormSpec, regs: list, k: int) -> int:
    """The allocator index of operand ``k``'s register (0 for the flags)."""
    if k == _FLAGS:
        return 0
    op = spec.operands[k]
    if _gpr_fixed(op):
        return x86.GPR64.index(x86.full_register(op.cls))
    return reg_index(regs[k], op.cls, op.width)


def forwarding_chain(cat) -> Chain | None:
    """``mov %rax, (%rbx); mov (%rbx), %rax``: the store-to-load forwarding round trip (the
    loop predictor's figure for a reload of what an iteration stored)."""
    if not _have(cat, STORE, RELOAD):
        return None
    store = x86.encode(x86.instantiate(cat.spec(STORE), [None, "RAX"], 0, base="RBX"))
    load = x86.encode(x86.instantiate(cat.spec(RELOAD), ["RAX", None], 0, base="RBX"))
    return Chain(STORE, f"store->load (forwarding round trip with {RELOAD})",
                 (store + load) * LINKS, LINKS)


def own_chain(form: str, cat) -> Chain | None:
    """The chain that gives a back move its share: a hub move's canonical round trip (half
    each), the forwarding round trip (half for the reload), or a form's chain through its own
    register (REBASE)."""
    if form == FORWARDED:
        c = forwarding_chain(cat)
        return None if c is None else Chain(c.form, c.pair, c.code, c.links, split=True)
    for c in cross_chains(form, cat):
        if c.split:
            return c
    if form in REBASE:
        spec = cat.spec(form)
        regs = build_regs(spec, {0})
        if regs is not None:
            return Chain(form, f"{label(spec, 0)}->{label(spec, 0)}",
                         x86.encode(x86.instantiate(spec, regs, 0, imm=0)) * LINKS, LINKS)
    return None


def _load_chain(name: str, cat, spec: x86.FormSpec) -> Chain | None:
    """A load whose value is no address (a narrow load, a conversion, a load-op): its
    address into its output, closed by a move to a general-purpose register and REBASE."""
    ops = spec.operands
    mem = [k for k, o in enumerate(ops) if o.kind == "mem" and o.access == "r"]
    writes = [k for k, o in enumerate(ops) if o.kind == "reg" and "w" in o.access]
    if len(mem) != 1 or len(writes) > 1 or spec.implicit or not _have(cat, *REBASE):
        return None
    w = writes[0] if writes else (_FLAGS if spec.writes_flags else None)
    if w is None:
        return None
    regs = build_regs(spec, {w} if w != _FLAGS else set())
    if regs is None:
        return None
    free = free_indices("GPR", banned_registers(spec) | in_use(regs), True)
    cls = _cls(spec, w)
    # the address register: the output itself when it is a general-purpose register
    addr = _index(spec, regs, w) if cls == "GPR" else (free.pop(0) if free else None)
    if addr is None or len(free) < 2:
        return None
    pointer, spare = free[0], free[1]
    try:
        back = [] if cls == "GPR" else _back(cat, cls, _index(spec, regs, w), "GPR", addr,
                                              spare)
        if back is None:
            return None
        base = x86.reg_name("GPR", 64, addr)
        and_spec, add_spec = cat.spec(REBASE[0]), cat.spec(REBASE[1])
        rebase = (x86.encode(x86.instantiate(and_spec, [base, None], 0, imm=0))
                  + x86.encode(x86.instantiate(add_spec,
                                               [base, x86.reg_name("GPR", 64, pointer)], 0)))
        link = x86.encode(x86.instantiate(spec, regs, 0, base=base))
    except x86.FormError:
        return None
    forms = tuple(f for f, _ in back) + REBASE
    out = "flags" if w == _FLAGS else label(spec, w)
    return Chain(name, f"{ops[mem[0]].label}->{out} (load-use, round trip with "
                       f"{'+'.join(forms)})",
                 (link + b"".join(code for _, code in back) + rebase) * LINKS, LINKS,
                 back=forms)


def cross_chains(name: str, cat) -> list[Chain]:
    """The round-trip chains of form ``name`` (module docstring)."""
    spec, mnemonic = cat.spec(name), cat.by_name[name].mnemonic
    ops = spec.operands
    banned = banned_registers(spec)
    base = "RBX" if "RBX" not in banned else "RSI"
    gprs = free_indices("GPR", banned | {base}, True)
    # a hub move closed by its partner is its class's canonical round trip
    canonical = {pair for c in HUBS if (h := hub(cat, c)) for pair in (h, h[::-1])}
    out: list[Chain] = []
    for r, w in _pairs(spec):
        chain_ops = {k for k in (r, w) if k != _FLAGS}
        regs = build_regs(spec, chain_ops)
        if regs is None:
            continue
        used = in_use(regs)
        if base in used:
            continue
        spare = [i for i in gprs if x86.reg_name("GPR", 64, i) not in used]
        if not spare:
            continue
        src, dst = _index(spec, regs, w), _index(spec, regs, r)
        try:
            back = _back(cat, _cls(spec, w), src, _cls(spec, r), dst, spare[0])
            if back is None:
                continue
            link = x86.encode(x86.instantiate(spec, regs, 0, base=base))
        except x86.FormError:
            continue
        forms = tuple(f for f, _ in back)
        split = len(forms) == 1 and (name, forms[0]) in canonical
        side = {r: "flags" if r == _FLAGS else label(spec, r),
                w: "flags" if w == _FLAGS else label(spec, w)}
        out.append(Chain(name, f"{side[r]}->{side[w]} (round trip with {'+'.join(forms)})",
                         (link + b"".join(code for _, code in back)) * LINKS, LINKS,
                         back=() if split else forms, split=split))
    # a vector load's address into its data: a pointer chase closed by a move to the address
    mem = [k for k, o in enumerate(ops) if o.kind == "mem"]
    h = hub(cat, "VEC")
    if mnemonic in VECTOR_LOADS and h is not None and len(ops) == 2 and mem == [1] \
            and ops[0].kind == "reg" and ops[0].cls == "VEC" and ops[0].access == "w" \
            and ops[1].width >= 64 and not spec.implicit:
        regs = [x86.reg_name("VEC", ops[0].width, 0), None]
        try:
            link = x86.encode(x86.instantiate(spec, regs, 0, base="RAX"))
        except x86.FormError:
            return out
        out.append(Chain(name, f"{ops[1].label}->{label(spec, 0)} (load-use, round trip "
                               f"with {h[1]})",
                         (link + _step(cat, h[1], 0, 0)) * LINKS, LINKS, back=(h[1],)))
    return out


def load_chains(name: str, cat, chased: bool) -> list[Chain]:
    """The address -> output chain of a load that no pointer chase measures (``chased``:
    the form has one already)."""
    if chased:
        return []
    c = _load_chain(name, cat, cat.spec(name))
    return [c] if c is not None else []


def store_chains(name: str, cat) -> list[Chain]:
    """A store of one register, 64 bits or more, other than the canonical one: its register
    into memory, closed by the forwarded reload of the address and a move back to the stored
    register's class (``vmovupd %ymm0, (%rbx); mov (%rbx), %rax; vmovq %rax, %xmm0``)."""
    spec = cat.spec(name)
    ops = spec.operands
    mem = [k for k, o in enumerate(ops) if o.kind == "mem"]
    srcs = [k for k, o in enumerate(ops) if o.kind == "reg"]
    if name == STORE or len(mem) != 1 or ops[mem[0]].access != "w" or ops[mem[0]].width < 64 \
            or len(srcs) != 1 or "r" not in ops[srcs[0]].access or spec.implicit \
            or not _have(cat, STORE, RELOAD):
        return []
    src, cls = srcs[0], ops[srcs[0]].cls
    regs = build_regs(spec, {src})
    if regs is None:
        return []
    free = free_indices("GPR", banned_registers(spec) | in_use(regs) | {"RBX"}, True)
    index = reg_index(regs[src], cls, ops[src].width)
    g = index if cls == "GPR" else (free[0] if free else None)
    if g is None:
        return []
    try:
        link = x86.encode(x86.instantiate(spec, regs, 0, base="RBX"))
        reload = x86.encode(x86.instantiate(cat.spec(RELOAD),
                                            [x86.reg_name("GPR", 64, g), None], 0, base="RBX"))
        back = [] if cls == "GPR" else _back(cat, "GPR", g, cls, index, g)
    except x86.FormError:
        return []
    if back is None:
        return []
    forms = (FORWARDED, *(f for f, _ in back))
    return [Chain(name, f"{label(spec, src)}->{ops[mem[0]].label} (store, round trip with "
                        f"{'+'.join(forms)})",
                  (link + reload + b"".join(code for _, code in back)) * LINKS, LINKS,
                  back=forms)]
