"""A synthetic recurrent scan (gated linear attention, one state per layer) whose state update
runs in emulated TF32 in the candidate: bug 1 of docs/background.md in miniature.

The state update is ``S_t = g_t * S_{t-1} + k_t^T v_t`` and the readout ``o_t = q_t S_t``.
With ``tf32=True`` every float32 operand of those products is rounded to a 10-bit mantissa
(TF32, round to nearest even) first, as a Triton ``tl.dot`` on float32 inputs does by default.
The rounding error is carried by the state from step to step, so the error is small on short
inputs and grows with context length. ``tf32=False`` is the fix (full float32).

    baseline:  scenarios/numerics/scan.py:fp32
    candidate: scenarios/numerics/scan.py:tf32
"""

from __future__ import annotations

import torch
from torch import nn

TF32_DROPPED_BITS = 13  # float32 has 23 explicit mantissa bits, TF32 keeps 10


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to TF32 precision (10-bit mantissa), round to nearest even."""
    bits = x.contiguous().view(torch.int32)
    lsb = (bits >> TF32_DROPPED_BITS) & 1
    rounded = (bits + lsb + ((1 << (TF32_DROPPED_BITS - 1)) - 1)) & ~((1 << TF32_DROPPED_BITS) - 1)
    return rounded.view(torch.float32)


class StateScan(nn.Module):
    """The recurrence over time, one token at a time."""

    def __init__(self, tf32: bool) -> None:
        super().__init__()
        self.tf32 = tf32

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        rnd = round_tf32 if self.tf32 else (lambda t: t)
        batch, length, dk = k.shape
        state = torch.zeros(batch, dk, v.shape[-1], dtype=torch.float32)
        outputs = []
        for t in range(length):
            update = rnd(k[:, t, :, None]) * rnd(v[:, t, None, :])
            state = rnd(g[:, t, :, None]) * rnd(state) + update
            outputs.append(torch.einsum("bk,bkv->bv", rnd(q[:, t]), rnd(state)))
        return torch.stack(outputs, dim=1)


class ScanBlock(nn.Module):
    def __init__(self, dim: int, key_dim: int, tf32: bool) -> None:
        super().__init__()
        self.key_dim = key_dim
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, 3 * key_dim + key_dim)
        self.scan = StateScan(tf32)
        self.out = nn.Linear(key_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v, gate = self.proj(self.norm(x)).split(self.key_dim, dim=-1)
        k = torch.nn.functional.normalize(k, dim=-1)
        g = 1.0 - 0.0005 * torch.sigmoid(gate)  # slow decay: a long memory
        return x + self.out(self.scan(q, k, v, g))


class ScanModel(nn.Module):
    def __init__(self, vocab: int, dim: int, key_dim: int, layers: int, tf32: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(ScanBlock(dim, key_dim, tf32) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build(tf32: bool = False, seed: int = 0, vocab: int = 256, dim: int = 32, key_dim: int = 16,
          layers: int = 2) -> nn.Module:
    torch.manual_seed(seed)
    return ScanModel(vocab, dim, key_dim, layers, tf32).eval()


def fp32(seed: int = 0, layers: int = 2) -> nn.Module:
    """The fixed scan: the state update in full float32."""
    return build(tf32=False, seed=seed, layers=layers)


def tf32(seed: int = 0, layers: int = 2) -> nn.Module:
    """The planted bug: the state update's products on TF32-rounded operands."""
    return build(tf32=True, seed=seed, layers=layers)
