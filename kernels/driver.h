/*
 * driver.h -- the interface between one real kernel (kernels/<name>.c) and the shared driver
 * (kernels/driver.c), which owns main(), the clock and the JSON output.
 *
 * Each kernel file defines `kernel_<name>` (the measured function: KERNEL_FN, global, never
 * inlined or cloned, so the binary holds exactly one copy that gdb and the block extractor
 * find by name) and one `const struct kernel_desc KERNEL_DESC` telling the driver how to set
 * up data of problem size n, call the kernel once, and checksum its output.
 *
 * Kernel bodies must not call library functions: the suite is compiled with -fno-builtin and
 * -fno-tree-loop-distribute-patterns so gcc does not turn loops into memset/memcpy calls.
 */
#ifndef CPUMAP_DRIVER_H
#define CPUMAP_DRIVER_H

#include <stddef.h>
#include <stdint.h>

/* noipa: no inlining, cloning or interprocedural propagation into the caller -- the compiled
 * body is what a generic caller would get, and its symbol is `kernel_<name>` exactly. */
#define KERNEL_FN __attribute__((noipa, used))

struct kernel_desc {
    const char *name;      /* <name>; the measured function is kernel_<name> */
    long default_n;        /* problem size whose data stays L1-resident (L1d 32 KiB) */
    /* allocate and fill the data of size n deterministically; return the bytes the kernel
     * touches (its footprint), or 0 when n is invalid */
    size_t (*setup)(long n);
    void (*run)(void);        /* one call of kernel_<name> on the data */
    double (*checksum)(void); /* a sum over the output, so the compiler cannot drop work */
};

extern const struct kernel_desc KERNEL_DESC;

/* 64-byte aligned, zeroed allocation; exits with a message when memory is short. */
void *drv_alloc(size_t bytes);

/* Deterministic fill values in [-1, 1) (a 64-bit LCG on seed and index, no libm). */
double drv_value(uint64_t seed, uint64_t i);

#endif /* CPUMAP_DRIVER_H */
