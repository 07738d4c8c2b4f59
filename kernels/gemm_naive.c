/* gemm_naive: C = C + A B, n x n row-major, i-j-k order (inner product per element, a
 * dependent chain). Default n = 16: 6 KiB. */
#include "driver.h"

static double *A, *B, *C;
static long N;

KERNEL_FN void kernel_gemm_naive(long n, const double *restrict A, const double *restrict B,
                                 double *restrict C)
{
    for (long i = 0; i < n; i++)
        for (long j = 0; j < n; j++) {
            double s = C[i * n + j];
            for (long k = 0; k < n; k++)
                s += A[i * n + k] * B[k * n + j];
            C[i * n + j] = s;
        }
}

static size_t setup(long n)
{
    N = n;
    A = drv_alloc((size_t)(n * n) * sizeof *A);
    B = drv_alloc((size_t)(n * n) * sizeof *B);
    C = drv_alloc((size_t)(n * n) * sizeof *C);
    for (long i = 0; i < n * n; i++) {
        A[i] = drv_value(9, (uint64_t)i);
        B[i] = drv_value(10, (uint64_t)i);
    }
    return 3 * (size_t)(n * n) * sizeof(double);
}

static void run(void) { kernel_gemm_naive(N, A, B, C); }

static double checksum(void)
{
    double s = 0;
    for (long i = 0; i < N * N; i++)
        s += C[i];
    return s;
}

const struct kernel_desc KERNEL_DESC = {"gemm_naive", 16, setup, run, checksum};
