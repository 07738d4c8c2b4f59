/*
 * papi_bench -- the measuring core of cpumap.
 *
 * Loads one batch shared object (ABI in CONTRACTS: cpumap_abi_version = 1, cpumap_nkernels,
 * cpumap_arena_bytes, cpumap_kernels[]), pins itself to one CPU, and for every kernel times
 * f1 (U copies of the kernel per iteration) and f2 (2U copies), repeatedly.  The caller takes
 * the difference f2 - f1, which cancels the call, loop and timer overheads (nanoBench style).
 *
 * Many short repetitions, stopped when the estimate is stable (see README "Measurement"): on a
 * shared host a neighbour slows some calls down and never speeds one up, so the caller
 * estimates each call's undisturbed duration from the low end of its repetitions
 * (robust_low), not from their median.  The iterations per call are scaled so that an f2 call
 * lasts about --call-us microseconds (short enough for many undisturbed windows, long enough
 * that the TSC's step, 26 ticks on the reference guest, is 0.1 % of a call).  Every
 * --calib-every repetitions a calibration sample is taken (an n and a 2n dependent add chain;
 * up to three pairs when it disagrees with the sample before: calib_sample),
 * so the core-cycles-per-tick ratio is estimated, the same robust way, from samples spread
 * over the kernel's own measurement, and one more after its last repetition (the `end` line):
 * the clock the repetitions ran at, which on Intel cores follows the code just run (AVX
 * licences).  Repetitions stop at the first checkpoint (--reps, then
 * each doubling) where the estimate of all repetitions and of their first half agree within
 * --stable-ppm, or at --max-reps or --budget-ms (the kernel is then reported unstable).
 *
 * Clock, chosen at run time:
 *   papi            PAPI_TOT_CYC and PAPI_TOT_INS are counted (instructions "counted").
 *   tsc-calibrated  no hardware counters (e.g. a KVM guest without a PMU): only TSC ticks are
 *                   recorded; the caller converts them with the core-cycles-per-tick ratio
 *                   measured here before and after the batch on a latency-1 dependent add chain.
 *                   Instructions are the static counts of the generated code ("derived").
 * A counter value is never made up: with tsc-calibrated the cycles columns are -1.
 *
 * A faulting kernel (SIGSEGV, SIGILL, SIGFPE, SIGBUS, SIGTRAP) or one running past --timeout-ms
 * is abandoned with siglongjmp, reported as a `fail` line, and the batch goes on.  Anything
 * worse (the process dies) is handled by the Python supervisor, which restarts us with --start.
 *
 * --map-pages N (basic blocks measured as written, BHive's method): a kernel that touches an
 * unmapped user page gets it mapped, up to N pages per kernel, all onto one shared physical
 * page (so whatever the block's registers point at stays L1-resident), and the instruction is
 * retried; the pages are unmapped when the kernel is done and reported on a `pages` line.
 * One more than N pages, a kernel-space or low address, or a protection fault stays a SIGSEGV.
 * The page holds the 64-bit value --map-fill everywhere, as BHive's does: a pointer the block
 * loads from it points where the block's registers started, so pointer chases run too.
 * A kernel that needs a new page after its warm-up fails ("pages mapped while timed"): its
 * addresses change from call to call, and its timed calls would include page faults.
 *
 * Output (stdout, tab separated, flushed after every kernel): see CONTRACTS "Harness CLI".
 * Exit status: 0 batch ran (even with failed kernels), 2 usage error, 3 .so cannot be loaded.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <papi.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cpumap_clock.h"

#define ABI_VERSION 1
#define MAX_ARENA_BYTES (64u * 1024u)
#define ARENA_PATTERN 0x3FF1111111111111ULL
#define CALIB_RUNS 7
#define SCALE_CALLS 3 /* timed calls that scale a kernel's iterations to --call-us */
#define CALIB_WARMUP_NS 20000000L /* spin this long first so the core leaves its idle clock */
#define LOOPS_AGREE 0.005 /* cpumap.measure.estimate.LOOPS_AGREE */
#define CALL_OVERHEAD_MAX_TICKS 450 /* ~ cpumap.measure.estimate.CALL_OVERHEAD_MAX (600 cycles) */

struct cpumap_kernel {
    const char *id;
    void (*f1)(uint64_t iters, void *arena);
    void (*f2)(uint64_t iters, void *arena);
    uint64_t iters, insns1, insns2, instances, reserved;
};

struct sample { /* one repetition of one kernel */
    uint64_t ticks1, ticks2;
    long long cycles1, cycles2, insns1, insns2;
    long long cal1, cal2; /* ticks of the n and 2n calibration chains, -1 if none taken */
};

/* TSC ticks per nanosecond, measured over the first calibration's warm-up (for --max-call-us). */
static double tsc_per_ns = 0.0;

/* Print `calib <when> <cycles_per_tick> <ticks> <adds>` using the fastest of CALIB_RUNS runs. */
static void calibrate(const char *when, uint64_t adds)
{
    uint64_t iters = (adds + CALIB_UNROLL - 1) / CALIB_UNROLL;
    double n0 = now_ns(), t_end = n0 + CALIB_WARMUP_NS;
    uint64_t k0 = tsc_begin();
    while (now_ns() < t_end)
        calib_once(iters);
    if (tsc_per_ns == 0.0)
        tsc_per_ns = (double)(tsc_end() - k0) / (now_ns() - n0);
    uint64_t best = UINT64_MAX;
    for (int r = 0; r < CALIB_RUNS; r++) {
        uint64_t t = calib_once(iters);
        if (t < best)
            best = t;
    }
    uint64_t total = iters * CALIB_UNROLL;
    printf("calib\t%s\t%.6f\t%llu\t%llu\n", when, (double)total / (double)best,
           (unsigned long long)best, (unsigned long long)total);
    fflush(stdout);
}

/* ---------------------------------------------------------------- fault recovery */

static sigjmp_buf kernel_jmp;
static volatile sig_atomic_t in_kernel; /* 1 only while a kernel (or its timer) may be running */

/* ---------------------------------------------------------------- pages mapped on demand */

#define PAGE_BYTES 4096UL
#define MAP_LOW 0x10000UL           /* below: vm.mmap_min_addr, never mapped */
#define MAP_HIGH 0x7ffffffff000UL   /* the top of user space */
static long map_limit;              /* --map-pages: pages a kernel may have mapped, 0: off */
static uint64_t map_fill;           /* --map-fill: the value every word of the page holds */
static int sandbox_fd = -1;         /* the one physical page every mapped page shows */
static uintptr_t *mapped;           /* pages mapped for the kernel in flight */
static volatile sig_atomic_t n_mapped, map_refused;
static long timed_pages; /* pages the kernel in flight needed after its warm-up */

/* Map the page of `addr` for the kernel in flight; 0 when it may not or cannot be. Raw
 * system calls: this runs in the SIGSEGV handler. */
static int map_page(const void *addr)
{
    uintptr_t page = (uintptr_t)addr & ~(PAGE_BYTES - 1);
    if (map_limit == 0 || page < MAP_LOW || page >= MAP_HIGH)
        return 0;
    if (n_mapped >= map_limit) {
        map_refused = 1;
        return 0;
    }
    long r = syscall(SYS_mmap, page, PAGE_BYTES, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_FIXED_NOREPLACE, sandbox_fd, 0L);
    if (r != (long)page) {
        if (r != -1) /* an old kernel took NOREPLACE as a hint and mapped elsewhere */
            syscall(SYS_munmap, r, PAGE_BYTES);
        return 0;
    }
    mapped[n_mapped] = page;
    n_mapped = n_mapped + 1;
    return 1;
}

/* Every word of the shared page back to --map-fill: a kernel's stores must not become the
 * next kernel's pointers. */
static int refill_sandbox(void)
{
    static uint64_t fill[PAGE_BYTES / 8];
    for (size_t w = 0; w < PAGE_BYTES / 8; w++)
        fill[w] = map_fill;
    return pwrite(sandbox_fd, fill, sizeof fill, 0) == (ssize_t)sizeof fill;
}

static void unmap_pages(void)
{
    for (long i = 0; i < n_mapped; i++)
        munmap((void *)mapped[i], PAGE_BYTES);
    n_mapped = 0;
    map_refused = 0;
}

static void on_signal(int sig, siginfo_t *si, void *uctx)
{
    (void)uctx;
    if (sig == SIGSEGV && in_kernel && si != NULL && si->si_code == SEGV_MAPERR &&
        map_page(si->si_addr))
        return; /* retry the instruction on the page just mapped */
    if (in_kernel) {
        in_kernel = 0;
        siglongjmp(kernel_jmp, sig);
    }
    if (sig == SIGALRM)
        return; /* a timer that fired just after its kernel finished */
    /* A fault in the harness itself: die with it so the supervisor sees a crash. */
    signal(sig, SIG_DFL);
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGBUS: return "SIGBUS";
    case SIGTRAP: return "SIGTRAP";
    case SIGALRM: return "timeout";
    default: return "signal";
    }
}

static void install_handlers(void)
{
    /* Own stack: the kernel may have left %rsp anywhere. */
    static char altstack[1 << 16] __attribute__((aligned(64)));
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0)
        perror("papi_bench: sigaltstack");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_ONSTACK | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGSEGV, SIGILL, SIGFPE, SIGBUS, SIGTRAP, SIGALRM};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
}

static void set_timer(long ms)
{
    struct itimerval it = {{0, 0}, {ms / 1000, (ms % 1000) * 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
}

/* A kernel abandoned mid-way may leave MXCSR, x87/MMX or AVX upper state dirty. Linux already
 * gives a signal handler a fresh FPU state (and siglongjmp skips the sigreturn that would bring
 * the kernel's back), but we restore the SysV defaults explicitly rather than rely on that.
 * Callee-saved registers and %rsp come back with siglongjmp; DF is cleared for the handler. */
static void reset_fp_state(void)
{
    unsigned mxcsr = 0x1f80;
    __asm__ volatile("ldmxcsr %0\n\temms\n\tfninit\n\tcld" ::"m"(mxcsr));
    if (__builtin_cpu_supports("avx"))
        __asm__ volatile("vzeroupper");
}

/* ---------------------------------------------------------------- measuring */

static void fill_arena(uint64_t *arena, size_t bytes)
{
    for (size_t i = 0; i < bytes / 8; i++)
        arena[i] = ARENA_PATTERN;
}

/* One timed call; with PAPI the counters are read just outside the TSC window. */
static inline void timed_call(void (*f)(uint64_t, void *), uint64_t iters, void *arena, int papi,
                              uint64_t *ticks, long long *cyc, long long *ins)
{
    long long c0[2] = {0, 0}, c1[2] = {0, 0};
    if (papi)
        PAPI_read(papi_set, c0);
    uint64_t t0 = tsc_begin();
    f(iters, arena);
    uint64_t t1 = tsc_end();
    if (papi) {
        PAPI_read(papi_set, c1);
        *cyc = c1[0] - c0[0];
        *ins = c1[1] - c0[1];
    }
    *ticks = t1 - t0;
}

/* How a kernel is measured (options of the same names; see the header comment). */
struct plan {
    uint64_t call_ticks;  /* target ticks of one f2 call (0: the table's iterations) */
    long reps, max_reps;  /* first checkpoint, last repetition */
    double stable;        /* relative agreement that stops the repetitions */
    uint64_t budget_ticks;/* measuring time per kernel (0: no limit) */
    long calib_every;     /* repetitions per calibration sample */
    uint64_t calib_iters; /* calibration chain: calib_iters x CALIB_UNROLL adds, then twice that */
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The undisturbed value of a timed quantity from its repetitions: interference only makes a
 * call longer, so the answer is at the low end; the mean of the samples within ROBUST_WIDTH
 * of the smallest (at least one TSC step, ROBUST_STEP ticks) averages the timer's steps away
 * instead of picking the lowest one.  cpumap.measure.estimate.robust_low is the same. */
#define ROBUST_WIDTH 0.003
#define ROBUST_STEP 32
#define MIN_CLUSTER 3
static double robust_low(const uint64_t *x, long n, uint64_t *tmp, long *members)
{
    *members = 0;
    if (n <= 0)
        return 0.0;
    memcpy(tmp, x, (size_t)n * sizeof *tmp);
    qsort(tmp, (size_t)n, sizeof *tmp, cmp_u64);
    double base = (double)tmp[0], lim = base * (1.0 + ROBUST_WIDTH);
    if (lim < base + ROBUST_STEP)
        lim = base + ROBUST_STEP;
    double sum = 0.0;
    long m = 0;
    for (long i = 0; i < n && (double)tmp[i] <= lim; i++, m++)
        sum += (double)tmp[i];
    *members = m;
    return sum / (double)m;
}

/* Ticks of U instances from the first n repetitions: f2 - f1 where both loops run at one
 * speed per instance (the implied overhead 2 f1 - f2 is a call's fixed cost), else the faster
 * loop's own (cpumap.measure.estimate.per_instance). */
static double estimate(const uint64_t *t1, const uint64_t *t2, long n, uint64_t *tmp,
                       long *members)
{
    long m1, m2;
    double r1 = robust_low(t1, n, tmp, &m1), r2 = robust_low(t2, n, tmp, &m2);
    *members = m1 < m2 ? m1 : m2;
    double overhead = 2.0 * r1 - r2;
    if (overhead >= -LOOPS_AGREE * r1 && overhead <= LOOPS_AGREE * r1 + CALL_OVERHEAD_MAX_TICKS)
        return r2 - r1;
    return r1 < r2 / 2.0 ? r1 : r2 / 2.0;
}

/* One calibration sample: the ticks of an n and a 2n add chain (*a, *b).  A neighbour that
 * slows a chain makes the sample read a slower clock: a sample that does not agree with the
 * one before (within CALIB_AGREE ticks of their 2n - n) takes up to CALIB_TRIES pairs and
 * keeps the fastest of each chain, so that it finds a quiet moment; one that agrees costs one
 * pair.  The first sample after the clock changed (an AVX licence) takes the extra pairs too.
 * On the Cascade Lake guest (2026-11-28) 21-41 % of a batch's samples fell outside any clock
 * level (cpumap.measure.clocklevels) with one pair, 6 % with this. */
#define CALIB_TRIES 3
#define CALIB_AGREE 32
static long long last_calib_diff = -1;
static void calib_sample(uint64_t iters, long long *a, long long *b)
{
    /* a short chain first: the kernel's body has pushed the calibration loop out of the op
     * cache and the predictors, and the first chain after it ran 7-17 % long */
    calib_once(2);
    uint64_t best1 = UINT64_MAX, best2 = UINT64_MAX;
    calib_pair(iters, &best1, &best2);
    for (int k = 1; k < CALIB_TRIES; k++) {
        long long diff = (long long)best2 - (long long)best1;
        if (last_calib_diff > 0 && llabs(diff - last_calib_diff) <= CALIB_AGREE)
            break;
        calib_pair(iters, &best1, &best2);
    }
    last_calib_diff = (long long)best2 - (long long)best1;
    *a = (long long)best1;
    *b = (long long)best2;
}

/* Warm up and measure one kernel into out[], *n_used repetitions with *iters_used iterations
 * per call; *stable says whether the repetitions stopped at a checkpoint (not at a limit).
 * Returns 0, or the signal that stopped it (SIGALRM = timeout). */
static int run_kernel(const struct cpumap_kernel *k, void *arena, const struct plan *pl,
                      long warmup, long timeout_ms, int papi, struct sample *out,
                      uint64_t *scratch, uint64_t *iters_used, long *n_used, int *stable,
                      long long *end1, long long *end2)
{
    int sig = sigsetjmp(kernel_jmp, 1); /* 1: restore the signal mask on the way back */
    if (sig != 0) {
        set_timer(0);
        reset_fp_state();
        return sig;
    }
    in_kernel = 1;
    set_timer(timeout_ms);
    uint64_t iters = k->iters;
    if (pl->call_ticks > 0) {
        /* scale the iterations so that an f2 call lasts about call_ticks (the first call is
         * cold: time the next ones), by the fastest of SCALE_CALLS timed calls: one call a
         * neighbour preempted scaled a run to 3 iterations instead of 408 (busy Sapphire
         * Rapids-class guest, 2026-12-02), and such a run measures the call's overhead */
        k->f2(iters, arena);
        uint64_t t = UINT64_MAX;
        for (int c = 0; c < SCALE_CALLS; c++) {
            uint64_t t0 = tsc_begin();
            k->f2(iters, arena);
            uint64_t dt = tsc_end() - t0;
            t = dt < t ? dt : t;
        }
        double want = (double)iters * (double)pl->call_ticks / (double)(t ? t : 1);
        iters = want < 1.0 ? 1 : (uint64_t)(want + 0.5);
    }
    *iters_used = iters;
    for (long w = 0; w < warmup; w++) {
        k->f1(iters, arena);
        k->f2(iters, arena);
    }
    long warm_pages = n_mapped;
    uint64_t *t1 = scratch, *t2 = scratch + pl->max_reps, *tmp = scratch + 2 * pl->max_reps;
    uint64_t started = tsc_begin();
    long next_check = pl->reps, n = 0;
    *stable = 0;
    while (n < pl->max_reps) {
        struct sample *s = &out[n];
        s->cal1 = s->cal2 = -1;
        if (n % pl->calib_every == 0)
            calib_sample(pl->calib_iters, &s->cal1, &s->cal2);
        s->cycles1 = s->cycles2 = -1;
        /* static counts hold for the table's iteration count only; -1 when it was changed */
        s->insns1 = iters == k->iters ? (long long)k->insns1 : -1;
        s->insns2 = iters == k->iters ? (long long)k->insns2 : -1;
        timed_call(k->f1, iters, arena, papi, &s->ticks1, &s->cycles1, &s->insns1);
        timed_call(k->f2, iters, arena, papi, &s->ticks2, &s->cycles2, &s->insns2);
        t1[n] = s->ticks1;
        t2[n] = s->ticks2;
        n++;
        if (n == next_check) {
            long members, unused;
            double all = estimate(t1, t2, n, tmp, &members);
            double half = estimate(t1, t2, n / 2, tmp, &unused);
            /* settled: the first half already had the value, and the fastest cluster of each
             * call kind holds MIN_CLUSTER repetitions (a value seen once may be luck: loads,
             * whose undisturbed calls are rare on a shared core, stopped too early without) */
            if (all > 0 && fabs(half / all - 1.0) <= pl->stable && members >= MIN_CLUSTER) {
                *stable = 1;
                break;
            }
            next_check *= 2;
        }
        if (pl->budget_ticks > 0 && n >= pl->reps && tsc_end() - started > pl->budget_ticks)
            break; /* over budget: stop, reported unstable */
    }
    *n_used = n;
    in_kernel = 0;
    set_timer(0);
    timed_pages = n_mapped - warm_pages;
    /* a closing sample: the clock the last repetitions ran at (an Intel core's clock follows
     * the code it runs; cpumap.measure.clocklevels.assign_local_ratios) */
    calib_sample(pl->calib_iters, end1, end2);
    return 0;
}

/* Ids go into a tab-separated line: refuse anything that would break it. */
static const char *safe_id(const char *id)
{
    if (id == NULL)
        return "?";
    for (const char *p = id; *p; p++)
        if (*p == '\t' || *p == '\n' || *p == '\r')
            return "?";
    return id;
}

/* ---------------------------------------------------------------- options */

static _Noreturn void usage(void)
{
    fputs("usage: papi_bench --so PATH --reps K --warmup W [--cpu C] [--timeout-ms T]\n"
          "                  [--start I] [--count N] [--clock auto|tsc|papi] [--calib-adds N]\n"
          "                  [--call-us US] [--max-reps M] [--stable-ppm P] [--budget-ms B]\n"
          "                  [--calib-every E] [--kcalib-adds N] [--kernels I,J,...]\n"
          "                  [--map-pages N] [--map-fill V]\n",
          stderr);
    exit(2);
}

/* Non-negative integer option value, or a usage error naming the option. */
static long long parse_num(const char *opt, const char *text, long long min)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min) {
        fprintf(stderr, "papi_bench: bad value for --%s: '%s' (integer >= %lld expected)\n", opt,
                text, min);
        exit(2);
    }
    return v;
}

/* Pin to `cpu`, or to the last CPU we are allowed on when cpu < 0. */
static int pin_cpu(long cpu)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
        perror("papi_bench: sched_getaffinity");
        exit(2);
    }
    if (cpu < 0) {
        for (int c = CPU_SETSIZE - 1; c >= 0; c--)
            if (CPU_ISSET(c, &allowed)) {
                cpu = c;
                break;
            }
    }
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed)) {
        fprintf(stderr, "papi_bench: --cpu %ld is not in this process's affinity set\n", cpu);
        exit(2);
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) {
        perror("papi_bench: sched_setaffinity");
        exit(2);
    }
    return (int)cpu;
}

static void *need_sym(void *h, const char *name, const char *so)
{
    void *p = dlsym(h, name);
    if (p == NULL) {
        fprintf(stderr, "papi_bench: %s: missing symbol %s\n", so, name);
        exit(3);
    }
    return p;
}

int main(int argc, char **argv)
{
    const char *so = NULL, *clock_opt = "auto", *list_opt = NULL;
    long long reps = -1, warmup = -1, cpu = -1, timeout_ms = 10000, start = 0, count = -1;
    long long calib_adds = 2000000, call_us = 0, max_reps = 0, stable_ppm = 5000,
              budget_ms = 0, calib_every = 8, kcalib_adds = 20000;
    static const struct option opts[] = {
        {"so", required_argument, 0, 's'},          {"reps", required_argument, 0, 'k'},
        {"warmup", required_argument, 0, 'w'},      {"cpu", required_argument, 0, 'c'},
        {"timeout-ms", required_argument, 0, 't'},  {"start", required_argument, 0, 'i'},
        {"count", required_argument, 0, 'n'},       {"clock", required_argument, 0, 'l'},
        {"calib-adds", required_argument, 0, 'a'},  {"call-us", required_argument, 0, 'm'},
        {"max-reps", required_argument, 0, 'M'},    {"stable-ppm", required_argument, 0, 'S'},
        {"budget-ms", required_argument, 0, 'B'},   {"calib-every", required_argument, 0, 'E'},
        {"kcalib-adds", required_argument, 0, 'K'}, {"kernels", required_argument, 0, 'L'},
        {"map-pages", required_argument, 0, 'P'},   {"map-fill", required_argument, 0, 'F'},
        {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 's': so = optarg; break;
        case 'k': reps = parse_num("reps", optarg, 1); break;
        case 'w': warmup = parse_num("warmup", optarg, 0); break;
        case 'c': cpu = parse_num("cpu", optarg, 0); break;
        case 't': timeout_ms = parse_num("timeout-ms", optarg, 1); break;
        case 'i': start = parse_num("start", optarg, 0); break;
        case 'n': count = parse_num("count", optarg, 0); break;
        case 'l': clock_opt = optarg; break;
        case 'a': calib_adds = parse_num("calib-adds", optarg, CALIB_UNROLL); break;
        case 'm': call_us = parse_num("call-us", optarg, 0); break;
        case 'M': max_reps = parse_num("max-reps", optarg, 0); break;
        case 'S': stable_ppm = parse_num("stable-ppm", optarg, 0); break;
        case 'B': budget_ms = parse_num("budget-ms", optarg, 0); break;
        case 'E': calib_every = parse_num("calib-every", optarg, 1); break;
        case 'K': kcalib_adds = parse_num("kcalib-adds", optarg, CALIB_UNROLL); break;
        case 'L': list_opt = optarg; break;
        case 'P': map_limit = (long)parse_num("map-pages", optarg, 0); break;
        case 'F': map_fill = (uint64_t)parse_num("map-fill", optarg, 0); break;
        default: usage(); /* getopt_long already said what was wrong */
        }
    }
    if (optind < argc) {
        fprintf(stderr, "papi_bench: unexpected argument '%s'\n", argv[optind]);
        usage();
    }
    if (so == NULL || reps < 0 || warmup < 0) {
        fputs("papi_bench: --so, --reps and --warmup are required\n", stderr);
        usage();
    }
    if (strcmp(clock_opt, "auto") != 0 && strcmp(clock_opt, "tsc") != 0 && strcmp(clock_opt, "papi") != 0) {
        fprintf(stderr, "papi_bench: bad --clock '%s'\n", clock_opt);
        usage();
    }
    if (max_reps < reps)
        max_reps = reps; /* no --max-reps: exactly --reps repetitions */

    /* Load the batch and check the ABI. */
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "papi_bench: dlopen: %s\n", dlerror());
        return 3;
    }
    uint64_t abi = *(const uint64_t *)need_sym(h, "cpumap_abi_version", so);
    uint64_t nk = *(const uint64_t *)need_sym(h, "cpumap_nkernels", so);
    uint64_t arena_bytes = *(const uint64_t *)need_sym(h, "cpumap_arena_bytes", so);
    const struct cpumap_kernel *kernels = need_sym(h, "cpumap_kernels", so);
    if (abi != ABI_VERSION || arena_bytes > MAX_ARENA_BYTES) {
        fprintf(stderr, "papi_bench: %s: abi version %llu (want %d), arena %llu bytes (max %u)\n",
                so, (unsigned long long)abi, ABI_VERSION, (unsigned long long)arena_bytes,
                MAX_ARENA_BYTES);
        return 3;
    }
    if ((uint64_t)start > nk || (count >= 0 && (uint64_t)(start + count) > nk)) {
        fprintf(stderr, "papi_bench: --start %lld --count %lld outside 0..%llu\n", start, count,
                (unsigned long long)nk);
        usage();
    }
    uint64_t end = count >= 0 ? (uint64_t)(start + count) : nk;
    /* the kernels to measure, in order: --kernels I,J,... or start..end-1; a listed kernel may
     * come more than once (the monitors close a long round too) */
    uint64_t cap = nk ? nk : 1;
    if (list_opt != NULL)
        for (const char *p = list_opt; *p; p++)
            cap += *p == ',';
    uint64_t *order = calloc(cap, sizeof *order);
    uint64_t norder = 0;
    if (order == NULL) {
        fputs("papi_bench: out of memory\n", stderr);
        return 1;
    }
    if (list_opt != NULL) {
        for (const char *p = list_opt; *p;) {
            char *e;
            errno = 0;
            unsigned long long v = strtoull(p, &e, 10);
            if (errno != 0 || e == p || v >= nk || norder >= cap || (*e != ',' && *e != '\0')) {
                fprintf(stderr, "papi_bench: bad --kernels '%s' (indices below %llu)\n", list_opt,
                        (unsigned long long)nk);
                usage();
            }
            order[norder++] = v;
            p = *e == ',' ? e + 1 : e;
        }
    } else {
        for (uint64_t i = (uint64_t)start; i < end; i++)
            order[norder++] = i;
    }

    pin_cpu((long)cpu);

    int papi = 0;
    if (strcmp(clock_opt, "tsc") != 0) {
        papi = papi_start();
        if (!papi && strcmp(clock_opt, "papi") == 0) {
            fputs("papi_bench: --clock papi but PAPI_TOT_CYC/PAPI_TOT_INS cannot be counted\n",
                  stderr);
            return 2;
        }
    }

    size_t alloc = ((arena_bytes + 4095) / 4096) * 4096;
    uint64_t *arena = aligned_alloc(4096, alloc ? alloc : 4096);
    struct sample *samples = calloc((size_t)max_reps, sizeof *samples);
    uint64_t *scratch = calloc((size_t)max_reps * 3, sizeof *scratch);
    if (arena == NULL || samples == NULL || scratch == NULL) {
        fputs("papi_bench: out of memory\n", stderr);
        return 1;
    }
    if (map_limit > 0) {
        sandbox_fd = memfd_create("cpumap-sandbox", 0);
        mapped = calloc((size_t)map_limit, sizeof *mapped);
        if (sandbox_fd < 0 || mapped == NULL || !refill_sandbox()) {
            perror("papi_bench: --map-pages");
            return 1;
        }
    }
    install_handlers();

    printf("clock\t%s\t%s\n", papi ? "papi" : "tsc-calibrated", papi ? "counted" : "derived");
    calibrate("before", (uint64_t)calib_adds);
    struct plan pl = {
        .call_ticks = (uint64_t)((double)call_us * 1000.0 * tsc_per_ns),
        .reps = (long)reps, .max_reps = (long)max_reps, .stable = (double)stable_ppm * 1e-6,
        .budget_ticks = (uint64_t)((double)budget_ms * 1e6 * tsc_per_ns),
        .calib_every = (long)calib_every,
        .calib_iters = (uint64_t)((kcalib_adds + CALIB_UNROLL - 1) / CALIB_UNROLL),
    };

    long n_ok = 0, n_failed = 0;
    for (uint64_t pos = 0; pos < norder; pos++) {
        uint64_t i = order[pos];
        const struct cpumap_kernel *k = &kernels[i];
        const char *id = safe_id(k->id);
        if (k->f1 == NULL || k->f2 == NULL) {
            printf("fail\t%llu\t%s\tnull function pointer\n", (unsigned long long)i, id);
            n_failed++;
            fflush(stdout);
            continue;
        }
        fill_arena(arena, arena_bytes);
        if (map_limit > 0 && !refill_sandbox()) {
            perror("papi_bench: refilling the --map-pages page");
            return 1;
        }
        uint64_t iters_used = k->iters;
        long n_used = 0;
        int stable = 0;
        long long end1 = -1, end2 = -1;
        int sig = run_kernel(k, arena, &pl, (long)warmup, (long)timeout_ms, papi, samples,
                             scratch, &iters_used, &n_used, &stable, &end1, &end2);
        long pages = n_mapped;
        int refused = map_refused;
        unmap_pages();
        if (sig != 0) {
            printf("fail\t%llu\t%s\t%s%s\n", (unsigned long long)i, id, signal_name(sig),
                   refused ? " (needs more pages than --map-pages)" : "");
            n_failed++;
        } else if (timed_pages > 0) {
            /* its addresses change from call to call: the timed calls include page faults */
            printf("fail\t%llu\t%s\tpages mapped while timed (%ld): its addresses change "
                   "from call to call\n", (unsigned long long)i, id, timed_pages);
            n_failed++;
        } else {
            printf("iters\t%llu\t%llu\n", (unsigned long long)i, (unsigned long long)iters_used);
            for (long r = 0; r < n_used; r++) {
                const struct sample *s = &samples[r];
                printf("row\t%llu\t%s\t%ld\t%llu\t%llu\t%lld\t%lld\t%lld\t%lld\t%lld\t%lld\n",
                       (unsigned long long)i, id, r, (unsigned long long)s->ticks1,
                       (unsigned long long)s->ticks2, s->cycles1, s->cycles2, s->insns1,
                       s->insns2, s->cal1, s->cal2);
            }
            if (map_limit > 0)
                printf("pages\t%llu\t%ld\n", (unsigned long long)i, pages);
            printf("end\t%llu\t%ld\t%d\t%llu\t%lld\t%lld\n", (unsigned long long)i, n_used,
                   stable, (unsigned long long)(pl.calib_iters * CALIB_UNROLL), end1, end2);
            n_ok++;
        }
        fflush(stdout);
    }

    calibrate("after", (uint64_t)calib_adds);
    printf("done\t%ld\t%ld\n", n_ok, n_failed);
    fflush(stdout);
    return 0;
}
