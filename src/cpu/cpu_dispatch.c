/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_dispatch.c - the CPU backend's entry points, each passed on to the kernels of one instruction-set level.
 *
 * On x86-64 the Makefile compiles the other files of src/cpu once per level (AMX tiles for the bf16 forward,
 * AVX-512 with the bf16 dot product, AVX-512, AVX2 + FMA, and the compiler's baseline), each time with that level's
 * target flags and -DFA_CPU_ISA=<level>, which gives the level's functions its name as a suffix (cpu_internal.h); it
 * compiles this file once, for the baseline, with -DFA_CPU_DISPATCH. The first call picks the widest level the
 * processor runs, or a narrower one named by FLASHATTN_CPU_SIMD, and every later call of the process uses the same one:
 * a workspace sized under one level must fit the call that uses it (the vector width sets the row padding).
 *
 * A build without FA_CPU_DISPATCH (NATIVE=1, another architecture, the sources compiled by hand) holds one
 * level, the compiler's: the kernels keep their plain names and this file only names that level.
 */
#define _DEFAULT_SOURCE 1 /* syscall(), for the AMX permission */

#include "internal.h"

#ifdef FA_CPU_DISPATCH

#include <cpuid.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define CPU_LEVEL_DECLARE(isa)                                                                             \
    size_t fa_cpu_workspace_size_##isa(const fa_params *p, int num_threads, int backward);                 \
    fa_status fa_cpu_fwd_##isa(const fa_params *p, const fa_exec *x);                                      \
    fa_status fa_cpu_bwd_##isa(const fa_params *p, const fa_exec *x);                                      \
    size_t fa_cpu_kvcache_workspace_size_##isa(const fa_params *p, const fa_kvcache *kv, int num_threads); \
    fa_status fa_cpu_fwd_kvcache_##isa(const fa_params *p, const fa_kvcache *kv, const fa_exec *x);
CPU_LEVEL_DECLARE(amx)
CPU_LEVEL_DECLARE(avx512bf16)
CPU_LEVEL_DECLARE(avx512)
CPU_LEVEL_DECLARE(avx2)
CPU_LEVEL_DECLARE(portable)

/* Whether the processor, and the OS for the wider registers' state (__builtin_cpu_supports checks that part),
 * has what the Makefile's CPU_ISA_FLAGS_<level> let the compiler use. F16C is read from CPUID: clang's
 * __builtin_cpu_supports does not know it in every version. */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
static int cpu_runs_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}
static int cpu_runs_avx512(void) {
    return cpu_runs_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}
/* AVX512_BF16 is CPUID leaf 7, sub-leaf 1, EAX bit 5 (read directly for the same reason as F16C). */
static int cpu_runs_avx512bf16(void) {
    unsigned a, b, c, d;
    return cpu_runs_avx512() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}
/* AMX-BF16 and AMX-TILE are CPUID leaf 7, EDX bits 22 and 24; the OS must hold the tile state (XCR0 bits 17
 * and 18) and grant it to this process, which Linux does on request (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA, 18); asked once, at the first choice. */
static int cpu_runs_amx(void) {
    unsigned a, b, c, d;
    if (!cpu_runs_avx512bf16() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)))
        return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
#ifdef __linux__
    static int granted = -1;
    if (granted < 0) granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0;
    return granted;
#else
    return 0;
#endif
}
static int cpu_runs_portable(void) {
    return 1;
}

/* One level's entry points. */
typedef struct cpu_level {
    const char *name;
    int (*runs)(void);
    size_t (*workspace_size)(const fa_params *p, int num_threads, int backward);
    fa_status (*fwd)(const fa_params *p, const fa_exec *x);
    fa_status (*bwd)(const fa_params *p, const fa_exec *x);
    size_t (*kvcache_workspace_size)(const fa_params *p, const fa_kvcache *kv, int num_threads);
    fa_status (*fwd_kvcache)(const fa_params *p, const fa_kvcache *kv, const fa_exec *x);
} cpu_level;

#define CPU_LEVEL(isa)                                                                                                \
    {                                                                                                                 \
        .name = #isa, .runs = cpu_runs_##isa, .workspace_size = fa_cpu_workspace_size_##isa, .fwd = fa_cpu_fwd_##isa, \
        .bwd = fa_cpu_bwd_##isa, .kvcache_workspace_size = fa_cpu_kvcache_workspace_size_##isa,                       \
        .fwd_kvcache = fa_cpu_fwd_kvcache_##isa                                                                       \
    }
/* Widest first; the last runs everywhere. */
static const cpu_level cpu_levels[] = { CPU_LEVEL(amx), CPU_LEVEL(avx512bf16), CPU_LEVEL(avx512), CPU_LEVEL(avx2),
                                        CPU_LEVEL(portable) };
#define CPU_LEVELS ((int)(sizeof cpu_levels / sizeof cpu_levels[0]))

#define CPU_SIMD_ENV "FLASHATTN_CPU_SIMD"
enum { CPU_CHOICE_FORCED = 1 << 8, CPU_CHOICE_BAD_ENV = 1 << 9 };

/* The widest level the processor runs, lowered to the one FLASHATTN_CPU_SIMD names if that is narrower: the
 * level's index, with CPU_CHOICE_FORCED when the variable is set to a level and CPU_CHOICE_BAD_ENV when it is
 * set to anything else (every call then fails, naming it). */
static int cpu_choose(void) {
    int best = 0;
    while (!cpu_levels[best].runs()) best++;
    const char *env = getenv(CPU_SIMD_ENV);
    if (!env || !*env) return best;
    for (int i = 0; i < CPU_LEVELS; i++)
        if (!strcmp(env, cpu_levels[i].name)) return (i > best ? i : best) | CPU_CHOICE_FORCED;
    return best | CPU_CHOICE_BAD_ENV;
}

/* The choice, made at the first call and kept for the process (-1 before): the same from every thread, so
 * threads that make it at once store the same value. */
static int cpu_choice(void) {
    static int choice = -1;
    int c = __atomic_load_n(&choice, __ATOMIC_ACQUIRE);
    if (c < 0) {
        __builtin_cpu_init();
        c = cpu_choose();
        __atomic_store_n(&choice, c, __ATOMIC_RELEASE);
    }
    return c;
}

static const cpu_level *cpu_level_get(void) {
    return &cpu_levels[cpu_choice() & 0xff];
}

/* The variable's value for messages ("" if the program has unset it since the choice). */
static const char *cpu_simd_env(void) {
    const char *env = getenv(CPU_SIMD_ENV);
    return env ? env : "";
}

static fa_status cpu_bad_env(void) {
    return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s=%s is not amx, avx512bf16, avx512, avx2 or portable", CPU_SIMD_ENV,
                   cpu_simd_env());
}

size_t fa_cpu_workspace_size(const fa_params *p, int num_threads, int backward) {
    return cpu_level_get()->workspace_size(p, num_threads, backward);
}

fa_status fa_cpu_fwd(const fa_params *p, const fa_exec *x) {
    if (cpu_choice() & CPU_CHOICE_BAD_ENV) return cpu_bad_env();
    return cpu_level_get()->fwd(p, x);
}

fa_status fa_cpu_bwd(const fa_params *p, const fa_exec *x) {
    if (cpu_choice() & CPU_CHOICE_BAD_ENV) return cpu_bad_env();
    return cpu_level_get()->bwd(p, x);
}

size_t fa_cpu_kvcache_workspace_size(const fa_params *p, const fa_kvcache *kv, int num_threads) {
    return cpu_level_get()->kvcache_workspace_size(p, kv, num_threads);
}

fa_status fa_cpu_fwd_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *x) {
    if (cpu_choice() & CPU_CHOICE_BAD_ENV) return cpu_bad_env();
    return cpu_level_get()->fwd_kvcache(p, kv, x);
}

const char *fa_cpu_simd(void) {
    return cpu_level_get()->name;
}

const char *fa_cpu_simd_choice(void) {
    static _Thread_local char text[160];
    const int c = cpu_choice();
    int best = 0;
    while (!cpu_levels[best].runs()) best++;
    if (c & CPU_CHOICE_BAD_ENV)
        snprintf(text, sizeof text, "%s=%s is not amx, avx512bf16, avx512, avx2 or portable: CPU backend calls fail",
                 CPU_SIMD_ENV, cpu_simd_env());
    else if (c & CPU_CHOICE_FORCED)
        snprintf(text, sizeof text, "%s=%s; this CPU runs up to %s", CPU_SIMD_ENV, cpu_simd_env(),
                 cpu_levels[best].name);
    else
        snprintf(text, sizeof text,
                 "chosen at run time: the widest of amx, avx512bf16, avx512, avx2, portable that this CPU runs");
    return text;
}

#else /* one level, the compiler's */

const char *fa_cpu_simd(void) {
#if defined(__AVX512BF16__)
    return "avx512bf16";
#elif defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
    return "avx2";
#elif defined(__AVX__)
    return "avx";
#elif defined(__ARM_NEON)
    return "neon";
#else
    return "portable";
#endif
}

const char *fa_cpu_simd_choice(void) {
    return "fixed at compile time: this build has no run-time choice";
}

#endif
