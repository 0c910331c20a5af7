/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_simd.h - the SIMD layer of the CPU backend: vector types sized by the target (GCC vector extensions),
 * a vectorised exp and tanh, fp16/bf16 row conversion, and the register-blocked matrix micro-kernel that
 * every product of the forward and backward is built from (and, at a level with the bf16 dot product, its
 * bf16-pair form, which bf16 calls use).
 *
 * Width: 64-byte vectors with AVX-512, 32 with AVX/AVX2, 16 otherwise (the compiler lowers those to
 * whatever the target has, scalars included). The target is the compiler's: one per instruction-set level when
 * the Makefile compiles the kernels once per level (cpu_dispatch.c chooses among them at run time).
 */
#ifndef FLASHATTN_CPU_SIMD_H
#define FLASHATTN_CPU_SIMD_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define FA_VL 16 /* floats per vector */
#define FA_MR 12 /* rows of the micro-kernel's accumulator block */
#elif defined(__AVX__)
#define FA_VL 8
#define FA_MR 6
#else
#define FA_VL 4
#define FA_MR 6
#endif
#define FA_NR 2 /* vectors per row of the accumulator block */

/* lcm(FA_MR, FA_VL): a query offset that is both whole micro-kernel rows and whole vectors. */
#define FA_QALIGN (FA_VL == 16 ? 48 : FA_VL == 8 ? 24 : 12)

#define FA_INLINE static inline __attribute__((always_inline))
/* For the functions that wrap one product: kept out of line so each gets the registers to itself. */
#define FA_NOINLINE  static __attribute__((noinline))
#define FA_STR_(x)   #x
#define FA_UNROLL(n) _Pragma(FA_STR_(GCC unroll n))

static inline int64_t fa_ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

typedef float fa_vf __attribute__((vector_size(FA_VL * 4)));
typedef int32_t fa_vi __attribute__((vector_size(FA_VL * 4)));
typedef uint32_t fa_vu __attribute__((vector_size(FA_VL * 4)));
/* For loads and stores at any float-aligned address. */
typedef float fa_vf_u __attribute__((vector_size(FA_VL * 4), aligned(4), may_alias));
typedef int32_t fa_vi_u __attribute__((vector_size(FA_VL * 4), aligned(4), may_alias));

FA_INLINE fa_vf fa_vload(const float *p) {
    return *(const fa_vf_u *)p;
}
FA_INLINE void fa_vstore(float *p, fa_vf v) {
    *(fa_vf_u *)p = v;
}
FA_INLINE fa_vf fa_vset1(float x) {
#if FA_VL == 16
    return (fa_vf){ x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x };
#elif FA_VL == 8
    return (fa_vf){ x, x, x, x, x, x, x, x };
#else
    return (fa_vf){ x, x, x, x };
#endif
}
FA_INLINE fa_vi fa_viset1(int32_t x) {
    return (fa_vi){ 0 } + x;
}
/* Whether some lane of a mask (lanes all-ones or zero) is set. */
FA_INLINE int fa_vi_any(fa_vi mask) {
    int any = 0;
    for (int i = 0; i < FA_VL; i++) any |= mask[i] != 0;
    return any;
}
/* 0, 1, 2, ... as floats / ints. */
FA_INLINE fa_vi fa_viota(void) {
    fa_vi r;
    for (int i = 0; i < FA_VL; i++) r[i] = i;
    return r;
}
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

/* a * b + c, fused where the target has FMA (ISO C mode does not contract a * b + c by itself). */
FA_INLINE fa_vf fa_vfma(fa_vf a, fa_vf b, fa_vf c) {
#if defined(__AVX512F__)
    return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__) && defined(__AVX__)
    return _mm256_fmadd_ps(a, b, c);
#else
    return a * b + c;
#endif
}
/* The scalar a * b + c rounded exactly as fa_vfma rounds each lane. */
FA_INLINE float fa_fmaf(float a, float b, float c) {
#if defined(__AVX512F__) || (defined(__FMA__) && defined(__AVX__))
    return __builtin_fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

/* mask ? a : b, mask lanes all-ones or zero. */
FA_INLINE fa_vf fa_vselect(fa_vi mask, fa_vf a, fa_vf b) {
    return (fa_vf)(((fa_vi)a & mask) | ((fa_vi)b & ~mask));
}
FA_INLINE fa_vf fa_vmax(fa_vf a, fa_vf b) {
#if defined(__AVX512F__)
    return _mm512_max_ps(a, b);
#elif defined(__AVX__)
    return _mm256_max_ps(a, b);
#else
    return fa_vselect(a > b, a, b);
#endif
}
FA_INLINE fa_vf fa_vmin(fa_vf a, fa_vf b) {
#if defined(__AVX512F__)
    return _mm512_min_ps(a, b);
#elif defined(__AVX__)
    return _mm256_min_ps(a, b);
#else
    return fa_vselect(a < b, a, b);
#endif
}
FA_INLINE fa_vf fa_vabs(fa_vf a) {
    return (fa_vf)((fa_vi)a & fa_viset1(0x7fffffff));
}
/* 2^f for |f| <= 1/2 (a little more is fine): a degree-6 polynomial, a relative-error fit on [-1/2, 1/2] (fit
 * error 2.0e-9). */
FA_INLINE fa_vf fa_vexp2_frac(fa_vf f) {
    fa_vf p = fa_vset1(1.535336196e-04f);
    p = fa_vfma(p, f, fa_vset1(1.339887502e-03f));
    p = fa_vfma(p, f, fa_vset1(9.618436918e-03f));
    p = fa_vfma(p, f, fa_vset1(5.550332367e-02f));
    p = fa_vfma(p, f, fa_vset1(2.402264774e-01f));
    p = fa_vfma(p, f, fa_vset1(6.931471825e-01f));
    p = fa_vfma(p, f, fa_vset1(1.0f));
    return p;
}

/* 2^n 2^f for integral n in [-127, 127] and |f| <= 1/2: 2^f by fa_vexp2_frac, 2^n through the exponent bits
 * (n = -127 gives 0). */
FA_INLINE fa_vf fa_vexp2_parts(fa_vf n, fa_vf f) {
    fa_vi ni = __builtin_convertvector(n, fa_vi);
    return fa_vexp2_frac(f) * (fa_vf)((ni + 127) << 23);
}

/* Rounds to the nearest integer, ties to even (|x| < 2^22). */
FA_INLINE fa_vf fa_vround(fa_vf x) {
#if defined(__AVX512F__)
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__AVX__)
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
    const fa_vf magic = fa_vset1(12582912.0f); /* 1.5 * 2^23: adding it leaves no fraction bits */
    return (x + magic) - magic;
#endif
}

/*
 * 2^x in fp32, vectorised. Error: at most 1 ulp against exp2() in double (1.2 ulp without FMA; measured by
 * dev/cpu_bench.c --math). fa_vexp2_nonpos is the softmax version: x is clamped to [-127, 127], and
 * x < -126.5 gives exactly 0 (the exponent field becomes 0 for n = -127), -inf included, so masked scores
 * need no special case; NaN stays NaN (the clamp's max and min return their second operand when one is NaN,
 * so x goes second), which is how a NaN score reaches the row sum. fa_vexp2 adds x < -126 -> 0 (no subnormal
 * results) and x > 127 -> +inf.
 *
 * The softmax calls it once per score, so it is written for few instructions: adding 1.5 * 2^23 + 127 rounds
 * x to an integer n in the low mantissa bits (as n + 127, which shifted left by 23 is the exponent field of
 * 2^n) and subtracting it back gives n exactly; no float-to-int conversion or separate rounding.
 */
FA_INLINE fa_vf fa_vexp2_nonpos(fa_vf x) {
    const fa_vf shifter = fa_vset1(12583039.0f); /* 1.5 * 2^23 + 127 */
    fa_vf xc = fa_vmin(fa_vset1(127.0f), fa_vmax(fa_vset1(-127.0f), x));
    fa_vf t = xc + shifter; /* in [2^23, 2^24): whole numbers, rounded to nearest */
    fa_vf f = xc - (t - shifter);
    return fa_vexp2_frac(f) * (fa_vf)((fa_vi)t << 23);
}

FA_INLINE fa_vf fa_vexp2(fa_vf x) {
    fa_vf res = fa_vselect(x < -126.0f, fa_vset1(0.0f), fa_vexp2_nonpos(x));
    res = fa_vselect(x > 127.0f, fa_vset1(__builtin_inff()), res);
    return fa_vselect(x != x, x, res);
}

/* exp(x) in fp32, vectorised: n = round(x log2 e), r = x - n ln 2 in two steps (Cody-Waite; the 9-bit head
 * of ln 2 makes n * head exact), exp(r) = 2^(r log2 e). Error: at most 2 ulp against exp() in double over
 * [-87.3, 88.3] (measured). Flushes below 2^-126 to 0, +inf above 88.3 (the true limit is 88.72), NaN -> NaN. */
FA_INLINE fa_vf fa_vexp(fa_vf x) {
    fa_vf xc = fa_vmin(fa_vmax(x, fa_vset1(-88.0f)), fa_vset1(88.3f));
    fa_vf n = fa_vround(xc * 1.44269504088896341f);
    fa_vf r = fa_vfma(n, fa_vset1(-0.693359375f), xc);
    r = fa_vfma(n, fa_vset1(2.12194440e-4f), r);
    fa_vf res = fa_vexp2_parts(n, r * 1.44269504088896341f);
    res = fa_vselect(x < -87.3365447f, fa_vset1(0.0f), res);
    res = fa_vselect(x > 88.3f, fa_vset1(__builtin_inff()), res);
    return fa_vselect(x != x, x, res);
}

/*
 * tanh(x) in fp32, vectorised. |x| < 0.625: x + x^3 q(x^2), q of degree 4 fitted for relative error on
 * [0, 0.625] (fit error 4.4e-9);
 * otherwise sign(x) (1 - 2 / (exp(2|x|) + 1)), which has no cancellation there. Error: a few ulp (measured
 * by dev/cpu_bench.c --exp).
 */
FA_INLINE fa_vf fa_vtanh(fa_vf x) {
    fa_vf ax = fa_vabs(x);
    fa_vf e = fa_vexp(fa_vmin(ax + ax, fa_vset1(88.0f)));
    fa_vf big = 1.0f - 2.0f / (e + 1.0f);
    fa_vf x2 = x * x;
    fa_vf q = fa_vset1(-5.704985000e-03f);
    q = fa_vfma(q, x2, fa_vset1(2.063908614e-02f));
    q = fa_vfma(q, x2, fa_vset1(-5.373971537e-02f));
    q = fa_vfma(q, x2, fa_vset1(1.333144158e-01f));
    q = fa_vfma(q, x2, fa_vset1(-3.333328068e-01f));
    fa_vf small = fa_vfma(q * x2, x, x);
    fa_vi sign = (fa_vi)x & fa_viset1((int32_t)0x80000000u);
    big = (fa_vf)((fa_vi)big | sign);
    /* NaN would otherwise come out as +-1 (the clamp in fa_vexp drops it) */
    return fa_vselect(x != x, x, fa_vselect(ax < 0.625f, small, big));
}

/* Mode of a micro-kernel call: C = AB, C += AB, or C = diag(row_scale) C + AB. The product is summed from zero
 * and C enters only at the end: its tile (in L2 at best) is then read while the k loop runs instead of
 * holding up the first multiply-adds. */
enum { FA_UK_SET = 0, FA_UK_ADD = 1, FA_UK_SCALE_ADD = 2 };

/* The micro-kernels' accumulators from zero, with C's rows prefetched where C enters at the end. */
FA_INLINE void fa_uk_begin(fa_vf (*acc)[FA_NR], const int nr, const float *c, const int64_t ldc, const int mode) {
    FA_UNROLL(16)
    for (int i = 0; i < FA_MR; i++) {
        FA_UNROLL(4)
        for (int v = 0; v < nr; v++) acc[i][v] = fa_vset1(0.0f);
        if (mode != FA_UK_SET) __builtin_prefetch(c + i * ldc, 1, 3);
        if (mode != FA_UK_SET && nr * FA_VL > 16) __builtin_prefetch(c + i * ldc + nr * FA_VL - 1, 1, 3);
    }
}

/* C (op)= the accumulators, by mode. */
FA_INLINE void fa_uk_end(fa_vf (*acc)[FA_NR], const int nr, float *c, const int64_t ldc, const int mode,
                         const float *row_scale) {
    FA_UNROLL(16)
    for (int i = 0; i < FA_MR; i++) {
        FA_UNROLL(4)
        for (int v = 0; v < nr; v++) {
            float *ci = c + i * ldc + v * FA_VL;
            if (mode == FA_UK_SET)
                fa_vstore(ci, acc[i][v]);
            else if (mode == FA_UK_ADD)
                fa_vstore(ci, fa_vload(ci) + acc[i][v]);
            else
                fa_vstore(ci, fa_vfma(fa_vload(ci), fa_vset1(row_scale[i]), acc[i][v]));
        }
    }
}

/*
 * The micro-kernel: C[FA_MR x nr*FA_VL] (op)= A[FA_MR x kc] B[kc x nr*FA_VL], nr <= FA_NR, with the
 * accumulators in registers for the whole k loop. Row i of A at step k is a[i * a_row + k * a_k] (one of
 * the two strides is 1 at every call site, the other a compile-time constant, so every A element is a
 * broadcast from a fixed offset of one moving pointer); vector v of row k of B is at b + k * ldb + v * b_vec
 * (b_vec = FA_VL for plain rows; packed operands keep each vector column as its own contiguous strip); row i
 * of C is c + i * ldc. Inlined into callers that pass constants for nr, a_row, a_k, b_vec and mode.
 */
FA_INLINE void fa_ukernel(const int nr, int64_t kc, const float *a, const int64_t a_row, const int64_t a_k,
                          const float *b, const int64_t ldb, const int64_t b_vec, float *c, const int64_t ldc,
                          const int mode, const float *row_scale) {
    fa_vf acc[FA_MR][FA_NR];
    fa_uk_begin(acc, nr, c, ldc, mode);
    for (; kc > 0; kc--) {
        fa_vf bv[FA_NR];
        FA_UNROLL(4)
        for (int v = 0; v < nr; v++) bv[v] = fa_vload(b + v * b_vec);
        FA_UNROLL(16)
        for (int i = 0; i < FA_MR; i++) {
            fa_vf av = fa_vset1(a[i * a_row]);
            FA_UNROLL(4)
            for (int v = 0; v < nr; v++) acc[i][v] = fa_vfma(av, bv[v], acc[i][v]);
        }
        a += a_k;
        b += ldb;
    }
    fa_uk_end(acc, nr, c, ldc, mode, row_scale);
}

/* Operand layouts of fa_gemm. A: rows i of group g = i / FA_MR start at a + g * grp + (i % FA_MR) * row and
 * step by k; B: vector v of row k at b + k * ld + v * vec, and column j is in vector j / FA_VL. */
typedef struct fa_layout_a {
    int64_t row, k, grp;
} fa_layout_a;
typedef struct fa_layout_b {
    int64_t ld, vec;
} fa_layout_b;

#ifndef FA_CPU_PREFETCH
#define FA_CPU_PREFETCH 1 /* -DFA_CPU_PREFETCH=0 leaves all of it to the hardware prefetchers */
#endif
/* A region the next product will read, to bring into the caches while this one runs: a block's first touch
 * would otherwise wait on memory at the start of its product. fa_gemm spreads the lines over its
 * micro-kernel calls. */
typedef struct fa_prefetch {
    const char *p;
    int64_t lines;
} fa_prefetch;

/* bytes from p; nothing for p = NULL. */
static inline fa_prefetch fa_prefetch_range(const void *p, int64_t bytes) {
    fa_prefetch r = { (const char *)p, p ? fa_ceil_div(bytes, 64) : 0 };
    return r;
}

/*
 * C[m x n] (op)= A[m x kc] B[kc x n] for m a multiple of FA_MR and n a multiple of FA_VL, as micro-kernel
 * calls: panels of FA_NR vectors of B outside (a panel stays in L1 while the rows of A pass by).
 */
FA_INLINE void fa_gemm(int64_t m, int64_t n, int64_t kc, const float *a, const fa_layout_a la, const float *b,
                       const fa_layout_b lb, float *c, int64_t ldc, const int mode, const float *row_scale,
                       fa_prefetch pf) {
    const int64_t calls = m / FA_MR * fa_ceil_div(n, FA_NR * FA_VL);
    const int64_t pf_per_call = calls > 0 ? fa_ceil_div(pf.lines, calls) : 0;
    for (int64_t j = 0; j < n; j += FA_NR * FA_VL) {
        const float *bj = b + j / FA_VL * lb.vec;
        for (int64_t i = 0; i < m; i += FA_MR) {
            const float *ai = a + i / FA_MR * la.grp;
            const float *rs = mode == FA_UK_SCALE_ADD ? row_scale + i : NULL;
            for (int64_t t = 0; FA_CPU_PREFETCH && t < pf_per_call && pf.lines > 0; t++, pf.lines--, pf.p += 64)
                __builtin_prefetch(pf.p, 0, 2);
            if (n - j >= FA_NR * FA_VL)
                fa_ukernel(FA_NR, kc, ai, la.row, la.k, bj, lb.ld, lb.vec, c + i * ldc + j, ldc, mode, rs);
            else
                fa_ukernel(1, kc, ai, la.row, la.k, bj, lb.ld, lb.vec, c + i * ldc + j, ldc, mode, rs);
        }
    }
}

#if defined(__AVX512BF16__)
/* This level runs the products of bf16 calls on the bf16 dot product (vdpbf16ps): two bf16 multiplies per
 * fp32 lane, both products added to the fp32 accumulator. */
#define FA_CPU_BF16 1

/* Operands of the bf16 products are bf16 pairs along the summed index k: a 32-bit word holds elements k
 * (low half) and k + 1 (high half), k even, so one word of A broadcast against one vector of B is two steps
 * of the fp32 micro-kernel's k loop. A row-major bf16 matrix is already in pairs along its rows; pairs across
 * rows (k the row index) are packed with fa_bf16_pairs. */
typedef uint32_t fa_vu_u __attribute__((vector_size(64), aligned(4), may_alias));

/* Word lane i: bf16(lo[i]) | bf16(hi[i]) << 16, each rounded to nearest even: both vectors converted by one
 * vcvtne2ps2bf16 (lo's 16 halves, then hi's), interleaved by one vpermw. */
FA_INLINE __m512i fa_bf16_pairs(fa_vf lo, fa_vf hi) {
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                                6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* fa_vexp2_nonpos for probabilities that are rounded to bf16 (relative 2^-9) before their product: 2^f of degree
 * 4 (relative error 2.7e-6 on |f| <= 1/2, a relative-error fit), two multiply-adds fewer; the row sums that take
 * the fp32 values carry that error into the LSE, far inside its tolerance. */
FA_INLINE fa_vf fa_vexp2_nonpos_bf16(fa_vf x) {
    const fa_vf shifter = fa_vset1(12583039.0f); /* 1.5 * 2^23 + 127 */
    fa_vf xc = fa_vmin(fa_vset1(127.0f), fa_vmax(fa_vset1(-127.0f), x));
    fa_vf t = xc + shifter;
    fa_vf f = xc - (t - shifter);
    fa_vf p = fa_vset1(9.570097551e-03f);
    p = fa_vfma(p, f, fa_vset1(5.591786653e-02f));
    p = fa_vfma(p, f, fa_vset1(2.402474433e-01f));
    p = fa_vfma(p, f, fa_vset1(6.931217909e-01f));
    p = fa_vfma(p, f, fa_vset1(9.999992847e-01f));
    return p * (fa_vf)((fa_vi)t << 23);
}

/* Rows 2t and 2t + 1 of src (n floats each at stride ld, n a multiple of FA_VL; the second taken as 0 from row
 * nrows on) as bf16 pairs in row t of dst (words at stride ld), for 2t < nrows. dst may be src: row t is written
 * after rows 2t and 2t + 1 are read, and every row below 2t has been read before. */
FA_INLINE void fa_rows_to_bf16_pairs(const float *src, int64_t ld, int64_t nrows, int64_t n, uint32_t *dst) {
    for (int64_t t = 0; 2 * t < nrows; t++) {
        const float *lo = src + 2 * t * ld, *hi = lo + ld;
        uint32_t *d = dst + t * ld;
        for (int64_t c = 0; c < n; c += FA_VL) {
            fa_vf h = 2 * t + 1 < nrows ? fa_vload(hi + c) : fa_vset1(0.0f);
            *(fa_vu_u *)(d + c) = (fa_vu_u)fa_bf16_pairs(fa_vload(lo + c), h);
        }
    }
}

/* fa_ukernel over kp pairs of k: A's pair of row i at step t is the word a[i * a_row + t * a_k], B's vector v
 * at b + t * ldb + v * b_vec (strides in words). */
FA_INLINE void fa_ukernel_bf16(const int nr, int64_t kp, const uint32_t *a, const int64_t a_row, const int64_t a_k,
                               const uint32_t *b, const int64_t ldb, const int64_t b_vec, float *c, const int64_t ldc,
                               const int mode, const float *row_scale) {
    fa_vf acc[FA_MR][FA_NR];
    fa_uk_begin(acc, nr, c, ldc, mode);
    for (; kp > 0; kp--) {
        __m512bh bv[FA_NR];
        FA_UNROLL(4)
        for (int v = 0; v < nr; v++) bv[v] = (__m512bh)_mm512_loadu_si512(b + v * b_vec);
        FA_UNROLL(16)
        for (int i = 0; i < FA_MR; i++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[i * a_row]);
            FA_UNROLL(4)
            for (int v = 0; v < nr; v++) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
        }
        a += a_k;
        b += ldb;
    }
    fa_uk_end(acc, nr, c, ldc, mode, row_scale);
}

/* fa_gemm over kp pairs of k, the layouts' strides in words. */
FA_INLINE void fa_gemm_bf16(int64_t m, int64_t n, int64_t kp, const uint32_t *a, const fa_layout_a la,
                            const uint32_t *b, const fa_layout_b lb, float *c, int64_t ldc, const int mode,
                            const float *row_scale, fa_prefetch pf) {
    const int64_t calls = m / FA_MR * fa_ceil_div(n, FA_NR * FA_VL);
    const int64_t pf_per_call = calls > 0 ? fa_ceil_div(pf.lines, calls) : 0;
    for (int64_t j = 0; j < n; j += FA_NR * FA_VL) {
        const uint32_t *bj = b + j / FA_VL * lb.vec;
        for (int64_t i = 0; i < m; i += FA_MR) {
            const uint32_t *ai = a + i / FA_MR * la.grp;
            const float *rs = mode == FA_UK_SCALE_ADD ? row_scale + i : NULL;
            for (int64_t t = 0; FA_CPU_PREFETCH && t < pf_per_call && pf.lines > 0; t++, pf.lines--, pf.p += 64)
                __builtin_prefetch(pf.p, 0, 2);
            if (n - j >= FA_NR * FA_VL)
                fa_ukernel_bf16(FA_NR, kp, ai, la.row, la.k, bj, lb.ld, lb.vec, c + i * ldc + j, ldc, mode, rs);
            else
                fa_ukernel_bf16(1, kp, ai, la.row, la.k, bj, lb.ld, lb.vec, c + i * ldc + j, ldc, mode, rs);
        }
    }
}
#endif

#if defined(FA_AMX_EMULATE) && defined(__AVX512BF16__)
/* Tests only (make test-amx-emulated): the AMX instructions the kernels use, in plain C on this thread's eight
 * emulated tiles, so that the AMX level's data layouts are tested on a processor without AMX. */
static _Thread_local unsigned char fa_emu_tile[8][16][64];
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbf16ps
#define _tile_loadconfig(cfg) ((void)(cfg))
#define _tile_release()       ((void)0)
#define _tile_zero(t)         memset(fa_emu_tile[t], 0, sizeof fa_emu_tile[t])
#define _tile_loadd(t, p, stride)                                                                          \
    do {                                                                                                   \
        for (int r_ = 0; r_ < 16; r_++) memcpy(fa_emu_tile[t][r_], (const char *)(p) + r_ * (stride), 64); \
    } while (0)
#define _tile_stored(t, p, stride)                                                                   \
    do {                                                                                             \
        for (int r_ = 0; r_ < 16; r_++) memcpy((char *)(p) + r_ * (stride), fa_emu_tile[t][r_], 64); \
    } while (0)
static inline float fa_emu_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* c[m][n] += sum_k a[m][2k] b[k][2n] + a[m][2k + 1] b[k][2n + 1], bf16 pairs, fp32 accumulators */
static inline void fa_emu_dpbf16ps(int c, int a, int b) {
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            float acc;
            memcpy(&acc, &fa_emu_tile[c][m][4 * n], 4);
            for (int k = 0; k < 16; k++) {
                uint16_t a0, a1, b0, b1;
                memcpy(&a0, &fa_emu_tile[a][m][4 * k], 2), memcpy(&a1, &fa_emu_tile[a][m][4 * k + 2], 2);
                memcpy(&b0, &fa_emu_tile[b][k][4 * n], 2), memcpy(&b1, &fa_emu_tile[b][k][4 * n + 2], 2);
                acc += fa_emu_bf16(a0) * fa_emu_bf16(b0) + fa_emu_bf16(a1) * fa_emu_bf16(b1);
            }
            memcpy(&fa_emu_tile[c][m][4 * n], &acc, 4);
        }
}
#define _tile_dpbf16ps(c, a, b) fa_emu_dpbf16ps(c, a, b)
#define FA_AMX_AVAILABLE        1
#elif defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define FA_AMX_AVAILABLE 1
#endif

#ifdef FA_AMX_AVAILABLE
/* This level runs the bf16 products of the forward on AMX tiles (tdpbf16ps: a 16 x 16 fp32 tile += a 16 x 32
 * bf16 tile times a 32 x 16 one, held as 16 rows of pairs): operands in the bf16-pair words of the level
 * above, A row-major (a row's pairs contiguous), B as pair rows (the layout vdpbf16ps broadcasts against). */
#define FA_CPU_AMX 1

/* Every tile 16 rows of 64 bytes (tiles 0-3 accumulators, 4-5 A, 6-7 B). The configuration is per thread;
 * loading it zeroes the tiles. */
FA_INLINE void fa_amx_begin(void) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
}
FA_INLINE void fa_amx_end(void) {
    _tile_release();
}

/*
 * C (m x n fp32, ldc floats) = A B, or += with add: A is m rows of kp pair words at stride lda words, B holds
 * kp pair rows of n words, its 16-column group g of pair row k at b + g * b_group + k * b_row. m, n and kp are
 * multiples of 16. Blocks of 32 x 32 (four accumulator tiles, two A and two B tiles), 16-wide at the edges.
 */
FA_INLINE void fa_amx_gemm(int64_t m, int64_t n, int64_t kp, const uint32_t *a, int64_t lda, const uint32_t *b,
                           int64_t b_row, int64_t b_group, float *c, int64_t ldc, int add) {
    const size_t sa = (size_t)lda * 4, sb = (size_t)b_row * 4, sc = (size_t)ldc * 4;
    for (int64_t i = 0; i < m; i += 32) {
        const int two_m = m - i >= 32;
        for (int64_t j = 0; j < n; j += 32) {
            const int two_n = n - j >= 32;
            float *c00 = c + i * ldc + j, *c01 = c00 + 16, *c10 = c00 + 16 * ldc, *c11 = c10 + 16;
            if (add) {
                _tile_loadd(0, c00, sc);
                if (two_n) _tile_loadd(1, c01, sc);
                if (two_m) _tile_loadd(2, c10, sc);
                if (two_m && two_n) _tile_loadd(3, c11, sc);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            }
            const uint32_t *b0 = b + j / 16 * b_group, *b1 = b0 + b_group;
            for (int64_t k = 0; k < kp; k += 16) {
                _tile_loadd(4, a + i * lda + k, sa);
                if (two_m) _tile_loadd(5, a + (i + 16) * lda + k, sa);
                _tile_loadd(6, b0 + k * b_row, sb);
                if (two_n) _tile_loadd(7, b1 + k * b_row, sb);
                _tile_dpbf16ps(0, 4, 6);
                if (two_n) _tile_dpbf16ps(1, 4, 7);
                if (two_m) _tile_dpbf16ps(2, 5, 6);
                if (two_m && two_n) _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, c00, sc);
            if (two_n) _tile_stored(1, c01, sc);
            if (two_m) _tile_stored(2, c10, sc);
            if (two_m && two_n) _tile_stored(3, c11, sc);
        }
    }
}
#endif

#endif
