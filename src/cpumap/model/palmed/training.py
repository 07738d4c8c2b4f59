"""Random kernels drawn like the held-out ones: the joint refits' training kernels.

Palmed's stages choose kernels that reveal resources (balanced pairs, mixes with the
saturating kernels), and those are not the kernels the model is used on. The joint refits
(``refit._polish``, and the wide stage's ``wide._refit_mode``) fit every measured kernel they
are given, so random kernels drawn as the held-out ones are (``mixed_kernels``, shared with
``cpumap.model.validation``) teach them the kernels the model is judged on; the held-out
draw then leaves them out.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence, Set

from cpumap.measure.asmgen import canonical
from cpumap.model.palmed.config import Kernel, PalmedConfig


def mixed_kernels(forms: Sequence[str], count: int, seed: int, min_distinct: int,
                  max_distinct: int, max_mult: int, skip: Callable[[Kernel], bool],
                  exclude: Set[str] = frozenset()) -> list[str]:
    """``count`` distinct kernels (canonical texts) of min..max_distinct distinct forms with
    multiplicities 1..max_mult, deterministic; none that ``skip`` refuses, none in
    ``exclude``. The held-out kernels (``validation.random_kernels``) and the joint refit's
    random training kernels (``training_kernels``) are both drawn by it, so that the model is
    fitted to kernels like those it is judged on."""
    rng = random.Random(seed)
    pool = sorted(forms)
    out: dict[str, None] = {}
    attempts = 0
    while len(out) < count and attempts < 100 * count and len(pool) >= min_distinct:
        attempts += 1
        k = rng.randint(min_distinct, min(max_distinct, len(pool)))
        kernel = {f: rng.randint(1, max_mult) for f in rng.sample(pool, k)}
        if skip(kernel):
            continue
        text = canonical(kernel)
        if text not in exclude:
            out.setdefault(text, None)
    return list(out)


#: Offset of the training kernels' seed from ``PalmedConfig.seed``: another draw than the
#: held-out kernels' (``model.validation_seed``, 1 by default); the wide ones take the next.
TRAINING_SEED = 7919


def training_kernels(forms: Sequence[str], cfg: PalmedConfig,
                     skip: Callable[[Kernel, bool], bool],
                     wide: Set[str] | None = None) -> tuple[list[str], list[str]]:
    """``cfg.training_kernels`` random kernels of 2-5 forms of ``forms`` for the plain joint
    refit, and where the host has a 512-bit mode (``wide``: its 512-bit forms) as many
    holding one of them for the wide stage's refit. ``skip(kernel, modes)`` refuses the
    kernels the plain stages (``modes``) or the wide stage may not measure.

    Measured with the mapping kernels; only the joint refits fit them (the per-form LPs see
    only mixes with saturating kernels). Zen 4 full profile, its database refitted with
    25,000 plain ones (2026-11-27, docs/operations.md), on the same 2,000 held-out kernels:
    RMS IPC error 10.0 % -> 9.5 %, Kendall's tau 0.872 -> 0.879. The plain refit has no
    mode, so its kernels leave the 512-bit forms out; the held-out kernels holding one (30 %
    of them) are predicted by the wide uses, and 25,000 wide ones (same database, fitted
    again) took those from 11.6 % RMS and tau 0.857 to 10.8 % and 0.869 (all 2,000: 9.5 %
    and 0.879 to 9.2 % and 0.883)."""
    n, seed = cfg.training_kernels, cfg.seed + TRAINING_SEED
    plain = mixed_kernels([f for f in forms if f not in (wide or ())], n, seed, 2, 5, 4,
                          lambda k: skip(k, True))
    if not wide:
        return plain, []
    return plain, mixed_kernels(forms, n, seed + 1, 2, 5, 4, lambda k: skip(k, False) or not any(
        f in wide for f in k))
