/* gemv: y = A x + y, A n x n row-major (BLAS level 2). Default n = 32: 8.5 KiB. */
#include "driver.h"

static double *A, *x, *y;
static long N;

KERNEL_FN void kernel_gemv(long n, const double *restrict A, const double *restrict x,
                           double *restrict y)
{
    for (long i = 0; i < n; i++) {
        double s = y[i];
        for (long j = 0; j < n; j++)
            s += A[i * n + j] * x[j];
        y[i] = s;
    }
}

static size_t setup(long n)
{
    N = n;
    A = drv_alloc((size_t)(n * n) * sizeof *A);
    x = drv_alloc((size_t)n * sizeof *x);
    y = drv_alloc((size_t)n * sizeof *y);
    for (long i = 0; i < n * n; i++)
        A[i] = drv_value(7, (uint64_t)i);
    for (long i = 0; i < n; i++)
        x[i] = drv_value(8, (uint64_t)i);
    return (size_t)(n * n + 2 * n) * sizeof(double);
}

static void run(void) { kernel_gemv(N, A, x, y); }

static double checksum(void)
{
    double s = 0;
    for (long i = 0; i < N; i++)
        s += y[i];
    return s;
}

const struct kernel_desc KERNEL_DESC = {"gemv", 32, setup, run, checksum};
