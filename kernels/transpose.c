/* transpose: B = A^T, n x n doubles, out of place (strided stores). Default n = 32: 16 KiB. */
#include "driver.h"

static double *A, *B;
static long N;

KERNEL_FN void kernel_transpose(long n, const double *restrict A, double *restrict B)
{
    for (long i = 0; i < n; i++)
        for (long j = 0; j < n; j++)
            B[j * n + i] = A[i * n + j];
}

static size_t setup(long n)
{
    N = n;
    A = drv_alloc((size_t)(n * n) * sizeof *A);
    B = drv_alloc((size_t)(n * n) * sizeof *B);
    for (long i = 0; i < n * n; i++)
        A[i] = drv_value(18, (uint64_t)i);
    return 2 * (size_t)(n * n) * sizeof(double);
}

static void run(void) { kernel_transpose(N, A, B); }

static double checksum(void)
{
    double s = 0;
    for (long i = 0; i < N * N; i++)
        s += B[i] * (double)(i % 7 + 1);
    return s;
}

const struct kernel_desc KERNEL_DESC = {"transpose", 32, setup, run, checksum};
