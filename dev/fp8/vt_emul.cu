// SPDX-License-Identifier: Apache-2.0
// The V^T writer of src/cuda/fa3_fp8.cuh (fa3_fp8_transpose_v_warp) emulated on the host, lane by lane, with
// ldmatrix .trans, prmt and stmatrix as PTX defines them, on the header's own address and task functions:
//   - every byte (key, head-dim byte) of a V stage lands at V^T row d, fa3_sw128(d, fa3_fp8_key_pos(key)), and
//     every V^T byte is written exactly once, nothing outside the stage;
//   - the result is byte for byte that of the previous writer (one task per warp in turn, task t: key group
//     t % 8, column group t / 8, addresses from the lane's row and chunk), emulated the same way;
//   - each 8-row matrix of every ldmatrix and stmatrix touches 8 different 16-byte bank groups (no conflicts);
// for D = 64 (half of each 128-byte row of V), 128 and 256, 3 warps (the kernel's writer) and 4
// (dev/fp8/parts_test.cu), several stage bases.
// No GPU needed. From the repository root:
//   nvcc -std=c++17 -Isrc -o /tmp/vt_emul dev/fp8/vt_emul.cu && /tmp/vt_emul
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda/fa3_fp8.cuh"

static int failures = 0;
#define CHECK(cond, ...)                                    \
    do {                                                    \
        if (!(cond)) {                                      \
            if (failures++ < 10) {                          \
                printf("FAIL %s:%d: ", __FILE__, __LINE__); \
                printf(__VA_ARGS__);                        \
                printf("\n");                               \
            }                                               \
        }                                                   \
    } while (0)

// Shared memory as bytes, with a count of the writes per byte.
struct Smem {
    std::vector<uint8_t> b;
    std::vector<int> writes;
    explicit Smem(size_t n) : b(n, 0xee), writes(n, 0) {}
};

// Matrix rows (8 addresses) must fall in 8 different 16-byte bank groups for one wavefront.
static void check_banks(const uint32_t (&addr)[32], const char *what) {
    for (int m = 0; m < 4; ++m) {
        int seen = 0;
        for (int r = 0; r < 8; ++r) seen |= 1 << ((addr[8 * m + r] >> 4) & 7);
        CHECK(seen == 0xff, "%s: matrix %d rows share bank groups", what, m);
    }
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lane l gives row l % 8 of matrix l / 8 (16 bytes, eight
// 16-bit elements); register i of lane l holds elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4) of
// matrix i, the first in the low half.
static void ldmatrix_x4_trans(const Smem &s, const uint32_t (&addr)[32], uint32_t (&r)[32][4]) {
    check_banks(addr, "ldmatrix");
    for (int l = 0; l < 32; ++l) {
        CHECK(addr[l] % 16 == 0 && addr[l] + 16 <= s.b.size(), "ldmatrix row address %#x", addr[l]);
        for (int i = 0; i < 4; ++i) {
            const int c = l / 4, q = l % 4;
            uint32_t v = 0;
            for (int h = 0; h < 2; ++h) {
                const uint32_t a = addr[8 * i + 2 * q + h] + 2 * c;
                v |= (uint32_t)(s.b[a] | s.b[a + 1] << 8) << (16 * h);
            }
            r[l][i] = v;
        }
    }
}

// stmatrix.sync.aligned.m8n8.x4.shared.b16: register j of lane l holds elements (l / 4, 2 (l % 4)) and
// (l / 4, 2 (l % 4) + 1) of matrix j, whose row r goes to the address of lane 8 j + r.
static void stmatrix_x4(Smem &s, const uint32_t (&addr)[32], const uint32_t (&r)[32][4]) {
    check_banks(addr, "stmatrix");
    for (int l = 0; l < 32; ++l) {
        CHECK(addr[l] % 16 == 0 && addr[l] + 16 <= s.b.size(), "stmatrix row address %#x", addr[l]);
        for (int j = 0; j < 4; ++j) {
            const uint32_t a = addr[8 * j + l / 4] + 4 * (l % 4);
            for (int x = 0; x < 4; ++x) {
                s.b[a + x] = (uint8_t)(r[l][j] >> (8 * x));
                s.writes[a + x]++;
            }
        }
    }
}

// __byte_perm(x, y, s): byte n of the result is byte (s >> 4 n) & 7 of the 8 bytes y:x.
static uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t xy = (uint64_t)y << 32 | x;
    uint32_t out = 0;
    for (int n = 0; n < 4; ++n) out |= (uint32_t)((xy >> (8 * ((s >> (4 * n)) & 7))) & 0xff) << (8 * n);
    return out;
}

static void permute_store(Smem &s, const uint32_t (&st)[32], const uint32_t (&v)[32][4]) {
    uint32_t r[32][4];
    for (int l = 0; l < 32; ++l) {
        const uint32_t se = fa3_fp8_vt_sel(l), so = se ^ 0x1111;
        r[l][0] = byte_perm(v[l][0], v[l][1], se);
        r[l][1] = byte_perm(v[l][0], v[l][1], so);
        r[l][2] = byte_perm(v[l][2], v[l][3], se);
        r[l][3] = byte_perm(v[l][2], v[l][3], so);
    }
    stmatrix_x4(s, st, r);
}

// Warp W's run as fa3_fp8_transpose_v_warp issues it: the same loop, the same XOR chains.
template <int D, int NW, int W>
static void new_warp(Smem &s, uint32_t s_v, uint32_t s_vt) {
    typedef fa3_fp8_vt_tasks<D, NW, W> T;
    constexpr int kDepth = 2;
    uint32_t ldx[32], stx[32], v[kDepth][32][4];
    for (int l = 0; l < 32; ++l) {
        ldx[l] = (s_v + fa3_fp8_vt_ld_lane(l)) ^ fa3_fp8_vt_ld_xor(T::cg(0));
        stx[l] = (s_vt + fa3_fp8_vt_st_lane(l)) ^ fa3_fp8_vt_st_xor(T::g(0));
    }
    for (int k = -(kDepth - 1); k < T::kCount; ++k) {
        const int kn = k + kDepth - 1;
        if (kn < T::kCount) {
            uint32_t a[32];
            for (int l = 0; l < 32; ++l) {
                if (kn > 0) ldx[l] ^= fa3_fp8_vt_ld_xor(T::cg(kn - 1)) ^ fa3_fp8_vt_ld_xor(T::cg(kn));
                a[l] = ldx[l] + fa3_fp8_vt_ld_off(T::g(kn), T::cg(kn));
            }
            ldmatrix_x4_trans(s, a, v[kn % kDepth]);
        }
        if (k < 0) continue;
        uint32_t a[32];
        for (int l = 0; l < 32; ++l) {
            if (k > 0) stx[l] ^= fa3_fp8_vt_st_xor(T::g(k - 1)) ^ fa3_fp8_vt_st_xor(T::g(k));
            a[l] = stx[l] + fa3_fp8_vt_st_off(T::cg(k));
        }
        permute_store(s, a, v[k % kDepth]);
    }
}

// The previous writer (commit 5ef177f), warp w of nw: tasks w, w + nw, ..., key group t & 7, column group t >> 3.
template <int D>
static void old_warp(Smem &s, uint32_t s_v, uint32_t s_vt, int w, int nw) {
    for (int task = w; task < 8 * (D / 32); task += nw) {
        const uint32_t g = task & 7, cg = task >> 3;
        uint32_t la[32], sa[32], v[32][4];
        for (int lane = 0; lane < 32; ++lane) {
            const uint32_t i = lane >> 3, r = lane & 7;
            const uint32_t ld = s_v + (8 * (i & 1) + r) * 128, lx = ((i >> 1) ^ r) << 4;
            const uint32_t n = 16 * (i >> 1) + 2 * r + ((i & 1) ^ (r >> 2)), st = s_vt + n * 128, nx = n & 7;
            la[lane] = ld + g * (16 * 128) + (cg >> 2) * (128 * 128) + (lx ^ ((cg & 3) << 5));
            sa[lane] = st + cg * (32 * 128) + ((g ^ nx) << 4);
        }
        ldmatrix_x4_trans(s, la, v);
        permute_store(s, sa, v);
    }
}

template <int D, int NW>
static void new_all(Smem &s, uint32_t s_v, uint32_t s_vt) {
    new_warp<D, NW, 0>(s, s_v, s_vt);
    if constexpr (NW > 1) new_warp<D, NW, 1>(s, s_v, s_vt);
    if constexpr (NW > 2) new_warp<D, NW, 2>(s, s_v, s_vt);
    if constexpr (NW > 3) new_warp<D, NW, 3>(s, s_v, s_vt);
}

template <int D, int NW>
static void run(uint32_t s_v, uint32_t s_vt, unsigned seed) {
    const uint32_t size = (s_v > s_vt ? s_v : s_vt) + 128 * fa3_fp8_tile_d(D) + 4096;
    Smem ref(size);
    std::vector<uint8_t> val(128 * D);
    for (int x = 0; x < 128 * D; ++x) {
        seed = seed * 1664525u + 1013904223u;
        val[x] = (uint8_t)(seed >> 24);
    }
    for (int k = 0; k < 128; ++k) // V: [D / 128 slabs][128 keys][128 B], swizzled
        for (int d = 0; d < D; ++d) ref.b[s_v + (d / 128) * 128 * 128 + fa3_sw128(k, d % 128)] = val[k * D + d];
    Smem mine = ref, old = ref;
    new_all<D, NW>(mine, s_v, s_vt);
    old_warp<D>(old, s_v, s_vt, 0, NW); // warp order is immaterial: every byte is written once
    for (int w = 1; w < NW; ++w) old_warp<D>(old, s_v, s_vt, w, NW);
    for (int k = 0; k < 128; ++k)
        for (int d = 0; d < D; ++d) {
            const uint32_t a = s_vt + fa3_sw128(d, fa3_fp8_key_pos(k));
            CHECK(mine.b[a] == val[k * D + d], "D %d NW %d: key %d byte %d: %#x, want %#x", D, NW, k, d, mine.b[a],
                  val[k * D + d]);
        }
    for (uint32_t a = 0; a < size; ++a) {
        const bool in_vt = a >= s_vt && a < s_vt + 128 * D;
        CHECK(mine.writes[a] == (in_vt ? 1 : 0), "D %d NW %d: byte %#x written %d times", D, NW, a, mine.writes[a]);
        CHECK(mine.b[a] == old.b[a], "D %d NW %d: byte %#x differs from the previous writer", D, NW, a);
    }
    printf("D %3d, %d warps, V at %#7x, V^T at %#7x: %s\n", D, NW, s_v, s_vt, failures ? "FAIL" : "ok");
}

int main() {
    const uint32_t bases[][2] = { { 0, 65536 }, { 1024, 99328 }, { 73728, 7168 } };
    for (int i = 0; i < 3; ++i) {
        run<64, 3>(bases[i][0], bases[i][1], 41 + i);
        run<64, 4>(bases[i][0], bases[i][1], 51 + i);
        run<128, 3>(bases[i][0], bases[i][1], 1 + i);
        run<128, 4>(bases[i][0], bases[i][1], 11 + i);
        run<256, 3>(bases[i][0], bases[i][1], 21 + i);
        run<256, 4>(bases[i][0], bases[i][1], 31 + i);
    }
    printf("%s\n", failures ? "vt_emul: FAILED" : "vt_emul: all passed");
    return failures ? 1 : 0;
}
