/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tensor_map.cu - host side of TMA: cuTensorMapEncodeTiled reached through the runtime's driver entry point
 * (the library does not link libcuda), and a small cache of encoded maps keyed by everything the encoder reads,
 * so that repeated calls on the same buffers skip the driver.
 */
#include <cudaTypedefs.h>
#include <pthread.h>
#include <string.h>

#include "cuda/fa3_fwd.cuh"

static PFN_cuTensorMapEncodeTiled_v12000 encode_tiled;
static cudaError_t encode_lookup_error = cudaSuccess;
static pthread_once_t encode_once = PTHREAD_ONCE_INIT;

static void encode_lookup(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    /* The versioned lookup is new in CUDA 12.5 (13.x deprecates the unversioned one); 12.4's lookup gives the
     * newest version of the symbol, which for cuTensorMapEncodeTiled is still the 12.0 one. */
#if CUDART_VERSION >= 12050
    encode_lookup_error =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
#else
    encode_lookup_error = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (encode_lookup_error == cudaSuccess && found == cudaDriverEntryPointSuccess)
        encode_tiled = (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

typedef struct map_key {
    uint64_t base;
    uint64_t dims[5];
    uint64_t strides[4];
    uint32_t box[5];
    uint32_t dtype;
} map_key;

enum { MAP_CACHE_SIZE = 32 };

static struct {
    pthread_mutex_t lock;
    int used, next;
    map_key keys[MAP_CACHE_SIZE];
    CUtensorMap maps[MAP_CACHE_SIZE];
} map_cache = { PTHREAD_MUTEX_INITIALIZER, 0, 0, {}, {} };

fa_status fa3_tensor_map(CUtensorMap *map, fa_dtype dtype, const void *base, const uint64_t dims[5],
                         const uint64_t strides_bytes[4], const uint32_t box[5]) {
    map_key key;
    memset(&key, 0, sizeof key);
    key.base = (uint64_t)(uintptr_t)base;
    memcpy(key.dims, dims, sizeof key.dims);
    memcpy(key.strides, strides_bytes, sizeof key.strides);
    memcpy(key.box, box, sizeof key.box);
    key.dtype = (uint32_t)dtype;

    pthread_mutex_lock(&map_cache.lock);
    for (int i = 0; i < map_cache.used; ++i)
        if (memcmp(&map_cache.keys[i], &key, sizeof key) == 0) {
            *map = map_cache.maps[i];
            pthread_mutex_unlock(&map_cache.lock);
            return FA_OK;
        }
    pthread_mutex_unlock(&map_cache.lock);

    pthread_once(&encode_once, encode_lookup);
    /* The encoder needs a current context, which a thread that has made no runtime call yet (PyTorch's
     * autograd worker, say) lacks: setting the current device makes its primary context current. */
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaSetDevice(device) != cudaSuccess)
        return fa_fail(FA_ERR_DEVICE, "TMA: no current device (%s)", cudaGetErrorString(cudaGetLastError()));
    if (encode_tiled == NULL)
        return fa_fail(FA_ERR_DEVICE, "TMA: cuTensorMapEncodeTiled is not available from the driver (%s)",
                       cudaGetErrorString(encode_lookup_error));
    const cuuint32_t element_strides[5] = { 1, 1, 1, 1, 1 };
    CUresult res =
        encode_tiled(map,
                     dtype == FA_BF16   ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                     : dtype == FA_E4M3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                     5, (void *)base, (const cuuint64_t *)dims, (const cuuint64_t *)strides_bytes,
                     (const cuuint32_t *)box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (res != CUDA_SUCCESS)
        return fa_fail(FA_ERR_DEVICE,
                       "TMA: cuTensorMapEncodeTiled failed (error %d) for dims {%llu, %llu, %llu, %llu, %llu}, "
                       "strides {%llu, %llu, %llu, %llu} bytes, box {%u, %u, %u, %u, %u}",
                       (int)res, (unsigned long long)dims[0], (unsigned long long)dims[1], (unsigned long long)dims[2],
                       (unsigned long long)dims[3], (unsigned long long)dims[4], (unsigned long long)strides_bytes[0],
                       (unsigned long long)strides_bytes[1], (unsigned long long)strides_bytes[2],
                       (unsigned long long)strides_bytes[3], box[0], box[1], box[2], box[3], box[4]);

    pthread_mutex_lock(&map_cache.lock);
    const int slot = map_cache.used < MAP_CACHE_SIZE ? map_cache.used++ : map_cache.next;
    map_cache.next = (slot + 1) % MAP_CACHE_SIZE;
    map_cache.keys[slot] = key;
    map_cache.maps[slot] = *map;
    pthread_mutex_unlock(&map_cache.lock);
    return FA_OK;
}

fa_status fa3_tensor_map_rows(CUtensorMap *map, const fa_params *p, const fa_tensor *t, int64_t rows, int heads,
                              int box_rows) {
    const int batch = fa_is_varlen(p) ? 1 : p->batch;
    /* a slab is 128 bytes of a row: 64 16-bit elements, or 128 e4m3 ones (t is q, k or v: o is never e4m3). An
     * e4m3 row of head dim 64 is half a slab: the box stays a slab wide, and TMA fills the 64 bytes past the row
     * with zeros (fa3_fp8_tile_d). */
    const int eb = p->dtype == FA_E4M3 ? 1 : 2, slab = 128 / eb;
    const int inner = p->head_dim < slab ? p->head_dim : slab, slabs = (p->head_dim + slab - 1) / slab;
    const uint64_t dims[5] = { (uint64_t)inner, (uint64_t)rows, (uint64_t)slabs, (uint64_t)heads, (uint64_t)batch };
    /* A dimension of extent 1 is never stepped; give it a stride TMA accepts whatever the caller passed. */
    const uint64_t strides[4] = { (uint64_t)t->stride_seq * eb, 128, heads > 1 ? (uint64_t)t->stride_head * eb : 16,
                                  batch > 1 ? (uint64_t)t->stride_batch * eb : 16 };
    const uint32_t box[5] = { (uint32_t)slab, (uint32_t)box_rows, (uint32_t)slabs, 1, 1 };
    return fa3_tensor_map(map, p->dtype, t->data, dims, strides, box);
}
