/* cond_reduce: sum and count of the positive elements of x (a reduction with a conditional;
 * compilers may if-convert it). Default n = 1024 doubles: 8 KiB. */
#include "driver.h"

static double *x, result;
static long N;

KERNEL_FN double kernel_cond_reduce(long n, const double *restrict x)
{
    double s = 0.0;
    long count = 0;
    for (long i = 0; i < n; i++) {
        if (x[i] > 0.0) {
            s += x[i];
            count++;
        }
    }
    return s + (double)count;
}

static size_t setup(long n)
{
    N = n;
    x = drv_alloc((size_t)n * sizeof *x);
    for (long i = 0; i < n; i++)
        x[i] = drv_value(19, (uint64_t)i);
    return (size_t)n * sizeof(double);
}

static void run(void) { result = kernel_cond_reduce(N, x); }

static double checksum(void) { return result; }

const struct kernel_desc KERNEL_DESC = {"cond_reduce", 1024, setup, run, checksum};
