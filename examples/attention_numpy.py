# SPDX-License-Identifier: Apache-2.0
"""Exact attention on numpy arrays with flashattn (CPU backend), forward and backward, checked against the
formula softmax(Q K^T / sqrt(d)) V evaluated directly in float64. No PyTorch needed.

    make && PYTHONPATH=python python3 examples/attention_numpy.py     # from the repository root
"""

import sys

import numpy as np

import flashattn

batch, seqlen, heads, head_dim = 2, 128, 4, 64
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((batch, seqlen, heads, head_dim), dtype=np.float32) for _ in range(3))

out, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)

# The definition, in float64, for comparison: (batch, heads, seqlen_q, seqlen_k) scores with a causal mask.
s = np.einsum("bihd,bjhd->bhij", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(head_dim)
s = np.where(np.tril(np.ones((seqlen, seqlen), dtype=bool)), s, -np.inf)
p = np.exp(s - s.max(axis=-1, keepdims=True))
p /= p.sum(axis=-1, keepdims=True)
expected = np.einsum("bhij,bjhd->bihd", p, v.astype(np.float64))
err = float(np.abs(out - expected).max())

# The backward: gradients of sum(out * dout) with respect to q, k and v.
dout = rng.standard_normal(out.shape, dtype=np.float32)
dq, dk, dv = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True)
dv_expected = np.einsum("bhij,bihd->bjhd", p, dout.astype(np.float64))  # dV = P^T dO
err_dv = float(np.abs(dv - dv_expected).max())

ok = err < 1e-4 and err_dv < 1e-4  # fp32 accumulation: errors of ~1e-6 expected
print(f"flashattn {flashattn.__version__} numpy: out {out.shape} {out.dtype}, max |error| {err:.1e}; "
      f"dV max |error| {err_dv:.1e}: {'ok' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
