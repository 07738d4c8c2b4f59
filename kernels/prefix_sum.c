/* prefix_sum: out[i] = in[0] + ... + in[i] over 64-bit integers (a loop-carried scan).
 * Default n = 1024: 16 KiB. */
#include "driver.h"

static int64_t *in, *out;
static long N;

KERNEL_FN void kernel_prefix_sum(long n, const int64_t *restrict in, int64_t *restrict out)
{
    int64_t s = 0;
    for (long i = 0; i < n; i++) {
        s += in[i];
        out[i] = s;
    }
}

static size_t setup(long n)
{
    N = n;
    in = drv_alloc((size_t)n * sizeof *in);
    out = drv_alloc((size_t)n * sizeof *out);
    for (long i = 0; i < n; i++)
        in[i] = (int64_t)(drv_value(16, (uint64_t)i) * 1000.0);
    return 2 * (size_t)n * sizeof(int64_t);
}

static void run(void) { kernel_prefix_sum(N, in, out); }

static double checksum(void)
{
    double s = 0;
    for (long i = 0; i < N; i++)
        s += (double)out[i];
    return s;
}

const struct kernel_desc KERNEL_DESC = {"prefix_sum", 1024, setup, run, checksum};
