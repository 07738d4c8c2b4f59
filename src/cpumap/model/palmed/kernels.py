"""Which kernels Palmed measures, and which measured kernels a resource model may be fitted to.

Stages 1-3 (singletons, balanced pairs among the pair candidates, classes and basic
instructions), the random test kernels of the core and the mixes of every later stage, with the
arithmetic on kernels (canonical text, scaling, reduction) they share. None of it solves an
LP: it only decides what to measure and what to trust, from singleton times and pair sharings.

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
pair) and shifts by CL are not modelled (``cpumap.model.outside.modelable``); legacy-SSE forms
stay slower next to 512-bit forms whatever registers they use (ADDPD xmm 1.0 instead of 0.5
cycles with disjoint write pools too): that one is the hardware's.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from cpumap.measure.asmgen import canonical, parse_canonical
from cpumap.model.palmed.config import (
    INTERACT_TOLS,
    SUPERADD_TOLS,
    Kernel,
    Measurements,
)

# --------------------------------------------------------------------------- kernel helpers


def _text(k: Mapping[str, int]) -> str:
    return canonical(k)


def _holds_any(text: str, forms: Set[str]) -> bool:
    """Whether the canonical kernel ``text`` names one of ``forms`` (read without parsing
    its counts: the modes' stages ask it of every measured kernel)."""
    return any(x.partition("*")[0] in forms for x in text.split())


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


def _alone(k: Mapping[str, int]) -> bool:
    """Whether the kernel is one form once: that form's singleton."""
    return len(k) == 1 and next(iter(k.values())) == 1


def singleton_kernels(forms: Sequence[str]) -> list[str]:
    """Stage 1: every form alone."""
    return [_text({f: 1}) for f in sorted(set(forms))]


@functools.lru_cache(maxsize=1 << 18)
def balanced(ta: float, tb: float, max_mult: int = 8) -> tuple[int, int]:
    """Coprime (m, n) <= max_mult with m*ta closest to n*tb (ties: smallest m + n).

    Balanced pairs make each part alone take about the same time, so the pair's time tells
    directly whether the two forms share their bottleneck (sum) or not (max). Cached: the
    stages ask for the same pairs again at every pass (a 10-port/300-form simulated fit
    asked 309,000 times, 36 s of its 170).
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


#: Pair candidates: forms slower than this many times the median singleton come after all
#: the others (``select_basic`` takes none of them as a basic instruction).
SLOW_CANDIDATE = 4.0


def pair_candidates(singletons: Mapping[str, float], cap: int | None,
                    first: Sequence[str] = (), plain: Set[str] | None = None) -> list[str]:
    """The forms whose pairs are measured: all of them, or ``cap`` of them.

    All pairs cost n(n-1)/2 kernels: 44,850 for 300 forms. Classes and basic instructions only
    need enough forms of every kind, so above ``cap`` forms the candidates are ``first`` (the
    forms of a list a person chose, one per kind of μop: ``model.first_candidates``) and then
    forms taken round-robin over the groups of equal singleton time (rounded to 2 %: forms of
    one μop kind share a time), the most populous group first, and within a group the
    ``plain`` forms (register and immediate operands only) first, spread over the names. The
    pairs stage then costs at most cap(cap-1)/2 kernels whatever the number of forms, and every
    later stage is linear in the number of forms; a resource that no candidate reveals is found
    by the refinement stage.

    Why this order: taken fastest group first and by name, 6,143 forms of the Sapphire
    Rapids-class guest gave 120 candidates of which a third were fences, serialising or
    non-temporal forms and most of the rest memory forms (one per 2 % of singleton time, the
    first name of each: ADDPD xmm, m128 before ADDPD xmm, xmm); the core built on them had
    resources such as ``SFENCE*3 VANDNPD ymm, ymm, m256`` and the held-out error was 16.5 %.
    A populous time group is a μop kind many forms share; a memory form uses both a load port
    and its ALU port and makes a poor basic instruction; forms slower than ``SLOW_CANDIDATE``
    times the median come last, after every other.
    """
    forms = sorted(singletons)
    if cap is None or len(forms) <= cap:
        return forms
    out = [f for f in dict.fromkeys(first) if f in singletons][:cap]
    taken = set(out)
    t_med = float(np.median(list(singletons.values())))
    groups: dict[tuple[bool, int], list[str]] = {}
    for f in forms:
        if f not in taken:
            key = (singletons[f] > SLOW_CANDIDATE * t_med,
                   round(math.log(singletons[f]) / math.log(1.02)))
            groups.setdefault(key, []).append(f)
    for slow in (False, True):
        queues = [_spread([f for f in g if plain is None or f in plain])
                  + _spread([f for f in g if plain is not None and f not in plain])
                  for key, g in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
                  if key[0] == slow]
        depth = 0
        while len(out) < cap and any(depth < len(q) for q in queues):
            for q in queues:
                if depth < len(q) and len(out) < cap:
                    out.append(q[depth])
            depth += 1
    return sorted(out)


def _spread(names: list[str]) -> list[str]:
    """``names`` (sorted) in an order whose every prefix is spread over the list: positions
    0, 1/2, 1/4, 3/4, ... of it (the van der Corput sequence), then those left in order.
    Neighbours in name order are variants of one mnemonic (ADDPD xmm, m128 and xmm, xmm)."""
    n = len(names)
    order: list[int] = []
    seen: set[int] = set()
    j = 0
    while len(order) < n and j < 4 * n:
        x, denom, k = 0.0, 1.0, j
        while k:
            denom *= 2
            x += (k & 1) / denom
            k >>= 1
        i = int(x * n)
        if i not in seen:
            seen.add(i)
            order.append(i)
        j += 1
    order += [i for i in range(n) if i not in seen]
    return [names[i] for i in order]


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
    out: set[frozenset[str]] = set()
    # the measured kernels of two forms, not every pair of forms: the pairs are quadratic
    # (4 million for 2,837 forms, 2-3 min a call, called at every step of the refinement)
    # and only a few thousand of them are ever measured
    for text in meas:
        if text.count(" ") != 1:
            continue
        k = parse_canonical(text)
        if len(k) != 2 or not all(f in singletons for f in k):
            continue
        a, b = sorted(k)
        if k != pair_kernel(a, singletons[a], b, singletons[b], max_mult):
            continue
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
    return m <= _additive_bound(k, singletons, tol) + 1e-12


def _additive_bound(k: Mapping[str, int], singletons: Mapping[str, float], tol: float) -> float:
    """(1 + ``SUPERADD_TOLS`` tol) times the kernel's forms in sequence: a kernel slower than
    that is *super-additive*, more than any resource model predicts."""
    return (1 + SUPERADD_TOLS * tol) * sum(n * singletons[f] for f, n in k.items())


def _floor(k: Mapping[str, int], singletons: Mapping[str, float]) -> float:
    """The least time a resource model with the forms' own resources (``refit._owned``)
    predicts: each form's copies one after another at its singleton's pace."""
    return max(n * singletons[f] for f, n in k.items())


#: A form is *non-additive* where at least this share of the measured kernels holding it beside
#: other forms are super-additive (``_resource_like``), and at least ``NON_ADDITIVE_MIN`` are.
NON_ADDITIVE_SHARE = 0.1
NON_ADDITIVE_MIN = 3


def non_additive(singletons: Mapping[str, float], meas: Measurements, tol: float,
                 apart: Callable[[Kernel], bool] | None = None,
                 classes: Mapping[str, Sequence[str]] | None = None,
                 ) -> dict[str, tuple[int, int, str]]:
    """Forms whose kernels are often slower than their forms in sequence -> (such kernels,
    kernels, the form they hold): outside what a resource model can say, so their
    predictions are approximate.

    On Zen 4 the non-temporal stores and the cache-line flushes (CLFLUSH, CLWB: they write to
    memory, not to L1) made 20-65 % of their kernels super-additive, LFENCE 15-18 %, every
    other form of the full profile at most a few % once those are set aside. A slow kernel
    blames every form in it, so forms are taken greedily, the largest share first, and its
    kernels set aside: a store beside a CLFLUSH is not condemned for the flush's time.
    ``apart``: kernels left out of the count (those of the 512-bit mode, whose forms' times
    beside a 512-bit form are not their singletons). ``classes``: representative -> members of
    the behaviour classes; a member, measured only alone and beside one saturating kernel, has
    too few kernels to be judged and takes its representative's verdict (on Zen 4 the YMM
    non-temporal stores of MOVNTPD's class: one beside RDRAND and a compress store measured
    405 cycles, predicted 210)."""
    kernels: list[tuple[frozenset[str], bool]] = []
    total: Counter[str] = Counter()
    slow: Counter[str] = Counter()
    for text, m in meas.items():
        if " " not in text or not (m > 0 and math.isfinite(m)):
            continue
        k = parse_canonical(text)
        if len(k) < 2 or not all(singletons.get(f, 0) > 0 for f in k) or (apart and apart(k)):
            continue
        forms, is_slow = frozenset(k), m > _additive_bound(k, singletons, tol)
        kernels.append((forms, is_slow))
        total.update(forms)  # kernels, not copies: a form counts once a kernel
        if is_slow:
            slow.update(forms)
    out: dict[str, tuple[int, int]] = {}
    while True:
        share, form = max(((n / total[f], f) for f, n in slow.items()
                           if n >= NON_ADDITIVE_MIN), default=(0.0, ""))
        if share < NON_ADDITIVE_SHARE:
            for rep, members in (classes or {}).items():
                if rep in out:
                    for m in members:
                        out.setdefault(m, out[rep])
            return out
        out[form] = (slow[form], total[form], form)
        # its kernels set aside: the counts of every form in them go down
        for forms, is_slow in kernels:
            if form in forms:
                total.subtract(forms)
                if is_slow:
                    slow.subtract(forms)
        kernels = [(forms, is_slow) for forms, is_slow in kernels if form not in forms]


def non_additive_note(form: str, slow: int, total: int, counted: str) -> str:
    """Why a non-additive form is approximate (``counted``: the form whose kernels say so)."""
    whose = "its" if counted == form else f"its behaviour class's ({counted})"
    return (f"slower than its parts in sequence in {slow} of {whose} {total} measured kernels "
            "beside other forms (no resource model is): predicted from its uses, approximately")


def _ok(meas: Measurements, text: str) -> bool:
    """Measured, and not a failed measurement (NaN)."""
    v = meas.get(text)
    return v is not None and math.isfinite(v)


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
