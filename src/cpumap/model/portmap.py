"""Port mappings in PMEvo's "Mapping3" JSON format, and their exact optimal schedule.

A port mapping (DESIGN §8) says, for every instruction form, which μops it decodes to and, for
every μop, the set of execution ports able to execute it::

    {"kind": "Mapping3",
     "arch": {"insns": ["ADDSS", "BSR"], "ports": ["p0", "p1"]},
     "assignment": {"ADDSS": [["p0", "p1"]], "BSR": [["p1"]]}}

A mapping may also say how some forms decode while a *wide* form (a 512-bit one) is in the
kernel, as on Intel cores, where port 1 takes no vector μops while 512-bit μops are in flight::

    "wide": {"forms": ["VADDPD_ZMM"], "assignment": {"VADDPD_XMM": [["p0", "p5"]]}}

A kernel holding a form of ``wide.forms`` is scheduled with ``wide.assignment`` in place of
the forms' own μops (a simulated machine with that mode, for ``cpumap.model.palmed.wide``).
``wide`` may also be a list of such modes, in priority order: a kernel is scheduled in the
first whose forms it holds (``cpumap.model.palmed.states``).

Ports are fully pipelined (one μop per port per cycle), so the steady-state cycles of a kernel
(a multiset of forms, no dependencies) is the optimal fractional schedule of its μops on ports:

    minimise T  s.t.  every μop is split over its allowed ports, every port's load <= T.

By Hall's theorem / max-flow min-cut this equals ``max over port sets S`` of (number of μops
whose allowed ports all lie in S) / |S|. Only *closed* sets matter (S equal to the union of the
μop port sets it contains): any other S has the same numerator as its closure and a larger
denominator. That closed-set view is also the exact *resource model* of the mapping: one
resource per closed set S, and form i uses ``u_i(S) / |S|`` of it (``true_resource_model``).
It is how the simulated machine answers kernels fast; above ``MAX_SUBSET_PORTS`` ports the
number of subsets explodes and the LP is solved instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MAX_SUBSET_PORTS",
    "MappingError",
    "PortMapping",
    "load_mapping",
    "schedule_cycles",
    "synthetic_mapping",
    "true_resource_model",
    "validate_mapping",
    "wide_mode_mapping",
    "dirty_upper_mapping",
]

#: Up to this many ports, cycles come from the closed-subset formula (vectorised, exact).
MAX_SUBSET_PORTS = 14


class MappingError(ValueError):
    """A mapping file or object that is not a valid Mapping3 port mapping."""


def validate_mapping(obj: Any, source: str = "<mapping>") -> dict[str, Any]:
    """Check a Mapping3 object; return it unchanged, or raise MappingError naming source and key.

    Every form of ``arch.insns`` must have an assignment (a non-empty list of μops, each a
    non-empty list of known ports); assignments of unknown forms are rejected too, so that a
    typo cannot silently drop a form from the simulated machine.
    """
    def bad(key: str, why: str) -> MappingError:
        return MappingError(f"{source}: {key}: {why}")

    if not isinstance(obj, dict):
        raise bad("<root>", "expected a JSON object")
    if obj.get("kind") != "Mapping3":
        raise bad("kind", f"expected 'Mapping3', got {obj.get('kind')!r}")
    arch = obj.get("arch")
    if not isinstance(arch, dict):
        raise bad("arch", "missing or not an object")
    insns, ports = arch.get("insns"), arch.get("ports")
    if not isinstance(insns, list) or not all(isinstance(i, str) and i for i in insns):
        raise bad("arch.insns", "expected a list of non-empty strings")
    if not isinstance(ports, list) or not ports or not all(isinstance(p, str) for p in ports):
        raise bad("arch.ports", "expected a non-empty list of strings")
    if len(set(insns)) != len(insns):
        raise bad("arch.insns", "duplicate names")
    if len(set(ports)) != len(ports):
        raise bad("arch.ports", "duplicate names")
    assignment = obj.get("assignment")
    if not isinstance(assignment, dict):
        raise bad("assignment", "missing or not an object")
    port_set = set(ports)
    for name in insns:
        if name not in assignment:
            raise bad(f"assignment.{name}", "form of arch.insns without an assignment")
    for name, uops in assignment.items():
        if name not in set(insns):
            raise bad(f"assignment.{name}", "form not listed in arch.insns")
        if not isinstance(uops, list) or not uops:
            raise bad(f"assignment.{name}", "expected a non-empty list of μops")
        for k, uop in enumerate(uops):
            if not isinstance(uop, list) or not uop:
                raise bad(f"assignment.{name}[{k}]", "expected a non-empty list of ports")
            unknown = [p for p in uop if p not in port_set]
            if unknown:
                raise bad(f"assignment.{name}[{k}]", f"unknown port(s) {unknown}")
    wide = obj.get("wide")
    for k, mode in enumerate(wide if isinstance(wide, list) else [] if wide is None else [wide]):
        where = f"wide[{k}]" if isinstance(wide, list) else "wide"
        if not isinstance(mode, dict) or not isinstance(mode.get("forms"), list) \
                or not isinstance(mode.get("assignment"), dict):
            raise bad(where, "expected an object with a list 'forms' and an object "
                      "'assignment'")
        unknown = [f for f in [*mode["forms"], *mode["assignment"]] if f not in set(insns)]
        if unknown:
            raise bad(where, f"forms not listed in arch.insns: {unknown}")
        validate_mapping({"kind": "Mapping3", "arch": arch,
                          "assignment": {**assignment, **mode["assignment"]}},
                         f"{source}: {where}")
    return obj


def load_mapping(path: str | Path) -> dict[str, Any]:
    """Read and validate a Mapping3 JSON file (errors name the file and the offending key)."""
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise MappingError(f"{p}: not valid JSON: {exc}") from exc
    return validate_mapping(obj, str(p))


class PortMapping:
    """A validated mapping compiled for fast scheduling (closed-set loads, per-kernel cache)."""

    def __init__(self, mapping: Mapping[str, Any], source: str = "<mapping>") -> None:
        validate_mapping(dict(mapping), source)
        self.forms: list[str] = list(mapping["arch"]["insns"])
        self.ports: list[str] = list(mapping["arch"]["ports"])
        pidx = {p: k for k, p in enumerate(self.ports)}
        # μops of each form as port bit masks (duplicates kept: two μops = twice the work)
        self.uops: dict[str, list[int]] = {
            f: [sum(1 << pidx[p] for p in set(u)) for u in mapping["assignment"][f]]
            for f in self.forms
        }
        self._index = {f: k for k, f in enumerate(self.forms)}
        self._cache: dict[tuple[tuple[str, int], ...], float] = {}
        wide = mapping.get("wide")
        modes = wide if isinstance(wide, list) else [wide] if wide else []
        #: (forms whose presence switches the kernel to the mode's assignment, the mapping
        #: that schedules it) in priority order: the first mode whose forms the kernel holds
        self._wide = [(frozenset(m["forms"]),
                       PortMapping({"kind": "Mapping3", "arch": mapping["arch"],
                                    "assignment": {**mapping["assignment"],
                                                   **m["assignment"]}}, source))
                      for m in modes]
        #: the forms of every mode
        self.wide_forms: frozenset[str] = frozenset().union(*(f for f, _ in self._wide))
        self.closed: list[int] = []
        self._u: np.ndarray | None = None
        if len(self.ports) <= MAX_SUBSET_PORTS:
            self._compile_subsets()

    def _compile_subsets(self) -> None:
        masks = sorted({m for us in self.uops.values() for m in us})
        closed = set()
        # closed sets = unions of any family of μop masks; grow the union closure
        frontier = set(masks)
        closed |= frontier
        while frontier:
            new = {a | b for a in frontier for b in masks} - closed
            closed |= new
            frontier = new
        self.closed = sorted(closed, key=lambda m: (bin(m).count("1"), m))
        u = np.zeros((len(self.forms), len(self.closed)), dtype=np.float64)
        for fi, f in enumerate(self.forms):
            for si, s in enumerate(self.closed):
                u[fi, si] = sum(1 for m in self.uops[f] if m & ~s == 0)
        self._u = u
        self._size = np.array([bin(s).count("1") for s in self.closed], dtype=np.float64)

    def cycles(self, kernel: Mapping[str, int]) -> float:
        """Exact optimal cycles per kernel instance (cached per kernel)."""
        for forms, wide in self._wide:
            if any(n and f in forms for f, n in kernel.items()):
                return wide.cycles(kernel)
        key = tuple(sorted((f, int(n)) for f, n in kernel.items() if n))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        for f, _ in key:
            if f not in self._index:
                raise KeyError(f"form {f!r} is not in the mapping")
        if not key:
            value = 0.0
        elif self._u is not None:
            idx = [self._index[f] for f, _ in key]
            counts = np.array([n for _, n in key], dtype=np.float64)
            load = counts @ self._u[idx]
            value = float(np.max(load / self._size))
        else:
            value = self._lp_cycles(key)
        self._cache[key] = value
        return value

    def _lp_cycles(self, key: tuple[tuple[str, int], ...]) -> float:
        """The scheduling LP, for mappings with too many ports for the subset formula.

        Variables: x[u, p] >= 0 (share of μop class u sent to port p, only allowed ports) and T.
        Minimise T s.t. sum_p x[u, p] = count(u) for every μop class, sum_u x[u, p] <= T.
        """
        from scipy.optimize import linprog

        count: dict[int, float] = {}
        for f, n in key:
            for m in self.uops[f]:
                count[m] = count.get(m, 0.0) + n
        classes = sorted(count)
        var: list[tuple[int, int]] = [
            (ci, p) for ci, m in enumerate(classes) for p in range(len(self.ports)) if m >> p & 1
        ]
        nv = len(var) + 1
        c = np.zeros(nv)
        c[-1] = 1.0
        a_eq = np.zeros((len(classes), nv))
        a_ub = np.zeros((len(self.ports), nv))
        for k, (ci, p) in enumerate(var):
            a_eq[ci, k] = 1.0
            a_ub[p, k] = 1.0
        a_ub[:, -1] = -1.0
        res = linprog(c, A_ub=a_ub, b_ub=np.zeros(len(self.ports)), A_eq=a_eq,
                      b_eq=np.array([count[m] for m in classes]), bounds=(0, None),
                      method="highs")
        if res.status != 0:  # pragma: no cover - the LP is always feasible and bounded
            raise RuntimeError(f"scheduling LP failed: {res.message}")
        return float(res.x[-1])


_COMPILED: dict[int, tuple[Mapping[str, Any], PortMapping]] = {}


def _compiled(mapping: Mapping[str, Any] | PortMapping) -> PortMapping:
    if isinstance(mapping, PortMapping):
        return mapping
    hit = _COMPILED.get(id(mapping))
    if hit is not None and hit[0] is mapping:
        return hit[1]
    pm = PortMapping(mapping)
    _COMPILED[id(mapping)] = (mapping, pm)  # keeps the object alive, so the id stays unique
    return pm


def schedule_cycles(mapping: Mapping[str, Any] | PortMapping, kernel: Mapping[str, int]) -> float:
    """Optimal steady-state cycles of one instance of ``kernel`` (form -> count) on ``mapping``.

    Example of the Palmed paper: ADDSS on {p0, p1}, BSR on {p1}; 2xADDSS + BSR needs 1.5 cycles
    (three μops on two ports), while 2xBSR + ADDSS needs 2 (BSR alone saturates p1).
    """
    return _compiled(mapping).cycles(kernel)


def true_resource_model(mapping: Mapping[str, Any] | PortMapping) -> dict[str, Any]:
    """The exact resource model of a port mapping: one resource per closed port set.

    Returns ``{"resources": [...], "rho": {form: {resource: use}}}`` with resources named by
    their ports joined with '+'. Used by tests as the ground truth a fitted model should match.
    """
    pm = _compiled(mapping)
    if pm._u is None:
        raise ValueError("too many ports for the closed-set resource model")
    names = ["+".join(pm.ports[p] for p in range(len(pm.ports)) if s >> p & 1) for s in pm.closed]
    rho = {
        f: {names[si]: float(pm._u[fi, si] / pm._size[si])
            for si in range(len(names)) if pm._u[fi, si] > 0}
        for fi, f in enumerate(pm.forms)
    }
    return {"resources": names, "rho": rho}


def synthetic_mapping(n_ports: int = 8, n_forms: int = 100, seed: int = 0) -> dict[str, Any]:
    """A realistic random Mapping3: port groups like a real x86 core, forms of 1-3 μops.

    Ports are split like Skylake's: ALU ports (general integer, of which a subset also executes
    vector μops, one executes shuffles, one branches and holds the divider), two load ports, a
    store-data port and a store-address port shared with the loads. μop kinds are port sets
    drawn from those groups (1-4 ports each). The first forms are single-μop forms of every kind
    (real ISAs have them: plain ALU, load, shuffle...); the others combine 1-3 μops (load-op,
    read-modify-write, multi-μop vector forms) and a few unpipelined divisions (several μops
    on the divider port). Deterministic in (n_ports, n_forms, seed).
    """
    if n_ports < 5:
        raise ValueError("synthetic_mapping needs at least 5 ports")
    rng = np.random.default_rng(seed)
    ports = [f"p{k}" for k in range(n_ports)]
    n_load = 2 if n_ports >= 7 else 1
    n_sa = 1 if n_ports >= 8 else 0
    n_alu = n_ports - n_load - 1 - n_sa
    alu = ports[:n_alu]
    load = ports[n_alu:n_alu + n_load]
    store_data = [ports[n_alu + n_load]]
    store_addr = load + ports[n_alu + n_load + 1:n_alu + n_load + 1 + n_sa]
    vec = alu[:max(2, min(3, n_alu - 1))]
    kinds: dict[str, list[str]] = {
        "alu": alu[:4] if n_alu >= 4 else alu,
        "alu_wide": alu,
        "vec": vec,
        "vec_mul": vec[:2],
        "shuffle": [vec[-1]],
        "branch": [alu[0], alu[-1]],
        "div": [alu[0]],
        "load": load,
        "store_data": store_data,
        "store_addr": store_addr,
    }
    if n_alu > 4:
        kinds["alu_hi"] = alu[3:]
    # a few extra irregular kinds, as real cores have (e.g. p06 shifts, p15 LEA)
    for k in range(2):
        size = int(rng.integers(1, min(4, n_alu) + 1))
        kinds[f"misc{k}"] = sorted(rng.choice(alu, size=size, replace=False).tolist(),
                                   key=ports.index)
    names = sorted(kinds)
    weights = np.array([{"alu": 4, "vec": 3, "load": 3, "alu_wide": 2}.get(n, 1.0)
                        for n in names])
    weights = weights / weights.sum()
    assignment: dict[str, list[list[str]]] = {}
    insns = [f"FORM_{k:03d}" for k in range(n_forms)]
    for k, name in enumerate(insns):
        if k < len(names) and names[k] != "div":
            uops = [kinds[names[k]]]
        elif k % 29 == 7:  # unpipelined divide: 3-6 μops on the divider port (+ an ALU μop)
            uops = [kinds["div"]] * int(rng.integers(3, 7)) + [kinds["alu"]]
        else:
            n_uops = int(rng.choice([1, 2, 3], p=[0.35, 0.4, 0.25]))
            uops = [kinds[names[int(rng.choice(len(names), p=weights))]] for _ in range(n_uops)]
            if n_uops >= 2 and rng.random() < 0.3:  # store form: store-address + store-data
                uops = uops[:n_uops - 2] + [kinds["store_addr"], kinds["store_data"]]
        assignment[name] = [list(u) for u in uops]
    return {"kind": "Mapping3", "arch": {"insns": insns, "ports": ports},
            "assignment": assignment}


def wide_mode_mapping(mode: bool = True, states: int = 1) -> tuple[dict[str, Any], dict[str, int]]:
    """(Mapping3, vector lengths) of a small core with Intel's 512-bit mode (``mode``): beside
    a 512-bit form (``*Z*``), the narrow vector forms (``*X*``) leave port 1, as Intel cores'
    do while 512-bit μops are in flight. The machine of ``cpumap.model.palmed.wide``'s tests
    and of ``benchmarks/palmed_sim.py --wide``.

    ``states=2``: Cascade Lake's two states of the mode. A 512-bit FP form (``VADDZ``,
    ``VADDZM``, ``VFMAZ``) wakes the second FMA unit on port 5, which then takes the narrow
    FP μops (``VFMAX``, ``VMULX`` and ``VMULSX``, which adds one) too; beside the other
    512-bit forms (``VSHUFZ``, and ``VPADDZ``, which adds one) they have port 0 alone. A
    kernel holding both kinds is in the first state (measured: ``MULSD xmm`` runs 2 a cycle
    beside ``VADDPD zmm``, 1 beside
    ``VPADDQ zmm``)."""
    alu = ["p0", "p1", "p5", "p6"]
    forms = {"ADD": [alu], "IMUL": [["p1"]], "LOAD": [["p2", "p3"]],
             "ADDLOAD": [alu, ["p2", "p3"]], "SHL": [["p0", "p6"]],
             "VADDX": [["p0", "p1", "p5"]], "VSHUFX": [["p1", "p5"]], "VFMAX": [["p0", "p1"]],
             "VLOADX": [["p2", "p3"]], "VADDXM": [["p0", "p1", "p5"], ["p2", "p3"]],
             "VMULX": [["p0", "p1"], ["p5"]], "VADDZ": [["p0", "p5"]], "VFMAZ": [["p0"]],
             "VSHUFZ": [["p5"]], "VADDZM": [["p0", "p5"], ["p2", "p3"]]}
    if states == 2:
        forms |= {"VPADDZ": [["p0", "p5"]], "VMULSX": [["p0", "p1"]]}
    m: dict[str, Any] = {"kind": "Mapping3",
                         "arch": {"insns": sorted(forms), "ports": [*alu, "p2", "p3"]},
                         "assignment": forms}
    cold = {"VADDX": [["p0", "p5"]], "VSHUFX": [["p5"]], "VFMAX": [["p0"]],
            "VADDXM": [["p0", "p5"], ["p2", "p3"]], "VMULX": [["p0"], ["p5"]]}
    if mode and states == 2:
        m["wide"] = [{"forms": ["VADDZ", "VADDZM", "VFMAZ"],
                      "assignment": cold | {"VFMAX": [["p0", "p5"]], "VMULSX": [["p0", "p5"]],
                                            "VMULX": [["p0", "p5"], ["p5"]]}},
                     {"forms": ["VPADDZ", "VSHUFZ"], "assignment": cold | {"VMULSX": [["p0"]]}}]
    elif mode:
        m["wide"] = {"forms": ["VADDZ", "VADDZM", "VFMAZ", "VSHUFZ"], "assignment": cold}
    widths = {f: 512 if "Z" in f else 128 for f in forms if f.startswith("V")}
    return m, widths


def dirty_upper_mapping() -> tuple[dict[str, Any], dict[str, str]]:
    """(Mapping3, families) of a small core with Intel's dirty-upper state
    (``cpumap.model.palmed.dirty``): beside a 256-bit AVX form (``*_YMM*``) a legacy-SSE form
    (``families`` ``sse``) that writes an xmm register takes an extra merge μop on the FP
    pipes, p0 or p1 (``MOVSD_XMM_M64``, ``SHUFPD_XMM``, ``CVTDQ2PD_XMM``); ``ADDPD_XMM``
    reads its destination and needs none; the VEX.128 forms (``V*_XMM``, the 256-bit forms'
    twins) zero the upper halves and are in neither family. Measured on Cascade Lake:
    ``MOVSD xmm, m64`` x 4 2.0 cycles alone, 2.77 beside ``VADDPD ymm`` x 2, 2.01 beside
    ``VSHUFPD ymm`` x 2: alone, the merge μop hides beside the loads."""
    fp, alu, ld = ["p0", "p1"], ["p0", "p1", "p5", "p6"], ["p2", "p3"]
    forms = {"ADD": [alu], "LOAD": [ld], "SHL": [["p0", "p6"]], "IMUL": [["p1"]],
             "ADDPD_XMM": [fp], "MOVSD_XMM_M64": [ld], "SHUFPD_XMM": [["p5"]],
             "CVTDQ2PD_XMM": [fp, ["p5"]], "VADDPD_XMM": [fp], "VSHUFPD_XMM": [["p5"]],
             "VADDPD_YMM": [fp], "VSHUFPD_YMM": [["p5"]], "VCVTDQ2PD_YMM": [fp, ["p5"]],
             "VMOVUPD_YMM_M256": [ld]}
    dirty = {"MOVSD_XMM_M64": [ld, fp], "SHUFPD_XMM": [["p5"], fp],
             "CVTDQ2PD_XMM": [fp, ["p5"], fp]}
    trigger = sorted(f for f in forms if "YMM" in f)
    m: dict[str, Any] = {"kind": "Mapping3",
                         "arch": {"insns": sorted(forms), "ports": [*alu, *ld]},
                         "assignment": forms, "wide": {"forms": trigger, "assignment": dirty}}
    families = {f: "sse" for f in forms if f.endswith("XMM") and not f.startswith("V")
                or f == "MOVSD_XMM_M64"} | dict.fromkeys(trigger, "avx")
    return m, families
