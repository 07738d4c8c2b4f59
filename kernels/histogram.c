/* histogram: bins of bytes with a data-dependent branch: small values (< 128, about half of
 * the pseudo-random data, in no pattern) add 1 to their bin, large values add their weight to
 * a separate bin set. Default n = 2048 bytes + 2 x 64 bins of int32: 2.5 KiB. */
#include "driver.h"

#define BINS 64

static uint8_t *data;
static int32_t *lo, *hi;
static long N;

KERNEL_FN void kernel_histogram(long n, const uint8_t *restrict data, int32_t *restrict lo,
                                int32_t *restrict hi)
{
    for (long i = 0; i < n; i++) {
        unsigned v = data[i];
        if (v < 128)
            lo[v % BINS] += 1;
        else
            hi[v % BINS] += (int32_t)(v >> 4);
    }
}

static size_t setup(long n)
{
    N = n;
    data = drv_alloc((size_t)n);
    lo = drv_alloc(BINS * sizeof *lo);
    hi = drv_alloc(BINS * sizeof *hi);
    for (long i = 0; i < n; i++)
        data[i] = (uint8_t)((drv_value(17, (uint64_t)i) + 1.0) * 128.0);
    return (size_t)n + 2 * BINS * sizeof(int32_t);
}

static void run(void) { kernel_histogram(N, data, lo, hi); }

static double checksum(void)
{
    double s = 0;
    for (long b = 0; b < BINS; b++)
        s += (double)lo[b] * (double)(b + 1) + (double)hi[b];
    return s;
}

const struct kernel_desc KERNEL_DESC = {"histogram", 2048, setup, run, checksum};
