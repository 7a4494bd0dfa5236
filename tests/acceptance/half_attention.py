"""Self-attention written the way Hugging Face and fairseq models write their eager path, run
"in half precision to save memory" the way a serving patch does it: q, k and v cast to float16
for the core (``q @ k^T``, the softmax, the weighted sum), the result cast back to the model's
float32 before ``o_proj``.

The layer has outlier features (q_proj and k_proj weights scaled, as large activations in some
heads of real models): its scores reach a few times 1e5 before the 1/sqrt(d) scaling, which
float32 holds and float16 (largest finite 65504) does not: the product overflows to Inf, the
softmax turns it into NaN, and NaN reaches o_proj.
"""

from __future__ import annotations

import torch
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, core_dtype: torch.dtype) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(hidden, hidden)
        self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden)
        self.o_proj = nn.Linear(hidden, hidden)
        self.core_dtype = core_dtype

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch, length, _ = hidden_states.shape
        shape = (batch, length, self.heads, self.head_dim)
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2).to(self.core_dtype)
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2).to(self.core_dtype)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2).to(self.core_dtype)
        attn_weights = torch.matmul(query, key.transpose(2, 3)) * self.scaling
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        attn_weights = attn_weights.masked_fill(~causal, torch.finfo(attn_weights.dtype).min)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_output = torch.matmul(attn_weights, value).to(hidden_states.dtype)
        attn_output = attn_output.transpose(1, 2).reshape(batch, length, -1)
        out: torch.Tensor = self.o_proj(attn_output)
        return out


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, core_dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, heads, core_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.attn(self.norm(x))
        return out


def half_attention(core_dtype: str = "float32", outlier_scale: float = 160.0, seed: int = 0) -> nn.Module:
    """Factory of :class:`Block` (hidden 32, 2 heads of 16; a module diff target over ``x``
    [1, L, 32]); q_proj's and k_proj's weights scaled by ``outlier_scale`` on both sides."""
    torch.manual_seed(seed)
    block = Block(32, 2, getattr(torch, core_dtype))
    with torch.no_grad():
        for proj in (block.attn.q_proj, block.attn.k_proj):
            proj.weight.mul_(outlier_scale)
            proj.bias.mul_(outlier_scale)
    return block.eval()


__all__ = ["half_attention"]
