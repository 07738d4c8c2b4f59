"""Palmed's knobs, its thresholds, and the types every stage shares.

The thresholds are tuned together (most in units of ``tol``: when measurements count as noisy,
what a soft bound costs, how far a pair or a kernel may exceed what a resource model allows)
and several stages read each of them; with ``PalmedConfig`` and the shared types (``Kernel``,
``Measurements``, ``Log``) they sit at the bottom of the package, so that every other module
imports from here and this module imports nothing of Palmed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

#: From this tolerance on, measurements are treated as noisy: inconsistent bounds are dropped.
NOISY_TOL = 0.01
#: Noisy per-form LPs: cost of exceeding an upper bound, relative to a tightness residual.
SOFT_UPPER = 3.0
#: Noisy refinement: a round that raises the misfit of singletons and pairs by more than this
#: share is dropped.
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
    # mapping kernels screened: each form meets each saturating kernel at the balanced
    # proportion first, and at the lighter ones only where that mix was slower than SK alone
    screen: bool = True
    # the joint refit (``refit._polish``) runs only while its candidate upper bounds (kernels
    # x (resources - 1)) stay within this; above, the per-form fits are the model. The native
    # full profile's (Sapphire Rapids-class guest, 135,267 kernels x 23) took 8 min (4 LPs)
    # and brought the held-out kernels without 512-bit forms from 10.4 % to 8.3 % RMS
    refit_max_bounds: int | None = 4_000_000
    # random kernels of 2-5 forms fitted by the joint refits (``training.training_kernels``)
    training_kernels: int = 0
    # their weight in the plain joint refit's objective (``refit._polish``), the other
    # kernels' being 1: they are drawn like the kernels the model is judged on
    training_weight: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"tol": self.tol, "max_mult": self.max_mult, "max_basic": self.max_basic,
                "core_tests": self.core_tests, "sat_factor": self.sat_factor,
                "betas": list(self.betas), "max_resources": self.max_resources,
                "max_refine": self.max_refine, "refine_batch": self.refine_batch,
                "fit_rounds": self.fit_rounds, "max_kernel": self.max_kernel,
                "seed": self.seed, "max_pair_forms": self.max_pair_forms,
                "core_batch": self.core_batch, "max_core_resources": self.max_core_resources,
                "screen": self.screen, "refit_max_bounds": self.refit_max_bounds,
                "training_kernels": self.training_kernels,
                "training_weight": self.training_weight}

    @property
    def core_cap(self) -> int:
        return min(self.max_resources, self.max_core_resources or self.max_resources)


#: Knobs only the last stage reads (``fit_model``'s joint refit): a state the earlier stages
#: saved with other values is fitted with these, as none of its kernels depends on them.
FIT_ONLY = ("training_weight",)


def resumed(saved: PalmedConfig, wanted: PalmedConfig | None, path: object) -> PalmedConfig:
    """The config a stage resumes a saved state with: ``wanted`` where it differs from the
    saved one in ``FIT_ONLY`` knobs at most (an error otherwise: a stage must not mix two
    builds), the saved one where none is wanted."""
    if wanted is None:
        return saved
    if replace(wanted, **{k: getattr(saved, k) for k in FIT_ONLY}) != saved:
        raise RuntimeError(f"{path} was built with {saved}, this stage runs with {wanted}")
    return wanted
