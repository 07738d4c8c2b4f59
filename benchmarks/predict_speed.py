"""`cpumap predict` at the native size: start-up, model load, bulk predictions per second.

Usage: python benchmarks/predict_speed.py [--forms 6000] [--ports 12] [--kernels 100000]
       python benchmarks/predict_speed.py --model results/<id>/model/model.json

Builds two resource models of a synthetic port mapping of the given size (multi-μop forms:
cpumap.model.portmap): the exact one (one resource per closed port set: every form uses most
of the 200-odd resources, a worst case far denser than a fitted model) and a sparse one of the
same size (one resource per μop port set, a form uses 1-4 resources, like the models Palmed
fits); with ``--model``, a fitted model instead (e.g. the full profile's). For each, it writes
model.json and prints:

- the size of the model (forms, resources, non-zero uses, bytes);
- the seconds to load it (``resmodel.load``, best of 5) and to build the predictor;
- the wall seconds of ``cpumap --help`` and of ``cpumap predict`` on one kernel (best of 5,
  a fresh interpreter each: what a user waits for);
- the wall seconds of ``cpumap predict --file`` on ``--kernels`` random kernels (1-5 distinct
  forms, multiplicities 1-4, canonical text) and the predictions per second, process start
  and model load included; the output is checked line by line against ``resmodel.predict``
  (plus ``resmodel.switching`` where the model carries an SSE/AVX switching cost).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cpumap.measure.asmgen import canonical
from cpumap.model import resmodel
from cpumap.model.portmap import synthetic_mapping, true_resource_model

CLI = [sys.executable, "-m", "cpumap.cli"]


def best_wall(cmd: list[str], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forms", type=int, default=6000)
    ap.add_argument("--ports", type=int, default=12)
    ap.add_argument("--kernels", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", type=Path, help="a fitted model.json instead of synthetic ones")
    args = ap.parse_args()

    if args.model is not None:
        run(f"fitted ({args.model})", resmodel.load(args.model), args)
        return 0

    mapping = synthetic_mapping(args.ports, args.forms, args.seed)
    truth = true_resource_model(mapping)
    run("dense (exact closed-set model)",
        resmodel.ResourceModel(resources=truth["resources"], rho=truth["rho"]), args)
    run("sparse (one resource per μop port set)", sparse_model(mapping), args)
    return 0


def sparse_model(mapping: dict) -> resmodel.ResourceModel:
    rho: dict[str, dict[str, float]] = {}
    for form, uops in mapping["assignment"].items():
        uses: dict[str, float] = {}
        for ports in uops:
            name = "+".join(sorted(ports))
            uses[name] = uses.get(name, 0.0) + 1.0 / len(ports)
        rho[form] = uses
    resources = sorted({r for u in rho.values() for r in u})
    return resmodel.ResourceModel(resources=resources, rho=rho)


def run(title: str, model: resmodel.ResourceModel, args: argparse.Namespace) -> None:
    print(f"== {title}")
    with tempfile.TemporaryDirectory() as tmp:
        path = resmodel.save(model, Path(tmp) / "model.json")
        uses = sum(len(u) for u in model.rho.values())
        print(f"model: {len(model.rho)} forms, {len(model.resources)} resources, {uses} "
              f"non-zero uses, {path.stat().st_size} bytes")
        load_s = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            loaded = resmodel.load(path)
            load_s = min(load_s, time.perf_counter() - t0)
        t0 = time.perf_counter()
        resmodel.Predictor(loaded)  # what `cpumap predict` builds before its first line
        build_s = time.perf_counter() - t0
        print(f"load: {load_s:.3f} s (best of 5); predictor: {build_s:.3f} s")

        forms = loaded.forms
        rng = random.Random(args.seed)
        kernels = [{f: rng.randint(1, 4) for f in rng.sample(forms, rng.randint(1, 5))}
                   for _ in range(args.kernels)]
        help_s = best_wall([*CLI, "--help"])
        one_s = best_wall([*CLI, "predict", "--model", str(path), canonical(kernels[0])])
        print(f"start-up: cpumap --help {help_s:.3f} s, cpumap predict (one kernel, model "
              f"load included) {one_s:.3f} s (best of 5)")

        infile = Path(tmp) / "kernels.txt"
        infile.write_text("".join(canonical(k) + "\n" for k in kernels))
        t0 = time.perf_counter()
        proc = subprocess.run([*CLI, "predict", "--model", str(path), "--file", str(infile)],
                              capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t0
        out = proc.stdout.splitlines()
        assert len(out) == len(kernels), (len(out), proc.stderr[-2000:])
        for k, line in zip(kernels, out, strict=True):
            obj = json.loads(line)
            cycles, bottleneck = resmodel.predict(loaded, canonical(k))
            # a host that pays for SSE/AVX switches: the CLI adds them (resmodel.switching)
            cycles += resmodel.switching(loaded, canonical(k))[1]
            assert obj["cycles"] == cycles and obj["bottleneck"] == bottleneck, obj
        print(f"bulk: {len(kernels)} kernels in {wall:.2f} s wall = "
              f"{len(kernels) / wall:.0f} predictions per second (process start and model "
              "load included; every answer equals resmodel.predict plus the switches)")


if __name__ == "__main__":
    sys.exit(main())
