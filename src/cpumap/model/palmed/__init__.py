"""Palmed (Derumigny et al., CGO 2022): a resource model built from kernel timings alone.

The library is pure: every stage takes the measurements made so far (canonical kernel text ->
cycles per instance) and returns the kernels it still needs, or its result. The driver
(``cpumap.model.palmed.build``: ``build_model`` in one process, ``Build`` one stage per pipeline
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
   Palmed); above ``max_pair_forms`` forms only the pairs among that many candidates (a
   listed set first, then forms spread over the singleton times) are measured
   (``pair_candidates``), so the stage is bounded and
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
   form at most, linear in the number of forms. Screened (``config.screen``): the lighter
   proportions only where the balanced mix ran slower than SK alone (elsewhere the form's
   use of r is nil, which the lighter mixes would only repeat): 116 -> 98 kernels per form
   on the exact 10-port/300-form machine.
7. **Remaining forms** (``fit_remaining``): a small LP per form (``_form_lp``). Then a check of
   every measured kernel (singletons, pairs, mixes); a kernel the model under-predicts reveals a
   resource that no basic kernel saturates (e.g. a port only some non-basic forms use): it
   becomes a new resource, all forms are measured against its saturating kernel (``|forms|``
   x ``len(betas)`` kernels) and refitted. At most ``max_refine`` rounds. Forms that behave
   alike (``classes``: same singleton and same mixes with every saturating kernel, within
   ``tol``) share their representative's LP and its refinement kernels; each other member
   meets each refinement resource at the lightest proportion only (its use of it), which
   splits it off if it differs. 12-port/1,000-form exact machine: 95 -> 70 kernels per form,
   649 -> 137 s, still exact. Noisy measurements
   end with one joint LP over every form's uses and every measured kernel (``_polish``): the
   per-form LPs see each other's errors only through fixed uses.
   Exact measurements (``tol < NOISY_TOL``): the per-form LPs run Gauss-Seidel (each sees the
   uses already refitted in the same pass), every mix stays designated to the resource its SK
   saturates, and each mix's increase ``M(SK^s + i^n) - M(SK^s)`` bounds ``n rho(i, r)`` from
   above (equality while r stays the bottleneck, so the smallest proportion wins). Without
   these, the refitted uses oscillated between passes (no bounds from the other forms' new
   uses, then crushed by them) and the refinement resources ended with no use at all: the
   10-port/300-form machine had 5.8% RMS error, now 0.00%.

8. **The 512-bit mode** (``wide``, given the forms' vector lengths): a probe right after the
   singletons sees whether narrow vector forms run slower beside a 512-bit form than a
   resource model allows (Intel: port 1 takes no vector μops while 512-bit μops are in
   flight). Where they do, the stages above never mix the two kinds, and this last stage
   measures the forms beside a 512-bit carrier and fits their *wide* uses, which predictions
   take in kernels holding a 512-bit form. Carriers that change the narrow forms differently
   (Cascade Lake: FP and integer 512-bit forms) make states of the mode, each fitted apart
   (``states``). The same machinery, with other roles, fits legacy-SSE forms beside 256-bit
   AVX forms where the host pays no switch penalty but merges the dirty upper halves of the
   registers with an extra μop (``dirty``); ``modes`` runs this stage for both.

The model predicts ``max_r sum_i sigma(K, i) rho(i, r)`` (``cpumap.model.resmodel.predict``).

Kernels that no resource model explains (pairs slower together than in sequence, kernels
slower than the sum of their parts) are left out of every LP: why, and what they did on Zen 4,
in ``kernels``. A form with many such kernels (non-temporal stores, cache-line flushes, LFENCE
on Zen 4: ``kernels.non_additive``) is modelled approximately and flagged.

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
refinement round is dropped if it raises the misfit of singletons and pairs. Uses are still
estimated from differences of measurements (``M(SK + i^n) - M(SK)``), which amplify relative
noise by about ``T(SK) / (n t(i))``, and refinement rarely helps under noise, so the core must
find the resources: hence 28 basic instructions (with 16, 8% RMS at 2% noise; with 28, 4.9%).
Finally every form's model explains its own singleton: under noise, after the joint refit, a
form left short of it gets a resource of its own (``refit._owned``); otherwise its uses are
scaled up (``_explained``).

Modules, each importing only those before it: ``config`` (``PalmedConfig``, the thresholds,
the shared types), ``kernels`` (stages 1-3, random test kernels, mixes, which measured kernels a
resource model may be fitted to), ``lp`` (the LP solve, its rows, a model's load on a kernel),
``core`` (stage 4), ``forms`` (stages 5-6, the per-form LPs), ``refit`` (joint refit, misfit,
every singleton explained), ``remaining`` (stage 7, refinement), ``wide`` (stage 8),
``states`` (the mode's probe, its states, stage 8 once per state), ``build`` (the driver). This
package only re-exports the names used from outside.
"""

from cpumap.model.palmed.build import Build, build_model
from cpumap.model.palmed.config import PalmedConfig
from cpumap.model.palmed.core import Core, Step, fit_core
from cpumap.model.palmed.forms import select_mapping_kernels, select_saturating
from cpumap.model.palmed.kernels import (
    NON_ADDITIVE_SHARE,
    Basic,
    balanced,
    interacting_pairs,
    mix,
    pair_candidates,
    select_basic,
    select_pairs,
    singleton_kernels,
)
from cpumap.model.palmed.lp import _LPStats as _LPStats  # internals the tests reach
from cpumap.model.palmed.lp import _predict as _predict
from cpumap.model.palmed.refit import _polish as _polish
from cpumap.model.palmed.remaining import fit_remaining

__all__ = [
    "NON_ADDITIVE_SHARE",
    "Basic",
    "Build",
    "Core",
    "PalmedConfig",
    "Step",
    "balanced",
    "build_model",
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
