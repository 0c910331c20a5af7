# SPDX-License-Identifier: Apache-2.0
"""One training step of a small causal self-attention layer whose attention is flashattn.flash_attn_func
(flash-attn 2.x's signature), on the GPU when PyTorch sees one and on the CPU otherwise; the gradients are
checked against the same layer with PyTorch's scaled_dot_product_attention. Exits 0 with a message when
PyTorch is not installed.

    make && PYTHONPATH=python python3 examples/train_step_torch.py     # from the repository root
"""

import sys

try:
    import torch
except ModuleNotFoundError:
    print("train_step_torch.py: skipped (PyTorch is not installed; examples/attention_numpy.py needs only numpy)")
    sys.exit(0)

import torch.nn.functional as F

from flashattn import flash_attn_func


class SelfAttention(torch.nn.Module):
    def __init__(self, dim, heads, use_flashattn=True):
        super().__init__()
        self.heads, self.use_flashattn = heads, use_flashattn
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        batch, seqlen, dim = x.shape
        # (batch, seqlen, heads, head_dim): flash-attn's layout, no transpose needed
        q, k, v = self.qkv(x).view(batch, seqlen, 3, self.heads, dim // self.heads).unbind(dim=2)
        if self.use_flashattn:
            y = flash_attn_func(q, k, v, causal=True)
        else:  # PyTorch's attention wants (batch, heads, seqlen, head_dim)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True).transpose(1, 2)
        return self.proj(y.reshape(batch, seqlen, dim))


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the CUDA kernels take f16/bf16
    torch.manual_seed(0)
    model = SelfAttention(dim=256, heads=4).to(device, dtype)
    reference = SelfAttention(dim=256, heads=4, use_flashattn=False).to(device, dtype)
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    x = torch.randn(2, 256, 256, device=device, dtype=dtype)
    target = torch.randn_like(x)
    loss = F.mse_loss(model(x), target)
    optimizer.zero_grad()
    loss.backward()
    F.mse_loss(reference(x), target).backward()

    # the gradient of the qkv projection went through the attention backward
    g, g_ref = model.qkv.weight.grad.float(), reference.qkv.weight.grad.float()
    rel = ((g - g_ref).norm() / g_ref.norm()).item()
    optimizer.step()
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    ok = rel < tolerance and torch.isfinite(loss).item()
    print(f"train step on {device} ({dtype}): loss {loss.item():.4f}, qkv weight gradient vs PyTorch attention: "
          f"relative error {rel:.1e}: {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
