#!/usr/bin/env python3
"""Independent reference measurement of x86 instruction throughput.

Why this exists: cpumap's numbers need an outside check that shares none of its code (no
harness, no assembly generator, no calibration code). This script writes one small C file
whose kernels are hand-written assembly loops (file-scope ``__asm__``, so we own every
register and need no compiler flags such as -mavx512f), compiles it with ``gcc -O2``, pins
itself to one CPU from C (sched_setaffinity) and times each loop with
clock_gettime(CLOCK_MONOTONIC_RAW).

Method, and why:
* each kernel exists with unroll U and 2U; the same iteration count N is timed for both, so
  ``(t(2U) - t(U)) / (N * U)`` is the time of one instruction with the loop overhead
  (dec/jnz, the taken branch, function call, clock reads) cancelled exactly;
* a run times ``--target-ms`` (20-50 ms) of loop execution per unroll, read in clock_gettime
  chunks of ``--chunk-ms`` (N is chosen so one 2U call lasts one chunk); the minimum chunk over
  all ``--runs`` runs is kept (50 us chunks by default: a neighbour on the same physical core
  slows whole bursts of milliseconds, and a short chunk can fall between them; with 1 ms
  chunks `add` read 0.276 cycles in a burst). Interference only ever adds time, and on a
  2-vCPU guest another process sharing the core preempts us every few ms: whole-run timings
  would then all be inflated, chunks shorter than a time slice let the minimum reject them;
* the core clock is unknown in a KVM guest without counters, so the same method times a
  dependent ``add %rdx, %rax`` chain (latency exactly 1 cycle): its ns per add is ns per
  cycle. It is measured before and after the kernels; their mean converts ns to cycles.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

GPR12 = ["rax", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"]
GPR8 = ["rax", "rdx", "rbp", "r8", "r9", "r10", "r11", "r12"]


def mem_off(i: int) -> int:
    """Offset of the i-th access: 32 distinct cache lines, 8 byte slots rotating in a line."""
    return (i % 32) * 64 + (i % 8) * 8


def zero_vec(kind: str, regs: range) -> list[str]:
    """Zero vector registers so no denormal/NaN operands can trigger slow paths."""
    if kind == "zmm":
        return [f"vpxord %zmm{r}, %zmm{r}, %zmm{r}" for r in regs]
    return [f"vpxor %ymm{r}, %ymm{r}, %ymm{r}" for r in regs]


# form name -> (instruction i of the unrolled body, setup lines before the loop)
KERNELS: dict[str, tuple[Callable[[int], str], list[str]]] = {
    "_CLOCK_ADD_CHAIN": (lambda i: "add %rdx, %rax", ["xor %eax, %eax", "mov $1, %edx"]),
    "ADD_R64_R64": (lambda i: f"add %rbx, %{GPR12[i % 12]}", []),
    "IMUL_R64_R64": (lambda i: f"imul %rbx, %{GPR12[i % 12]}", []),
    "SHL_R64_I8": (lambda i: f"shl $3, %{GPR12[i % 12]}", []),
    "VADDPD_YMM_YMM_YMM": (lambda i: f"vaddpd %ymm0, %ymm1, %ymm{2 + i % 14}",
                           zero_vec("ymm", range(16))),
    "VPADDD_YMM_YMM_YMM": (lambda i: f"vpaddd %ymm0, %ymm1, %ymm{2 + i % 14}",
                           zero_vec("ymm", range(16))),
    "VPSHUFB_YMM_YMM_YMM": (lambda i: f"vpshufb %ymm0, %ymm1, %ymm{2 + i % 14}",
                            zero_vec("ymm", range(16))),
    "VMULPS_XMM_XMM_XMM": (lambda i: f"vmulps %xmm0, %xmm1, %xmm{2 + i % 14}",
                           zero_vec("ymm", range(16))),
    "VFMADD231PD_YMM_YMM_YMM": (lambda i: f"vfmadd231pd %ymm0, %ymm1, %ymm{2 + i % 14}",
                                zero_vec("ymm", range(16))),
    "VADDPD_ZMM_ZMM_ZMM": (lambda i: f"vaddpd %zmm0, %zmm1, %zmm{2 + i % 24}",
                           zero_vec("zmm", range(26))),
    "VMULPD_ZMM_ZMM_ZMM": (lambda i: f"vmulpd %zmm0, %zmm1, %zmm{2 + i % 24}",
                           zero_vec("zmm", range(26))),
    "VFMADD231PD_ZMM_ZMM_ZMM": (lambda i: f"vfmadd231pd %zmm0, %zmm1, %zmm{2 + i % 24}",
                                zero_vec("zmm", range(26))),
    "MOV_R64_M64": (lambda i: f"mov {mem_off(i)}(%rsi), %{GPR8[i % 8]}", []),
    "MOV_M64_R64": (lambda i: f"mov %{GPR8[i % 8]}, {mem_off(i)}(%rdi)", []),
}

SAVED = ["rbx", "rbp", "r12", "r13", "r14", "r15"]


def asm_function(sym: str, body: Callable[[int], str], setup: list[str], unroll: int) -> str:
    """One SysV function ``void sym(long iters /*rdi*/, char *buf /*rsi*/)``."""
    lines = [".text", f".globl {sym}", f".type {sym}, @function", ".p2align 6", f"{sym}:"]
    lines += [f"push %{r}" for r in SAVED]
    lines += ["mov %rdi, %rcx", "mov %rsi, %rdi", "mov $3, %ebx"] + setup
    lines += [".p2align 6", "1:"] + [body(i) for i in range(unroll)]
    lines += ["dec %rcx", "jnz 1b", "vzeroupper"] + [f"pop %{r}" for r in reversed(SAVED)]
    lines += ["ret", f".size {sym}, .-{sym}"]
    return "\n".join(lines)


C_MAIN = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*kern)(long, char *);
struct entry { const char *name; kern one, two; };
extern struct entry table[];
extern int ntable;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}
static double run(kern k, long n, char *buf) {
    double t0 = now_ns();
    k(n, buf);
    return now_ns() - t0;
}
/* ns per instruction of entry e. n is set so one 2U call lasts one chunk; each run is
   target/chunk chunks of U and 2U alternately; min chunk times over all runs are kept. */
static double measure(struct entry *e, char *buf, int unroll, int runs, double target,
                      double chunk) {
    long n = 16;
    run(e->two, n, buf);
    for (;;) {
        double t = run(e->two, n, buf);
        if (t > chunk / 4) { n = (long)(n * chunk / t) + 1; break; }
        n *= 4;
    }
    int chunks = (int)(target / chunk) > 1 ? (int)(target / chunk) : 1;
    double m1 = 1e30, m2 = 1e30;
    for (int r = 0; r < runs * chunks; r++) {
        double t1 = run(e->one, n, buf), t2 = run(e->two, n, buf);
        if (t1 < m1) m1 = t1;
        if (t2 < m2) m2 = t2;
    }
    return (m2 - m1) / ((double)n * unroll);
}
int main(int argc, char **argv) {
    int cpu = atoi(argv[1]), unroll = atoi(argv[2]), runs = atoi(argv[3]);
    double target = atof(argv[4]) * 1e6, chunk = atof(argv[5]) * 1e6;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set)) { perror("sched_setaffinity"); return 1; }
    char *buf = aligned_alloc(4096, 1 << 16);
    memset(buf, 1, 1 << 16);
    double c0 = measure(&table[0], buf, unroll, runs, target, chunk);
    printf("_ns_per_cycle_before %.6f\n", c0);
    for (int i = 1; i < ntable; i++)
        printf("%s %.6f\n", table[i].name, measure(&table[i], buf, unroll, runs, target, chunk));
    printf("_ns_per_cycle_after %.6f\n", measure(&table[0], buf, unroll, runs, target, chunk));
    return 0;
}
"""


def write_program(names: list[str], unroll: int, kernels: dict | None = None) -> str:
    """C source: the kernel table plus file-scope asm for U and 2U of every kernel
    (``kernels`` adds to or overrides KERNELS: benchmarks/latency_check.py's chains)."""
    table = KERNELS | (kernels or {})
    parts, entries = [C_MAIN], []
    for k, name in enumerate(names):
        body, setup = table[name]
        for suffix, u in (("one", unroll), ("two", 2 * unroll)):
            parts.append(f"__asm__(\n{json.dumps(asm_function(f'k{k}_{suffix}', body, setup, u))}"
                         "\n);")
            parts.append(f"void k{k}_{suffix}(long, char *);")
        entries.append(f'{{"{name}", k{k}_one, k{k}_two}}')
    parts.append("struct entry table[] = {" + ", ".join(entries) + "};")
    parts.append(f"int ntable = {len(names)};")
    return "\n".join(parts) + "\n"


def measure(forms: list[str], cpu: int, unroll: int, runs: int, target_ms: float,
            chunk_ms: float = 0.05, kernels: dict | None = None) -> dict:
    """Compile and run the program; return {form: cycles/insn, "_ghz": .., "_ghz_drift": ..}."""
    names = ["_CLOCK_ADD_CHAIN"] + forms
    with tempfile.TemporaryDirectory(prefix="cpumap-indep-") as tmp:
        src, exe = Path(tmp) / "indep.c", Path(tmp) / "indep"
        src.write_text(write_program(names, unroll, kernels))
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
        cmd = [str(exe), str(cpu), str(unroll), str(runs), str(target_ms), str(chunk_ms)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    ns = {k: float(v) for k, v in (line.split() for line in out.splitlines())}
    ns_per_cycle = (ns["_ns_per_cycle_before"] + ns["_ns_per_cycle_after"]) / 2
    res = {f: ns[f] / ns_per_cycle for f in forms}
    res["_ghz"] = 1 / ns_per_cycle
    res["_ghz_drift"] = abs(ns["_ns_per_cycle_before"] / ns["_ns_per_cycle_after"] - 1)
    return res


def host_flags() -> set[str]:
    """CPU flags of /proc/cpuinfo (the first processor)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def runnable(forms: list[str]) -> list[str]:
    """The forms this CPU can run: zmm forms need AVX-512 (not on Zen 3)."""
    avx512 = "avx512f" in host_flags()
    return [f for f in forms if avx512 or "ZMM" not in f]


def main() -> int:
    """Parse arguments, measure, print a table or JSON."""
    forms = runnable([f for f in KERNELS if not f.startswith("_")])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("forms", nargs="*", default=forms, help=f"subset of: {' '.join(forms)}")
    p.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)),
                   help="CPU to pin to (default: last allowed, like cpumap)")
    p.add_argument("--unroll", type=int, default=128, help="U; 2U is measured too (>= 64)")
    p.add_argument("--runs", type=int, default=9, help="runs per kernel, min is kept (>= 7)")
    p.add_argument("--target-ms", type=float, default=30.0, help="loop time per run and unroll")
    p.add_argument("--chunk-ms", type=float, default=0.05,
                   help="length of one timed chunk (short: many fall into quiet moments)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    unknown = set(a.forms) - set(forms)
    if unknown:
        p.error(f"unknown forms: {sorted(unknown)}")
    res = measure(a.forms, a.cpu, a.unroll, a.runs, a.target_ms, a.chunk_ms)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"core clock {res['_ghz']:.4f} GHz (drift {100 * res['_ghz_drift']:.2f}%), "
          f"cpu {a.cpu}, U={a.unroll}/{2 * a.unroll}, "
          f"min over {a.runs} runs of {a.chunk_ms} ms chunks")
    print(f"{'form':<26}{'cycles/insn':>12}{'insn/cycle':>12}")
    for f in a.forms:
        print(f"{f:<26}{res[f]:>12.4f}{1 / res[f]:>12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
