#!/usr/bin/env python3
"""Acceptance figures for ``cpumap measure``: agreement, repeatability, linearity, pairs.

Why: a throughput number is only useful if it is right (agrees with an independent
measurement), stable (the same kernel measured again gives the same number, whatever the
neighbours on a shared host are doing), and behaves like throughput should when kernels are
combined (A*2 costs twice A; A B costs at least the slower of A and B). Each check prints
PASS/FAIL; the script always exits 0 because it is a report, not a gate. cpumap is run as a
subprocess, exactly as a user would run it. The forms are issue 12's list; on a host without
AVX-512 (Zen 3) the ymm form of the FMA stands in for the zmm one.

Checks:
(a) agreement: cycles of each form vs benchmarks/independent.py in the same run, <= 3 %;
(b) repeatability: 5 separate invocations per form, (max - min) / min of ``cycles`` <= 1 %
    (the invocations cpumap flagged itself are named, with why: unstable, no quiet round,
    slower than its reference);
(c) linearity: cycles(A*2) / cycles(A) within 1 % of 2;
(d) pairs: cycles(A B) >= max(cycles(A), cycles(B)) * 0.99.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from independent import runnable  # noqa: E402

FMA = runnable(["VFMADD231PD_ZMM_ZMM_ZMM"]) or ["VFMADD231PD_YMM_YMM_YMM"]
FORMS = ["ADD_R64_R64", "SHL_R64_I8", "IMUL_R64_R64", "MOV_R64_M64", "MOV_M64_R64",
         "VADDPD_YMM_YMM_YMM", "VMULPS_XMM_XMM_XMM", *FMA, "VPADDD_YMM_YMM_YMM",
         "VPSHUFB_YMM_YMM_YMM"]
PAIRS = [("ADD_R64_R64", "VADDPD_YMM_YMM_YMM"), ("MOV_R64_M64", "MOV_M64_R64"),
         ("IMUL_R64_R64", "ADD_R64_R64"), (FMA[0], "VPADDD_YMM_YMM_YMM"),
         ("SHL_R64_I8", "VPSHUFB_YMM_YMM_YMM")]


class Runner:
    """Runs ``cpumap measure --json --force --no-db`` and memoises results per kernel when asked."""

    def __init__(self, exe: str, results: str, cpu: int, repeat: int | None):
        # --no-db: a report must not add rows to the database; it also sidesteps the DB part
        # name (second resolution) colliding when one kernel is measured twice in a second.
        self.base = [exe, "--results", results, "measure", "--json", "--force", "--no-db",
                     "--cpu", str(cpu)]
        if repeat:
            self.base += ["--repeat", str(repeat)]
        self.memo: dict[tuple[str, ...], float | None] = {}
        #: invocations cpumap itself flagged (unstable, no quiet round, above the kernel's
        #: reference), with why: what a user would have been warned about
        self.flagged: dict[tuple[str, ...], list[tuple[float, str]]] = {}

    def fresh(self, instrs: list[str]) -> float | None:
        """One new invocation; None (reported as FAIL) if cpumap fails."""
        proc = subprocess.run(self.base + instrs, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"  cpumap failed on {' '.join(instrs)}: {proc.stderr.strip()[-300:]}",
                  file=sys.stderr)
            return None
        out = json.loads(proc.stdout)
        why = [w for w, flag in (("unstable", out.get("unstable")),
                                 ("no quiet round", out.get("quiet_rounds") == 0),
                                 ("above reference", out.get("above_reference"))) if flag]
        if why:
            self.flagged.setdefault(tuple(instrs), []).append(
                (float(out["cycles"]), f"{', '.join(why)}, {out.get('rounds')} rounds"))
        return float(out["cycles"])

    def cycles(self, instrs: list[str]) -> float | None:
        """Memoised: the same kernel is measured once across sections (a), (c) and (d)."""
        key = tuple(instrs)
        if key not in self.memo:
            self.memo[key] = self.fresh(instrs)
        return self.memo[key]


def fmt(x: float | None, spec: str = ".4f") -> str:
    return "n/a" if x is None else format(x, spec)


def repeatability(run: Runner, n: int) -> list[dict]:
    """(b) spread of ``cycles`` over n separate invocations per form; their median is the form's
    value for (a), (c) and (d)."""
    print(f"(b) repeatability over {n} invocations, (max-min)/min <= 1%")
    rows = []
    for form in FORMS:
        vals = [run.fresh([form]) for _ in range(n)]
        good = sorted(v for v in vals if v is not None)
        spread = (good[-1] - good[0]) / good[0] if len(good) == n else None
        ok = spread is not None and spread <= 0.01
        if good:
            run.memo[(form,)] = good[len(good) // 2]
        flagged = run.flagged.get((form,), [])
        rows.append({"kernel": form, "cycles": vals, "spread": spread, "pass": ok,
                     "flagged": flagged})
        note = f"  (flagged by cpumap: {'; '.join(f'{v:.4f} {w}' for v, w in flagged)})" \
            if flagged else ""
        print(f"  {form:<26} min {fmt(min(good, default=None))}  "
              f"max {fmt(max(good, default=None))}  spread {fmt(spread, '.3%'):>7}  "
              f"{'PASS' if ok else 'FAIL'}{note}")
    return rows


def agreement(run: Runner, cpu: int) -> list[dict]:
    """(a) cpumap (median of the invocations of (b)) vs the independent inline-asm loops."""
    cmd = [sys.executable, str(HERE / "independent.py"), "--json", "--cpu", str(cpu), *FORMS]
    ref = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    print(f"(a) agreement with benchmarks/independent.py (core clock {ref['_ghz']:.4f} GHz), "
          "<= 3%")
    rows = []
    for form in FORMS:
        ind = ref[form]
        c = run.cycles([form])
        rel = None if c is None else c / ind - 1
        ok = rel is not None and abs(rel) <= 0.03
        rows.append({"form": form, "cpumap": c, "independent": ind, "rel_diff": rel, "pass": ok})
        print(f"  {form:<26} cpumap {fmt(c)}  indep {ind:.4f}  diff {fmt(rel, '+.2%'):>8}  "
              f"{'PASS' if ok else 'FAIL'}")
    return rows


def linearity(run: Runner) -> list[dict]:
    """(c) A*2 must cost twice A (cycles are per kernel instance)."""
    print("(c) linearity: cycles(A*2) / cycles(A) within 1% of 2")
    rows = []
    for form in FORMS:
        one, two = run.cycles([form]), run.cycles([f"{form}*2"])
        ratio = None if one is None or two is None else two / one
        ok = ratio is not None and abs(ratio / 2 - 1) <= 0.01
        rows.append({"form": form, "cycles": one, "cycles_x2": two, "ratio": ratio, "pass": ok})
        print(f"  {form:<26} A {fmt(one)}  A*2 {fmt(two)}  ratio {fmt(ratio, '.4f')}  "
              f"{'PASS' if ok else 'FAIL'}")
    return rows


def pairs(run: Runner) -> list[dict]:
    """(d) a kernel cannot be faster than its slowest part."""
    print("(d) pairs: cycles(A B) >= max(cycles(A), cycles(B)) * 0.99")
    rows = []
    for a, b in PAIRS:
        ca, cb, cab = run.cycles([a]), run.cycles([b]), run.cycles([a, b])
        ok = None not in (ca, cb, cab) and cab >= max(ca, cb) * 0.99
        rows.append({"a": a, "b": b, "cycles_a": ca, "cycles_b": cb, "cycles_ab": cab,
                     "pass": ok})
        print(f"  {a + ' ' + b:<44} A {fmt(ca)}  B {fmt(cb)}  AB {fmt(cab)}  "
              f"{'PASS' if ok else 'FAIL'}")
    return rows


def main() -> int:
    """Run the four sections, print the report, and a summary line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_exe = HERE.parent / ".venv" / "bin" / "cpumap"
    p.add_argument("--cpumap", default=str(default_exe) if default_exe.exists()
                   else shutil.which("cpumap"), help="cpumap executable")
    p.add_argument("--results", default="/tmp/bench-results", help="cpumap results directory")
    p.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)),
                   help="CPU for both cpumap and independent.py (default: last allowed)")
    p.add_argument("--repeat", type=int, help="cpumap --repeat K (default: cpumap's)")
    p.add_argument("--invocations", type=int, default=5, help="for the repeatability check")
    p.add_argument("--json", action="store_true", help="also write the figures as JSON")
    a = p.parse_args()
    if not a.cpumap:
        p.error("cpumap executable not found; pass --cpumap")
    run = Runner(a.cpumap, a.results, a.cpu, a.repeat)
    rep = repeatability(run, a.invocations)
    report = {"cpu": a.cpu, "repeatability": rep, "agreement": agreement(run, a.cpu),
              "linearity": linearity(run), "pairs": pairs(run)}
    counts = {k: (sum(r["pass"] for r in v), len(v)) for k, v in report.items() if k != "cpu"}
    report["summary"] = {k: {"pass": p_, "total": t} for k, (p_, t) in counts.items()}
    if a.json:
        print(json.dumps(report, indent=2))
    print("summary: " + ", ".join(f"{k} {p_}/{t}" for k, (p_, t) in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
