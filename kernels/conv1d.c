/* conv1d: out[i] = sum_t w[t] in[i + t], 8 taps, single precision. Default n = 512 outputs:
 * 4 KiB of output and 2 KiB of input. */
#include "driver.h"

#define TAPS 8

static float *in, *out, w[TAPS];
static long N;

KERNEL_FN void kernel_conv1d(long n, const float *restrict in, const float *restrict w,
                             float *restrict out)
{
    for (long i = 0; i < n; i++) {
        float s = 0.0f;
        for (long t = 0; t < TAPS; t++)
            s += w[t] * in[i + t];
        out[i] = s;
    }
}

static size_t setup(long n)
{
    N = n;
    in = drv_alloc((size_t)(n + TAPS) * sizeof *in);
    out = drv_alloc((size_t)n * sizeof *out);
    for (long i = 0; i < n + TAPS; i++)
        in[i] = (float)drv_value(14, (uint64_t)i);
    for (long t = 0; t < TAPS; t++)
        w[t] = (float)drv_value(15, (uint64_t)t);
    return (size_t)(2 * n + 2 * TAPS) * sizeof(float);
}

static void run(void) { kernel_conv1d(N, in, w, out); }

static double checksum(void)
{
    double s = 0;
    for (long i = 0; i < N; i++)
        s += out[i];
    return s;
}

const struct kernel_desc KERNEL_DESC = {"conv1d", 512, setup, run, checksum};
