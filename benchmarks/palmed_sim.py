"""Palmed on a simulated machine: kernels per stage, LP solve times, accuracy on held-out kernels.

Usage: python benchmarks/palmed_sim.py [--ports 10] [--forms 300] [--noise 0.0] [--seed 0]
                                     [--workers 1]
       python benchmarks/palmed_sim.py --matrix   # 8p/100f and 10p/300f, noise 0 and 2%
       python benchmarks/palmed_sim.py --wide [--states 2] [--noise 0.02]  # the 512-bit mode
       python benchmarks/palmed_sim.py --dirty [--noise 0.02]  # legacy SSE beside AVX

Builds ``synthetic_mapping(n_ports, n_forms)``, runs ``palmed.build_model`` against the
simulated machine (tol = 3.5 x noise), then predicts random held-out kernels (1-5 distinct
forms, multiplicities 1-4) and prints kernels per stage, LP solve times, wall time, and the
RMS relative error, MAPE of IPC and Kendall's tau against the exact (noise-free) schedule.

``--wide``: the small core of ``portmap.wide_mode_mapping`` whose narrow vector forms leave
port 1 beside 512-bit ones, built without and with the vector lengths (the 512-bit mode,
``cpumap.model.palmed.wide``); RMS and max relative error of IPC per kind of held-out
kernel (no 512-bit form, 512-bit forms only, mixed).

``--dirty``: the small core of ``portmap.dirty_upper_mapping`` whose legacy-SSE forms take a
merge μop beside 256-bit AVX forms, built without and with the dirty-upper probe
(``cpumap.model.palmed.dirty``); errors per kind (no legacy SSE beside AVX, mixed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from cpumap.isa.transition import mixes, mixes_512
from cpumap.model import palmed, resmodel
from cpumap.model.jobs import NATIVE_REFINE_BATCH
from cpumap.model.palmed.build import build_model
from cpumap.model.palmed.forms import set_lp_workers
from cpumap.model.portmap import dirty_upper_mapping, synthetic_mapping, wide_mode_mapping
from cpumap.model.simulate import SimulatedMachine


def held_out(forms: list[str], count: int, seed: int) -> list[dict[str, int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        k = int(rng.integers(1, 6))
        pick = rng.choice(len(forms), size=k, replace=False)
        out.append({forms[int(p)]: int(rng.integers(1, 5)) for p in pick})
    return out


def evaluate(model: resmodel.ResourceModel, machine: SimulatedMachine,
             kernels: list[dict[str, int]]) -> dict[str, float]:
    """RMS relative IPC error and Kendall's tau of IPC, against the exact (noise-free) cycles."""
    true_ipc, pred_ipc = [], []
    for k in kernels:
        n = sum(k.values())
        true_ipc.append(n / machine.exact(k))
        pred_ipc.append(n / resmodel.predict(model, k)[0])
    t, p = np.array(true_ipc), np.array(pred_ipc)
    rel = (p - t) / t
    return {"rms": float(np.sqrt(np.mean(rel ** 2))), "mape": float(np.mean(np.abs(rel))),
            "max": float(np.max(np.abs(rel))), "tau": float(kendalltau(t, p).statistic)}


def run_one(ports: int, forms: int, noise: float, seed: int, tests: int,
            verbose: bool, training: int = 0, training_weight: float = 1.0,
            betas: tuple[float, ...] | None = None) -> dict:
    """Build and evaluate one simulated machine; print its figures; return them."""
    mapping = synthetic_mapping(ports, forms, seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"synthetic-{ports}p-{forms}f.json"
        path.write_text(json.dumps(mapping))
        machine = SimulatedMachine(path, noise=noise, seed=seed)
    # noisy: refinement rounds of the native profile's size (``jobs.NATIVE_REFINE_BATCH``);
    # a round is kept or dropped as a whole, and one resource that moves uses between
    # near-twins sinks the others (10p/300f at 2 %, seeds 0-2: 2.84/7.85/7.03 % RMS with
    # rounds of 4, 3.66/4.34/4.98 % with rounds of 2)
    batch = NATIVE_REFINE_BATCH if noise else palmed.PalmedConfig.refine_batch
    cfg = palmed.PalmedConfig(tol=max(1e-6, 3.5 * noise), seed=seed, refine_batch=batch,
                              training_kernels=training, training_weight=training_weight,
                              **({"betas": betas} if betas else {}))
    log = (lambda s: print("  " + s, file=sys.stderr)) if verbose else (lambda s: None)
    t0 = time.perf_counter()
    model, stats = build_model(machine.forms, machine.measure, config=cfg, log=log)
    wall = time.perf_counter() - t0
    acc = evaluate(model, machine, held_out(machine.forms, tests, seed + 1000))
    print(f"machine {machine.machine_id}: {ports} ports, {forms} forms, noise {noise:.1%}, "
          f"tol {cfg.tol:g}")
    print(f"  pairs among {stats['n_pair_forms']} forms; classes {stats['n_classes']}, basic "
          f"{stats['n_basic']}, resources {stats['n_resources']} "
          f"({stats['n_core_resources']} core)")
    print("  kernels per stage: " + ", ".join(f"{k} {v}" for k, v in stats["kernels"].items())
          + f"; total {stats['total_kernels']} ({stats['total_kernels'] / forms:.0f} per form)")
    print("  measurement rounds: " + ", ".join(f"{k} {v}"
                                               for k, v in stats["measure_rounds"].items()))
    for stage, v in stats["lp"].items():
        print(f"  LP {stage}: {v['solves']} solves, {v['seconds']:.2f} s")
    print("  wall per stage: " + ", ".join(f"{k} {v:.2f}s"
                                           for k, v in stats["wall_seconds"].items())
          + f"; total {wall:.1f} s")
    print(f"  held-out {tests} kernels: RMS rel. IPC error {acc['rms']:.2%}, MAPE "
          f"{acc['mape']:.2%}, max {acc['max']:.1%}, Kendall tau {acc['tau']:.4f}", flush=True)
    return {"ports": ports, "forms": forms, "noise": noise, "wall": wall, **acc,
            "kernels": stats["total_kernels"]}


def run_wide(noise: float, seed: int, tests: int, states: int = 1) -> None:
    """The 512-bit mode's core, without and with the vector lengths: errors per kind
    (``states=2``: Cascade Lake's two states of the mode)."""
    mapping, widths = wide_mode_mapping(states=states)
    machine = SimulatedMachine(mapping=mapping, noise=noise, seed=seed)
    cfg = palmed.PalmedConfig(tol=max(1e-6, 3 * noise), seed=seed)
    kernels = held_out(machine.forms, tests, seed + 1000)
    kinds: dict[str, list[dict[str, int]]] = {"plain": [], "512-bit only": [], "mixed": []}
    for k in kernels:
        wide = any(widths.get(f, 0) >= 512 for f in k)
        kinds["mixed" if mixes_512(k, widths) else "512-bit only" if wide else "plain"].append(k)
    print(f"512-bit mode core ({states} state{'s' if states > 1 else ''}), "
          f"{len(machine.forms)} forms, noise {noise:.1%}, tol {cfg.tol:g}")
    for label, w in (("without the vector lengths", None), ("with them", widths)):
        model, stats = build_model(machine.forms, machine.measure, config=cfg, widths=w)
        parts = [f"{kind} ({len(ks)}): {evaluate(model, machine, ks)['rms']:.2%} RMS, "
                 f"max {evaluate(model, machine, ks)['max']:.1%}"
                 for kind, ks in kinds.items() if ks]
        print(f"  {label}: {stats['n_resources']} resources, {stats['total_kernels']} "
              f"kernels; " + "; ".join(parts), flush=True)


def run_dirty(noise: float, seed: int, tests: int) -> None:
    """The dirty-upper core, without and with its probe: errors per kind."""
    mapping, fams = dirty_upper_mapping()
    machine = SimulatedMachine(mapping=mapping, noise=noise, seed=seed)
    cfg = palmed.PalmedConfig(tol=max(1e-6, 3 * noise), seed=seed)
    carriers = sorted(f for f, fam in fams.items() if fam == "avx" and "_M" not in f)
    kinds: dict[str, list[dict[str, int]]] = {"plain": [], "mixed": []}
    for k in held_out(machine.forms, tests, seed + 1000):
        kinds["mixed" if mixes(k, fams) else "plain"].append(k)
    print(f"dirty-upper core, {len(machine.forms)} forms, noise {noise:.1%}, tol {cfg.tol:g}")
    for label, dirty in (("without the probe", None), ("with it", (fams, carriers))):
        model, stats = build_model(machine.forms, machine.measure, config=cfg, dirty=dirty)
        parts = [f"{kind} ({len(ks)}): {e['rms']:.2%} RMS, max {e['max']:.1%}"
                 for kind, ks in kinds.items() if ks
                 for e in [evaluate(model, machine, ks)]]
        print(f"  {label}: {stats['n_resources']} resources, {stats['total_kernels']} "
              f"kernels; " + "; ".join(parts), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ports", type=int, default=10)
    ap.add_argument("--forms", type=int, default=300)
    ap.add_argument("--noise", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tests", type=int, default=2000)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--training", type=int, default=0,
                    help="random training kernels of 2-5 forms for the joint refit "
                    "(model.training_kernels: 2,000 in the default run, 25,000 in the full "
                    "profile); never the held-out ones")
    ap.add_argument("--training-weight", type=float, default=1.0,
                    help="their weight in the joint refit (model.training_weight)")
    ap.add_argument("--workers", type=int, default=1,
                    help="processes for the per-form LPs of noisy fitting passes")
    ap.add_argument("--betas", type=lambda v: tuple(float(x) for x in v.split(",")),
                    default=None, help="the mapping kernels' proportions, comma-separated "
                    "(PalmedConfig.betas; default: the build's own)")
    ap.add_argument("--matrix", action="store_true",
                    help="8 ports/100 forms and 10 ports/300 forms, each without and with 2%% "
                    "noise")
    ap.add_argument("--wide", action="store_true",
                    help="the 512-bit mode's small core, without and with the vector lengths")
    ap.add_argument("--states", type=int, default=1, choices=(1, 2),
                    help="with --wide: the states of the mode (2: Cascade Lake's)")
    ap.add_argument("--dirty", action="store_true",
                    help="the dirty-upper core, without and with its probe")
    args = ap.parse_args(argv)
    set_lp_workers(args.workers)
    if args.dirty:
        run_dirty(args.noise, args.seed, args.tests)
        return 0
    if args.wide:
        run_wide(args.noise, args.seed, args.tests, args.states)
        return 0
    if args.matrix:
        runs = [(8, 100, 0.0), (8, 100, 0.02), (10, 300, 0.0), (10, 300, 0.02)]
    else:
        runs = [(args.ports, args.forms, args.noise)]
    for ports, forms, noise in runs:
        run_one(ports, forms, noise, args.seed, args.tests, args.verbose, args.training,
                args.training_weight, args.betas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
