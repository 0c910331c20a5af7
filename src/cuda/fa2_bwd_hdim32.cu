/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa2_bwd_hdim32.cu - the FA2 backward kernels for head dim 32 (f16 and bf16).
 */
#include "fa2_bwd.cuh"

FA2_BWD_DECLARE_LAUNCH(32) {
    return dtype == FA_BF16 ? fa2_bwd_launch<__nv_bfloat16, 32>(a, tile, key_blocks, st)
                            : fa2_bwd_launch<__half, 32>(a, tile, key_blocks, st);
}
