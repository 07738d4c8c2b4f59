#!/usr/bin/env python3
"""Latencies by `cpumap measure --latency` beside independent hand-written chains (issue 15).

The independent side shares no code with cpumap's (benchmarks/independent.py's method: file-
scope asm loops at unroll U and 2U, clock_gettime chunks, the minimum kept, ns converted to
cycles by a dependent add chain), with registers and values of its own. Both run in the same
invocation, interleaved form by form; a chain across register classes is compared by its
measured round trip. Prints one line per form and exits 1 if a form is off by more than the
tolerance (5 % by default).

    .venv/bin/python benchmarks/latency_check.py [--results DIR] [--tolerance 0.05]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import independent  # noqa: E402

ONE = ["mov $0x3FF0000000000000, %rax", "vmovq %rax, %xmm0", "vbroadcastsd %xmm0, %ymm0",
       "vmovapd %ymm0, %ymm1", "vmovapd %ymm0, %ymm2"]
ONE_ZMM = ["mov $0x3FF0000000000000, %rax", "vmovq %rax, %xmm0", "vbroadcastsd %xmm0, %zmm0",
           "vmovapd %zmm0, %zmm1", "vmovapd %zmm0, %zmm2"]

#: form -> (instruction i of the chain, setup, instructions per link, cpumap's pair)
CHAINS = {
    "ADD_R64_R64": (lambda i: "add %rbx, %rdx", [], 1, "R64#0->R64#0"),
    "IMUL_R64_R64": (lambda i: "imul %rbx, %rdx", [], 1, "R64#0->R64#0"),
    "ADC_R64_R64": (lambda i: "adc %rbx, %rdx", [], 1, "R64#0->R64#0"),
    "SHL_R64_I8": (lambda i: "shl $3, %rdx", [], 1, "R64#0->R64#0"),
    "VADDPD_YMM_YMM_YMM": (lambda i: "vaddpd %ymm0, %ymm2, %ymm2", ONE, 1, "YMM#1->YMM#0"),
    "VMULPS_XMM_XMM_XMM": (lambda i: "vmulps %xmm0, %xmm2, %xmm2", ONE, 1, "XMM#1->XMM#0"),
    "VFMADD231PD_YMM_YMM_YMM": (lambda i: "vfmadd231pd %ymm0, %ymm1, %ymm2", ONE, 1,
                                "YMM#0->YMM#0"),
    "VPADDD_YMM_YMM_YMM": (lambda i: "vpaddd %ymm0, %ymm2, %ymm2", ONE, 1, "YMM#1->YMM#0"),
    "VPSHUFB_YMM_YMM_YMM": (lambda i: "vpshufb %ymm0, %ymm2, %ymm2", ONE, 1, "YMM#1->YMM#0"),
    "VDIVPD_YMM_YMM_YMM": (lambda i: "vdivpd %ymm0, %ymm2, %ymm2", ONE, 1, "YMM#1->YMM#0"),
    "MULSD_XMM_XMM": (lambda i: "mulsd %xmm0, %xmm2", ONE, 1, "XMM#0->XMM#0"),
    "MOV_R64_M64": (lambda i: "mov (%rdx), %rdx", ["mov %rdi, (%rdi)", "mov %rdi, %rdx"], 1,
                    "M64->R64#0 (load-use)"),
    "MOV_M64_R64": (lambda i: "mov %rdx, 8(%rdi)" if i % 2 == 0 else "mov 8(%rdi), %rdx",
                    ["mov %rdi, %rdx"], 2,
                    "store->load (forwarding round trip with MOV_R64_M64)"),
    "VADDPD_ZMM_ZMM_ZMM": (lambda i: "vaddpd %zmm0, %zmm2, %zmm2", ONE_ZMM, 1, "ZMM#1->ZMM#0"),
    # a read-modify-write of one address, and round trips across register classes (compared
    # as measured: how cpumap shares a round trip out is a convention, docs/measurement.md)
    "ADD_M64_I8": (lambda i: "addq $1, 8(%rdi)", [], 1, "M64->M64 (through memory)"),
    "VMOVQ_R64_XMM": (lambda i: "vmovq %xmm2, %rdx" if i % 2 == 0 else "vmovq %rdx, %xmm2",
                      [], 2, "XMM#1->R64#0 (round trip with VMOVQ_XMM_R64)"),
    "CVTSD2SI_R64_XMM": (lambda i: "cvtsd2si %xmm2, %rdx" if i % 2 == 0
                         else "vmovq %rdx, %xmm2", ONE, 2,
                         "XMM#1->R64#0 (round trip with VMOVQ_XMM_R64)"),
    "CMP_R64_R64": (lambda i: "cmp %rbx, %rdx" if i % 2 == 0 else "setb %dl", [], 2,
                    "R64#0->flags (round trip with SETB_R8)"),
    "VMOVUPD_YMM_M256": (lambda i: "vmovupd (%rdx), %ymm2" if i % 2 == 0
                         else "vmovq %xmm2, %rdx", ["mov %rdi, (%rdi)", "mov %rdi, %rdx"], 2,
                         "M256->YMM#0 (load-use, round trip with VMOVQ_R64_XMM)"),
    # loads whose value is no address, made the address again by `and $0` and `add`
    "MOVZX_R64_M8": (lambda i: ("movzbq (%rdx), %rdx", "and $0, %rdx", "add %rdi, %rdx")[i % 3],
                     ["mov %rdi, %rdx"], 3,
                     "M8->R64#0 (load-use, round trip with AND_R64_I8+ADD_R64_R64)"),
    "VADDPD_YMM_YMM_M256": (lambda i: ("vaddpd (%rdx), %ymm0, %ymm2", "vmovq %xmm2, %rdx",
                                       "and $0, %rdx", "add %rdi, %rdx")[i % 4],
                            [*ONE, "mov %rdi, %rdx"], 4,
                            "M256->YMM#0 (load-use, round trip with "
                            "VMOVQ_R64_XMM+AND_R64_I8+ADD_R64_R64)"),
}
#: forms whose measured round trip, not their share of it, is compared
ROUND_TRIPS = {"VMOVQ_R64_XMM", "CVTSD2SI_R64_XMM", "CMP_R64_R64", "VMOVUPD_YMM_M256",
               "MOVZX_R64_M8", "VADDPD_YMM_YMM_M256"}


def cpumap_latency(results: str, form: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "cpumap.cli", "--results", results, "measure",
                           "--latency", "--json", form], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"cpumap measure --latency {form} failed: {proc.stderr[-500:]}")
    return {c["pair"]: c for c in json.loads(proc.stdout)["chains"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--cpu", type=int, default=0)
    args = ap.parse_args()
    forms = independent.runnable(list(CHAINS))
    kernels = {f: (CHAINS[f][0], CHAINS[f][1]) for f in forms}
    print(f"{'form':26s} {'pair':26s} {'cpumap':>8s} {'± %':>5s} {'chain':>8s} {'diff':>7s}")
    bad = 0
    for form in forms:  # interleaved: one form's two measurements a few seconds apart
        ours = cpumap_latency(args.results, form)[CHAINS[form][3]]
        ref = independent.measure([form], args.cpu, 48, 3, 10, kernels=kernels)
        theirs = ref[form] * CHAINS[form][2]
        key = "round_trip" if form in ROUND_TRIPS else "latency"
        diff = ours[key] / theirs - 1
        bad += abs(diff) > args.tolerance
        unc = 100 * ours["uncertainty"] if ours["uncertainty"] is not None else float("nan")
        print(f"{form:26s} {CHAINS[form][3][:26]:26s} {ours[key]:8.3f} {unc:5.1f} "
              f"{theirs:8.3f} {100 * diff:+6.1f}%", flush=True)
    print(f"{len(forms) - bad}/{len(forms)} within {100 * args.tolerance:.0f} %")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
