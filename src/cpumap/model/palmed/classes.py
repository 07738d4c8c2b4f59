"""Forms that behave alike: one representative refined and fitted for each class.

Why: a whole instruction set holds thousands of forms but far fewer behaviours (VADDPD,
VSUBPD, VMAXPD on one register width; the integer ALU's reg-reg forms...), and stage 7's cost
was every form against every resource the refinement adds, at every proportion, and an LP per
form in every fitting pass. Forms whose singleton and whose mixes with each saturating kernel
measured the same (within ``tol``, kernels of the same shape) are one *behaviour class*:
every form still meets every resource the refinement adds at the lightest proportion (its
use of that resource: what tells forms apart that the core's resources could not, such as a
μop on three ALU ports against one on four), but only the class's representative gets the
other proportions and an LP of its own, and the members take its uses.

The classes are recomputed from the measurements on every call (nothing but the
measurements is state), so a model rebuilt from the database comes out the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cpumap.measure.asmgen import parse_canonical
from cpumap.model.palmed.config import Kernel, Measurements, PalmedConfig
from cpumap.model.palmed.kernels import _text, mix


@dataclass
class Classes:
    """``rep_of``: form -> its representative (itself for representatives)."""

    rep_of: dict[str, str]
    members: dict[str, list[str]] = field(default_factory=dict)

    @property
    def reps(self) -> list[str]:
        return sorted(self.members)

    def of(self, form: str) -> str:
        return self.rep_of.get(form, form)


def _signature(form: str, saturating: Sequence[tuple[Mapping[str, int], float]],
               singletons: Mapping[str, float], meas: Measurements, cfg: PalmedConfig,
               full: int) -> tuple[tuple, list[float]] | None:
    """(shape, values) of a form's behaviour against the saturating kernels: the shape names
    each measured mix by (resource, proportion, instances of the form, scale of SK), the
    values are the singleton and those mixes' cycles; every proportion for the first ``full``
    resources, the lightest one for the others. None when a mix failed."""
    shape: list[tuple] = []
    values = [singletons[form]]
    for r, (sk, t_sk) in enumerate(saturating):
        for b, beta in (enumerate(cfg.betas) if r < full else
                        [(len(cfg.betas) - 1, cfg.betas[-1])]):
            base, k = mix(dict(sk), t_sk, form, singletons[form], beta, cfg.max_kernel)
            text = _text(k)
            if text not in meas:
                continue
            m = meas[text]
            if not (math.isfinite(m) and m > 0):
                return None
            first = next(iter(sk))
            shape.append((r, b, k[form] - base.get(form, 0), base[first] // sk[first]))
            values.append(m)
    return tuple(shape), values


def behaviour_classes(forms: Sequence[str], fixed: Sequence[str],
                      saturating: Sequence[tuple[Mapping[str, int], float]],
                      singletons: Mapping[str, float], meas: Measurements,
                      cfg: PalmedConfig, full: int | None = None) -> Classes:
    """Classes of ``forms`` alike against ``saturating``: every measured proportion of the
    first ``full`` resources (the core's, screened alike for all forms), the lightest one of
    the others (refinement). Greedy, in order, the ``fixed`` forms (basic instructions: their
    uses come from the core) first and always representatives; a form joins the first
    representative of the same shape whose values all lie within ``tol`` (relative) of its
    own."""
    full = len(saturating) if full is None else full
    tol = max(cfg.tol, 1e-9)
    fixed_set = set(fixed)
    order = [f for f in fixed if f in set(forms)] + sorted(set(forms) - fixed_set)
    by_shape: dict[tuple, tuple[list[str], list[np.ndarray]]] = {}
    rep_of: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    for f in order:
        sig = _signature(f, saturating, singletons, meas, cfg, full)
        joined = None
        if sig is not None:
            reps, vals = by_shape.setdefault(sig[0], ([], []))
            v = np.asarray(sig[1])
            if vals and f not in fixed_set:
                mat = np.vstack(vals)
                hit = np.flatnonzero(np.all(np.abs(mat - v) <= tol * np.minimum(mat, v),
                                            axis=1))
                joined = reps[int(hit[0])] if hit.size else None
            if joined is None:
                reps.append(f)
                vals.append(v)
        if joined is None:
            rep_of[f] = f
            members[f] = [f]
        else:
            rep_of[f] = joined
            members[joined].append(f)
    return Classes(rep_of, members)


def substituted(meas: Measurements, classes: Classes) -> dict[str, float]:
    """The measurements seen through the classes: every kernel holding a member also stands
    for the same kernel with the member's representative (where that was not measured
    itself), so that pairs and mixes measured with members inform the representatives."""
    out = dict(meas)
    if all(f == r for f, r in classes.rep_of.items()):
        return out
    for text, m in meas.items():
        k = parse_canonical(text)
        if all(classes.of(f) == f for f in k):
            continue
        sub: Kernel = {}
        for f, n in k.items():
            rep = classes.of(f)
            sub[rep] = sub.get(rep, 0) + n
        out.setdefault(_text(sub), m)
    return out
