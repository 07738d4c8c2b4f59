"""Palmed (Derumigny et al., CGO 2022): a resource model built from kernel timings alone.

The library is pure: every stage takes the measurements made so far (canonical kernel text ->
cycles per instance) and returns the kernels it still needs, or its result. The driver
(``cpumap.model.palmed_build``: ``build_model`` in one process, ``Build`` one stage per pipeline
job) runs the stages against any ``measure(kernels) -> cycles`` callback (the simulated
machine in tests, the native harness and the measurement DB in the pipeline). Nothing here
prints; progress goes to ``log``.

Stages (and why)
----------------
1. **Singletons** ``{i}``: ``t(i)``, the cycles of each form alone.
2. **Pairs in balanced proportions** ``a^m b^n`` with ``m t(a) ~ n t(b)``: when both parts alone
   take the same time, the pair takes ``max`` of them if a and b share nothing and their sum if
   they compete for the same resource; the *sharing* ``s = (M - max)/min`` in [0, 1] is
   the most informative single number about a pair. All pairs would be quadratic (as in
   Palmed); above ``max_pair_forms`` forms only the pairs among that many candidates spread
   over the singleton times are measured (``pair_candidates``), so the stage is bounded and
   the whole build grows linearly with the number of forms. ``select_pairs(probes=...)``
   limits it further to pairs with a probe set.
3. **Classes and basic instructions** (``select_basic``): forms with the same singleton time
   and the same sharing with every other form behave alike; one representative per class.
   The basic instructions are the simplest representatives (fewest conflicts, fastest).
4. **Core mapping** (``fit_core``): a cutting-plane loop over kernels of basic instructions
   only. The current core model predicts every core kernel; the most under-predicted one has a
   bottleneck resource the model lacks, so it becomes the *defining kernel* of a new resource.
   Its saturating kernel SK (the defining kernel scaled up) and the mixes ``SK + b^n`` for
   every basic b at a few proportions are measured, and one joint LP (``_core_lp``) refits
   all uses of all basic instructions. Ends when no core kernel is under-predicted, or at
   ``max_core_resources`` (the rest of ``max_resources`` is left to the refinement, the only
   stage that can give a form outside the basic set, e.g. a divider, a resource of its own).
5. **Saturating kernels** (``select_saturating``): one per resource, its defining kernel
   scaled to a common size.
6. **Mapping kernels** (``select_mapping_kernels``): every remaining form i against every
   saturating kernel, ``SK^s + i^n`` at proportions n t(i) / T(SK^s) in ``betas`` (balanced,
   then lighter so that the resource stays the bottleneck): ``len(betas) * |R|`` kernels per
   form, linear in the number of forms.
7. **Remaining forms** (``fit_remaining``): a small LP per form (``_form_lp``). Then a check of
   every measured kernel (singletons, pairs, mixes); a kernel the model under-predicts reveals a
   resource that no basic kernel saturates (e.g. a port only some non-basic forms use): it
   becomes a new resource, all forms are measured against its saturating kernel (``|forms|``
   x ``len(betas)`` kernels) and refitted. At most ``max_refine`` rounds. Noisy measurements
   end with one joint LP over every form's uses and every measured kernel (``_polish``): the
   per-form LPs see each other's errors only through fixed uses.
   Exact measurements (``tol < NOISY_TOL``): the per-form LPs run Gauss-Seidel (each sees the
   uses already refitted in the same pass), every mix stays designated to the resource its SK
   saturates, and each mix's increase ``M(SK^s + i^n) - M(SK^s)`` bounds ``n rho(i, r)`` from
   above (equality while r stays the bottleneck, so the smallest proportion wins). Without
   these, the refitted uses oscillated between passes (no bounds from the other forms' new
   uses, then crushed by them) and the refinement resources ended with no use at all: the
   10-port/300-form machine had 5.8% RMS error, now 0.00%.

The model predicts ``max_r sum_i sigma(K, i) rho(i, r)`` (``cpumap.model.resmodel.predict``).

Kernels no resource model explains
----------------------------------
A resource model is sub-additive: ``M(A + B) <= M(A) + M(B)``, so a pair's sharing is at most 1.
On hardware some pairs are slower together than in sequence, because the generated code makes
them depend on each other (flags: CMOVE after SHR by CL; registers: legacy-SSE writes merging
into registers that 512-bit forms wrote; memory ordering: a read-modify-write store among other
stores). On Zen 4, 89 of the 3,160 pairs of the quick set (ADD m64,r64 with MOVSD to memory: 5.2
cycles a pair, 2.0 for the two in sequence). Fitted, such kernels became defining kernels of
resources of which every form mixed with them got a phantom use (held-out IPC error 19.6%,
Kendall's tau 0.73). So pairs whose sharing exceeds ``1 + INTERACT_TOLS tol`` are *interacting*
(``interacting_pairs``), and a kernel holding one, or slower than ``1 + SUPERADD_TOLS tol``
times the sum of its forms' singletons, is left out of every LP and may not define a resource
(``_resource_like``); forms that interact come last among the basic instructions. Held-out
kernels that hold an interacting pair stay mispredicted: no resource model can predict them.
Two of the causes were then removed where they arise: the generator gives read-modify-writes
memory slots of their own (``asmgen`` layout 2: ADD m64,r64 + MOVSD m64,xmm now 2.0 cycles a
pair) and shifts by CL are not modelled (``modelling.modelable``); legacy-SSE forms stay slower
next to 512-bit forms whatever registers they use (ADDPD xmm 1.0 instead of 0.5 cycles with
disjoint write pools too): that one is the hardware's.

Every kernel is *built* from construction times (a resource's defining kernel comes with the
measured time it was derived from, SK^s takes s times that), never from a measurement of the
kernel it extends: a new resource's saturating kernel and all its mixes are chosen, and
measured, in one round (on hardware each round starts the harness ``bench.rounds`` times).

Noise (``tol >= NOISY_TOL``): upper bounds of the core and per-form LPs are soft (a penalised
slack), a form's bounds only come from kernels where it is a sizeable share (``MIN_SHARE``);
the form's singleton keeps its bottleneck within tol, unless the form's mixes with that
resource's saturating kernel bound its use below that (``_increase_bound``: a divider the core
has no resource for was forced onto the FP multiplier; left unexplained, its singleton makes
the refinement give it a resource of its own); the core adds a resource only for a gap
above 2 tol; refinement resources only come from singletons and balanced pairs, and a
refinement round is kept only if it lowers the misfit of singletons and pairs. Uses are still
estimated from differences of measurements (``M(SK + i^n) - M(SK)``), which amplify relative
noise by about ``T(SK) / (n t(i))``, and refinement rarely helps under noise, so the core must
find the resources: hence 28 basic instructions (with 16, 8% RMS at 2% noise; with 28, 4.9%).
Finally every form's model explains its own singleton (``_explained``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from cpumap.measure.asmgen import canonical, parse_canonical

__all__ = [
    "Basic",
    "Core",
    "PalmedConfig",
    "Step",
    "balanced",
    "fit_core",
    "fit_remaining",
    "interacting_pairs",
    "mix",
    "pair_candidates",
    "select_basic",
    "select_mapping_kernels",
    "select_pairs",
    "select_saturating",
    "singleton_kernels",
]

#: From this tolerance on, measurements are treated as noisy: inconsistent bounds are dropped.
NOISY_TOL = 0.01
#: Noisy per-form LPs: cost of exceeding an upper bound, relative to a tightness residual.
SOFT_UPPER = 3.0
#: Noisy refinement: a round must lower the misfit of singletons and pairs by this share.
REFINE_GAIN = 0.02
#: Refinement ignores under-predictions below this share whatever tol (exact measurements: LP
#: round-off left gaps of 1e-6, each turned into a useless resource and a measurement round).
REFINE_MIN_GAP = 1e-3
#: Noisy per-form LPs: upper bounds only from kernels where the form alone would take at least
#: this share of the measured time (elsewhere the other forms' modelled load, with its errors,
#: decides the bound: errors of a few % of a large load crushed the form's uses to zero).
MIN_SHARE = 0.25
#: Noisy per-form LPs: weight of the singleton's tightness against one mix kernel's.
SINGLETON_WEIGHT = 4.0
#: Two forms *interact* when their balanced pair's sharing exceeds 1 by more than this many tol
#: (the pair is slower than its two parts run one after the other: no resource model can say
#: that; see ``interacting_pairs``).
INTERACT_TOLS = 4.0
#: A kernel is *super-additive* when it takes more than (1 + this many tol) times the sum of its
#: forms' singleton times (``_resource_like``).
SUPERADD_TOLS = 2.0

Kernel = dict[str, int]
Measurements = Mapping[str, float]
Log = Callable[[str], None]


def _nolog(_: str) -> None:
    pass


@dataclass(frozen=True)
class PalmedConfig:
    """Knobs of the algorithm.

    ``tol`` is the relative tolerance on cycles used everywhere a measured and a predicted value
    are compared: set it to about 3x the relative measurement noise (1e-6 for exact simulated
    machines). ``betas`` are the proportions of the mapping kernels (see ``mix``).
    """

    tol: float = 0.02
    max_mult: int = 8
    max_basic: int = 28
    core_tests: int | None = None  # random kernels of basic instructions; None = 8 x |basic|
    sat_factor: float = 4.0  # saturating kernels take ~ sat_factor x the slowest basic form
    betas: tuple[float, ...] = (1.0, 0.25, 1.0 / 16)
    max_resources: int = 64
    max_refine: int = 6
    refine_batch: int = 4
    fit_rounds: int = 12
    max_kernel: int = 600  # instructions per kernel instance (the generator allows 1000/form)
    seed: int = 0
    max_pair_forms: int | None = 120  # pairs among at most this many forms (None: all)
    core_batch: int = 1  # resources the core may add per measurement round
    # resources the core may find (None: max_resources); the rest is left to the refinement,
    # which alone can give slow forms (dividers) a resource of their own
    max_core_resources: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"tol": self.tol, "max_mult": self.max_mult, "max_basic": self.max_basic,
                "core_tests": self.core_tests, "sat_factor": self.sat_factor,
                "betas": list(self.betas), "max_resources": self.max_resources,
                "max_refine": self.max_refine, "refine_batch": self.refine_batch,
                "fit_rounds": self.fit_rounds, "max_kernel": self.max_kernel,
                "seed": self.seed, "max_pair_forms": self.max_pair_forms,
                "core_batch": self.core_batch, "max_core_resources": self.max_core_resources}

    @property
    def core_cap(self) -> int:
        return min(self.max_resources, self.max_core_resources or self.max_resources)


# --------------------------------------------------------------------------- kernel helpers


def _text(k: Mapping[str, int]) -> str:
    return canonical(k)


def _scale(k: Mapping[str, int], s: int) -> Kernel:
    return {f: n * s for f, n in k.items()}


def _add(k: Mapping[str, int], form: str, n: int) -> Kernel:
    out = dict(k)
    out[form] = out.get(form, 0) + n
    return out


def _reduce(k: Mapping[str, int]) -> Kernel:
    g = 0
    for n in k.values():
        g = math.gcd(g, n)
    return {f: n // g for f, n in k.items()} if g > 1 else dict(k)


def singleton_kernels(forms: Sequence[str]) -> list[str]:
    """Stage 1: every form alone."""
    return [_text({f: 1}) for f in sorted(set(forms))]


def balanced(ta: float, tb: float, max_mult: int = 8) -> tuple[int, int]:
    """Coprime (m, n) <= max_mult with m*ta closest to n*tb (ties: smallest m + n).

    Balanced pairs make each part alone take about the same time, so the pair's time tells
    directly whether the two forms share their bottleneck (sum) or not (max).
    """
    best: tuple[float, int, int, int] | None = None
    for m in range(1, max_mult + 1):
        for n in range(1, max_mult + 1):
            if math.gcd(m, n) != 1:
                continue
            a, b = m * ta, n * tb
            err = abs(a - b) / max(a + b, 1e-300)
            key = (round(err, 12), m + n, m, n)
            if best is None or key < best:
                best = key
    assert best is not None
    return best[2], best[3]


def pair_kernel(a: str, ta: float, b: str, tb: float, max_mult: int = 8) -> Kernel:
    m, n = balanced(ta, tb, max_mult)
    return {a: m, b: n}


def select_pairs(singletons: Mapping[str, float], *, max_mult: int = 8,
                 probes: Sequence[str] | None = None) -> list[str]:
    """Stage 2: balanced pairs of all forms (or of every form with each probe form)."""
    forms = sorted(singletons)
    others = forms if probes is None else sorted(set(probes))
    out = set()
    for a in forms:
        for b in others:
            if a == b or (probes is None and b < a):
                continue
            out.add(_text(pair_kernel(a, singletons[a], b, singletons[b], max_mult)))
    return sorted(out)


def pair_candidates(singletons: Mapping[str, float], cap: int | None) -> list[str]:
    """The forms whose pairs are measured: all of them, or ``cap`` spread over singleton times.

    All pairs cost n(n-1)/2 kernels: 44,850 for 300 forms. Classes and basic instructions only
    need enough forms of every kind, so above ``cap`` forms the candidates are taken round-robin
    over the distinct singleton times (rounded to 2 %: forms of one μop kind share a time),
    fastest group first, names in order within a group. The pairs stage then costs at most
    cap(cap-1)/2 kernels whatever the number of forms, and every later stage is linear in the
    number of forms; a resource that no candidate reveals is found by the refinement stage.
    """
    forms = sorted(singletons)
    if cap is None or len(forms) <= cap:
        return forms
    groups: dict[float, list[str]] = {}
    for f in forms:
        key = round(math.log(singletons[f]) / math.log(1.02))
        groups.setdefault(key, []).append(f)
    queues = [groups[k] for k in sorted(groups)]
    out: list[str] = []
    depth = 0
    while len(out) < cap:
        for q in queues:
            if depth < len(q) and len(out) < cap:
                out.append(q[depth])
        depth += 1
    return sorted(out)


def sharing(a: str, b: str, singletons: Mapping[str, float], meas: Measurements,
            max_mult: int = 8) -> float | None:
    """(M - max(A, B)) / min(A, B) for the balanced pair (A = m t(a), B = n t(b)); None if the
    pair was not measured. 0: a and b share nothing; 1: they share their bottleneck."""
    k = pair_kernel(a, singletons[a], b, singletons[b], max_mult)
    m = meas.get(_text(k))
    if m is None or not math.isfinite(m):
        return None
    x, y = k[a] * singletons[a], k[b] * singletons[b]
    return (m - max(x, y)) / min(x, y)


def interacting_pairs(singletons: Mapping[str, float], meas: Measurements, tol: float,
                      max_mult: int = 8) -> set[frozenset[str]]:
    """Pairs of forms whose balanced pair is slower than both parts in sequence (sharing > 1).

    In a resource model a kernel never takes longer than its parts one after the other
    (``M(A + B) <= M(A) + M(B)``), so a sharing above 1 (+ ``INTERACT_TOLS`` tol) is not
    throughput but an interaction that the generated code creates between the two forms: a
    dependence through flags or registers (CMOVE after SHR by CL, legacy-SSE writes merging into
    registers that 512-bit forms wrote), or memory ordering (a read-modify-write store among
    other stores). See the module docstring for what they did to the model on Zen 4.
    """
    forms = sorted(singletons)
    out: set[frozenset[str]] = set()
    for i, a in enumerate(forms):
        for b in forms[i + 1:]:
            s = sharing(a, b, singletons, meas, max_mult)
            if s is not None and _interacts(s, tol):
                out.add(frozenset((a, b)))
    return out


def _interacts(s: float, tol: float) -> bool:
    """A pair's sharing above what a resource model allows (1), beyond the noise."""
    return s > 1 + INTERACT_TOLS * tol + 1e-6


def _resource_like(k: Mapping[str, int], m: float, singletons: Mapping[str, float], tol: float,
                   bad: set[frozenset[str]]) -> bool:
    """Whether a measured kernel can be explained by a resource model at all.

    Not when it holds an interacting pair of forms, nor when it is super-additive: slower than
    the sum of its forms' singleton times by more than ``SUPERADD_TOLS`` tol. Such kernels may
    not define a resource and stay out of every LP: fitted, they spread their extra time over
    the uses of every form mixed with them.
    """
    if any(frozenset(p) in bad for p in combinations(sorted(k), 2)):
        return False
    if not all(f in singletons for f in k):
        return True
    return m <= (1 + SUPERADD_TOLS * tol) * sum(n * singletons[f] for f, n in k.items()) + 1e-12


def _measured_like(meas: Measurements, text: str, k: Mapping[str, int],
                   singletons: Mapping[str, float], tol: float,
                   bad: set[frozenset[str]]) -> bool:
    """Measured (not failed), and explainable by a resource model (``_resource_like``)."""
    return _ok(meas, text) and _resource_like(k, meas[text], singletons, tol, bad)


def _usable(k: Mapping[str, int], m: float, known: set[str], singletons: Mapping[str, float],
            tol: float, bad: set[frozenset[str]]) -> bool:
    """A measured kernel of known forms only that a resource model can explain: the kernels
    the refinement checks, may take as new resources, and the joint refit fits."""
    return set(k) <= known and math.isfinite(m) and m > 0 \
        and _resource_like(k, m, singletons, tol, bad)


# --------------------------------------------------------------------------- classes, basic


@dataclass
class Basic:
    """Result of stage 3: classes of forms that behave alike, and the basic instructions."""

    classes: dict[str, list[str]]  # representative -> members (sorted, rep first)
    basic: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"classes": self.classes, "basic": self.basic}


def select_basic(singletons: Mapping[str, float], meas: Measurements, *,
                 tol: float = 0.02, max_basic: int = 16, max_mult: int = 8) -> Basic:
    """Stage 3: classes of equivalent forms and a small set of basic instructions.

    Two forms are equivalent when their singleton times agree within ``tol`` and their sharing
    with every third form (whose pair with both was measured) agrees within ``4 tol`` (sharing is
    a ratio of differences, so it amplifies noise). Forms join the first compatible class in
    name order (deterministic); the representative is the first member.

    Basic instructions: the representatives that interact with no form (``interacting_pairs``),
    then those that conflict (sharing > 0.5) with the fewest other representatives, then the
    fastest. A form that competes with few others uses few resources
    (e.g. one μop on one port group) and makes saturating kernels with a single clear
    bottleneck; slow forms (unpipelined units) would make saturating kernels huge. Choosing
    badly costs extra refinement rounds, never correctness (stage 7 adds missing resources).
    """
    forms = sorted(singletons)
    eps_t, eps_s = tol + 1e-9, 4 * tol + 1e-6
    share: dict[tuple[str, str], float] = {}
    for i, a in enumerate(forms):
        for b in forms[i + 1:]:
            s = sharing(a, b, singletons, meas, max_mult)
            if s is not None:
                share[(a, b)] = share[(b, a)] = s

    def alike(a: str, b: str) -> bool:
        ta, tb = singletons[a], singletons[b]
        if abs(ta - tb) > eps_t * max(ta, tb):
            return False
        s = share.get((a, b))
        if s is not None and s < 1 - eps_s:
            return False
        for c in forms:
            if c in (a, b):
                continue
            sa, sb = share.get((a, c)), share.get((b, c))
            if sa is not None and sb is not None and abs(sa - sb) > eps_s:
                return False
        return True

    classes: dict[str, list[str]] = {}
    for f in forms:
        for rep, members in classes.items():
            if alike(rep, f):
                members.append(f)
                break
        else:
            classes[f] = [f]
    reps = sorted(classes)
    conflicts = {a: sum(1 for b in reps if b != a and share.get((a, b), 0.0) > 0.5)
                 for a in reps}
    # forms that interact with another form (sharing above 1: see interacting_pairs) make
    # core kernels that no resource model explains: they come last
    interacts = {a: any(_interacts(s, tol) for (x, _), s in share.items() if x == a)
                 for a in reps}
    t_med = float(np.median([singletons[r] for r in reps]))
    order = sorted(reps, key=lambda r: (singletons[r] > 4 * t_med, interacts[r], conflicts[r],
                                        round(singletons[r], 9), r))
    return Basic(classes=classes, basic=sorted(order[:max_basic]))


def random_kernels(forms: Sequence[str], count: int, seed: int, max_distinct: int = 4,
                   max_mult: int = 3) -> list[Kernel]:
    """Deterministic random kernels of 2..max_distinct distinct forms (tests of the core)."""
    rng = np.random.default_rng(seed)
    forms = sorted(forms)
    out: list[Kernel] = []
    if len(forms) < 2:
        return out
    for _ in range(count):
        k = int(rng.integers(2, min(max_distinct, len(forms)) + 1))
        pick = rng.choice(len(forms), size=k, replace=False)
        out.append({forms[int(p)]: int(rng.integers(1, max_mult + 1)) for p in pick})
    return out


def mix(sk: Mapping[str, int], t_sk: float, form: str, t_form: float,
        beta: float, max_kernel: int = 600) -> tuple[Kernel, Kernel]:
    """``(SK^s, SK^s + form^n)`` with n t(form) / (s T(SK)) ~ beta, n >= 1, s >= 1 minimal.

    beta = 1 is Palmed's balanced proportion (low noise amplification); smaller betas keep the
    saturated resource the bottleneck so that the increase ``M(SK^s + form^n) - M(SK^s)`` is
    exactly ``n rho(form, r)``. ``s`` is capped so that the kernel keeps at most about
    ``max_kernel`` instructions (very slow forms then get a larger proportion).
    """
    s = max(1, math.ceil(t_form / (beta * t_sk) - 1e-9))
    size = max(1, sum(sk.values()))
    s = max(1, min(s, (max_kernel // 2) // size))
    n = max(1, min(round(beta * s * t_sk / t_form), max_kernel - s * size))
    base = _scale(sk, s)
    return base, _add(base, form, n)


# --------------------------------------------------------------------------- LP helpers


@dataclass
class _LPStats:
    solves: int = 0
    seconds: float = 0.0


def _solve(c: np.ndarray, a_ub: Any, b_ub: np.ndarray, a_eq: Any, b_eq: np.ndarray,
           ub: np.ndarray, stats: _LPStats, lb: np.ndarray | None = None) -> np.ndarray:
    t0 = time.perf_counter()
    res = linprog(c, A_ub=a_ub if len(b_ub) else None, b_ub=b_ub if len(b_ub) else None,
                  A_eq=a_eq if len(b_eq) else None, b_eq=b_eq if len(b_eq) else None,
                  bounds=np.stack([np.zeros_like(ub) if lb is None else lb, ub], axis=1),
                  method="highs")
    stats.solves += 1
    stats.seconds += time.perf_counter() - t0
    if res.status != 0:
        raise RuntimeError(f"Palmed LP failed: {res.message}")
    return np.maximum(res.x, 0.0)


@dataclass
class _Row:
    """One measured kernel inside an LP: its multiset, cycles and designated resource."""

    kernel: Kernel
    cycles: float
    designated: int | None  # index of the resource that must be tight, or None
    base_text: str | None = None  # mixes: the SK^s it extends (difference formulation)
    saturated: int | None = None  # mixes: the resource SK^s saturates


# --------------------------------------------------------------------------- core


@dataclass
class Core:
    """Result of stage 4: resources (by defining kernel) and the basic forms' uses."""

    basic: list[str]
    defining: list[Kernel]  # one defining kernel per resource, in discovery order
    rho: dict[str, dict[int, float]]  # form -> resource index -> use
    tests: list[str] = field(default_factory=list)
    t_defining: list[float] = field(default_factory=list)  # construction times (see _Res)

    @property
    def n_resources(self) -> int:
        return len(self.defining)


@dataclass
class Step:
    """What a stage returns: kernels still to measure (``need``), or ``done`` and ``result``.

    ``state`` holds the resources found so far as tuples (defining kernel, construction time,
    ...); pass it back with the next call.
    """

    need: list[str]
    result: Any = None
    state: list[Any] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.need


def _predict(rho: Mapping[str, Mapping[int, float]], n_res: int,
             k: Mapping[str, int]) -> np.ndarray:
    load = np.zeros(n_res)
    for f, n in k.items():
        for r, v in rho.get(f, {}).items():
            load[r] += n * v
    return load


def _saturating(defining: Kernel, t_def: float, target: float, max_kernel: int) -> Kernel:
    d = _reduce(defining)
    cap = max(1, (max_kernel // 4) // sum(d.values()))
    return _scale(d, max(1, min(cap, math.ceil(target / t_def - 1e-9))))


def _sat_est(defining: Kernel, t_def: float, target: float,
             max_kernel: int) -> tuple[Kernel, float]:
    """The saturating kernel of a resource and its *construction* time.

    Kernels are built from construction times, never from the measurement of the kernel being
    extended: the saturating kernel SK = d^s takes about s t(d), so SK and all its mixes can be
    chosen, and measured, in the same round as the resource is found (one measurement round per
    resource instead of three; on hardware every round starts the harness ``bench.rounds``
    times). The fit itself only uses measured values.
    """
    sk = _saturating(defining, t_def, target, max_kernel)
    return sk, t_def * sum(sk.values()) / max(1, sum(defining.values()))


def _source_time(k: Mapping[str, int], meas: Measurements) -> tuple[Kernel, float]:
    """(reduced kernel, its construction time) of a measured kernel k = g x reduced."""
    d = _reduce(k)
    return d, meas[_text(k)] * sum(d.values()) / sum(k.values())


def _mix_texts(sk: Kernel, t_sk: float, forms: Sequence[str], singletons: Mapping[str, float],
               betas: Sequence[float], max_kernel: int) -> list[str]:
    out = [_text(sk)]
    for f in forms:
        for beta in betas:
            base, k = mix(sk, t_sk, f, singletons[f], beta, max_kernel)
            out += [_text(base), _text(k)]
    return out


def _core_lp(basic: Sequence[str], upper: list[tuple[Kernel, float]],
             tight: list[tuple[Kernel, float, int]], n_res: int, t_ref: float,
             stats: _LPStats, soft: bool = False) -> dict[str, dict[int, float]]:
    """The core mapping LP, over the uses of all basic forms at once.

    Variables: rho[b, r] >= 0 for every basic form b and resource r, plus e+[k], e-[k] >= 0
    for every kernel k with a designated resource d(k).
    Constraints, for every measured core kernel k with cycles M(k):
      * upper bounds: sum_b sigma(k, b) rho[b, r] <= M(k) (1 + tol) for every r -- no resource
        may be busier than the measured time (``upper`` carries M (1 + tol));
      * tightness: sum_b sigma(k, b) rho[b, d(k)] + e-[k] - e+[k] = M(k) -- the designated
        resource is the bottleneck (the resource the saturating kernel defines, for SK and its
        mixes; the predicted bottleneck for tests that it explains).
    Objective: minimise sum_k (e+[k] + e-[k]) / M(k) (relative L1 misfit: robust to noisy
    outliers, exact when the data are exact) + 1e-6 sum rho / t_ref (among equally good fits,
    prefer no phantom uses).
    Noisy measurements (``soft``): every upper bound of kernel k gets a slack u[k] >= 0 costing
    ``SOFT_UPPER`` / M(k): one outlier (on hardware, a neighbour's burst) must not force every
    use down, which leaves singletons unexplained and makes the cutting plane add resource
    after resource for the same form.
    Why an LP and not a MILP: which resource is tight in which kernel is decided outside (by
    construction of the kernels, then by the alternation in ``_fit_core_rho``), so everything
    left is linear.
    """
    nb = len(basic)
    bidx = {b: i for i, b in enumerate(basic)}
    nv_rho = nb * n_res
    nv_fit = nv_rho + 2 * len(tight)
    nv = nv_fit + (len(upper) if soft else 0)
    c = np.zeros(nv)
    c[:nv_rho] = 1e-6 / t_ref
    ub_r: list[int] = []
    ub_c: list[int] = []
    ub_v: list[float] = []
    b_ub: list[float] = []
    row_i = 0
    for j, (kernel, bound) in enumerate(upper):
        if soft:
            c[nv_fit + j] = SOFT_UPPER / bound
        for r in range(n_res):
            for f, n in kernel.items():
                ub_r.append(row_i)
                ub_c.append(bidx[f] * n_res + r)
                ub_v.append(float(n))
            if soft:
                ub_r.append(row_i)
                ub_c.append(nv_fit + j)
                ub_v.append(-1.0)
            b_ub.append(bound)
            row_i += 1
    eq_r: list[int] = []
    eq_c: list[int] = []
    eq_v: list[float] = []
    b_eq: list[float] = []
    for j, (kernel, cycles, d) in enumerate(tight):
        for f, n in kernel.items():
            eq_r.append(j)
            eq_c.append(bidx[f] * n_res + d)
            eq_v.append(float(n))
        eq_r += [j, j]
        eq_c += [nv_rho + 2 * j, nv_rho + 2 * j + 1]
        eq_v += [1.0, -1.0]
        b_eq.append(cycles)
        c[nv_rho + 2 * j] = c[nv_rho + 2 * j + 1] = 1.0 / cycles
    a_ub = coo_matrix((ub_v, (ub_r, ub_c)), shape=(row_i, nv)).tocsr()
    a_eq = coo_matrix((eq_v, (eq_r, eq_c)), shape=(len(tight), nv)).tocsr()
    ub = np.full(nv, np.inf)
    x = _solve(c, a_ub, np.array(b_ub), a_eq, np.array(b_eq), ub, stats)
    return {b: {r: float(x[i * n_res + r]) for r in range(n_res) if x[i * n_res + r] > 1e-12}
            for i, b in enumerate(basic)}


def _keep_fixed(load: np.ndarray, fix: int, cycles: float, tol: float) -> int | None:
    """A saturating kernel keeps its resource unless another one explains it within tol."""
    others = np.delete(load, fix)
    ambiguous = others.size and others.max() >= cycles * (1 - tol)
    return None if ambiguous else fix


def _redesignate(rows: list[_Row], fixed: list[int | None], rho: Mapping[str, Mapping[int, float]],
                 n_res: int, tol: float) -> None:
    """Decide which resource each kernel's measured time is attributed to.

    Kernels built to saturate resource r keep r unless another resource is predicted within
    tol of the measured time (then they only bound the uses: the saturated resource may not be
    the bottleneck). Other kernels (singletons, pairs, tests) are attributed to their predicted
    bottleneck when it explains the measurement within tol.
    """
    for row, fix in zip(rows, fixed, strict=True):
        load = _predict(rho, n_res, row.kernel)
        if fix is not None:
            row.designated = _keep_fixed(load, fix, row.cycles, tol)
        else:
            top = int(np.argmax(load)) if n_res else 0
            row.designated = top if n_res and load[top] >= row.cycles * (1 - tol) else None


def fit_core(basic: Basic | Sequence[str], singletons: Mapping[str, float],
             meas: Measurements, *, state: Sequence[tuple[Mapping[str, int], float]] = (),
             config: PalmedConfig | None = None, log: Log = _nolog,
             lp_stats: _LPStats | None = None) -> Step:
    """Stage 4: the core mapping of the basic instructions (cutting plane + joint LP).

    ``state`` holds the defining kernels found so far (from the previous Step's ``state``), so
    that a pipeline can resume the loop between measurement rounds. Returns a Step whose
    ``need`` lists kernels to measure before calling again, or ``done`` with a ``Core``.
    """
    cfg = config or PalmedConfig()
    stats = lp_stats or _LPStats()
    bas = sorted(basic.basic if isinstance(basic, Basic) else basic)
    t_ref = max(singletons[b] for b in bas)
    target = cfg.sat_factor * t_ref
    tests: list[Kernel] = [{b: 1} for b in bas]
    for i, a in enumerate(bas):
        for b in bas[i + 1:]:
            tests.append(pair_kernel(a, singletons[a], b, singletons[b], cfg.max_mult))
    n_tests = cfg.core_tests if cfg.core_tests is not None else 8 * len(bas)
    tests += random_kernels(bas, n_tests, cfg.seed)
    test_texts = [_text(k) for k in tests]
    need = sorted({t for t in test_texts if t not in meas})
    if need:
        return Step(need=need, state=list(state))
    defining = [(dict(k), float(t)) for k, t in state]
    bad = interacting_pairs({b: singletons[b] for b in bas}, meas, cfg.tol, cfg.max_mult)

    def sane(k: Kernel) -> bool:
        return _measured_like(meas, _text(k), k, singletons, cfg.tol, bad)

    while True:
        # kernels of every resource found so far must be measured before fitting
        need_set: set[str] = set()
        rows: list[_Row] = []
        fixed: list[int | None] = []
        for k in tests:
            if sane(k):
                rows.append(_Row(k, meas[_text(k)], None))
                fixed.append(None)
        for r, (d, t_def) in enumerate(defining):
            sk, t_sk = _sat_est(d, t_def, target, cfg.max_kernel)
            texts = _mix_texts(sk, t_sk, bas, singletons, cfg.betas, cfg.max_kernel)
            missing = {t for t in texts if t not in meas}
            if missing:
                need_set |= missing
                continue
            if sane(sk):
                rows.append(_Row(sk, meas[_text(sk)], r))
                fixed.append(r)
            for b in bas:
                for beta in cfg.betas:
                    base, k = mix(sk, t_sk, b, singletons[b], beta, cfg.max_kernel)
                    for kk in (base, k):
                        if sane(kk):
                            rows.append(_Row(kk, meas[_text(kk)], r))
                            fixed.append(r)
        if need_set:
            return Step(need=sorted(need_set), state=defining)
        rho = _fit_core_rho(bas, rows, fixed, len(defining), t_ref, cfg, stats)
        # cutting plane: the most under-predicted test defines a missing resource
        worst: tuple[float, str, Kernel] | None = None
        cands: list[tuple[float, str, Kernel]] = []
        used = {_text(_reduce(d)) for d, _ in defining}
        for k in tests:
            if not sane(k):
                continue
            m = meas[_text(k)]
            pred = float(_predict(rho, len(defining), k).max()) if defining else 0.0
            gap = (m - pred) / m
            # twice the tolerance: the measurement and the fitted model both carry noise; a
            # resource defined by noise would mislead every later stage
            if gap > 2 * cfg.tol and _text(_reduce(k)) not in used:
                key = (-round(gap, 9), _text(k), k)
                cands.append(key)
                if worst is None or key[:2] < (worst[0], worst[1]):
                    worst = (key[0], key[1], k)
        if worst is None or len(defining) >= cfg.core_cap:
            log(f"core: {len(defining)} resources over {len(bas)} basic instructions")
            core = Core(basic=bas, defining=[d for d, _ in defining], rho=rho, tests=test_texts,
                        t_defining=[t for _, t in defining])
            return Step(need=[], result=core, state=defining)
        # core_batch > 1 (hardware: fewer measurement rounds): also the next most
        # under-predicted tests that share no form with those taken this round
        taken: set[str] = set()
        added = 0
        for gap, text, k in sorted(cands, key=lambda c: c[:2]):
            if added >= cfg.core_batch or len(defining) >= cfg.core_cap:
                break
            if set(k) & taken:
                continue
            taken |= set(k)
            log(f"core: resource R{len(defining):02d} from {text} "
                f"(under-predicted by {-gap:.1%})")
            defining.append(_source_time(k, meas))
            added += 1


def _fit_core_rho(bas: list[str], rows: list[_Row], fixed: list[int | None], n_res: int,
                  t_ref: float, cfg: PalmedConfig, stats: _LPStats) -> dict[str, dict[int, float]]:
    """Alternate: solve the core LP for the current designations, then re-decide them."""
    if n_res == 0:
        return {b: {} for b in bas}
    for row, fix in zip(rows, fixed, strict=True):
        row.designated = fix
    upper = [(r.kernel, r.cycles * (1 + cfg.tol)) for r in rows]
    rho: dict[str, dict[int, float]] = {}
    for _ in range(cfg.fit_rounds):
        tight = [(r.kernel, r.cycles, r.designated) for r in rows if r.designated is not None]
        rho = _core_lp(bas, upper, tight, n_res, t_ref, stats,  # type: ignore[arg-type]
                       soft=cfg.tol >= NOISY_TOL)
        before = [r.designated for r in rows]
        _redesignate(rows, fixed, rho, n_res, cfg.tol)
        if before == [r.designated for r in rows]:
            break
    return rho


# --------------------------------------------------------------------------- saturating, mapping


def select_saturating(core: Core, meas: Measurements, singletons: Mapping[str, float],
                      config: PalmedConfig | None = None) -> list[tuple[Kernel, float]]:
    """Stage 5: one saturating kernel per resource: its defining kernel scaled so that it takes
    about ``sat_factor`` times the slowest basic form (large enough for balanced mixes with
    integer counts), with its construction time (``_sat_est``)."""
    cfg = config or PalmedConfig()
    target = cfg.sat_factor * max(singletons[b] for b in core.basic)
    return [_sat_est(d, t, target, cfg.max_kernel)
            for d, t in zip(core.defining, core.t_defining, strict=True)]


def select_mapping_kernels(saturating: Sequence[tuple[Mapping[str, int], float]],
                           forms: Sequence[str], singletons: Mapping[str, float],
                           meas: Measurements, config: PalmedConfig | None = None) -> list[str]:
    """Stage 6: every form against every saturating kernel (with its construction time) at
    each proportion of ``betas`` (and each scaled SK^s alone, the base of the difference):
    ``|R| (1 + 2 len(betas))`` kernels per form at most, linear in the number of forms."""
    cfg = config or PalmedConfig()
    out: set[str] = set()
    for sk, t_sk in saturating:
        out |= set(_mix_texts(dict(sk), t_sk, sorted(forms), singletons, cfg.betas,
                              cfg.max_kernel))
    return sorted(t for t in out if t not in meas)


def _form_lp(form: str, t_form: float, rows: list[_Row], rho: Mapping[str, Mapping[int, float]],
             n_res: int, meas: Measurements, tol: float, stats: _LPStats) -> dict[int, float]:
    """The small LP of one remaining form (Palmed's per-instruction LP).

    Variables: x[r] >= 0, the form's use of resource r; e+[k], e-[k] >= 0 per designated kernel;
    with noisy measurements (tol >= NOISY_TOL) also u[k] >= 0 per kernel.
    Every other form's uses are fixed (core LP, or the previous refinement round).
    For every measured kernel k containing the form c = sigma(k, form) times:
      * upper bounds: base(k, r) + c x[r] <= M(k) (1 + tol) + u[k] for every r, where
        base(k, r) is the other forms' load of r (u = 0 when exact). Noisy: soft, u[k] costs
        ``SOFT_UPPER`` c / M(k): the other forms' fixed uses carry their own errors, and a hard
        bound from one unlucky kernel would crush the form's use to zero (seen: singletons
        predicted 37% short at 2% noise); bounds where the others alone already fill the
        measured time carry no information and are left out;
      * tightness, for mixes SK^s + form^n designated to resource r:
        n x[r] + e-[k] - e+[k] = M(SK^s + form^n) - M(SK^s) -- the increase of the measured time
        is the form's use of the saturated resource (a difference of measurements, so that
        errors of the model of SK do not leak in); for a singleton designated to its predicted
        bottleneck r: x[r] + e- - e+ = t(form).
    Objective: min sum_k (e+ + e-) c / M(k) (relative L1, weights favour the kernels where the
    form is a large part, whose difference is least amplified by noise; the singleton counts
    ``SINGLETON_WEIGHT`` times: it is the one kernel where the form is everything)
    + sum_k SOFT_UPPER u[k] c / M(k) + 1e-6 sum x / t(form).
    """
    noisy = tol >= NOISY_TOL
    nrow = len(rows)
    nv = n_res + 2 * nrow + (nrow if noisy else 0)
    c = np.zeros(nv)
    c[:n_res] = 1e-6 / t_form
    ub = np.full(nv, np.inf)
    ub[:n_res] = t_form * (1 + tol)
    lb = np.zeros(nv)
    eq_rows: list[np.ndarray] = []
    b_eq: list[float] = []
    ub_r: list[int] = []
    ub_c: list[int] = []
    ub_v: list[float] = []
    b_ub: list[float] = []
    for j, row in enumerate(rows):
        cnt = row.kernel[form]
        others = {f: n for f, n in row.kernel.items() if f != form}
        base = _predict(rho, n_res, others)
        room = row.cycles * (1 + tol) - base
        if noisy and cnt * t_form >= MIN_SHARE * row.cycles:
            # where the other forms already fill a resource, the row is inconsistent with their
            # (noisy) fixed uses and would force a zero use: it carries no information there
            u = n_res + 2 * nrow + j
            c[u] = SOFT_UPPER * cnt / row.cycles
            for r in np.flatnonzero(room > tol * row.cycles):
                ub_r += [len(b_ub), len(b_ub)]
                ub_c += [int(r), u]
                ub_v += [float(cnt), -1.0]
                b_ub.append(float(room[r]))
        elif not noisy:
            # every upper bound involves a single x[r] (the other forms are fixed)
            ub[:n_res] = np.minimum(ub[:n_res], np.maximum(room, 0.0) / cnt)
        if not noisy and row.saturated is not None and row.base_text is not None:
            # SK^s saturates r, so M(SK^s + form^n) >= M(SK^s) + n x[r] at every proportion,
            # with equality while r stays the bottleneck: the use is at most the smallest
            # increase (a balanced mix can move the bottleneck to a resource not found yet,
            # whose larger increase must not become a use of r)
            ub[row.saturated] = min(ub[row.saturated], _increase(row, form, meas, tol))
        if row.designated is None:
            continue
        a = np.zeros(nv)
        if row.base_text is not None:
            a[row.designated] = cnt - _count(row.base_text, form)
            rhs = row.cycles - meas[row.base_text]
        else:
            a[row.designated] = cnt
            rhs = row.cycles - base[row.designated]
        a[n_res + 2 * j] = 1.0
        a[n_res + 2 * j + 1] = -1.0
        w = SINGLETON_WEIGHT if noisy and not others else 1.0
        c[n_res + 2 * j] = c[n_res + 2 * j + 1] = w * a[row.designated] / row.cycles
        if noisy and not others and _increase_bound(form, rows, meas, row.designated, tol) \
                >= t_form * (1 - tol):
            # the form alone is the best-measured fact about it: its bottleneck keeps it,
            # unless a mix with the resource's saturating kernel says the form uses much
            # less of it (a divider has no resource yet: forced onto the FP multiplier, it
            # made every kernel with both up to 38% slow); the singleton is then left
            # unexplained, and the refinement gives the form a resource of its own
            lb[row.designated] = t_form * (1 - tol)
        eq_rows.append(a)
        b_eq.append(rhs)
    a_ub = coo_matrix((ub_v, (ub_r, ub_c)), shape=(len(b_ub), nv)).tocsr()
    x = _solve(c, a_ub, np.array(b_ub), np.array(eq_rows) if eq_rows else np.zeros((0, nv)),
               np.array(b_eq), ub, stats, lb)
    # uses below the tolerance are noise (or LP round-off): a phantom use of a resource that
    # the form does not touch would add up over large kernels
    return {r: float(x[r]) for r in range(n_res) if x[r] > max(tol, 1e-9) * t_form}


def _increase_bound(form: str, rows: Sequence[_Row], meas: Measurements, r: int,
                    tol: float) -> float:
    """The least use of resource r that the form's mixes with r's saturating kernel allow.

    ``M(SK^s + form^n) - M(SK^s) >= n rho(form, r)`` whatever the bottleneck (within noise, so
    ``2 tol`` of the mix's time is added): the smallest increase over the proportions bounds
    the use from above. Infinite when no mix saturates r.
    """
    return min((_increase(row, form, meas, tol) for row in rows
                if row.saturated == r and row.base_text is not None), default=math.inf)


def _increase(row: _Row, form: str, meas: Measurements, tol: float) -> float:
    """A mix's increase over its saturating kernel per added instance of the form, plus
    ``2 tol`` of the mix's time (noise): ``(M(SK^s + form^n) - M(SK^s)) / n``, at least 0;
    infinite when the mix adds no instance."""
    assert row.base_text is not None
    n_add = row.kernel[form] - _count(row.base_text, form)
    if n_add <= 0:
        return math.inf
    return max(row.cycles - meas[row.base_text] + 2 * tol * row.cycles, 0.0) / n_add


def _ok(meas: Measurements, text: str) -> bool:
    """Measured, and not a failed measurement (NaN)."""
    v = meas.get(text)
    return v is not None and math.isfinite(v)


def _count(text: str, form: str) -> int:
    return parse_canonical(text).get(form, 0)


def _form_rows(form: str, saturating: Sequence[tuple[Mapping[str, int], float]],
               singletons: Mapping[str, float], meas: Measurements, cfg: PalmedConfig,
               pair_index: Mapping[str, list[str]],
               bad: set[frozenset[str]]) -> tuple[list[_Row], list[int | None]]:
    """The kernels of one form's LP: its singleton, its pairs with basic forms, its mixes
    with every saturating kernel; kernels no resource model explains (``_resource_like``)
    left out."""
    rows: list[_Row] = [_Row({form: 1}, singletons[form], None)]
    fixed: list[int | None] = [None]

    def sane(k: Mapping[str, int], text: str) -> bool:
        return _measured_like(meas, text, k, singletons, cfg.tol, bad)

    for text in pair_index.get(form, []):
        k = parse_canonical(text)
        if sane(k, text):
            rows.append(_Row(k, meas[text], None))
            fixed.append(None)
    for r, (sk, t_sk) in enumerate(saturating):
        for beta in cfg.betas:
            base, k = mix(dict(sk), t_sk, form, singletons[form], beta, cfg.max_kernel)
            if sane(k, _text(k)) and sane(base, _text(base)):
                rows.append(_Row(k, meas[_text(k)], r, _text(base), r))
                fixed.append(r)
    return rows, fixed


def _fit_forms(core: Core, forms: Sequence[str], singletons: Mapping[str, float],
               meas: Measurements, saturating: Sequence[tuple[Mapping[str, int], float]],
               pair_index: Mapping[str, list[str]], cfg: PalmedConfig,
               stats: _LPStats, bad: set[frozenset[str]] | None = None,
               ) -> dict[str, dict[int, float]]:
    """Every form's uses of the resources of ``saturating``: per-form LPs (``_form_lp``),
    alternated with the designations until both are stable (at most ``fit_rounds``)."""
    n_res = len(saturating)
    rho: dict[str, dict[int, float]] = {f: dict(v) for f, v in core.rho.items()}
    per_form = {f: _form_rows(f, saturating, singletons, meas, cfg, pair_index, bad or set())
                for f in forms}
    exact = cfg.tol < NOISY_TOL
    for _ in range(cfg.fit_rounds):
        new_rho: dict[str, dict[int, float]] = {}
        # exact: Gauss-Seidel, each form's LP sees the uses already refitted in this pass;
        # fitting all forms against the previous pass (Jacobi) oscillated when resources were
        # new: a pass with no bounds from the other forms, then a pass crushed by them
        current = {f: dict(v) for f, v in rho.items()} if exact else rho
        for f in forms:
            rows, fixed = per_form[f]
            new_rho[f] = _form_lp(f, singletons[f], rows, current, n_res, meas, cfg.tol, stats)
            if exact:
                current[f] = new_rho[f]
        moved = max((abs(new_rho[f].get(r, 0.0) - rho.get(f, {}).get(r, 0.0))
                     for f in forms for r in range(n_res)), default=0.0)
        rho = new_rho
        before = [row.designated for f in forms for row in per_form[f][0]]
        for f in forms:
            rows, fixed = per_form[f]
            _redesignate_form(f, rows, fixed, rho, n_res, cfg.tol)
        if before == [row.designated for f in forms for row in per_form[f][0]] \
                and moved <= 1e-9:
            break
    return rho


def _explained(rho: dict[str, dict[int, float]], defining: list[Kernel],
               saturating: list[Kernel], forms: Sequence[str],
               singletons: Mapping[str, float], cfg: PalmedConfig,
               log: Log) -> tuple[dict[str, dict[int, float]], list[Kernel], list[Kernel]]:
    """Last safety net: every form's model explains its own singleton.

    When refinement stops (``max_refine``, ``max_resources``) a form may still lack its
    bottleneck resource; predicting (almost) nothing for it would make any kernel holding it
    look free (seen: 900% IPC errors on a 300-form machine). A form predicted below
    t(form)(1 - tol) alone gets its uses scaled up to t(form); a form with no use at all gets a
    resource of its own (defining kernel: the form alone).
    """
    rho = {f: dict(v) for f, v in rho.items()}
    defining, saturating = list(defining), list(saturating)
    for f in forms:
        uses = rho.get(f, {})
        p = max(uses.values(), default=0.0)
        t = singletons[f]
        if p >= t * (1 - max(cfg.tol, 1e-9)):
            continue
        if p > 1e-9 * t:
            rho[f] = {r: v * t / p for r, v in uses.items()}
            log(f"explain: {f} predicted {p:.4g} alone, measured {t:.4g}: uses scaled")
        else:
            rho[f] = {len(defining): t}
            defining.append({f: 1})
            saturating.append({f: 1})
            log(f"explain: {f} has no use: resource R{len(defining) - 1:02d} of its own")
    return rho, defining, saturating


def _polish(rho: Mapping[str, Mapping[int, float]], n_res: int, forms: Sequence[str],
            singletons: Mapping[str, float], meas: Measurements, tol: float,
            bad: set[frozenset[str]], stats: _LPStats, log: Log) -> dict[str, dict[int, float]]:
    """Noisy measurements: one joint LP over every form's uses and every measured kernel.

    Why: the per-form LPs fix every other form's uses, so each form absorbs the errors of the
    forms fitted before it, and a form's uses are only checked against kernels built around
    it (its mixes with the saturating kernels). Pairs of two non-basic forms then show up as
    kernels where two forms' uses of a shared unit sit on different resources, and held-out
    kernels of three or more forms are predicted too fast (Zen 4, quick set: held-out RMS IPC
    error 15.5%, MAPE 9.4%, Kendall's tau 0.861; with this refit of the same model from the
    same database 13.1%, 6.8%, 0.880).
    Variables: rho[f, r] >= 0 for every form f and resource r; e+[k], e-[k], u[k] >= 0 for
    every measured kernel k (singletons, pairs, core kernels, mixes; not those holding an
    interacting pair, nor super-additive ones).
    Constraints, with d(k) the bottleneck the current model predicts for k:
      * tightness: sum_f sigma(k, f) rho[f, d(k)] + e-[k] - e+[k] = M(k);
      * soft upper bounds: sum_f sigma(k, f) rho[f, r] <= M(k) (1 + tol) + u[k], r != d(k).
    Objective: min sum_k (e+[k] + e-[k] + SOFT_UPPER u[k]) / M(k) + 1e-6 sum rho / t_ref.
    The current model is a feasible point, so the refit never fits the measurements worse.
    One pass only: redesignating and refitting again lowered the in-sample misfit further
    (4.4% -> 3.2% -> 2.9% mean relative) but raised the held-out error (13.1% -> 13.6%).
    Exact measurements skip it: every kernel is already explained there, and the LP would
    only choose among equally exact uses.
    """
    known = set(forms)
    rows: list[tuple[Kernel, float, int]] = []
    for text, m in sorted(meas.items()):
        k = parse_canonical(text)
        if _usable(k, m, known, singletons, tol, bad):
            rows.append((k, m, int(np.argmax(_predict(rho, n_res, k)))))
    if not rows or not n_res:
        return {f: dict(v) for f, v in rho.items()}
    fidx = {f: i for i, f in enumerate(forms)}
    nv_rho = len(forms) * n_res
    nk = len(rows)
    nv = nv_rho + 3 * nk
    c = np.zeros(nv)
    c[:nv_rho] = 1e-6 / max(singletons[f] for f in forms)
    eq_r: list[int] = []
    eq_c: list[int] = []
    eq_v: list[float] = []
    ub_r: list[int] = []
    ub_c: list[int] = []
    ub_v: list[float] = []
    b_ub: list[float] = []
    for j, (k, m, d) in enumerate(rows):
        cols = [fidx[f] * n_res for f in k]
        counts = [float(n) for n in k.values()]
        eq_r += [j] * (len(k) + 2)
        eq_c += [col + d for col in cols] + [nv_rho + 2 * j, nv_rho + 2 * j + 1]
        eq_v += counts + [1.0, -1.0]
        c[nv_rho + 2 * j] = c[nv_rho + 2 * j + 1] = 1.0 / m
        u = nv_rho + 2 * nk + j
        c[u] = SOFT_UPPER / m
        for r in range(n_res):
            if r == d:
                continue
            row_i = len(b_ub)
            ub_r += [row_i] * (len(k) + 1)
            ub_c += [col + r for col in cols] + [u]
            ub_v += counts + [-1.0]
            b_ub.append(m * (1 + tol))
    a_eq = coo_matrix((eq_v, (eq_r, eq_c)), shape=(nk, nv)).tocsr()
    a_ub = coo_matrix((ub_v, (ub_r, ub_c)), shape=(len(b_ub), nv)).tocsr()
    fitted = [(k, m) for k, m, _ in rows]
    before = _misfit(rho, n_res, fitted)
    x = _solve(c, a_ub, np.array(b_ub), a_eq, np.array([m for _, m, _ in rows]),
               np.full(nv, np.inf), stats)
    out = {f: {r: float(x[fidx[f] * n_res + r]) for r in range(n_res)
               if x[fidx[f] * n_res + r] > tol * singletons[f]} for f in forms}
    log(f"polish: joint refit over {nk} kernels, RMS relative misfit {before:.2%} -> "
        f"{_misfit(out, n_res, fitted):.2%}")
    return out


def _misfit(rho: Mapping[str, Mapping[int, float]], n_res: int,
            checks: Sequence[tuple[Kernel, float]]) -> float:
    """RMS relative error of the predicted cycles of (kernel, measured cycles) pairs."""
    if not checks:
        return 0.0
    err = [(float(_predict(rho, n_res, k).max()) - m) / m for k, m in checks]
    return float(np.sqrt(np.mean(np.square(err))))


def fit_remaining(core: Core, forms: Sequence[str], singletons: Mapping[str, float],
                  meas: Measurements, *,
                  state: Sequence[tuple[Mapping[str, int], float, int]] = (),
                  classes: Mapping[str, Sequence[str]] | None = None,
                  config: PalmedConfig | None = None, log: Log = _nolog,
                  lp_stats: _LPStats | None = None) -> Step:
    """Stage 7: the uses of every form, then refinement with the resources the core missed.

    ``state`` lists the refinement resources found so far as (defining kernel, construction
    time, round). Returns a Step whose ``need`` lists mapping kernels to measure (new
    resources: one measurement round per refinement round), or ``done`` with
    ``result = (rho, defining, saturating)``: rho maps form -> resource index -> use.
    """
    cfg = config or PalmedConfig()
    stats = lp_stats or _LPStats()
    forms = sorted(set(forms))
    refined = [(dict(k), float(t), int(rnd)) for k, t, rnd in state]
    defining = [dict(d) for d in core.defining] + [k for k, _, _ in refined]
    t_def = list(core.t_defining) + [t for _, t, _ in refined]
    rounds = 1 + max((rnd for _, _, rnd in refined), default=-1)
    target = cfg.sat_factor * max(singletons[b] for b in core.basic)
    # pairs measured between each form and a basic form: extra upper bounds, cheap information
    pair_index: dict[str, list[str]] = {}
    for f in forms:
        for b in core.basic:
            if b == f:
                continue
            text = _text(pair_kernel(f, singletons[f], b, singletons[b], cfg.max_mult))
            if text in meas:
                pair_index.setdefault(f, []).append(text)
    rep_of = {m: rep for rep, members in (classes or {}).items() for m in members}
    noisy = cfg.tol >= NOISY_TOL
    known = set(forms)
    bad = interacting_pairs({f: singletons[f] for f in forms}, meas, cfg.tol, cfg.max_mult)
    # the fixed in-sample check of a refinement round: singletons and balanced pairs
    checks: list[tuple[Kernel, float]] = []
    if noisy:
        for text, m in sorted(meas.items()):
            k = parse_canonical(text)
            if len(k) > 2 or not _usable(k, m, known, singletons, cfg.tol, bad):
                continue
            if len(k) == 1 and k == {next(iter(k)): 1}:
                checks.append((k, m))
            elif len(k) == 2:
                a, b = sorted(k)
                if k == pair_kernel(a, singletons[a], b, singletons[b], cfg.max_mult):
                    checks.append((k, m))
    while True:
        saturating = [_sat_est(d, t, target, cfg.max_kernel)
                      for d, t in zip(defining, t_def, strict=True)]
        need = select_mapping_kernels(saturating, forms, singletons, meas, cfg)
        if need:
            return Step(need=need, state=refined)
        n_res = len(defining)
        rho = _fit_forms(core, forms, singletons, meas, saturating, pair_index, cfg, stats, bad)
        if noisy and refined and rounds > 0:
            # keep the last refinement round only if it explains the singletons and pairs
            # better: with noisy measurements a new resource can fit noise and make the
            # model worse (seen: 8% -> 27% RMS at 2% noise)
            n_prev = n_res - sum(1 for _, _, rnd in refined if rnd == rounds - 1)
            prev = _fit_forms(core, forms, singletons, meas, saturating[:n_prev], pair_index,
                              cfg, stats, bad)
            now_s, prev_s = _misfit(rho, n_res, checks), _misfit(prev, n_prev, checks)
            if now_s > prev_s * (1 - REFINE_GAIN):
                log(f"refine: round {rounds - 1} dropped (misfit of singletons and pairs "
                    f"{now_s:.2%} vs {prev_s:.2%} without it)")
                prev = _polish(prev, n_prev, forms, singletons, meas, cfg.tol, bad, stats, log)
                return Step(need=[], result=_explained(
                    prev, defining[:n_prev], [sk for sk, _ in saturating[:n_prev]], forms,
                    singletons, cfg, log), state=[r for r in refined if r[2] != rounds - 1])
            log(f"refine: round {rounds - 1} kept (misfit {now_s:.2%} vs {prev_s:.2%})")
        # refinement: measured kernels the model under-predicts reveal missing resources
        cands: list[tuple[float, str]] = []
        used = {_text(_reduce(d)) for d in defining}
        # noisy: only singletons and balanced pairs may define a resource (a large mix
        # defines a resource mixing several bottlenecks, that noise then spreads over forms)
        pool = ((_text(k), m) for k, m in checks) if noisy else meas.items()
        for text, m in pool:
            k = parse_canonical(text)
            if not _usable(k, m, known, singletons, cfg.tol, bad):
                continue
            pred = float(_predict(rho, n_res, k).max()) if n_res else 0.0
            gap = (m - pred) / m
            if gap > max(3 * cfg.tol, REFINE_MIN_GAP) and _text(_reduce(k)) not in used:
                cands.append((-round(gap, 9), text))
        cands.sort()
        if not cands or rounds >= cfg.max_refine or n_res >= cfg.max_resources:
            if cands:
                log(f"refine: stopping with {len(cands)} under-predicted kernels "
                    f"(worst {-cands[0][0]:.1%})")
            if noisy:
                rho = _polish(rho, n_res, forms, singletons, meas, cfg.tol, bad, stats, log)
            return Step(need=[], result=_explained(
                rho, defining, [sk for sk, _ in saturating], forms, singletons, cfg, log),
                state=refined)
        added: list[Kernel] = []
        taken: set[str] = set()
        for gap, text in cands:
            k = parse_canonical(text)
            # one candidate per form (and per class) a round: two under-predicted kernels
            # sharing a form are most often short of the same resource
            key = {rep_of.get(f, f) for f in k}
            if key & taken:
                continue
            taken |= key
            d, t = _source_time(k, meas)
            added.append(d)
            refined.append((d, t, rounds))
            t_def.append(t)
            log(f"refine: resource R{n_res + len(added) - 1:02d} from {text} "
                f"(under-predicted by {-gap:.1%})")
            if len(added) >= cfg.refine_batch:
                break
        defining += added
        rounds += 1


def _redesignate_form(form: str, rows: list[_Row], fixed: list[int | None],
                      rho: Mapping[str, Mapping[int, float]], n_res: int, tol: float) -> None:
    """As _redesignate, for one form's rows: only its singleton follows its bottleneck.

    Exact measurements: a mix keeps its saturated resource (its increase bounds the use from
    above, ``_form_lp``). Releasing it whenever another resource happened to explain the mix
    let uses drop to zero and come back from one alternation round to the next (seen: the
    fit never settled, and a form lost its use of the one resource of its own μop kind).
    """
    for row, fix in zip(rows, fixed, strict=True):
        load = _predict(rho, n_res, row.kernel)
        if fix is not None:
            row.designated = fix if tol < NOISY_TOL else _keep_fixed(load, fix, row.cycles, tol)
        elif row.kernel == {form: 1} and n_res:
            row.designated = int(np.argmax(load))
