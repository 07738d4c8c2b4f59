"""Held-out validation of a resource model: random kernels, measured and predicted.

The kernels are drawn independently of the ones Palmed chose (1 to 5 distinct forms with
random multiplicities, from a fixed seed, none of the random kernels the joint refit was
given), so the errors say how the model does on kernels it never saw. IPC is compared rather
than cycles because it is what the seed's evaluation uses: RMS relative error of IPC, and
Kendall's tau of the IPC ranking (scipy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from cpumap.isa import transition
from cpumap.measure import asmgen
from cpumap.model import resmodel
from cpumap.model.palmed.training import mixed_kernels


def random_kernels(forms: Sequence[str], count: int, seed: int, max_distinct: int = 5,
                   max_mult: int = 4, apart: Mapping[str, str] | None = None,
                   exclude: Set[str] = frozenset()) -> list[str]:
    """``count`` distinct kernels (canonical texts) of 1..max_distinct forms, deterministic;
    none mixing the families of ``apart`` (``cpumap.isa.transition``: the host's SSE/AVX
    switching penalty, which no throughput model is meant to predict), none in ``exclude``
    (the random kernels the model was fitted to: held out means not among them)."""
    return mixed_kernels(forms, count, seed, 1, max_distinct, max_mult,
                         lambda k: bool(apart) and transition.mixes(k, apart), exclude)


#: Bootstrap of the held-out metrics: resamples and the seed (the same interval every run).
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0


def metrics(table: pd.DataFrame) -> dict[str, Any]:
    """Coverage-free metrics of a table with ``ipc_measured`` and ``ipc_predicted`` columns,
    with 95 % bootstrap intervals of the RMS error and of Kendall's tau (``*_ci``).

    Why intervals: the error of a few hundred random kernels is dominated by a few of them
    (Zen 4, full profile: 7.9 % RMS and tau 0.881 on the 200 kernels of seed 1, 10.2 % and
    0.875 on 2,000 of seed 2, same model), so a point figure alone says less than it seems.
    """
    ok = table.dropna(subset=["ipc_measured", "ipc_predicted"])
    if ok.empty:
        return {"kernels": 0, "rms_rel_error_ipc": math.nan, "mape_ipc": math.nan,
                "kendall_tau": math.nan}
    meas = ok.ipc_measured.to_numpy(float)
    pred = ok.ipc_predicted.to_numpy(float)
    rel = (pred - meas) / meas
    out: dict[str, Any] = {"kernels": int(len(ok)),
                           "rms_rel_error_ipc": float(np.sqrt(np.mean(rel ** 2))),
                           "mape_ipc": float(np.mean(np.abs(rel))),
                           "kendall_tau": float(kendalltau(meas, pred).statistic)
                           if len(ok) > 1 else math.nan}
    if len(ok) > 2:
        # percentile bootstrap over kernels (paired: a kernel's measured and predicted IPC
        # are drawn together)
        rng = np.random.default_rng(BOOTSTRAP_SEED)
        draws = rng.integers(0, len(ok), size=(BOOTSTRAP_RESAMPLES, len(ok)))
        rms = np.sqrt(np.mean(rel[draws] ** 2, axis=1))
        taus = np.array([kendalltau(meas[d], pred[d]).statistic for d in draws])
        out["rms_rel_error_ipc_ci"] = [float(v) for v in np.percentile(rms, [2.5, 97.5])]
        out["kendall_tau_ci"] = [float(v) for v in np.nanpercentile(taus, [2.5, 97.5])]
    return out


def validate(model: resmodel.ResourceModel, kernels: Sequence[str],
             measure: Callable[[list[str]], Mapping[str, float]],
             widths: Mapping[str, int] | None = None,
             fams: Mapping[str, str] | None = None,
             uncertainty: Callable[[list[str]], Mapping[str, float]] | None = None
             ) -> pd.DataFrame:
    """Measured and predicted cycles and IPC of each kernel (failed measurements: NaN), and
    which kernels hold a 512-bit vector form beside narrower ones (``mixes_512``, from
    ``widths``: ``transition.vector_lengths``) or a legacy-SSE form beside a 256-bit or wider
    AVX one (``mixes_sse_avx``, from ``fams``: ``transition.families``): the two kinds of
    kernel whose forms run otherwise together than apart on an Intel core. With
    ``uncertainty`` (``Measurer.uncertainty``), each measurement's own relative uncertainty
    (``measured_uncertainty``): how far its rounds were apart."""
    measured = measure(list(kernels))
    unc = uncertainty(list(kernels)) if uncertainty is not None else None
    rows = []
    for text in kernels:
        k = asmgen.parse_canonical(text)
        n = sum(k.values())
        pred, bottleneck = resmodel.predict(model, k)
        meas = measured.get(asmgen.canonical(k), math.nan)
        rows.append({"kernel": text, "n_insns": n, "cycles_measured": meas,
                     "cycles_predicted": pred, "bottleneck": bottleneck,
                     "interacting": resmodel.interacting(model, k),
                     "mixes_512": transition.mixes_512(k, widths or {}),
                     "mixes_sse_avx": transition.mixes(k, fams or {}),
                     "ipc_measured": n / meas if meas and meas > 0 else math.nan,
                     "ipc_predicted": n / pred if pred > 0 else math.nan}
                    | ({} if unc is None else {"measured_uncertainty": unc.get(text, math.nan)}))
    return pd.DataFrame(rows)
