/* dot: s = sum x[i]*y[i] (BLAS level 1; a floating-point reduction, so without -ffast-math it
 * stays one dependent chain). Default n = 1024 doubles per vector: 16 KiB. */
#include "driver.h"

static double *x, *y, result;
static long N;

KERNEL_FN double kernel_dot(long n, const double *restrict x, const double *restrict y)
{
    double s = 0.0;
    for (long i = 0; i < n; i++)
        s += x[i] * y[i];
    return s;
}

static size_t setup(long n)
{
    N = n;
    x = drv_alloc((size_t)n * sizeof *x);
    y = drv_alloc((size_t)n * sizeof *y);
    for (long i = 0; i < n; i++) {
        x[i] = drv_value(3, (uint64_t)i);
        y[i] = drv_value(4, (uint64_t)i);
    }
    return 2 * (size_t)n * sizeof(double);
}

static void run(void) { result = kernel_dot(N, x, y); }

static double checksum(void) { return result; }

const struct kernel_desc KERNEL_DESC = {"dot", 1024, setup, run, checksum};
