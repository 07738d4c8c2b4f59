"""The resource model (DESIGN §8): abstract resources and each form's use of them.

A form i uses ``rho[i][r] >= 0`` cycles of resource r per instance; a kernel K (form i
``sigma(K, i)`` times) needs ``max_r sum_i sigma(K, i) * rho[i][r]`` cycles: every resource
can serve one unit per cycle and the most used one is the bottleneck.

File format (JSON, written atomically, keys sorted, floats rounded to ``DIGITS`` decimals so that
rebuilding a model from the same measurements gives a byte-identical file)::

    {
      "format": "cpumap-resource-model",
      "version": 1,
      "resources": ["R00", "R01", ...],           # order is meaningful (table columns)
      "rho": {"FORM": {"R00": 0.5, ...}, ...},     # zero uses are omitted
      "labels": {"R00": "ADD/SUB/XOR +9: 4 per cycle", ...},  # derived from rho (written,
                                                  # never read back: always recomputed)
      "provenance": {...},                        # free-form: machine, stages, kernels...
      "wide": {"trigger": ["VADDPD_ZMM_ZMM_ZMM", ...],   # optional: see below
               "rho": {"VADDPD_XMM_XMM_XMM": {"R03": 0.5}, ...},
               "next": [{"trigger": [...], "rho": {...}}, ...]}  # optional: more states
    }

``wide`` (hosts where it was measured, ``cpumap.model.palmed.wide``): in a kernel holding a
form of ``wide.trigger`` (a 512-bit form), a form of ``wide.rho`` uses those resources instead
of its own (Intel cores take no vector μops on port 1 while 512-bit μops are in flight).
``wide.next`` lists further states of the mode, consulted in order for a kernel holding no
trigger of the ones before (``cpumap.model.palmed.states``: on Cascade Lake a 512-bit FP form
wakes the second FMA unit, which then takes narrow FP μops too, and an integer one does not).

Resources of one form or one class alone are named by what holds them: ``chain:FORM``, a
dependence chain's (``cpumap.model.outside``), and ``own:FORM``, a unit a class of alike forms
holds longer than the ports it shares, named after the class's representative
(``cpumap.model.palmed.refit._owned``). The others are found by Palmed, not named by anyone:
``R14`` says nothing. Each gets a label from what defines it, the forms that saturate it
alone (``cpumap.model.labels.resource_labels``, re-exported here), so that a bottleneck
reads as "VADDPD/VPADDD/VMULPS +40: 2 per cycle"; a unit two classes hold together
(``refit._one_unit``: the divider) is named after the first.

A kernel without a form writing all the flags waits for its partial flags writers one after
the other (``ROL r64, imm8``): ``provenance.flags_chain`` (``cpumap.model.flagchain``) bounds
it from below beside the resources, and names the bottleneck ``chain:flags`` where it binds.
No kernel issues more instructions a cycle than the host's front end does: the issue width
measured by the build (``provenance.issue``, ``cpumap.model.issue``) bounds it from below as
well, named ``issue`` where it binds.

This module is on the prediction path of ``cpumap predict`` (bulk: thousands of kernels per
second, a command that starts in a fraction of a second): it imports nothing heavy at module
level, and :class:`Predictor` predicts from sparse uses in plain Python.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cpumap.isa import transition
from cpumap.measure.asmgen import interleave, parse_canonical
from cpumap.model import flagchain, issue
from cpumap.model.labels import CHAIN, OWN, mnemonic, private, resource_labels
from cpumap.store.files import write_json_atomic

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CHAIN",
    "DIGITS",
    "FORMAT",
    "OWN",
    "Predictor",
    "ResourceModel",
    "interacting",
    "load",
    "mnemonic",
    "predict",
    "private",
    "resource_labels",
    "save",
    "switching",
]

FORMAT = "cpumap-resource-model"
VERSION = 1
#: Decimals kept in files: far below measurement noise, and stable across rebuilds.
DIGITS = 9
@dataclass
class ResourceModel:
    """Resources, each form's use of them, and how the model was obtained."""

    resources: list[str]
    rho: dict[str, dict[str, float]]
    provenance: dict[str, Any] = field(default_factory=dict)
    #: {"trigger": [forms], "rho": {form: uses}, "next": [further states]} where the host
    #: has a 512-bit mode; else {}
    wide: dict[str, Any] = field(default_factory=dict)

    @property
    def wide_states(self) -> list[tuple[frozenset[str], Mapping[str, dict[str, float]]]]:
        """(trigger forms, uses) of each state of the mode in priority order, built again only
        when ``wide`` gets new lists (975 trigger forms on the full profile: ``predict`` asks
        for them on every kernel)."""
        states = [self.wide, *(self.wide.get("next") or [])] if self.wide else []
        key = tuple(id(s.get("trigger")) for s in states)
        memo = self.__dict__.get("_states_memo")
        if memo is None or memo[0] != key or memo[2] is not self.wide:
            built = [(frozenset(s.get("trigger") or ()), s.get("rho") or {}) for s in states]
            memo = self.__dict__["_states_memo"] = (key, built, self.wide)
        return memo[1]

    @property
    def wide_trigger(self) -> frozenset[str]:
        """The trigger forms of every state."""
        return frozenset().union(*(t for t, _ in self.wide_states))

    @property
    def wide_rho(self) -> Mapping[str, dict[str, float]]:
        """The first state's uses (the only state on most hosts)."""
        return self.wide.get("rho") or {}

    def uses_in(self, kernel: Mapping[str, int]) -> dict[str, Mapping[str, float]]:
        """The uses of each form of this kernel: ``rho``, or in a kernel holding a trigger
        form, the uses of the first state whose trigger it holds where that state has the
        form (KeyError for a form the model lacks). Only the kernel's forms: ``predict``
        calls it for every kernel."""
        wide: Mapping[str, dict[str, float]] = {}
        for trigger, uses in self.wide_states:
            if not trigger.isdisjoint(kernel):
                wide = uses
                break
        return {f: wide[f] if f in wide else self.rho[f] for f in kernel}

    @property
    def forms(self) -> list[str]:
        return sorted(self.rho)

    @property
    def approximate(self) -> dict[str, str]:
        """Forms modelled only approximately (dependence chains), each with why."""
        return dict(self.provenance.get("approximate") or {})

    @property
    def sse_avx(self) -> tuple[dict[str, str], float]:
        """(form -> family of the forms kept apart, cycles per switch) where the host was
        measured to pay for switching between legacy SSE and 256-bit AVX
        (``cpumap.measure.transition``); ({}, 0.0) where it does not."""
        rec = self.provenance.get("sse_avx_transition") or {}
        if not rec.get("penalty"):
            return {}, 0.0
        return dict(rec.get("families") or {}), float(rec.get("cycles_per_switch", 0.0))

    @property
    def flags_chain(self) -> tuple[dict[str, float], frozenset[str]]:
        """(links, breakers) of the chain through the flags (``cpumap.model.flagchain``), read
        again only when the provenance gets a new record (``predict`` asks on every kernel,
        and a full profile has thousands of breakers)."""
        rec = self.provenance.get("flags_chain")
        memo = self.__dict__.get("_chain_memo")
        if memo is None or memo[0] is not rec:
            memo = self.__dict__["_chain_memo"] = (rec, flagchain.read(self.provenance))
        return memo[1]

    @property
    def issue_width(self) -> float:
        """Instructions a cycle the host issues at most (``cpumap.model.issue``); 0.0 where
        the model has no such bound."""
        return issue.read(self.provenance)

    def validate(self) -> None:
        """Raise ValueError on unknown resources, negative or non-finite uses."""
        known = set(self.resources)
        if len(known) != len(self.resources):
            raise ValueError("duplicate resource names")
        for form, uses in [*self.rho.items(),
                           *(x for _, table in self.wide_states for x in table.items())]:
            for r, v in uses.items():
                if r not in known:
                    raise ValueError(f"form {form!r} uses unknown resource {r!r}")
                if not (math.isfinite(v) and v >= 0):
                    raise ValueError(f"form {form!r}: use of {r!r} must be finite and >= 0")
        unknown = sorted({f for t, table in self.wide_states for f in (*t, *table)}
                         - set(self.rho))
        if unknown:
            raise ValueError(f"wide: forms not in rho: {unknown[:5]}")

    def to_dict(self) -> dict[str, Any]:
        out = {"format": FORMAT, "version": VERSION, "resources": list(self.resources),
               "rho": _rounded(self.rho), "labels": resource_labels(self),
               "provenance": self.provenance}
        states = [{"trigger": sorted(t), "rho": _rounded(table)} for t, table in self.wide_states]
        if states:
            out["wide"] = states[0] | ({"next": states[1:]} if states[1:] else {})
        return out

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], source: str = "<model>") -> ResourceModel:
        if not isinstance(obj, Mapping) or obj.get("format") != FORMAT:
            raise ValueError(f"{source}: format: expected {FORMAT!r}")
        if obj.get("version") != VERSION:
            raise ValueError(f"{source}: version: expected {VERSION}, got {obj.get('version')!r}")
        for key, typ in (("resources", list), ("rho", dict)):
            if not isinstance(obj.get(key), typ):
                raise ValueError(f"{source}: {key}: missing or not a {typ.__name__}")
        wide = obj.get("wide") or {}
        states: list[Any] = []
        if wide:
            more = wide.get("next", []) if isinstance(wide, Mapping) else None
            states = [wide, *more] if isinstance(more, list) else [None]
            if not all(isinstance(s, Mapping) and isinstance(s.get("trigger", []), list)
                       and isinstance(s.get("rho", {}), Mapping) for s in states):
                raise ValueError(f"{source}: wide: expected {{'trigger': [...], 'rho': "
                                 "{...}, 'next': [...]}")
            states = [{"trigger": [str(f) for f in s.get("trigger", [])],
                       "rho": _floats(s.get("rho", {}))} for s in states]
        model = cls(resources=[str(r) for r in obj["resources"]],
                    rho=_floats(obj["rho"]), provenance=dict(obj.get("provenance") or {}),
                    wide=states[0] | ({"next": states[1:]} if states[1:] else {})
                    if states else {})
        try:
            model.validate()
        except ValueError as exc:
            raise ValueError(f"{source}: rho: {exc}") from exc
        return model

    def table(self) -> pd.DataFrame:
        """Readable mapping: one row per form, one column per shared resource, the form's
        private resource (``private``; at most one: a chain's or its class's own) and its use,
        the predicted cycles of the form alone, its bottleneck resource and that resource's
        label. (A column per private resource made the Zen 4 full model's table 889 columns
        wide, nearly all zeros.)"""
        import pandas as pd  # local: the prediction path never needs it

        labels = resource_labels(self)
        shared = [r for r in self.resources if not private(r)]
        rows = []
        for form in self.forms:
            row: dict[str, Any] = {"form": form}
            row.update({r: self.rho[form].get(r, 0.0) for r in shared})
            mine = [r for r in self.rho[form] if private(r)]
            row["private"] = ", ".join(mine)
            row["private_use"] = sum(self.rho[form][r] for r in mine)
            cyc, bott = predict(self, {form: 1})
            row["cycles"] = cyc
            row["bottleneck"] = bott
            row["bottleneck_label"] = labels.get(bott, "") if bott else ""
            rows.append(row)
        return pd.DataFrame(rows, columns=["form", *shared, "private", "private_use", "cycles",
                                           "bottleneck", "bottleneck_label"])


def _rounded(rho: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Uses as written to files: rounded to ``DIGITS``, zeros left out."""
    return {form: {r: round(float(v), DIGITS) for r, v in uses.items() if round(v, DIGITS) > 0}
            for form, uses in rho.items()}


def _floats(rho: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    return {str(f): {str(r): float(v) for r, v in uses.items()} for f, uses in rho.items()}


def predict(model: ResourceModel, kernel: Mapping[str, int] | str) -> tuple[float, str | None]:
    """Predicted cycles of one kernel instance and the bottleneck resource.

    ``kernel`` is a multiset (form -> count) or its canonical text. Unknown forms raise KeyError
    rather than being ignored: silently dropping an instruction would under-predict. Ties (within
    ``TIE`` relative: sums in another order differ in the last bits) go to the first resource
    in model order, so the answer does not depend on the order of the kernel's forms.
    """
    k = parse_canonical(kernel) if isinstance(kernel, str) else kernel
    for form in k:
        if form not in model.rho:
            raise KeyError(f"form {form!r} is not in the resource model")
    rho = model.uses_in(k)
    loads = {i: sum(n * rho[f].get(r, 0.0) for f, n in k.items())
             for i, r in enumerate(model.resources)}
    return _with_bounds(_bottleneck(loads, model.resources),
                        flagchain.cycles(*model.flags_chain, k),
                        issue.cycles(model.issue_width, k))


#: Loads within this relative distance of the largest tie for the bottleneck.
TIE = 1e-12


def _bottleneck(loads: Mapping[int, float], resources: list[str]) -> tuple[float, str | None]:
    """The largest load and its resource: the first in model order among the tied (the one
    tie rule of ``predict`` and ``Predictor``; ``loads`` maps resource index -> load)."""
    best = max(loads.values(), default=0.0)
    if best <= 0:
        return 0.0, None
    return best, resources[min(i for i, v in loads.items() if v >= best * (1 - TIE))]


def _with_bounds(bound: tuple[float, str | None], chain: float,
                 issued: float) -> tuple[float, str | None]:
    """The resources' bound, or the flags chain or the issue width where one is longer
    (a tie goes to the resource, then to the chain)."""
    for cycles, name in ((chain, flagchain.FLAGS), (issued, issue.ISSUE)):
        if cycles > bound[0] * (1 + TIE):
            bound = (cycles, name)
    return bound


def interacting(model: ResourceModel, kernel: Iterable[str]) -> bool:
    """Whether the kernel holds a pair of forms the model's build found interacting (slower
    together than in sequence: outside what a resource model predicts)."""
    return _holds_pair(_interacting_pairs(model), kernel)


def _interacting_pairs(model: ResourceModel) -> set[frozenset[str]]:
    return {frozenset(p) for p in model.provenance.get("interacting", [])}


def _holds_pair(pairs: set[frozenset[str]], kernel: Iterable[str]) -> bool:
    return bool(pairs) and any(frozenset(p) in pairs for p in combinations(sorted(kernel), 2))


class Predictor:
    """Fast repeated predictions with one model: ``predict`` without re-reading the model.

    Each form's non-zero uses as a tuple of (resource index, use), so a kernel costs a few
    additions per form: about a microsecond per form in plain Python, no array library to
    import. The answer is ``predict``'s (same sums in the same order, same tie rule).
    Building it for a 6,000-form model takes a fraction of a second (benchmarks/predict_speed.py).
    """

    def __init__(self, model: ResourceModel):
        self.model = model
        index = {r: i for i, r in enumerate(model.resources)}
        self.uses = {f: tuple((index[r], v) for r, v in u.items() if v > 0)
                     for f, u in model.rho.items()}
        self._states = [(trigger, {**self.uses, **{
            f: tuple((index[r], v) for r, v in u.items() if v > 0) for f, u in table.items()}})
            for trigger, table in model.wide_states]
        self._chain = model.flags_chain
        self._width = model.issue_width
        self.labels = resource_labels(model)
        self._pairs = _interacting_pairs(model)
        self._approximate = frozenset(model.approximate)
        self._sse_avx = model.sse_avx

    def switching(self, kernel: Mapping[str, int]) -> tuple[int, float]:
        """:func:`switching` of a multiset, the model's switching record read once."""
        return _switching(*self._sse_avx, kernel, None)

    def predict(self, kernel: Mapping[str, int]) -> tuple[float, str | None]:
        """Cycles per instance and bottleneck resource; KeyError names an unknown form."""
        load: dict[int, float] = {}
        table = self.uses
        for trigger, uses_there in self._states:
            if not trigger.isdisjoint(kernel):
                table = uses_there
                break
        for form, n in kernel.items():
            try:
                uses = table[form]
            except KeyError:
                raise KeyError(f"form {form!r} is not in the resource model") from None
            for i, v in uses:
                load[i] = load.get(i, 0.0) + n * v
        return _with_bounds(_bottleneck(load, self.model.resources),
                            flagchain.cycles(*self._chain, kernel),
                            issue.cycles(self._width, kernel))

    def interacting(self, kernel: Iterable[str]) -> bool:
        return _holds_pair(self._pairs, kernel)

    def wide_mode(self, kernel: Iterable[str]) -> bool:
        """Whether the kernel is predicted with the uses beside a 512-bit form
        (``model.wide``): it holds a trigger form."""
        return any(not trigger.isdisjoint(kernel) for trigger, _ in self._states)

    def approximate(self, kernel: Iterable[str]) -> list[str]:
        """The kernel's forms the model holds only approximately (``model.approximate``)."""
        return sorted(f for f in kernel if f in self._approximate) if self._approximate else []


def save(model: ResourceModel, path: str | Path) -> Path:
    """Write the model atomically (sorted keys, rounded floats: reproducible bytes)."""
    model.validate()
    return write_json_atomic(model.to_dict(), path)


def load(path: str | Path) -> ResourceModel:
    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not valid JSON: {exc}") from exc
    return ResourceModel.from_dict(obj, str(p))


def switching(model: ResourceModel, kernel: Mapping[str, int] | str,
              sequence: Iterable[str] | None = None) -> tuple[int, float]:
    """(switches between legacy SSE and 256-bit AVX per instance, their cycles) of a kernel
    run as a loop body: in ``sequence``'s order (a real block), else in the order the
    generator lays a multiset out (``asmgen.interleave``, what ``cpumap measure`` runs).
    (0, 0.0) on a host without the penalty: the resource bound is then the prediction."""
    return _switching(*model.sse_avx, kernel, sequence)


def _switching(fams: Mapping[str, str], cost: float, kernel: Mapping[str, int] | str,
               sequence: Iterable[str] | None) -> tuple[int, float]:
    if not fams:
        return 0, 0.0
    k = parse_canonical(kernel) if isinstance(kernel, str) else dict(kernel)
    n = transition.switches(list(sequence) if sequence is not None else interleave(k), fams)
    return n, n * cost
