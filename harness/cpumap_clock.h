/*
 * cpumap_clock.h -- the clock primitives every cpumap measuring program shares: the measuring
 * harness (papi_bench.c), the real-kernel driver and the bandwidth sweep.
 *
 * Cycles come from PAPI (PAPI_TOT_CYC) where the CPU exposes counters; otherwise from the TSC,
 * converted to core cycles by the ratio measured on a dependent add chain (one add per core
 * cycle on every x86 core).  A counter value is never made up.
 *
 * Header-only (static functions) so each program stays one translation unit; include it after
 * <papi.h>, <stdint.h>, <stdio.h> and <time.h>.
 */
#ifndef CPUMAP_CLOCK_H
#define CPUMAP_CLOCK_H

#define CALIB_UNROLL 1000 /* adds per iteration of the calibration loop (matches .rept below) */

/* lfence before rdtsc: earlier instructions have completed; lfence after: later ones wait. */
static inline uint64_t tsc_begin(void)
{
    uint32_t lo, hi;
    __asm__ volatile("lfence\n\trdtsc\n\tlfence" : "=a"(lo), "=d"(hi)::"memory");
    return ((uint64_t)hi << 32) | lo;
}

/* rdtscp waits for all earlier instructions; lfence keeps later ones from starting first. */
static inline uint64_t tsc_end(void)
{
    uint32_t lo, hi, aux;
    __asm__ volatile("rdtscp\n\tlfence" : "=a"(lo), "=d"(hi), "=c"(aux)::"memory");
    return ((uint64_t)hi << 32) | lo;
}

/* Ticks of `iters` x CALIB_UNROLL dependent `add %rdx, %rax`: one core cycle per add on every
 * x86 core, so adds / ticks = core cycles per TSC tick. dec/jnz run beside the chain for free. */
static uint64_t calib_once(uint64_t iters)
{
    uint64_t acc = 0, one = 1, n = iters;
    uint64_t t0 = tsc_begin();
    __asm__ volatile("1:\n\t"
                     ".rept 1000\n\t"
                     "add %%rdx, %%rax\n\t"
                     ".endr\n\t"
                     "dec %%rcx\n\t"
                     "jnz 1b"
                     : "+c"(n), "+a"(acc)
                     : "d"(one)
                     : "cc");
    uint64_t t1 = tsc_end();
    return t1 - t0;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* TSC ticks of `iters` x CALIB_UNROLL dependent adds: the fastest of `runs` chains of 2n
 * iterations minus the fastest of n (n/2n: the timer overhead cancels; at least 1).  (Taking
 * the minimum of per-pair differences instead is biased: one slow n run shrinks its
 * difference.)  Integers only, so that callers may keep floating point out of the way. */
static inline void calib_pair(uint64_t iters, uint64_t *best1, uint64_t *best2)
{
    /* one more n and 2n chain, each kept where it is the fastest so far */
    uint64_t t1 = calib_once(iters), t2 = calib_once(2 * iters);
    if (t1 < *best1)
        *best1 = t1;
    if (t2 < *best2)
        *best2 = t2;
}

static inline uint64_t calib_ticks(uint64_t iters, int runs)
{
    uint64_t best1 = UINT64_MAX, best2 = UINT64_MAX;
    for (int r = 0; r < runs; r++)
        calib_pair(iters, &best1, &best2);
    return best2 > best1 ? best2 - best1 : 1;
}

/* Core cycles per TSC tick, as the programs that convert ticks themselves need it: spin
 * `warmup_ns` so the core leaves its idle clock, then calib_ticks. */
static inline double calib_ratio(double warmup_ns, uint64_t iters, int runs)
{
    double t_end = now_ns() + warmup_ns;
    while (now_ns() < t_end)
        calib_once(iters);
    return (double)iters * CALIB_UNROLL / (double)calib_ticks(iters, runs);
}

static int papi_set = PAPI_NULL;

/* Try to count PAPI_TOT_CYC + PAPI_TOT_INS; on failure say why on stderr and return 0. */
static int papi_start(void)
{
    int rc = PAPI_library_init(PAPI_VER_CURRENT);
    if (rc != PAPI_VER_CURRENT) {
        fprintf(stderr, "cpumap: PAPI_library_init failed (%d)\n", rc);
        return 0;
    }
    const char *what = "PAPI_create_eventset";
    if ((rc = PAPI_create_eventset(&papi_set)) != PAPI_OK)
        goto fail;
    what = "PAPI_add_event(PAPI_TOT_CYC)";
    if ((rc = PAPI_add_event(papi_set, PAPI_TOT_CYC)) != PAPI_OK)
        goto fail;
    what = "PAPI_add_event(PAPI_TOT_INS)";
    if ((rc = PAPI_add_event(papi_set, PAPI_TOT_INS)) != PAPI_OK)
        goto fail;
    what = "PAPI_start";
    if ((rc = PAPI_start(papi_set)) != PAPI_OK)
        goto fail;
    return 1;
fail:
    fprintf(stderr, "cpumap: %s: %s\n", what, PAPI_strerror(rc));
    PAPI_shutdown();
    papi_set = PAPI_NULL;
    return 0;
}

#endif /* CPUMAP_CLOCK_H */
