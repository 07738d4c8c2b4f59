/* gemm_blocked: C = C + A B, n x n row-major, tiled BS x BS with i-k-j order inside a tile
 * (contiguous, vectorizable inner loop). n must be a multiple of BS. Default n = 16: 6 KiB. */
#include "driver.h"

#define BS 8

static double *A, *B, *C;
static long N;

KERNEL_FN void kernel_gemm_blocked(long n, const double *restrict A, const double *restrict B,
                                   double *restrict C)
{
    for (long ii = 0; ii < n; ii += BS)
        for (long kk = 0; kk < n; kk += BS)
            for (long jj = 0; jj < n; jj += BS)
                for (long i = ii; i < ii + BS; i++)
                    for (long k = kk; k < kk + BS; k++) {
                        double a = A[i * n + k];
                        for (long j = jj; j < jj + BS; j++)
                            C[i * n + j] += a * B[k * n + j];
                    }
}

static size_t setup(long n)
{
    if (n % BS)
        return 0;
    N = n;
    A = drv_alloc((size_t)(n * n) * sizeof *A);
    B = drv_alloc((size_t)(n * n) * sizeof *B);
    C = drv_alloc((size_t)(n * n) * sizeof *C);
    for (long i = 0; i < n * n; i++) {
        A[i] = drv_value(11, (uint64_t)i);
        B[i] = drv_value(12, (uint64_t)i);
    }
    return 3 * (size_t)(n * n) * sizeof(double);
}

static void run(void) { kernel_gemm_blocked(N, A, B, C); }

static double checksum(void)
{
    double s = 0;
    for (long i = 0; i < N * N; i++)
        s += C[i];
    return s;
}

const struct kernel_desc KERNEL_DESC = {"gemm_blocked", 16, setup, run, checksum};
