"""Palmed on a simulated machine: kernels per stage, LP solve times, accuracy on held-out kernels.

Usage: python benchmarks/palmed_sim.py [--ports 10] [--forms 300] [--noise 0.0] [--seed 0]

Builds ``synthetic_mapping(n_ports, n_forms)``, runs ``palmed.build_model`` against the
simulated machine, then predicts random held-out kernels (1-5 distinct forms, multiplicities
1-4) and prints the RMS relative error of IPC and Kendall's tau against the exact schedule.
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

from cpumap import palmed, resmodel
from cpumap.portmap import synthetic_mapping
from cpumap.simulate import SimulatedMachine


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
    return {"rms": float(np.sqrt(np.mean(rel ** 2))), "max": float(np.max(np.abs(rel))),
            "tau": float(kendalltau(t, p).statistic)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ports", type=int, default=10)
    ap.add_argument("--forms", type=int, default=300)
    ap.add_argument("--noise", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tests", type=int, default=2000)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    mapping = synthetic_mapping(args.ports, args.forms, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"synthetic-{args.ports}p-{args.forms}f.json"
        path.write_text(json.dumps(mapping))
        machine = SimulatedMachine(path, noise=args.noise, seed=args.seed)
    tol = max(1e-6, 3.5 * args.noise)
    cfg = palmed.PalmedConfig(tol=tol, seed=args.seed)
    log = (lambda s: print("  " + s, file=sys.stderr)) if args.verbose else (lambda s: None)
    t0 = time.perf_counter()
    model, stats = palmed.build_model(machine.forms, machine.measure, config=cfg, log=log)
    wall = time.perf_counter() - t0
    acc = evaluate(model, machine, held_out(machine.forms, args.tests, args.seed + 1000))
    print(f"machine {machine.machine_id}: {args.ports} ports, {args.forms} forms, "
          f"noise {args.noise:.1%}")
    print(f"classes {stats['n_classes']}, basic {stats['n_basic']}, resources "
          f"{stats['n_resources']} ({stats['n_core_resources']} core)")
    print("kernels per stage: " + ", ".join(f"{k} {v}" for k, v in stats["kernels"].items())
          + f"; total {stats['total_kernels']}")
    for stage, v in stats["lp"].items():
        print(f"LP {stage}: {v['solves']} solves, {v['seconds']:.2f} s")
    print("wall per stage: " + ", ".join(f"{k} {v:.2f}s" for k, v in stats["wall_seconds"].items())
          + f"; total {wall:.1f} s")
    print(f"held-out {args.tests} kernels: RMS rel. IPC error {acc['rms']:.2%}, "
          f"max {acc['max']:.1%}, Kendall tau {acc['tau']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
