/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_fwd.cu - FlashAttention-3 forward for Hopper (sm_90a): what it supports, the tile configuration per
 * problem, the tensor maps, and the dispatch to the per-head-dim launchers (the kernel is in fa3_fwd.cuh).
 *
 * Developer knobs, only in a build with FA_TUNING (make FA_TUNING=1), which also compiles the instances they
 * reach; the shipped library reads none of them and runs the defaults. FLASHATTN_FA3_SCHEDULE = full | pingpong |
 * overlap | plain (Q from shared memory) | qreg (the default: full, Q K^T with Q from registers) picks the
 * consumer schedule of head dim 128 (bf16; overlap and full also apply to 128-row tiles of head dim 64);
 * FLASHATTN_FA3_BLOCK_M = 128 | 192 the query tile of head dim 64, FLASHATTN_FA3_BLOCK_N = 96 | 128 the key
 * block of its 192-row tiles; FLASHATTN_FA3_SCHEDULER = dynamic (tiles from the atomic counter) | static
 * (round robin) | grid (one CTA per tile, not persistent); FLASHATTN_FA3_LAZY = 0 rescales O whenever a row max
 * grows; FLASHATTN_FA3_ORDER = head keeps causal tiles in head-major order, = longest longest first everywhere;
 * FLASHATTN_FA3_SECTION_MB = N sizes the longest-first sections by N MB of K and V (default 32);
 * FLASHATTN_FA3_ALIGN = start starts every sequence's first 192-row tile at its row 0 also under a causal mask.
 * A build with -DFA3_TRACE=1 writes each launch's timeline to the file FLASHATTN_FA3_TRACE names
 * (dev/hopper/trace.py reads it). The measurements behind the defaults are in docs/worklog.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/fa3_fwd.cuh"

/* Compiled in every pass; its binary version says whether this build carries sm_90a code. */
__global__ void fa3_probe_kernel(void) {}

int fa3_has_sm90a_code(void) {
    static int cached = -1; /* benign race: every thread computes the same value */
    if (cached < 0) {
        cudaFuncAttributes attr;
        if (cudaFuncGetAttributes(&attr, (const void *)fa3_probe_kernel) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        cached = attr.binaryVersion == 90;
    }
    return cached;
}

/* Whether the build's architecture list (FA_CUDA_ARCHS, e.g. "80 90a") holds sm_90a: the answer for a device
 * description with no device behind it, where the runtime cannot be asked. */
static constexpr bool archs_hold_sm90a(const char *s) {
    for (; s[0] != '\0'; ++s)
        if (s[0] == '9' && s[1] == '0' && s[2] == 'a') return true;
    return false;
}

extern "C" int fa3_sm90a_available(const fa_cuda_device *dev) {
    if (dev->cc_major != 9 || dev->cc_minor != 0) return 0;
#ifdef FA_CUDA_ARCHS
    if (fa_cuda_device_is_virtual(dev)) return archs_hold_sm90a(FA_CUDA_ARCHS);
#endif
    return fa3_has_sm90a_code();
}

static int aligned16(const void *ptr) {
    return ((uintptr_t)ptr & 15u) == 0;
}

/* TMA needs byte strides that are positive multiples of 16 (elements: multiples of 8). */
static int tma_stride_ok(int64_t stride_elems) {
    return stride_elems > 0 && stride_elems % 8 == 0 && stride_elems < ((int64_t)1 << 38);
}

fa_status fa3_check_tensor(const char *name, const fa_tensor *t, int dense, int batch, int heads) {
    if (!aligned16(t->data)) return fa_fail(FA_ERR_UNSUPPORTED, "fa3: %s is not 16-byte aligned", name);
    if (!tma_stride_ok(t->stride_seq) || (heads > 1 && !tma_stride_ok(t->stride_head)) ||
        (dense && batch > 1 && !tma_stride_ok(t->stride_batch)))
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "fa3: the strides of %s (batch %lld, seq %lld, head %lld) are not positive "
                       "multiples of 8 elements",
                       name, (long long)t->stride_batch, (long long)t->stride_seq, (long long)t->stride_head);
    return FA_OK;
}

/* What the e4m3 kernel (fa3_fp8_fwd.cuh) takes beyond the 16-bit kernel's rules: head dims 64, 128 and 256, descales
 * per (batch entry, head), rows of q, k and v 16-byte aligned (TMA moves bytes: strides in multiples of 16 e4m3
 * elements). */
static fa_status fa3_fp8_supported(const fa_params *p) {
    const int compiled = (p->head_dim == 64 && FA_HAS_HDIM_64) || (p->head_dim == 128 && FA_HAS_HDIM_128) ||
                         (p->head_dim == 256 && FA_HAS_HDIM_256);
    if (!compiled)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "fa3 e4m3 forward: head_dim %d (the e4m3 kernel has head dims 64, 128 and 256%s)", p->head_dim,
                       FA_HAS_HDIM_64 && FA_HAS_HDIM_128 && FA_HAS_HDIM_256 ? "" : ", not all of them compiled");
    if (p->descale_block_q % 64 != 0 || p->descale_block_k % 128 != 0)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "fa3 e4m3 forward: descale_block_q / descale_block_k (%d / %d): the CUDA kernel takes blocks of "
                       "q in multiples of 64 rows and of k, v in multiples of 128 (its tiles), or 0; the cpu backend "
                       "takes any",
                       (int)p->descale_block_q, (int)p->descale_block_k);
    const int dense = !fa_is_varlen(p);
    const fa_tensor *ts[3] = { &p->q, &p->k, &p->v };
    const char *names[3] = { "q", "k", "v" };
    for (int i = 0; i < 3; i++) {
        const fa_tensor *t = ts[i];
        const int heads = i == 0 ? p->heads_q : p->heads_kv;
        if (t->stride_seq % 16 || (heads > 1 && t->stride_head % 16) || (dense && p->batch > 1 && t->stride_batch % 16))
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "fa3 e4m3 forward: the strides of %s (batch %lld, seq %lld, head %lld) are not multiples "
                           "of 16 elements (TMA moves 16-byte units)",
                           names[i], (long long)t->stride_batch, (long long)t->stride_seq, (long long)t->stride_head);
    }
    return FA_OK;
}

extern "C" fa_status fa3_fwd_supported(const fa_params *p, const fa_cuda_device *dev) {
    if (dev->cc_major != 9 || dev->cc_minor != 0)
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 forward: needs compute capability 9.0 (device %d has %d.%d)",
                       dev->ordinal, dev->cc_major, dev->cc_minor);
    if (!fa3_sm90a_available(dev))
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 forward: this library was built without sm_90a code");
    if (p->dtype != FA_F16 && p->dtype != FA_BF16 && p->dtype != FA_E4M3)
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 forward: dtype must be f16, bf16 or e4m3");
    fa_status st;
    if (p->dtype == FA_E4M3 && (st = fa3_fp8_supported(p)) != FA_OK) return st;
    switch (p->head_dim) {
#define FA3_CASE(D) case D:
        FA3_HDIMS(FA3_CASE)
#undef FA3_CASE
        break;
    default: return fa_fail(FA_ERR_UNSUPPORTED, "fa3 forward: head_dim %d (compiled:" FA3_HDIMS_STR ")", p->head_dim);
    }
    if (p->alibi_slopes != NULL && p->dtype == FA_E4M3)
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 forward: ALiBi with e4m3 inputs is not supported");
    if (!(p->softcap > 0.0f) && !(p->softmax_scale > 0.0f))
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 forward: softmax_scale must be positive without softcap");
    const int64_t tiles = (int64_t)((p->seqlen_q + fa3_block_m(p) - 1) / fa3_block_m(p)) * p->heads_q * p->batch;
    if (tiles > ((int64_t)1 << 30))
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 forward: %lld query tiles is too many", (long long)tiles);
    const int dense = !fa_is_varlen(p);
    if (dense ? (p->seqlen_q < 1 || p->seqlen_k < 1) : (p->total_q < 1 || p->total_k < 1))
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 forward: empty Q or K tensor");
    if ((st = fa3_check_tensor("q", &p->q, dense, p->batch, p->heads_q)) != FA_OK) return st;
    if ((st = fa3_check_tensor("k", &p->k, dense, p->batch, p->heads_kv)) != FA_OK) return st;
    if ((st = fa3_check_tensor("v", &p->v, dense, p->batch, p->heads_kv)) != FA_OK) return st;
    if ((st = fa3_check_tensor("o", &p->o, dense, p->batch, p->heads_q)) != FA_OK) return st;
    return FA_OK;
}

/* The workspace holds the tile counter of the persistent grid and the tag of the launch that reset it
 * (fa3_sched::counter_reset). */
extern "C" size_t fa3_fwd_workspace_size(const fa_params *p, const fa_cuda_device *dev) {
    (void)p;
    (void)dev;
    return 256;
}

/* A tag no other launch of this process has, and one that stale workspace contents (zeros, a pattern, another
 * process's tags) match only by a 2^-64 chance: a bijective 64-bit mix of a per-process salt plus a count. */
static unsigned long long mix64(unsigned long long x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static unsigned long long next_launch_tag(void) {
    static unsigned long long salt, launches;
    if (__atomic_load_n(&salt, __ATOMIC_ACQUIRE) == 0) {
        unsigned long long s = mix64((unsigned long long)time(NULL) ^ (unsigned long long)(uintptr_t)&salt ^
                                     ((unsigned long long)clock() << 32)) |
                               1;
        unsigned long long zero = 0;
        __atomic_compare_exchange_n(&salt, &zero, s, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    /* never 0: that is the retired tag (fa3_sched::counter_retire) */
    return mix64(__atomic_load_n(&salt, __ATOMIC_ACQUIRE) + __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED)) | 1;
}

#ifdef FA_TUNING
static int env_is(const char *name, const char *value) {
    const char *s = getenv(name);
    return s != NULL && strcmp(s, value) == 0;
}

static int env_choice(const char *name, int a, int b) {
    const char *s = getenv(name);
    const int v = s != NULL ? atoi(s) : 0;
    return v == a || v == b ? v : 0;
}

static fa3_knobs knobs_read(void) {
    fa3_knobs k;
    memset(&k, 0, sizeof k);
    k.schedule = FA3_SCHEDULE_DEFAULT;
    static const struct {
        const char *name;
        int schedule;
    } schedules[] = { { "full", FA3_SCHEDULE_FULL },
                      { "pingpong", FA3_SCHEDULE_PINGPONG },
                      { "overlap", FA3_SCHEDULE_OVERLAP },
                      { "plain", FA3_SCHEDULE_PLAIN },
                      { "qreg", FA3_SCHEDULE_QREG } };
    for (size_t i = 0; i < sizeof schedules / sizeof schedules[0]; i++)
        if (env_is("FLASHATTN_FA3_SCHEDULE", schedules[i].name)) k.schedule = schedules[i].schedule;
    k.block_m = env_choice("FLASHATTN_FA3_BLOCK_M", 128, 192);
    k.block_n = env_choice("FLASHATTN_FA3_BLOCK_N", 96, 128);
    k.order = env_is("FLASHATTN_FA3_ORDER", "head") ? 1 : env_is("FLASHATTN_FA3_ORDER", "longest") ? 2 : 0;
    const char *mb = getenv("FLASHATTN_FA3_SECTION_MB");
    k.section_mb = mb != NULL && atoi(mb) > 0 ? atoi(mb) : 0;
    k.align_start = env_is("FLASHATTN_FA3_ALIGN", "start");
    k.eager_max = env_is("FLASHATTN_FA3_LAZY", "0");
    k.scheduler = env_is("FLASHATTN_FA3_SCHEDULER", "static") ? 1 : env_is("FLASHATTN_FA3_SCHEDULER", "grid") ? 2 : 0;
    return k;
}

const fa3_knobs *fa3_knobs_get(void) {
    static const fa3_knobs knobs = knobs_read(); /* initialised once, thread-safely (C++ static) */
    return &knobs;
}
#else
/* The library's own choices everywhere: the launchers carry only the instances these reach. */
const fa3_knobs *fa3_knobs_get(void) {
    static const fa3_knobs defaults = { FA3_SCHEDULE_DEFAULT, 0, 0, 0, 0, 0, 0, 0 };
    return &defaults;
}
#endif

/* Key-block width: 128 for head dims 64 and 128 (a wider S spills), 80 for 256 (two stages of K and V plus Q
 * fill shared memory). Head dim 64 with three consumer warpgroups (192-row tiles) at 160 registers: 128 spills
 * in the general (masked) step but not in the unmasked steps, and is as fast as 96 (which does not spill) or
 * faster. FLASHATTN_FA3_BLOCK_N = 96 | 128 overrides it for those tiles (FA_TUNING). */
static int choose_block_n(const fa_params *p, int block_m) {
    if (p->dtype == FA_E4M3) return 128; /* the e4m3 kernel's V^T and P packing are made for 128 keys */
    if (p->head_dim == 256) return 80;
    if (p->head_dim == 64 && block_m == 192 && fa3_knobs_get()->block_n) return fa3_knobs_get()->block_n;
    return 128;
}

/* Tiles of unequal length (a causal or right-bounded window mask): the (batch, head) pairs per section of the
 * longest-first tile order (fa3_args.section), as many as keep their K and V within about 32 MB of L2
 * (FLASHATTN_FA3_SECTION_MB). Equal tiles, or FLASHATTN_FA3_ORDER = head: 0, head-major; also up to 1k queries,
 * where a head has few tiles and head-major, whose tiles of one head run side by side and share its K and V in
 * L2 at once, is as fast or faster; from 2k on longest first is. FLASHATTN_FA3_ORDER = longest: longest first
 * there too. */
static int longest_first_section(const fa_params *p, int right_bounded) {
    const int order = fa3_knobs_get()->order;
    if (!right_bounded || order == 1) return 0;
    if (p->seqlen_q <= 1024 && order != 2) return 0;
    const int64_t pairs = (int64_t)p->heads_q * p->batch;
    const int64_t kv_bytes = (int64_t)p->seqlen_k * p->head_dim * 4 / (p->heads_q / p->heads_kv); /* per query head */
    const int budget_mb = fa3_knobs_get()->section_mb;
    int64_t n = ((int64_t)(budget_mb > 0 ? budget_mb : 32) << 20) / (kv_bytes > 0 ? kv_bytes : 1);
    if (n < 1) n = 1;
    if (n > pairs) n = pairs;
    return (int)n;
}

/* Tensor map of q, k, v or o. */
static fa_status make_map(CUtensorMap *map, const fa_params *p, const fa_tensor *t, int heads, int box_rows) {
    const int dense = !fa_is_varlen(p);
    const int64_t rows =
        t == &p->q || t == &p->o ? (dense ? p->seqlen_q : p->total_q) : (dense ? p->seqlen_k : p->total_k);
    return fa3_tensor_map_rows(map, p, t, rows, heads, box_rows);
}

/* The FA3 forward's choices for one problem, made in one place: fa3_fwd_run launches what the plan says and
 * fa3_fwd_describe puts it in words (flashattn info --plan). */
struct fa3_plan {
    int block_m, block_n; /* query rows per tile (64 per consumer warpgroup), keys per block */
    int window_right;     /* resolved: 0 under a causal mask */
    int num_m_blocks;
    int reverse_m;  /* a head's tiles from its last query block down (a right-bounded mask: the longest first) */
    int align_end;  /* 192-row tiles end at the last query, so that a partial tile is the first, shortest one */
    int section;    /* longest-first sections of this many (batch, head) pairs; 0: head-major */
    int first_last; /* every head's first tile (one warpgroup's rows, one key block) is claimed last */
    int general;    /* softcap, ALiBi, a left window edge or a varlen batch: the kernel that has them */
    int num_tiles, grid;
    int scheduler; /* 0: persistent, tiles from the atomic counter; 1: persistent, round robin; 2: a CTA per tile */
};

static fa3_plan fa3_plan_make(const fa_params *p, const fa_cuda_device *dev) {
    fa3_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.block_m = fa3_block_m(p);
    pl.block_n = choose_block_n(p, pl.block_m);
    pl.window_right = p->causal ? 0 : p->window_right;
    pl.num_m_blocks = (p->seqlen_q + pl.block_m - 1) / pl.block_m;
    pl.reverse_m = pl.window_right >= 0;
    /* FLASHATTN_FA3_ALIGN = start: the partial tile last, as without a mask */
    pl.align_end = pl.block_m == 192 && pl.reverse_m && !fa3_knobs_get()->align_start;
    pl.section = longest_first_section(p, pl.reverse_m);
    pl.general = p->softcap > 0.0f || p->alibi_slopes != NULL || p->window_left >= 0 || fa_is_varlen(p);
    /* Head-major tiles that end at the last query (192-row tiles under a causal mask, up to 1k queries) and
     * whose first tile holds one warpgroup's rows (3k + 1 groups of 64): those first tiles, a single key block
     * under a causal mask, are claimed after all the others (fa3_sched::claim_order), so that they fill the end
     * of the grid: its last wave no longer waits on the last heads' long tiles. */
    const int idle_first = (pl.num_m_blocks * pl.block_m - p->seqlen_q) / 64; /* warpgroups, as tile_get's shift */
    pl.first_last =
        pl.align_end && pl.section == 0 && !fa_is_varlen(p) && pl.num_m_blocks > 1 && idle_first == pl.block_m / 64 - 1;
    pl.num_tiles = pl.num_m_blocks * p->heads_q * p->batch;
    /* The persistent grid everywhere, also for head dim 256 under a causal mask, where O is staged in the Q
     * tiles (a persistent CTA's next Q cannot land before its epilogue is done): it is faster there too. */
    pl.scheduler = fa3_knobs_get()->scheduler;
    pl.grid = pl.scheduler == 2 || pl.num_tiles < dev->sm_count ? pl.num_tiles : dev->sm_count;
    return pl;
}

/* The consumer schedule each head dim's launcher (fa3_fwd_hdim*.cu) runs in the default build. */
static const char *schedule_words(const fa_params *p, const fa3_plan *pl) {
    if (p->dtype == FA_E4M3)
        return p->head_dim == 128 ? "e4m3: intra-warpgroup overlap and ping-pong, Q K^T with Q from registers, V^T by "
                                    "the producer's warps 1-3, O from registers"
                                  : "e4m3: intra-warpgroup overlap, V^T by the producer's warps 1-3, O from registers";
    if (p->head_dim == 64 && pl->block_m == 128) return "intra-warpgroup overlap, Q K^T with Q from registers";
    if (p->head_dim == 128) return "intra-warpgroup overlap and ping-pong, Q K^T with Q from registers";
    return "intra-warpgroup overlap and ping-pong";
}

extern "C" void fa3_fwd_describe(const fa_params *p, const fa_cuda_device *dev, char *buf, size_t size) {
    const fa3_plan pl = fa3_plan_make(p, dev);
    const int has_lean = (p->head_dim == 64 && pl.block_m == 192) || p->head_dim == 256 || p->dtype == FA_E4M3;
    static const char *const schedulers[3] = { "persistent, tiles from an atomic counter", "persistent, round robin",
                                               "one CTA per tile" };
    char order[160];
    if (pl.section > 0)
        snprintf(order, sizeof order, "longest first in sections of %d (batch, head) pairs", pl.section);
    else
        snprintf(order, sizeof order, "head-major");
    snprintf(buf, size, "%d x %d tiles, %d consumer warpgroups (%s)%s; tiles %s%s%s%s; %d CTAs over %d tiles (%s)",
             pl.block_m, pl.block_n, pl.block_m / 64, schedule_words(p, &pl),
             !has_lean    ? ""
             : pl.general ? ", the kernel with softcap, ALiBi, left window edges and varlen"
                          : ", the kernel without softcap, ALiBi, left window edges or varlen",
             order, pl.reverse_m ? ", each head from its last query block" : "",
             pl.align_end ? ", 192-row tiles ending at the last query" : "",
             pl.first_last ? ", every head's first tile claimed last" : "", pl.grid, pl.num_tiles,
             schedulers[pl.scheduler >= 0 && pl.scheduler < 3 ? pl.scheduler : 0]);
#ifdef FA_TUNING
    const size_t n = strlen(buf);
    if (n < size) snprintf(buf + n, size - n, " [tuning build: the FLASHATTN_FA3_* variables may change this]");
#endif
}

extern "C" fa_status fa3_fwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream) {
    fa_status st = fa3_fwd_supported(p, dev);
    if (st != FA_OK) return st;

    const fa3_plan pl = fa3_plan_make(p, dev);
    const int schedule = fa3_knobs_get()->schedule;
    const int block_m = pl.block_m, block_n = pl.block_n;

    fa3_problem pr;
    memset(&pr, 0, sizeof pr);
    fa3_args *a = &pr.args;
    a->seqlen_q = p->seqlen_q;
    a->seqlen_k = p->seqlen_k;
    a->heads_q = p->heads_q;
    a->group = p->heads_q / p->heads_kv;
    a->num_m_blocks = pl.num_m_blocks;
    a->reverse_m = pl.reverse_m;
    a->align_end = pl.align_end;
    a->section = pl.section;
    a->cu_q = p->cu_seqlens_q;
    a->cu_k = p->cu_seqlens_k;
    const float log2e = 1.4426950408889634f;
    if (p->softcap > 0.0f) {
        a->softcap_pre = p->softmax_scale / p->softcap;
        a->scale_log2 = p->softcap * log2e;
    } else {
        a->softcap_pre = 0.0f;
        a->scale_log2 = p->softmax_scale * log2e;
    }
    /* P may reach 2^8 before the max is moved (see fa3_softmax); FLASHATTN_FA3_LAZY = 0 moves it on any growth
     * (where the full softmax runs: the three-warpgroup kernels take most blocks against the stale max). */
    a->max_slack = fa3_knobs_get()->eager_max ? 0.0f : 8.0f / a->scale_log2;
    a->window_left = p->window_left;
    a->window_right = pl.window_right;
    a->alibi = p->alibi_slopes;
    a->alibi_batch_stride = p->alibi_batch_stride;
    a->alibi_scale = log2e / a->scale_log2;
    a->lse = p->lse;
    a->total_q = p->total_q;
    a->o = p->o.data;
    a->o_stride_batch = p->o.stride_batch;
    a->o_stride_seq = p->o.stride_seq;
    a->o_stride_head = p->o.stride_head;
    a->k = p->k.data;
    a->k_stride_batch = p->k.stride_batch;
    a->k_stride_seq = p->k.stride_seq;
    a->k_stride_head = p->k.stride_head;
    a->num_tiles = pl.num_tiles;
    a->num_bh = p->heads_q * p->batch;
    a->first_blocks_claim = pl.first_last ? a->num_bh * (a->num_m_blocks - 1) : a->num_tiles;
    a->div_head_tiles = fa3_divisor_make(pl.first_last ? a->num_m_blocks - 1 : 1 << 30);
    a->div_m_blocks = fa3_divisor_make(a->num_m_blocks);
    a->div_heads = fa3_divisor_make(p->heads_q);
    a->div_group = fa3_divisor_make(a->group);
    a->div_section = fa3_divisor_make(a->section > 0 ? a->section : 1);
    a->div_section_tiles = fa3_divisor_make(a->section > 0 ? a->section * a->num_m_blocks : 1);
    a->q_descale = p->q_descale;
    a->k_descale = p->k_descale;
    a->v_descale = p->v_descale;
    if (p->dtype == FA_E4M3) { /* the 16-bit kernels never read descales (their blocks would pick GENERAL) */
        a->descale_block_q = p->descale_block_q;
        a->descale_block_k = p->descale_block_k;
    }
    a->descale_blocks_q = (int)fa_descale_blocks(p, 'q');
    a->descale_blocks_k = (int)fa_descale_blocks(p, 'k');
    a->descale_kblocks = p->descale_block_k > 0 ? p->descale_block_k / 128 : 1;
    if (a->num_tiles == 0) return FA_OK;
    pr.grid = pl.grid;
    if (pl.scheduler != 2 && workspace != NULL && pl.scheduler != 1) {
        a->counter_tag = (unsigned long long *)workspace;
        a->tile_counter = (int *)((char *)workspace + sizeof(unsigned long long));
        a->launch_tag = next_launch_tag();
    }

    if ((st = make_map(&pr.tm_q, p, &p->q, p->heads_q, 64)) != FA_OK) return st;
    if ((st = make_map(&pr.tm_k, p, &p->k, p->heads_kv, block_n)) != FA_OK) return st;
    if ((st = make_map(&pr.tm_v, p, &p->v, p->heads_kv, block_n)) != FA_OK) return st;
    if (p->dtype == FA_E4M3) { /* O (out_dtype) is written from registers: no map */
        const int out_bf16 = p->out_dtype == FA_BF16;
        switch (p->head_dim) {
#if FA_HAS_HDIM_64
        case 64: return fa3_fp8_run_hdim64(&pr, out_bf16, stream);
#endif
#if FA_HAS_HDIM_128
        case 128: return fa3_fp8_run_hdim128(&pr, out_bf16, stream);
#endif
#if FA_HAS_HDIM_256
        case 256: return fa3_fp8_run_hdim256(&pr, out_bf16, stream);
#endif
        default: return fa_fail(FA_ERR_INTERNAL, "fa3 e4m3 forward: no launcher for head_dim %d", p->head_dim);
        }
    }
    if ((st = make_map(&pr.tm_o, p, &p->o, p->heads_q, 64)) != FA_OK) return st;

    const int bf16 = p->dtype == FA_BF16;
    /* The launchers' signatures differ (head dim 64 also picks its tile height), so each compiled one is named. */
    switch (p->head_dim) {
#if FA_HAS_HDIM_64
    case 64: return fa3_run_hdim64(&pr, bf16, block_m, block_n, schedule, stream);
#endif
#if FA_HAS_HDIM_128
    case 128: return fa3_run_hdim128(&pr, bf16, block_n, schedule, stream);
#endif
#if FA_HAS_HDIM_256
    case 256: return fa3_run_hdim256(&pr, bf16, block_n, schedule, stream);
#endif
    default: return fa_fail(FA_ERR_INTERNAL, "fa3 forward: no launcher for head_dim %d", p->head_dim);
    }
}

const fa_kernel_family fa3_fwd_family = { "fa3 forward", fa3_fwd_supported, fa3_fwd_workspace_size, fa3_fwd_run,
                                          fa3_fwd_describe };
