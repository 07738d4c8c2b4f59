/*
 * bw_sweep.c -- memory bandwidth by working-set sweep (cpumap roofline ceilings).
 *
 * For every access kind (read, write, copy, triad, ntwrite) and every working-set size S it
 * runs P passes over S bytes of data per thread, on T threads pinned one per CPU and started
 * together by a barrier, and reports the bytes the kernels loaded and stored (STREAM's
 * convention: copy moves 2 x its array, triad 3 x; write-allocate traffic is NOT counted, it
 * is the core-side view), the TSC ticks of the slowest thread's span and the nanoseconds of
 * the same span (clock_gettime), K times, with the most context switches any thread had during
 * the repetition (getrusage RUSAGE_THREAD): a repetition that shared its CPU with another
 * process is slow for that reason alone, and the caller can leave it out.  Cycles are ticks x the core cycles per TSC tick
 * measured on a dependent add chain (cpumap_clock.h) before and after the sweep; PAPI is not
 * used (bandwidth needs only time).
 *
 * Kernels use 256-bit AVX2 loads/stores (Zen 4's L1 takes two 256-bit loads and one 256-bit
 * store per cycle, so 256-bit accesses can saturate every level); ntwrite uses vmovntdq.
 * Buffers are 2 MiB aligned with MADV_HUGEPAGE (fewer TLB misses at DRAM sizes) and first
 * touched by the thread that uses them.
 *
 * Usage: bw_sweep --kinds read,write,copy,triad,ntwrite --sizes 16384,1048576,...
 *                 --cpus 0,1 --reps K --min-ms M [--quiet-reps Q --max-reps R --point-ms B]
 *                 [--max-point-ms C]
 * (at least K repetitions per point; more, up to R, until Q of them ran undisturbed and the
 * point's repetitions took B ms in all; but none past K once they took C ms, when C > 0: a
 * DRAM repetition of 70-250 ms nearly always sees a context switch on a shared 2-vCPU guest,
 * so without C every DRAM point ran R repetitions, 100 s for each 1 GiB point)
 * Output: one JSON line per (kind, size) on stdout, then a final {"done": ...} line.
 * Exit codes: 0 ok, 2 bad arguments, 1 allocation or thread failure.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <papi.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#include "cpumap_clock.h"

#define MAX_THREADS 256
#define MAX_SIZES 512
#define ALIGN (2u << 20)
#define CHUNK 256 /* bytes per unrolled loop iteration: 8 x 32-byte vectors */

enum kind { K_READ, K_WRITE, K_COPY, K_TRIAD, K_NTWRITE, K_COUNT };
static const char *KIND_NAMES[K_COUNT] = {"read", "write", "copy", "triad", "ntwrite"};
/* arrays per kind: the working set S is split evenly over them */
static const int KIND_ARRAYS[K_COUNT] = {1, 1, 2, 3, 1};

struct shared {
    pthread_barrier_t start, stop;
    enum kind kind;
    size_t bytes;   /* working set per thread */
    long passes;
    int quit;
};

struct worker {
    pthread_t tid;
    int index, cpu;
    struct shared *sh;
    char *buf;      /* ALIGN-aligned, >= max working set + arrays * ALIGN */
    size_t cap;
    double sink;
    uint64_t ticks; /* the thread's own span of the last run (tsc) */
    long passes_run;
    long switches;  /* context switches of the thread during the last run */
};

static volatile double g_sink;

/* Array pointers of a working set of `bytes` in buf: each array `bytes / arrays` long,
 * rounded down to CHUNK, separated by a 4 KiB + 64 B offset so that arrays do not alias in
 * the L1 sets. */
static size_t layout(char *buf, enum kind k, size_t bytes, char **a, char **b, char **c)
{
    int n = KIND_ARRAYS[k];
    size_t len = (bytes / (size_t)n) / CHUNK * CHUNK;
    size_t stride = (len + 4096 + 64 + 63) & ~(size_t)63;
    *a = buf;
    *b = buf + stride;
    *c = buf + 2 * stride;
    return len;
}

/* Read kernel: `passes` passes over [a, a + len), both loops in assembly.  Each iteration
 * XORs eight 32-byte loads into four accumulators (the load folded into vpxor: one macro-op
 * each), one pointer, one compare: at two loads per cycle the loop control rides along, and no
 * per-pass dispatch or second counter eats into small working sets (the C loop it replaced
 * reached 60.8 of the 64 bytes per cycle two 32-byte loads allow). */
static void read_passes(const char *a, size_t len, long passes)
{
    const char *end = a + len;
    __asm__ volatile("vpxor %%ymm0, %%ymm0, %%ymm0\n\t"
                     "vpxor %%ymm1, %%ymm1, %%ymm1\n\t"
                     "vpxor %%ymm2, %%ymm2, %%ymm2\n\t"
                     "vpxor %%ymm3, %%ymm3, %%ymm3\n\t"
                     "2:\n\t"
                     "mov %[a], %%rsi\n\t"
                     ".p2align 5\n"
                     "1:\n\t"
                     "vpxor 0(%%rsi), %%ymm0, %%ymm0\n\t"
                     "vpxor 32(%%rsi), %%ymm1, %%ymm1\n\t"
                     "vpxor 64(%%rsi), %%ymm2, %%ymm2\n\t"
                     "vpxor 96(%%rsi), %%ymm3, %%ymm3\n\t"
                     "vpxor 128(%%rsi), %%ymm0, %%ymm0\n\t"
                     "vpxor 160(%%rsi), %%ymm1, %%ymm1\n\t"
                     "vpxor 192(%%rsi), %%ymm2, %%ymm2\n\t"
                     "vpxor 224(%%rsi), %%ymm3, %%ymm3\n\t"
                     "add $256, %%rsi\n\t"
                     "cmp %[end], %%rsi\n\t"
                     "jb 1b\n\t"
                     "dec %[n]\n\t"
                     "jnz 2b\n\t"
                     "vzeroupper"
                     : [n] "+r"(passes)
                     : [a] "r"(a), [end] "r"(end)
                     : "rsi", "xmm0", "xmm1", "xmm2", "xmm3", "cc", "memory");
}

static double run_passes(enum kind k, char *buf, size_t bytes, long passes)
{
    char *a, *b, *c;
    size_t len = layout(buf, k, bytes, &a, &b, &c);
    if (k == K_READ) {
        if (passes > 0 && len > 0)
            read_passes(a, len, passes);
        return 0.0;
    }
    __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    const __m256i val = _mm256_set1_epi64x(0x3FF1111111111111LL);
    const __m256d s = _mm256_set1_pd(1.0000001);
    for (long p = 0; p < passes; p++) {
        switch (k) {
        case K_READ:
            for (size_t i = 0; i < len; i += CHUNK) {
                const __m256i *q = (const __m256i *)(a + i);
                acc0 = _mm256_xor_si256(acc0, _mm256_load_si256(q + 0));
                acc1 = _mm256_xor_si256(acc1, _mm256_load_si256(q + 1));
                acc2 = _mm256_xor_si256(acc2, _mm256_load_si256(q + 2));
                acc3 = _mm256_xor_si256(acc3, _mm256_load_si256(q + 3));
                acc0 = _mm256_xor_si256(acc0, _mm256_load_si256(q + 4));
                acc1 = _mm256_xor_si256(acc1, _mm256_load_si256(q + 5));
                acc2 = _mm256_xor_si256(acc2, _mm256_load_si256(q + 6));
                acc3 = _mm256_xor_si256(acc3, _mm256_load_si256(q + 7));
            }
            break;
        case K_WRITE:
            for (size_t i = 0; i < len; i += CHUNK) {
                __m256i *q = (__m256i *)(a + i);
                for (int j = 0; j < 8; j++)
                    _mm256_store_si256(q + j, val);
            }
            break;
        case K_NTWRITE:
            for (size_t i = 0; i < len; i += CHUNK) {
                __m256i *q = (__m256i *)(a + i);
                for (int j = 0; j < 8; j++)
                    _mm256_stream_si256(q + j, val);
            }
            _mm_sfence();
            break;
        case K_COPY:
            for (size_t i = 0; i < len; i += CHUNK) {
                const __m256i *src = (const __m256i *)(a + i);
                __m256i *dst = (__m256i *)(b + i);
                for (int j = 0; j < 8; j++)
                    _mm256_store_si256(dst + j, _mm256_load_si256(src + j));
            }
            break;
        case K_TRIAD: /* a = b + s * c */
            for (size_t i = 0; i < len; i += CHUNK) {
                double *x = (double *)(a + i);
                const double *y = (const double *)(b + i), *z = (const double *)(c + i);
                for (int j = 0; j < 32; j += 4)
                    _mm256_store_pd(x + j, _mm256_fmadd_pd(s, _mm256_load_pd(z + j),
                                                           _mm256_load_pd(y + j)));
            }
            break;
        default:
            break;
        }
        __asm__ volatile("" ::: "memory"); /* every pass really happens */
    }
    acc0 = _mm256_xor_si256(_mm256_xor_si256(acc0, acc1), _mm256_xor_si256(acc2, acc3));
    return (double)_mm256_extract_epi64(acc0, 0);
}

/* Bytes the kernel loads and stores in one pass over a working set of `bytes`. */
static size_t pass_bytes(enum kind k, size_t bytes)
{
    char *a, *b, *c;
    size_t len = layout(NULL, k, bytes, &a, &b, &c);
    return len * (size_t)KIND_ARRAYS[k];
}

static double max_ticks(const struct worker *ws, int n)
{
    uint64_t m = 0;
    for (int t = 0; t < n; t++)
        if (ws[t].ticks > m)
            m = ws[t].ticks;
    return (double)m;
}

static long max_switches(const struct worker *ws, int n)
{
    long m = 0;
    for (int t = 0; t < n; t++)
        if (ws[t].switches > m)
            m = ws[t].switches;
    return m;
}

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fprintf(stderr, "bw_sweep: cannot pin to cpu %d\n", cpu);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    pin(w->cpu);
    /* first touch by the owning thread */
    memset(w->buf, 1, w->cap);
    for (;;) {
        pthread_barrier_wait(&w->sh->start);
        if (w->sh->quit)
            break;
        long passes = w->sh->passes;
        struct rusage r0, r1;
        getrusage(RUSAGE_THREAD, &r0);
        uint64_t t0 = tsc_begin();
        w->sink += run_passes(w->sh->kind, w->buf, w->sh->bytes, passes);
        w->ticks = tsc_end() - t0;
        getrusage(RUSAGE_THREAD, &r1);
        /* a run that lost the CPU to another process is slow for that reason alone */
        w->switches = (r1.ru_nivcsw - r0.ru_nivcsw) + (r1.ru_nvcsw - r0.ru_nvcsw);
        w->passes_run = passes;
        pthread_barrier_wait(&w->sh->stop);
    }
    return NULL;
}

static int parse_list(const char *s, long *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s)
            return -1;
        out[n++] = v;
        s = (*end == ',') ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return n;
}

static double calibrate(void)
{
    return calib_ratio(2e7, 200, 7);
}

int main(int argc, char **argv)
{
    long sizes[MAX_SIZES], cpus[MAX_THREADS];
    int nsizes = 0, ncpus = 0, reps = 3, quiet_reps = 0, max_reps = 64;
    double min_ms = 20.0, point_ms = 0.0, max_point_ms = 0.0;
    int kinds[K_COUNT], nkinds = 0;
    (void)papi_start; /* the shared header's PAPI helper is not needed for bandwidth */
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val)
            goto usage;
        i++;
        if (!strcmp(opt, "--sizes")) {
            nsizes = parse_list(val, sizes, MAX_SIZES);
        } else if (!strcmp(opt, "--cpus")) {
            ncpus = parse_list(val, cpus, MAX_THREADS);
        } else if (!strcmp(opt, "--reps")) {
            reps = atoi(val);
        } else if (!strcmp(opt, "--quiet-reps")) {
            quiet_reps = atoi(val);
        } else if (!strcmp(opt, "--max-reps")) {
            max_reps = atoi(val);
        } else if (!strcmp(opt, "--min-ms")) {
            min_ms = atof(val);
        } else if (!strcmp(opt, "--point-ms")) {
            point_ms = atof(val);
        } else if (!strcmp(opt, "--max-point-ms")) {
            max_point_ms = atof(val);
        } else if (!strcmp(opt, "--kinds")) {
            char tmp[256];
            snprintf(tmp, sizeof tmp, "%s", val);
            for (char *tok = strtok(tmp, ","); tok; tok = strtok(NULL, ",")) {
                int k;
                for (k = 0; k < K_COUNT && strcmp(tok, KIND_NAMES[k]); k++)
                    ;
                if (k == K_COUNT || nkinds == K_COUNT)
                    goto usage;
                kinds[nkinds++] = k;
            }
        } else {
            goto usage;
        }
    }
    if (max_reps > 64)
        max_reps = 64;
    if (nsizes <= 0 || ncpus <= 0 || nkinds <= 0 || reps < 1 || min_ms <= 0 || max_reps < reps ||
        max_point_ms < 0)
        goto usage;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] < CHUNK * 3)
            goto usage;

    long maxsize = 0;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] > maxsize)
            maxsize = sizes[i];
    size_t cap = ((size_t)maxsize + 3 * (4096 + 128) + ALIGN - 1) / ALIGN * ALIGN;

    struct shared sh = {0};
    struct worker *ws = calloc((size_t)ncpus, sizeof *ws);
    pthread_barrier_init(&sh.start, NULL, (unsigned)ncpus + 1);
    pthread_barrier_init(&sh.stop, NULL, (unsigned)ncpus + 1);
    for (int t = 0; t < ncpus; t++) {
        ws[t].index = t;
        ws[t].cpu = (int)cpus[t];
        ws[t].sh = &sh;
        ws[t].cap = cap;
        ws[t].buf = aligned_alloc(ALIGN, cap);
        if (!ws[t].buf) {
            fprintf(stderr, "bw_sweep: cannot allocate %zu bytes\n", cap);
            return 1;
        }
        madvise(ws[t].buf, cap, MADV_HUGEPAGE);
        if (pthread_create(&ws[t].tid, NULL, worker_main, &ws[t]) != 0) {
            fprintf(stderr, "bw_sweep: cannot start thread %d\n", t);
            return 1;
        }
    }
    /* The controlling thread only starts and stops the workers and reads the clocks. */
    double ratio_before = calibrate();
    double tsc_t0 = now_ns();
    uint64_t tsc0 = tsc_begin();
    /* TSC ticks per millisecond, for choosing pass counts (10 ms measurement) */
    while (now_ns() - tsc_t0 < 1e7)
        ;
    double tsc_per_ms = (double)(tsc_begin() - tsc0) / ((now_ns() - tsc_t0) / 1e6);

    for (int ki = 0; ki < nkinds; ki++) {
        enum kind k = (enum kind)kinds[ki];
        for (int si = 0; si < nsizes; si++) {
            size_t bytes = (size_t)sizes[si];
            sh.kind = k;
            sh.bytes = bytes;
            /* passes for >= min_ms: double the passes until one run takes >= min_ms / 8
             * (a warm-up of the data and the code), then scale */
            long passes = 1;
            for (;;) {
                sh.passes = passes;
                pthread_barrier_wait(&sh.start);
                pthread_barrier_wait(&sh.stop);
                double ms = max_ticks(ws, ncpus) / tsc_per_ms;
                if (ms >= min_ms / 8 || passes > (1L << 40)) {
                    passes = (long)((double)passes * min_ms / (ms > 1e-6 ? ms : 1e-6)) + 1;
                    break;
                }
                passes *= 2;
            }
            sh.passes = passes;
            printf("{\"kind\": \"%s\", \"bytes\": %zu, \"threads\": %d, \"passes\": %ld, "
                   "\"pass_bytes\": %zu, \"ticks\": [",
                   KIND_NAMES[k], bytes, ncpus, passes, pass_bytes(k, bytes));
            double ns[64];
            uint64_t span[64];
            long sw[64];
            /* at least `reps` repetitions, more (up to max_reps) until `quiet_reps` of them ran
             * without a context switch of any measuring thread, and more still while the
             * point has used less than point_ms: many short repetitions where a pass is short
             * (cache-resident sizes: one of them falls in a quiet moment of a shared host),
             * few where a pass takes milliseconds anyway (DRAM) */
            int nr = 0, quiet = 0;
            double point_ns = 0.0;
            for (int r = 0; r < max_reps && (r < reps || ((quiet < quiet_reps ||
                                                            point_ns < point_ms * 1e6) &&
                                                           (max_point_ms <= 0 ||
                                                            point_ns < max_point_ms * 1e6)));
                 r++, nr++) {
                pthread_barrier_wait(&sh.start);
                uint64_t t0 = tsc_begin();
                double n0 = now_ns();
                pthread_barrier_wait(&sh.stop);
                span[r] = tsc_end() - t0;
                ns[r] = now_ns() - n0;
                point_ns += ns[r];
                sw[r] = max_switches(ws, ncpus);
                quiet += sw[r] == 0;
                /* the slowest thread's own span: barrier wake-ups are not in it */
                printf("%s%llu", r ? ", " : "", (unsigned long long)max_ticks(ws, ncpus));
            }
            printf("], \"span_ticks\": [");
            for (int r = 0; r < nr; r++)
                printf("%s%llu", r ? ", " : "", (unsigned long long)span[r]);
            printf("], \"span_ns\": [");
            for (int r = 0; r < nr; r++)
                printf("%s%.0f", r ? ", " : "", ns[r]);
            printf("], \"switches\": [");
            for (int r = 0; r < nr; r++)
                printf("%s%ld", r ? ", " : "", sw[r]);
            printf("]}\n");
            fflush(stdout);
        }
    }
    uint64_t tsc1 = tsc_end();
    double tsc_t1 = now_ns();
    double ratio_after = calibrate();
    sh.quit = 1;
    pthread_barrier_wait(&sh.start);
    double sink = 0;
    for (int t = 0; t < ncpus; t++) {
        pthread_join(ws[t].tid, NULL);
        sink += ws[t].sink;
        free(ws[t].buf);
    }
    g_sink = sink;
    printf("{\"done\": true, \"clock\": \"tsc-calibrated\", \"calib_before\": %.6f, "
           "\"calib_after\": %.6f, \"tsc_mhz\": %.3f, \"cpus\": [",
           ratio_before, ratio_after, (double)(tsc1 - tsc0) / (tsc_t1 - tsc_t0) * 1e3);
    for (int t = 0; t < ncpus; t++)
        printf("%s%ld", t ? ", " : "", cpus[t]);
    printf("], \"hugepage_advice\": true}\n");
    free(ws);
    return 0;
usage:
    fprintf(stderr, "usage: bw_sweep --kinds read,write,copy,triad,ntwrite --sizes B1,B2,... "
                    "--cpus C1,C2,... [--reps K] [--min-ms M] [--quiet-reps Q] [--max-reps R]"
                    " [--point-ms B] [--max-point-ms C]"
                    "  (sizes >= %d bytes)\n",
            CHUNK * 3);
    return 2;
}
