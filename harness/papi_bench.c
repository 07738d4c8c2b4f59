/*
 * papi_bench -- the measuring core of cpumap.
 *
 * Loads one batch shared object (ABI in CONTRACTS: cpumap_abi_version = 1, cpumap_nkernels,
 * cpumap_arena_bytes, cpumap_kernels[]), pins itself to one CPU, and for every kernel times
 * f1 (U copies of the kernel per iteration) and f2 (2U copies) K times.  The caller takes the
 * difference f2 - f1, which cancels the call, loop and timer overheads (nanoBench style).
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
 * Output (stdout, tab separated, flushed after every kernel): see CONTRACTS "Harness CLI".
 * Exit status: 0 batch ran (even with failed kernels), 2 usage error, 3 .so cannot be loaded.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <papi.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cpumap_clock.h"

#define ABI_VERSION 1
#define MAX_ARENA_BYTES (64u * 1024u)
#define ARENA_PATTERN 0x3FF1111111111111ULL
#define CALIB_RUNS 7
#define CALIB_WARMUP_NS 20000000L /* spin this long first so the core leaves its idle clock */

struct cpumap_kernel {
    const char *id;
    void (*f1)(uint64_t iters, void *arena);
    void (*f2)(uint64_t iters, void *arena);
    uint64_t iters, insns1, insns2, instances, reserved;
};

struct sample { /* one repetition of one kernel */
    uint64_t ticks1, ticks2;
    long long cycles1, cycles2, insns1, insns2;
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

/* Per-kernel calibration: the core clock of a VM drifts (seen: 1.384 -> 1.423 cycles/tick
 * within a batch), so the ratio is measured again right before each kernel, shortly (min of
 * KCALIB_RUNS chains of KCALIB_ITERS x 1000 adds, ~70 us), and printed as
 * `kcalib <index> <ticks> <adds>`. The batch-wide before/after calibrations stay as a check. */
#define KCALIB_RUNS 5
#define KCALIB_ITERS 50
static void calibrate_kernel(uint64_t index)
{
    /* n/2n difference, as for kernels: the timer and loop start-up costs cancel */
    uint64_t best = calib_ticks(KCALIB_ITERS, KCALIB_RUNS);
    /* integers only: a floating-point division here would leave the inexact flag set in
     * MXCSR right before the kernel; the supervisor computes adds / ticks */
    printf("kcalib\t%llu\t%llu\t%llu\n", (unsigned long long)index, (unsigned long long)best,
           (unsigned long long)(KCALIB_ITERS * CALIB_UNROLL));
}

/* ---------------------------------------------------------------- fault recovery */

static sigjmp_buf kernel_jmp;
static volatile sig_atomic_t in_kernel; /* 1 only while a kernel (or its timer) may be running */

static void on_signal(int sig)
{
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
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_ONSTACK;
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

/* Longest a single f2 call may take, in TSC ticks (0: no limit). A kernel whose f2 call takes
 * longer runs with proportionally fewer iterations (at least one): slow instructions (RDSEED,
 * VERW: ~2,000 cycles each) would otherwise take seconds for no better precision. */
static uint64_t max_call_ticks = 0;

/* Warm up and measure one kernel into out[0..reps), with *iters_used iterations per call.
 * Returns 0, or the signal that stopped it (SIGALRM = timeout). */
static int run_kernel(const struct cpumap_kernel *k, void *arena, long reps, long warmup,
                      long timeout_ms, int papi, struct sample *out, uint64_t *iters_used)
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
    if (max_call_ticks > 0) {
        uint64_t t0 = tsc_begin();
        k->f2(iters, arena);
        uint64_t t = tsc_end() - t0;
        if (t > max_call_ticks) {
            iters = (uint64_t)((double)iters * (double)max_call_ticks / (double)t);
            if (iters < 1)
                iters = 1;
        }
    }
    *iters_used = iters;
    for (long w = 0; w < warmup; w++) {
        k->f1(iters, arena);
        k->f2(iters, arena);
    }
    for (long r = 0; r < reps; r++) {
        struct sample *s = &out[r];
        s->cycles1 = s->cycles2 = -1;
        /* static counts hold for the table's iteration count only; -1 when it was reduced */
        s->insns1 = iters == k->iters ? (long long)k->insns1 : -1;
        s->insns2 = iters == k->iters ? (long long)k->insns2 : -1;
        timed_call(k->f1, iters, arena, papi, &s->ticks1, &s->cycles1, &s->insns1);
        timed_call(k->f2, iters, arena, papi, &s->ticks2, &s->cycles2, &s->insns2);
    }
    in_kernel = 0;
    set_timer(0);
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
          "                  [--max-call-us US]\n",
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
    const char *so = NULL, *clock_opt = "auto";
    long long reps = -1, warmup = -1, cpu = -1, timeout_ms = 10000, start = 0, count = -1;
    long long calib_adds = 2000000, max_call_us = 0;
    static const struct option opts[] = {
        {"so", required_argument, 0, 's'},         {"reps", required_argument, 0, 'k'},
        {"warmup", required_argument, 0, 'w'},     {"cpu", required_argument, 0, 'c'},
        {"timeout-ms", required_argument, 0, 't'}, {"start", required_argument, 0, 'i'},
        {"count", required_argument, 0, 'n'},      {"clock", required_argument, 0, 'l'},
        {"calib-adds", required_argument, 0, 'a'}, {"max-call-us", required_argument, 0, 'm'},
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
        case 'm': max_call_us = parse_num("max-call-us", optarg, 0); break;
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
    struct sample *samples = calloc((size_t)reps, sizeof *samples);
    if (arena == NULL || samples == NULL) {
        fputs("papi_bench: out of memory\n", stderr);
        return 1;
    }
    install_handlers();

    printf("clock\t%s\t%s\n", papi ? "papi" : "tsc-calibrated", papi ? "counted" : "derived");
    calibrate("before", (uint64_t)calib_adds);
    max_call_ticks = (uint64_t)((double)max_call_us * 1000.0 * tsc_per_ns);

    long n_ok = 0, n_failed = 0;
    for (uint64_t i = (uint64_t)start; i < end; i++) {
        const struct cpumap_kernel *k = &kernels[i];
        const char *id = safe_id(k->id);
        if (k->f1 == NULL || k->f2 == NULL) {
            printf("fail\t%llu\t%s\tnull function pointer\n", (unsigned long long)i, id);
            n_failed++;
            fflush(stdout);
            continue;
        }
        fill_arena(arena, arena_bytes);
        calibrate_kernel(i);
        uint64_t iters_used = k->iters;
        int sig = run_kernel(k, arena, (long)reps, (long)warmup, (long)timeout_ms, papi, samples,
                             &iters_used);
        if (sig != 0) {
            printf("fail\t%llu\t%s\t%s\n", (unsigned long long)i, id, signal_name(sig));
            n_failed++;
        } else {
            printf("iters\t%llu\t%llu\n", (unsigned long long)i, (unsigned long long)iters_used);
            for (long long r = 0; r < reps; r++) {
                const struct sample *s = &samples[r];
                printf("row\t%llu\t%s\t%lld\t%llu\t%llu\t%lld\t%lld\t%lld\t%lld\n",
                       (unsigned long long)i, id, r, (unsigned long long)s->ticks1,
                       (unsigned long long)s->ticks2, s->cycles1, s->cycles2, s->insns1,
                       s->insns2);
            }
            n_ok++;
        }
        fflush(stdout);
    }

    calibrate("after", (uint64_t)calib_adds);
    printf("done\t%ld\t%ld\n", n_ok, n_failed);
    fflush(stdout);
    return 0;
}
