// SPDX-License-Identifier: Apache-2.0
// The e4m3 parts of src/cuda/fa3_fp8.cuh and the e4m3 wgmma wrappers on one warpgroup, against the host:
//   S = Q K^T   (64 x 128 over D, both K-major: fa3_wgmma_ss<128, e4m3>)
//   O = P V     (64 x D over 128 keys: P from the accumulator layout by fa3_fp8_pack_p, V transposed by
//                fa3_fp8_transpose_v, fa3_wgmma_rs_kmajor<D, e4m3>)
// for D = 128 and 256. Build and run on an sm_90a GPU from the repository root:
//   nvcc -std=c++17 -arch=sm_90a -Isrc -o /tmp/fp8_parts dev/fp8/parts_test.cu && /tmp/fp8_parts
#include <cuda_fp8.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/fa3_fp8.cuh"
#include "cuda/fa3_wgmma.cuh"
#include "cuda/hopper.cuh"

#define BN 128
#define BM 64

// Row-major [rows][D] bytes from global into [D / 128 slabs][rows][128 B] with the 128-byte swizzle.
__device__ void to_slabs(const uint8_t *g, uint8_t *s, int rows, int d) {
    for (int i = threadIdx.x; i < rows * d; i += blockDim.x) {
        const int r = i / d, c = i % d;
        s[(c / 128) * rows * 128 + fa3_sw128(r, c % 128)] = g[i];
    }
}

template <int D>
__global__ void qk_kernel(const uint8_t *q, const uint8_t *k, float *out) {
#if FA_SM90A
    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t *sq = smem, *sk = smem + BM * D;
    to_slabs(q, sq, BM, D);
    to_slabs(k, sk, BN, D);
    hp_fence_proxy_async();
    __syncthreads();
    float s[BN / 2];
    for (int i = 0; i < BN / 2; ++i) s[i] = 0.f;
    hp_wgmma_fence();
    const uint64_t dq = hp_desc_sw128(hp_smem_addr(sq), 16, 1024), dk = hp_desc_sw128(hp_smem_addr(sk), 16, 1024);
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk)
        fa3_wgmma_ss<BN, __nv_fp8_e4m3>(s, hp_desc_add(dq, ((kk / 4) * BM * 128 + (kk % 4) * 32) >> 4),
                                        hp_desc_add(dk, ((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), kk > 0);
    hp_wgmma_commit();
    hp_wgmma_wait<0>();
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int i = 0; i < BN / 2; ++i) {
        const int row = 16 * w + lane / 4 + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * (lane % 4) + (i & 1);
        out[row * BN + col] = s[i];
    }
#endif
}

template <int D>
__global__ void pv_kernel(const float *p, const uint8_t *v, float *out) {
#if FA_SM90A
    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t *sv = smem, *svt = smem + BN * D;
    to_slabs(v, sv, BN, D);
    __syncthreads();
    fa3_fp8_transpose_v<D>(hp_smem_addr(sv), hp_smem_addr(svt), threadIdx.x);
    hp_fence_proxy_async();
    __syncthreads();
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    float s[BN / 2];
    for (int i = 0; i < BN / 2; ++i) {
        const int row = 16 * w + lane / 4 + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * (lane % 4) + (i & 1);
        s[i] = p[row * BN + col];
    }
    uint32_t pa[BN / 8];
    fa3_fp8_pack_p<BN>(s, pa);
    float o[D / 2];
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    hp_wgmma_fence();
    const uint64_t dvt = hp_desc_sw128(hp_smem_addr(svt), 16, 1024);
#pragma unroll
    for (int kk = 0; kk < BN / 32; ++kk)
        fa3_wgmma_rs_kmajor<D, __nv_fp8_e4m3>(o, pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3],
                                              hp_desc_add(dvt, (kk * 32) >> 4), kk > 0);
    hp_wgmma_commit();
    hp_wgmma_wait<0>();
    for (int i = 0; i < D / 2; ++i) {
        const int row = 16 * w + lane / 4 + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * (lane % 4) + (i & 1);
        out[row * D + col] = o[i];
    }
#endif
}

static float e4m3(uint8_t b) {
    __nv_fp8_e4m3 x;
    x.__x = b;
    return (float)x;
}

static uint8_t rand_e4m3(void) {
    for (;;) {
        const uint8_t b = (uint8_t)(rand() & 0xff);
        if ((b & 0x7f) != 0x7f) return b; /* not NaN */
    }
}

#define CK(x)                                                                    \
    do {                                                                         \
        cudaError_t e_ = (x);                                                    \
        if (e_ != cudaSuccess) {                                                 \
            printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));    \
            exit(2);                                                             \
        }                                                                        \
    } while (0)

template <int D>
static int run(void) {
    const size_t nq = BM * D, nk = BN * D;
    uint8_t *hq = (uint8_t *)malloc(nq), *hk = (uint8_t *)malloc(nk), *hv = (uint8_t *)malloc(nk);
    float *hp = (float *)malloc(sizeof(float) * BM * BN), *hs = (float *)malloc(sizeof(float) * BM * BN);
    float *ho = (float *)malloc(sizeof(float) * BM * D);
    for (size_t i = 0; i < nq; ++i) hq[i] = rand_e4m3();
    for (size_t i = 0; i < nk; ++i) hk[i] = rand_e4m3(), hv[i] = rand_e4m3();
    for (int i = 0; i < BM * BN; ++i) hp[i] = 300.0f * (float)rand() / (float)RAND_MAX; /* P scaled into e4m3's range */
    uint8_t *dq, *dk, *dv;
    float *dp, *ds, *dout;
    CK(cudaMalloc(&dq, nq));
    CK(cudaMalloc(&dk, nk));
    CK(cudaMalloc(&dv, nk));
    CK(cudaMalloc(&dp, sizeof(float) * BM * BN));
    CK(cudaMalloc(&ds, sizeof(float) * BM * BN));
    CK(cudaMalloc(&dout, sizeof(float) * BM * D));
    CK(cudaMemcpy(dq, hq, nq, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, hk, nk, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, hv, nk, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dp, hp, sizeof(float) * BM * BN, cudaMemcpyHostToDevice));
    const int smem_qk = (int)(nq + nk), smem_pv = (int)(2 * nk);
    CK(cudaFuncSetAttribute(qk_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_qk));
    CK(cudaFuncSetAttribute(pv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_pv));
    qk_kernel<D><<<1, 128, smem_qk>>>(dq, dk, ds);
    pv_kernel<D><<<1, 128, smem_pv>>>(dp, dv, dout);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hs, ds, sizeof(float) * BM * BN, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ho, dout, sizeof(float) * BM * D, cudaMemcpyDeviceToHost));
    /* FP8 wgmma keeps fewer accumulator bits than fp32 (about 14 retained across the sum), so an element's error is
     * held to 2^-10 of the sum of its terms' magnitudes; a fragment or layout mistake is of the order of that sum. */
    double worst_s = 0, worst_o = 0;
    for (int r = 0; r < BM; ++r)
        for (int c = 0; c < BN; ++c) {
            double ref = 0, mag = 0;
            for (int x = 0; x < D; ++x) {
                const double t = (double)e4m3(hq[r * D + x]) * e4m3(hk[c * D + x]);
                ref += t, mag += fabs(t);
            }
            if (mag > 0) worst_s = fmax(worst_s, fabs(ref - hs[r * BN + c]) / mag);
        }
    for (int r = 0; r < BM; ++r)
        for (int c = 0; c < D; ++c) {
            double ref = 0, mag = 0;
            for (int k = 0; k < BN; ++k) {
                const double t = (double)(float)__nv_fp8_e4m3(hp[r * BN + k]) * e4m3(hv[k * D + c]);
                ref += t, mag += fabs(t);
            }
            if (mag > 0) worst_o = fmax(worst_o, fabs(ref - ho[r * D + c]) / mag);
        }
    const double tol = 1.0 / 1024;
    const int ok = worst_s <= tol && worst_o <= tol;
    printf("%s D=%d: worst error / sum of |terms|: S = Q K^T %.3g, O = P V %.3g (bound %.3g)\n", ok ? "PASS" : "FAIL",
           D, worst_s, worst_o, tol);
    return ok ? 0 : 1;
}

int main(void) {
    srand(1);
    return run<128>() | run<256>();
}
