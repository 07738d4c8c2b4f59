"""Forms that behave alike: one representative refined and fitted for each class.

Why: a whole instruction set holds thousands of forms but far fewer behaviours (VADDPD,
VSUBPD, VMAXPD on one register width; the integer ALU's reg-reg forms...), and stage 7's cost
was every form against every resource the refinement adds, at every proportion, and an LP per
form in every fitting pass. Forms whose singleton and whose mixes with each saturating kernel
measured alike (``_Reps.alike``: a member's mixes are its representative's, per unit of singleton
time, within half of ``tol``) are one *behaviour class*: every form still meets every
resource the refinement adds at the lightest proportion (its use of that resource: what
tells forms apart that the core's resources could not, such as a μop on three ALU ports
against one on four), but only the class's representative gets the other proportions and an
LP of its own, and the members take its uses (per unit of singleton time).

A failed mix is part of the key a class shares, not a reason to stand alone: every kernel a
host keeps apart (legacy SSE beside 256-bit AVX, 512-bit beside narrower vector forms) counts
as failed, and on the Sapphire Rapids-class guest half of the 6,143 forms have such mixes.

The classes are recomputed from the measurements on every call (nothing but the
measurements is state), so a model rebuilt from the database comes out the same.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cpumap.measure.asmgen import parse_canonical
from cpumap.model.palmed.config import NOISY_TOL, Kernel, Measurements, PalmedConfig
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


#: A member's singleton and mixes lie within this share of tol of its representative's
#: prediction. At the whole tol, forms of different uses joined under noise: a simulated
#: 10-port/300-form machine at 2 % noise (tol 3.5 x noise) went from 3.5 % to 4.7 % RMS
#: held-out error, members taking uses a few % off their own; at half of it 3.55 %.
CLASS_TOL = 0.5
#: Noisy measurements: a member may miss that prediction on this many of its mixes (a
#: neighbour's burst on one kernel), never by more than ``OUTLIER_TOLS`` times the class
#: tolerance. Native full profile, Sapphire Rapids-class guest, 6,143 forms against 24 core
#: resources (tol 0.05): 3,193 classes with none allowed, 1,874 with two.
NOISY_OUTLIERS = 2
OUTLIER_TOLS = 3.0


@dataclass
class _Behaviour:
    """A form's mixes on the grid (resource, proportion): measured cycles ``m`` (NaN where
    not measured or failed), the base SK^s alone ``mb`` (NaN where not measured), the form's
    instances ``n``."""

    t: float
    m: np.ndarray
    mb: np.ndarray
    n: np.ndarray
    key: tuple


def _behaviour(form: str, saturating: Sequence[tuple[Mapping[str, int], float]],
               singletons: Mapping[str, float], meas: Measurements, cfg: PalmedConfig,
               full: int) -> _Behaviour:
    """The measured mixes of ``form`` with ``saturating``, and its group key: which of the
    mixes every form has (the balanced proportion of the first ``full`` resources, the
    core's, measured for every form by the mapping stage; the lightest one of the others,
    measured for every form by refinement) were measured, and which of all failed.

    The lighter proportions of the core's resources are measured for representatives only
    (``fit_remaining``); they count where both forms have them, so a member never splits off
    for lacking them. A failed mix (a kernel that faulted, or one kept apart for an
    SSE/AVX or 512-bit mode switch: the same for every form of a family) is part of the key,
    not a reason to stand alone."""
    nb = len(cfg.betas)
    shape = (len(saturating), nb)
    m = np.full(shape, np.nan)
    mb = np.full(shape, np.nan)
    n = np.ones(shape)
    present: list[tuple[int, int]] = []
    failed: list[tuple[int, int]] = []
    for r, (sk, t_sk) in enumerate(saturating):
        required = 0 if r < full else nb - 1
        for b in (range(nb) if r < full else [nb - 1]):
            base, k = mix(dict(sk), t_sk, form, singletons[form], cfg.betas[b],
                          cfg.max_kernel)
            text = _text(k)
            if text not in meas:
                continue
            if b == required:
                present.append((r, b))
            v, vb = meas[text], meas.get(_text(base), math.nan)
            if not (math.isfinite(v) and v > 0):
                failed.append((r, b))
                continue
            m[r, b], n[r, b] = v, k[form] - base.get(form, 0)
            if math.isfinite(vb) and vb > 0:
                mb[r, b] = vb
    return _Behaviour(singletons[form], m, mb, n, (tuple(present), tuple(failed)))


class _Reps:
    """The representatives of one key, their singletons, mixes and rises per unit of
    singleton time stacked (grown by doubling: every form of the key is compared with all of
    them)."""

    def __init__(self, shape: tuple[int, int]) -> None:
        self.names: list[str] = []
        self.t = np.empty(8)
        self.m = np.empty((8, *shape))
        self.rise = np.empty((8, *shape))

    def add(self, name: str, b: _Behaviour) -> None:
        i = len(self.names)
        if i == len(self.t):
            self.t, self.m, self.rise = (np.concatenate([a, np.empty_like(a)])
                                         for a in (self.t, self.m, self.rise))
        self.names.append(name)
        self.t[i], self.m[i], self.rise[i] = b.t, b.m, (b.m - b.mb) / (b.n * b.t)

    def alike(self, f: _Behaviour, tol: float, outliers: int) -> str | None:
        """The first representative whose behaviour predicts ``f``'s, or None.

        A representative predicts a mix of f from its own rise over its SK^s, per unit of
        its singleton time: M(SK^s + f^n) ~ M(SK^s) + n t(f) (M_r - Mb_r) / (n_r t(r)). That
        is exact for forms of the same uses wherever the saturated resource stays the
        bottleneck, and does not ask both forms to have the same instance counts (forms of
        nearly the same singleton time get n and n + 1 instances in a mix)."""
        k = len(self.names)
        if not k:
            return None
        t, m, rise = self.t[:k], self.m[:k], self.rise[:k]
        # where either base SK^s was not measured, the representative's mix itself
        pred = np.where(np.isnan(rise) | np.isnan(f.mb), m, f.mb + f.n * f.t * rise)
        dev = np.abs(f.m - pred) / f.m
        dev = np.where(np.isnan(dev), 0.0, dev).reshape(k, -1)
        ok = (np.abs(t - f.t) <= tol * np.minimum(t, f.t)) \
            & (np.count_nonzero(dev > tol, axis=1) <= outliers) \
            & np.all(dev <= (OUTLIER_TOLS * tol if outliers else tol), axis=1)
        hit = np.flatnonzero(ok)
        return self.names[int(hit[0])] if hit.size else None


def behaviour_classes(forms: Sequence[str], fixed: Sequence[str],
                      saturating: Sequence[tuple[Mapping[str, int], float]],
                      singletons: Mapping[str, float], meas: Measurements,
                      cfg: PalmedConfig, full: int | None = None) -> Classes:
    """Classes of ``forms`` alike against ``saturating`` (``_behaviour``: every proportion
    of the first ``full`` resources, the core's, the lightest one of the others,
    refinement's). Greedy, in order, the ``fixed`` forms (basic instructions: their uses come
    from the core) first and always representatives; a form joins the first representative
    of the same key that predicts its singleton and its mixes within ``CLASS_TOL`` tol
    (``_Reps.alike``; noisy measurements: all but ``NOISY_OUTLIERS`` of them)."""
    full = len(saturating) if full is None else full
    tol = max(cfg.tol * CLASS_TOL, 1e-9)
    outliers = NOISY_OUTLIERS if cfg.tol >= NOISY_TOL else 0
    fixed_set = set(fixed)
    order = [f for f in fixed if f in set(forms)] + sorted(set(forms) - fixed_set)
    by_key: dict[tuple, _Reps] = {}
    rep_of: dict[str, str] = {}
    members: dict[str, list[str]] = {}
    for f in order:
        beh = _behaviour(f, saturating, singletons, meas, cfg, full)
        reps = by_key.setdefault(beh.key, _Reps(beh.m.shape))
        hit = None if f in fixed_set else reps.alike(beh, tol, outliers)
        if hit is None:
            reps.add(f, beh)
            rep_of[f] = f
            members[f] = [f]
        else:
            rep_of[f] = hit
            members[hit].append(f)
    return Classes(rep_of, members)


def through(k: Mapping[str, int], classes: Classes) -> Kernel:
    """The kernel with every member replaced by its representative."""
    sub: Kernel = {}
    for f, n in k.items():
        rep = classes.of(f)
        sub[rep] = sub.get(rep, 0) + n
    return sub


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
        out.setdefault(_text(through(k, classes)), m)
    return out
