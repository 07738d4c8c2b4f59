/*
 * fntime.c -- LD_PRELOAD library that times the first call of one function of any dynamically
 * linked x86-64 program (cpumap analyze).
 *
 * Environment (set by cpumap.evaluate.fntime):
 *   CPUMAP_FNTIME_ADDR  link-time (ELF) address of the function, hex
 *   CPUMAP_FNTIME_PIE   1 when the executable is position-independent (ET_DYN): the address is
 *                       relative to its load base
 *   CPUMAP_FNTIME_OUT   file the result is written to (one line of key=value, then renamed)
 *
 * Method: an int3 on the function's first instruction; its trap handler reads the TSC, puts the
 * instruction back and an int3 on the return address; the return's trap reads the TSC again and
 * puts that byte back.  Later calls run untouched.  Between the two reads lie the function and
 * the cost of the method itself (a sigreturn, then a trap and a signal delivery), which is
 * measured in the same process on an empty function timed the same way (CALIB_CALLS times, the
 * fastest kept) and reported beside the result for the caller to subtract.  The TSC is converted
 * to core cycles by the dependent add chain of cpumap_clock.h, measured in the same process
 * before main().
 *
 * A return address reached with another stack pointer (the same address run by another path)
 * is let through: its byte is restored, the instruction single-stepped (trap flag) and the int3
 * put back, so only the timed call's own return stops the clock.  Nothing is written when the
 * function is never called; the caller says so.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <papi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#pragma GCC diagnostic ignored "-Wunused-function" /* cpumap_clock.h's PAPI part is unused */
#include "cpumap_clock.h"

#define CALIB_CALLS 64
#define TF_FLAG 0x100

enum phase { IDLE, ARMED, IN_CALL, STEPPING, DONE };

static struct {
    uintptr_t entry, ret;
    uint8_t entry_byte, ret_byte;
    uint64_t entry_sp, t0, t1;
    volatile enum phase phase;
} T;

static void patch(uintptr_t addr, uint8_t byte, uint8_t *old)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo = addr & ~(uintptr_t)(page - 1);
    mprotect((void *)lo, 2 * (size_t)page, PROT_READ | PROT_WRITE | PROT_EXEC);
    if (old)
        *old = *(volatile uint8_t *)addr;
    *(volatile uint8_t *)addr = byte;
    mprotect((void *)lo, 2 * (size_t)page, PROT_READ | PROT_EXEC);
}

static const char *out_path;
static double ratio;
static uint64_t overhead_min = UINT64_MAX, overhead_max;
static int timing_program; /* 0 while the method times itself */

/* open/write/rename only: called from the trap handler, when the timed call returns */
static void write_result(void)
{
    char tmp[4096], line[512];
    snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
    int n = snprintf(line, sizeof line,
                     "ticks=%llu overhead_ticks=%llu overhead_max_ticks=%llu "
                     "cycles_per_tick=%.6f calib_calls=%d\n",
                     (unsigned long long)(T.t1 - T.t0), (unsigned long long)overhead_min,
                     (unsigned long long)overhead_max, ratio, CALIB_CALLS);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return;
    if (write(fd, line, (size_t)n) == n && close(fd) == 0)
        rename(tmp, out_path);
}

static void on_trap(int sig, siginfo_t *info, void *uctx)
{
    (void)sig;
    ucontext_t *uc = uctx;
    greg_t *g = uc->uc_mcontext.gregs;
    uintptr_t pc = (uintptr_t)g[REG_RIP];
    if (T.phase == STEPPING && info->si_code != SI_KERNEL) { /* the single step is done */
        patch(T.ret, 0xCC, NULL);
        g[REG_EFL] &= ~TF_FLAG;
        T.phase = IN_CALL;
        return;
    }
    if (T.phase == ARMED && pc == T.entry + 1) {
        patch(T.entry, T.entry_byte, NULL);
        g[REG_RIP] = (greg_t)T.entry;
        T.entry_sp = (uint64_t)g[REG_RSP];
        T.ret = *(uintptr_t *)T.entry_sp;
        patch(T.ret, 0xCC, &T.ret_byte);
        T.phase = IN_CALL;
        T.t0 = tsc_end(); /* as late as the handler allows: the patching is not timed */
        return;
    }
    if (T.phase == IN_CALL && pc == T.ret + 1) {
        uint64_t t = tsc_begin();
        patch(T.ret, T.ret_byte, NULL);
        g[REG_RIP] = (greg_t)T.ret;
        if ((uint64_t)g[REG_RSP] != T.entry_sp + 8) { /* not our return: step over, re-arm */
            g[REG_EFL] |= TF_FLAG;
            T.phase = STEPPING;
            return;
        }
        T.t1 = t;
        T.phase = DONE;
        if (timing_program)
            write_result();
        return;
    }
    /* an int3 of the program's own: what the default action would have done */
    signal(SIGTRAP, SIG_DFL);
    raise(SIGTRAP);
}

static void __attribute__((noinline)) empty(void)
{
    __asm__ volatile("" ::: "memory");
}

static void arm(uintptr_t addr)
{
    T.entry = addr;
    T.phase = ARMED;
    patch(addr, 0xCC, &T.entry_byte);
}

static uintptr_t main_base;

static int first_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    main_base = info->dlpi_addr; /* the first object is the executable */
    return 1;
}

static void __attribute__((constructor)) setup(void)
{
    const char *addr_s = getenv("CPUMAP_FNTIME_ADDR");
    out_path = getenv("CPUMAP_FNTIME_OUT");
    if (!addr_s || !out_path)
        return;
    const char *pie = getenv("CPUMAP_FNTIME_PIE");
    uintptr_t addr = (uintptr_t)strtoull(addr_s, NULL, 16);
    /* the variables are for this process only: children the program starts are not timed */
    unsetenv("CPUMAP_FNTIME_ADDR");
    unsetenv("LD_PRELOAD");
    if (pie && pie[0] == '1') {
        dl_iterate_phdr(first_object, NULL);
        addr += main_base;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTRAP, &sa, NULL);
    ratio = calib_ratio(2e6, 200, 5);
    for (int k = 0; k < CALIB_CALLS; k++) { /* the method's own cost, on an empty function */
        arm((uintptr_t)&empty);
        empty();
        if (T.phase != DONE)
            return;
        uint64_t d = T.t1 - T.t0;
        overhead_min = d < overhead_min ? d : overhead_min;
        overhead_max = d > overhead_max ? d : overhead_max;
    }
    T.phase = IDLE;
    timing_program = 1;
    arm(addr);
}
