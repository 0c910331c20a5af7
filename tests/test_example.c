/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_example.c - the C API example of the README, compiled and run as a test: causal attention forward
 * and backward on the CPU for one (batch, seqlen, heads, head_dim) problem in fp32.
 * Needs only flashattn.h:  cc example.c $(pkg-config --cflags --libs flashattn)
 */
#include <flashattn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    enum { B = 2, S = 128, H = 4, D = 64 };
    const size_t n = (size_t)B * S * H * D; /* (batch, seqlen, heads, head_dim), contiguous */
    float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    float *o = malloc(n * sizeof(float)), *lse = malloc((size_t)B * H * S * sizeof(float));
    float *dout = malloc(n * sizeof(float)), *dq = malloc(n * sizeof(float));
    float *dk = malloc(n * sizeof(float)), *dv = malloc(n * sizeof(float));
    if (!q || !k || !v || !o || !lse || !dout || !dq || !dk || !dv) return 1;
    for (size_t i = 0; i < n; i++) {
        q[i] = sinf(0.001f * (float)i);
        k[i] = cosf(0.002f * (float)i);
        v[i] = sinf(0.003f * (float)i + 1.0f);
        dout[i] = 1.0f;
    }

    fa_params p;
    fa_params_init(&p, FA_F32, B, S, S, H, H, D); /* softmax_scale 0 = 1/sqrt(D) */
    p.causal = 1;
    p.q = fa_tensor_contiguous(q, S, H, D);
    p.k = fa_tensor_contiguous(k, S, H, D);
    p.v = fa_tensor_contiguous(v, S, H, D);
    p.o = fa_tensor_contiguous(o, S, H, D);
    p.lse = lse;

    fa_exec exec = { 0 };
    exec.backend = FA_BACKEND_CPU;
    fa_status st = fa_fwd(&p, &exec);
    if (st != FA_OK) {
        fprintf(stderr, "fa_fwd: %s: %s\n", fa_strerror(st), fa_last_error());
        return 1;
    }

    p.dout = fa_tensor_contiguous(dout, S, H, D);
    p.dq = fa_tensor_contiguous(dq, S, H, D);
    p.dk = fa_tensor_contiguous(dk, S, H, D);
    p.dv = fa_tensor_contiguous(dv, S, H, D);
    st = fa_bwd(&p, &exec);
    if (st != FA_OK) {
        fprintf(stderr, "fa_bwd: %s: %s\n", fa_strerror(st), fa_last_error());
        return 1;
    }

    /* With a causal mask the first query sees only the first key: O[b, 0, h] = V[b, 0, h], and LSE = its score. */
    double err = 0.0;
    for (int h = 0; h < H; h++)
        for (int d = 0; d < D; d++) err = fmax(err, fabs(o[h * D + d] - v[h * D + d]));
    printf("O[0,1,0,0:4] = %.5f %.5f %.5f %.5f, LSE[0,0,1] = %.5f, dV[0,0,0,0] = %.5f\n", o[H * D], o[H * D + 1],
           o[H * D + 2], o[H * D + 3], lse[1], dv[0]);
    printf("first row equals V: max error %.2e\n", err);
    printf("%d passed, %d failed\n", err < 1e-6, !(err < 1e-6));

    free(q), free(k), free(v), free(o), free(lse), free(dout), free(dq), free(dk), free(dv);
    return err < 1e-6 ? 0 : 1;
}
