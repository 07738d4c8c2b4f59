/* triad: a = b + s*c (STREAM triad). Default n = 512 doubles per vector: 12 KiB. */
#include "driver.h"

static double *a, *b, *c;
static long N;

KERNEL_FN void kernel_triad(long n, double s, double *restrict a, const double *restrict b,
                            const double *restrict c)
{
    for (long i = 0; i < n; i++)
        a[i] = b[i] + s * c[i];
}

static size_t setup(long n)
{
    N = n;
    a = drv_alloc((size_t)n * sizeof *a);
    b = drv_alloc((size_t)n * sizeof *b);
    c = drv_alloc((size_t)n * sizeof *c);
    for (long i = 0; i < n; i++) {
        b[i] = drv_value(5, (uint64_t)i);
        c[i] = drv_value(6, (uint64_t)i);
    }
    return 3 * (size_t)n * sizeof(double);
}

static void run(void) { kernel_triad(N, 3.0, a, b, c); }

static double checksum(void)
{
    double s = 0;
    for (long i = 0; i < N; i++)
        s += a[i];
    return s;
}

const struct kernel_desc KERNEL_DESC = {"triad", 512, setup, run, checksum};
