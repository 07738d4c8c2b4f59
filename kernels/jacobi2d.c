/* jacobi2d: one sweep of the 5-point Jacobi stencil, B = 0.2 (A_c + A_n + A_s + A_e + A_w) on
 * the interior of an n x n grid (Polybench jacobi-2d, one time step). Default n = 32: 16 KiB. */
#include "driver.h"

static double *A, *B;
static long N;

KERNEL_FN void kernel_jacobi2d(long n, const double *restrict A, double *restrict B)
{
    for (long i = 1; i < n - 1; i++)
        for (long j = 1; j < n - 1; j++)
            B[i * n + j] = 0.2 * (A[i * n + j] + A[(i - 1) * n + j] + A[(i + 1) * n + j] +
                                  A[i * n + j + 1] + A[i * n + j - 1]);
}

static size_t setup(long n)
{
    if (n < 3)
        return 0;
    N = n;
    A = drv_alloc((size_t)(n * n) * sizeof *A);
    B = drv_alloc((size_t)(n * n) * sizeof *B);
    for (long i = 0; i < n * n; i++)
        A[i] = drv_value(13, (uint64_t)i);
    return 2 * (size_t)(n * n) * sizeof(double);
}

static void run(void) { kernel_jacobi2d(N, A, B); }

static double checksum(void)
{
    double s = 0;
    for (long i = 0; i < N * N; i++)
        s += B[i];
    return s;
}

const struct kernel_desc KERNEL_DESC = {"jacobi2d", 32, setup, run, checksum};
