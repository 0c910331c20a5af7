# SPDX-License-Identifier: Apache-2.0
"""A decoding loop over a paged KV cache with flashattn.flash_attn_with_kvcache (flash-attn 2.x's signature).

A toy one-layer model (random weights) serves a batch of prompts of different lengths: each prompt is
prefilled on its own, then the whole batch generates one token per step, each call writing the new token's
keys and values into the cache in place and attending to everything cached so far. Pages of the cache are
handed out as the sequences grow, in no particular order. Every attention output is checked against PyTorch's
scaled_dot_product_attention over the keys and values the loop produced, and at the end the cache must hold
exactly those rows. On the GPU when PyTorch sees one, on the CPU otherwise. Exits 0 with a message when
PyTorch is not installed.

    make && PYTHONPATH=python python3 examples/decode_torch.py     # from the repository root
"""

import sys

try:
    import torch
except ModuleNotFoundError:
    print("decode_torch.py: skipped (PyTorch is not installed; flashattn.attention_with_kvcache is the numpy path)")
    sys.exit(0)

import torch.nn.functional as F

from flashattn import flash_attn_with_kvcache

PAGE_SIZE = 16  # rows of keys (and of values) per page; any size works


class PagedCache:
    """Keys and values in pages of PAGE_SIZE rows shared by all sequences: row i of sequence b lies in page
    block_table[b, i // PAGE_SIZE] at row i % PAGE_SIZE. seqlens[b] rows of sequence b are filled."""

    def __init__(self, batch, max_len, heads_kv, head_dim, device, dtype, generator):
        max_pages = -(-max_len // PAGE_SIZE)
        num_pages = batch * max_pages
        self.k = torch.zeros(num_pages, PAGE_SIZE, heads_kv, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.block_table = torch.zeros(batch, max_pages, dtype=torch.int32, device=device)
        self.seqlens = [0] * batch
        self.free_pages = torch.randperm(num_pages, generator=generator).tolist()

    def reserve(self, b, rows):
        """Gives sequence b the pages its next `rows` rows need."""
        have = -(-self.seqlens[b] // PAGE_SIZE)
        need = -(-(self.seqlens[b] + rows) // PAGE_SIZE)
        for i in range(have, need):
            self.block_table[b, i] = self.free_pages.pop()

    def rows(self, b):
        """Sequence b's keys and values, (seqlen, heads_kv, head_dim) each, gathered from its pages."""
        pages = self.block_table[b, : -(-self.seqlens[b] // PAGE_SIZE)].long()
        n = self.seqlens[b]
        return self.k[pages].flatten(0, 1)[:n], self.v[pages].flatten(0, 1)[:n]


class ToyLayer:
    """x (batch, tokens, dim) -> q, k, v in flash-attn's (batch, tokens, heads, head_dim) layout, and the
    attention output back to the next token's input."""

    def __init__(self, dim, heads_q, heads_kv, device, dtype, generator):
        self.heads_q, self.heads_kv, self.head_dim = heads_q, heads_kv, dim // heads_q

        def weight(rows):
            return (torch.randn(dim, rows, generator=generator) / dim**0.5).to(device, dtype)

        self.wq, self.wk, self.wv, self.wo = weight(dim), weight(self.heads_kv * self.head_dim), \
            weight(self.heads_kv * self.head_dim), weight(dim)

    def qkv(self, x):
        shape = x.shape[:2]
        return ((x @ self.wq).view(*shape, self.heads_q, self.head_dim),
                (x @ self.wk).view(*shape, self.heads_kv, self.head_dim),
                (x @ self.wv).view(*shape, self.heads_kv, self.head_dim))

    def next_input(self, x, attn):
        return F.layer_norm(x + attn.flatten(2) @ self.wo, x.shape[-1:])


def reference(q, k, v, causal):
    """PyTorch's attention in float32 for one sequence: q (tokens, heads_q, d), k and v (seqlen, heads_kv, d);
    with causal, the last query sees every key (flash-attn aligns the mask bottom-right)."""
    group = q.shape[1] // k.shape[1]
    q, k, v = (t.float().transpose(0, 1) for t in (q, k, v))
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    mask = None
    if causal:
        offset = k.shape[1] - q.shape[1]
        mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril(offset)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(0, 1)


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the CUDA kernels take f16/bf16
    generator = torch.Generator().manual_seed(0)
    prompt_lens, new_tokens = [5, 23, 40], 24
    batch, dim, heads_q, heads_kv = len(prompt_lens), 256, 4, 2  # grouped-query attention: 2 query heads per KV head
    model = ToyLayer(dim, heads_q, heads_kv, device, dtype, generator)
    cache = PagedCache(batch, max(prompt_lens) + new_tokens, heads_kv, model.head_dim, device, dtype, generator)
    produced = [([], []) for _ in range(batch)]  # per sequence: every key and value written, in order
    worst = 0.0

    def check(out, q, b, causal):
        nonlocal worst
        k, v = (torch.cat(rows) for rows in produced[b])
        want = reference(q, k, v, causal)
        worst = max(worst, ((out.float() - want).abs().max() / want.abs().max()).item())

    # Prefill: each prompt on its own call (its own length), causal attention over its tokens.
    x_next = []
    for b, n in enumerate(prompt_lens):
        x = torch.randn(1, n, dim, generator=generator).to(device, dtype)
        q, k, v = model.qkv(x)
        cache.reserve(b, n)
        seqlens = torch.tensor([cache.seqlens[b]], dtype=torch.int32, device=device)
        out = flash_attn_with_kvcache(q, cache.k, cache.v, k=k, v=v, cache_seqlens=seqlens,
                                      block_table=cache.block_table[b : b + 1], causal=True)
        cache.seqlens[b] += n
        produced[b][0].append(k[0])
        produced[b][1].append(v[0])
        check(out[0], q[0], b, causal=True)
        x_next.append(model.next_input(x, out)[:, -1:])

    # Decode: the whole batch, one token per sequence per step; cache_seqlens[b] is where its token goes.
    x = torch.cat(x_next)
    for _ in range(new_tokens):
        q, k, v = model.qkv(x)
        for b in range(batch):
            cache.reserve(b, 1)
        seqlens = torch.tensor(cache.seqlens, dtype=torch.int32, device=device)
        out = flash_attn_with_kvcache(q, cache.k, cache.v, k=k, v=v, cache_seqlens=seqlens,
                                      block_table=cache.block_table, causal=True)
        for b in range(batch):
            cache.seqlens[b] += 1
            produced[b][0].append(k[b])
            produced[b][1].append(v[b])
            check(out[b], q[b], b, causal=True)
        x = model.next_input(x, out)

    # The cache holds every key and value the loop produced, in order, and nothing else was needed.
    cache_ok = all(torch.equal(cache.rows(b)[0], torch.cat(produced[b][0]))
                   and torch.equal(cache.rows(b)[1], torch.cat(produced[b][1])) for b in range(batch))
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    ok = worst < tolerance and cache_ok and bool(torch.isfinite(x).all())
    print(f"decoded {new_tokens} tokens after prompts of {', '.join(map(str, prompt_lens))} on {device} ({dtype}), "
          f"{len(cache.k) - len(cache.free_pages)} pages of {PAGE_SIZE} rows in use: largest error against "
          f"PyTorch attention {worst:.1e} of the output's magnitude, cache {'as written' if cache_ok else 'WRONG'}: "
          f"{'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
