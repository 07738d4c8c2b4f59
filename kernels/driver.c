/*
 * driver.c -- main() of every real-kernel benchmark of the suite (see driver.h).
 *
 *   BIN [--n N] [--reps K] [--cold] [--cpu C] [--min-ticks T] [--untimed]
 *
 * Sets up the kernel's data of problem size N (default: the kernel's L1-resident size), then
 * K times: (--cold: evict the data caches) timestamp, kernel_<name>(...), timestamp.  Prints
 * ONE JSON line on stdout:
 *   {"kernel", "n", "reps", "inner", "clock": "papi"|"tsc-calibrated", "cycles_per_tick",
 *    "ticks": [...], "cycles": [...], "bytes_footprint", "checksum"}
 * With PAPI counters the cycles are counted (cycles_per_tick null); without (a KVM guest) they
 * are TSC ticks times core cycles per tick, measured on a dependent add chain before and
 * after the repetitions (cpumap_clock.h).  There is no warm-up call outside the K timed ones,
 * so `--reps 1` calls the kernel exactly once (what gdb counting relies on); the caller keeps
 * the minimum over repetitions.
 *
 * --min-ticks T (warm runs only): the TSC of a KVM guest advances in steps (26 ticks = ~37
 * core cycles on the reference machine), too coarse for a kernel call of a few hundred cycles.
 * With T > 0, R (a power of two) is doubled until R back-to-back calls last at least T
 * ticks (the faster of two runs of R), and every repetition then times R calls; "inner" is R and
 * "cycles" are per call (ticks / R x ratio).  The default T = 0 keeps R = 1 and the exact
 * number of calls (Cachegrind and Callgrind runs difference call counts).
 *
 * --untimed: no clock at all (no PAPI, no calibration chains; "clock": "untimed", no
 * "cycles"), for the runs that only count (Valgrind, gdb): under Valgrind the two calibrations'
 * 84 million adds cost about a second a run, and a counted run's times mean nothing.
 *
 * Exit codes: 0 ok, 2 bad arguments.
 */
#define _GNU_SOURCE
#include <papi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../harness/cpumap_clock.h"
#include "driver.h"

#define CALIB_ITERS 2000     /* x CALIB_UNROLL adds per calibration run (~0.5 ms) */
#define CALIB_RUNS 7         /* the fastest n and 2n runs are kept */
#define CALIB_WARMUP_NS 2e7  /* spin before calibrating so the core clock has ramped up */
#define EVICT_BYTES (64u << 20) /* twice the L3 of the reference machine */

void *drv_alloc(size_t bytes)
{
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) {
        fprintf(stderr, "driver: cannot allocate %zu bytes\n", rounded);
        exit(2);
    }
    memset(p, 0, rounded ? rounded : 64);
    return p;
}

double drv_value(uint64_t seed, uint64_t i)
{
    uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull);
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (double)(x >> 11) / (double)(1ull << 52) - 1.0; /* [-1, 1) */
}

static double calibrate(void)
{
    return calib_ratio(CALIB_WARMUP_NS, CALIB_ITERS, CALIB_RUNS);
}

static volatile uint64_t evict_sink;

/* Read and write every line of a buffer twice the size of the last-level cache. */
static void evict(void)
{
    static unsigned char *buf;
    if (!buf)
        buf = drv_alloc(EVICT_BYTES);
    uint64_t s = 0;
    for (size_t i = 0; i < EVICT_BYTES; i += 64) {
        s += buf[i];
        buf[i] = (unsigned char)s;
    }
    evict_sink = s;
}

static long parse_long(const char *opt, const char *v, long lo)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo) {
        fprintf(stderr, "driver: %s needs an integer >= %ld, got '%s'\n", opt, lo, v);
        exit(2);
    }
    return x;
}

static void usage(const char *prog)
{
    fprintf(stderr, "usage: %s [--n N] [--reps K] [--cold] [--cpu C] [--min-ticks T] "
            "[--untimed]\n", prog);
    exit(2);
}

int main(int argc, char **argv)
{
    long n = KERNEL_DESC.default_n, reps = 1, cpu = -1, min_ticks = 0, inner = 1;
    int cold = 0, untimed = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = parse_long("--n", argv[++i], 1);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = parse_long("--reps", argv[++i], 1);
        else if (!strcmp(argv[i], "--cpu") && i + 1 < argc)
            cpu = parse_long("--cpu", argv[++i], 0);
        else if (!strcmp(argv[i], "--min-ticks") && i + 1 < argc)
            min_ticks = parse_long("--min-ticks", argv[++i], 0);
        else if (!strcmp(argv[i], "--cold"))
            cold = 1;
        else if (!strcmp(argv[i], "--untimed"))
            untimed = 1;
        else
            usage(argv[0]);
    }
    if (cpu >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET((int)cpu, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0) {
            perror("driver: sched_setaffinity");
            return 2;
        }
    }
    size_t footprint = KERNEL_DESC.setup(n);
    if (!footprint) {
        fprintf(stderr, "driver: kernel %s does not accept --n %ld\n", KERNEL_DESC.name, n);
        return 2;
    }
    uint64_t *ticks = drv_alloc((size_t)reps * sizeof *ticks);
    long long *counted = drv_alloc((size_t)reps * sizeof *counted);
    int papi = untimed ? 0 : papi_start();
    double ratio = papi || untimed ? 0.0 : calibrate();
    if (min_ticks > 0 && !cold && !untimed) {
        /* double R until R untimed-for-the-record calls last min_ticks (the first call, with
         * its page faults and cold caches, would underestimate R if timed alone); each R is
         * run twice and the faster run counts: one interrupted run stopped the doubling early,
         * and the repetitions then lasted less than half of min_ticks (seen in CI) */
        for (inner = 1; inner < (1L << 24); inner *= 2) {
            uint64_t best = UINT64_MAX;
            for (int trial = 0; trial < 2; trial++) {
                uint64_t t0 = tsc_begin();
                for (long k = 0; k < inner; k++)
                    KERNEL_DESC.run();
                uint64_t t = tsc_end() - t0;
                if (t < best)
                    best = t;
            }
            if (best >= (uint64_t)min_ticks)
                break;
        }
    }
    for (long r = 0; r < reps; r++) {
        if (cold)
            evict();
        long long c0[2] = {0, 0}, c1[2] = {0, 0};
        if (papi)
            PAPI_read(papi_set, c0);
        uint64_t t0 = tsc_begin();
        for (long k = 0; k < inner; k++)
            KERNEL_DESC.run();
        uint64_t t1 = tsc_end();
        if (papi)
            PAPI_read(papi_set, c1);
        ticks[r] = t1 - t0;
        counted[r] = c1[0] - c0[0];
    }
    if (!papi && !untimed)
        ratio = (ratio + calibrate()) / 2.0;
    double sum = KERNEL_DESC.checksum();
    printf("{\"kernel\": \"%s\", \"n\": %ld, \"reps\": %ld, \"inner\": %ld, \"clock\": \"%s\", "
           "\"cycles_per_tick\": ",
           KERNEL_DESC.name, n, reps, inner,
           untimed ? "untimed" : papi ? "papi" : "tsc-calibrated");
    if (papi || untimed)
        printf("null");
    else
        printf("%.6f", ratio);
    printf(", \"ticks\": [");
    for (long r = 0; r < reps; r++)
        printf("%s%llu", r ? ", " : "", (unsigned long long)ticks[r]);
    printf("], \"cycles\": [");
    for (long r = 0; r < reps && !untimed; r++) {
        if (papi)
            printf("%s%.1f", r ? ", " : "", (double)counted[r] / (double)inner);
        else
            printf("%s%.1f", r ? ", " : "", (double)ticks[r] * ratio / (double)inner);
    }
    printf("], \"bytes_footprint\": %zu, \"checksum\": ", footprint);
    if (sum == sum && sum - sum == 0.0)
        printf("%.17g}\n", sum);
    else
        printf("null}\n");
    return 0;
}
