/* daxpy: y = a*x + y (BLAS level 1). Default n = 1024 doubles per vector: 16 KiB. */
#include "driver.h"

static double *x, *y;
static long N;

KERNEL_FN void kernel_daxpy(long n, double a, const double *restrict x, double *restrict y)
{
    for (long i = 0; i < n; i++)
        y[i] = a * x[i] + y[i];
}

static size_t setup(long n)
{
    N = n;
    x = drv_alloc((size_t)n * sizeof *x);
    y = drv_alloc((size_t)n * sizeof *y);
    for (long i = 0; i < n; i++) {
        x[i] = drv_value(1, (uint64_t)i);
        y[i] = drv_value(2, (uint64_t)i);
    }
    return 2 * (size_t)n * sizeof(double);
}

static void run(void) { kernel_daxpy(N, 0.5, x, y); }

static double checksum(void)
{
    double s = 0;
    for (long i = 0; i < N; i++)
        s += y[i];
    return s;
}

const struct kernel_desc KERNEL_DESC = {"daxpy", 1024, setup, run, checksum};
