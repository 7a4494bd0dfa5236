"""Scans and chunked products on torch's own operators (``torch.cumsum``, ``torch.matmul``,
``F.linear``) as diff targets: the way a user's change computes the same thing in another order
or in another dtype.

- :func:`cp_scan`: ``proj`` -> a prefix sum along the sequence (``torch.cumsum``, in the
  model's own forward) -> ``out``. ``layout="whole"`` is one device; ``"contiguous"`` splits the
  sequence into contiguous blocks as context parallelism on ``ranks`` ranks does (each block's
  own cumsum, then the totals of the blocks before it added: the same sum in another order, a
  correct scan); ``"off-by-one"`` is that with the carry built from each block's total less its
  last element (a boundary bug).
- :func:`chunked_attention`: causal linear attention in chunks (``attn``), the intra-chunk
  scores ``q k^T`` (``attn.scores``) in float32 or with float16 operands (a mixed-precision
  patch: ``.to(torch.float16)`` inside the module, whose parameters, inputs and outputs stay
  float32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CPScan(nn.Module):
    def __init__(self, dim: int = 16, layout: str = "whole", ranks: int = 4, seed: int = 0) -> None:
        super().__init__()
        if layout not in ("whole", "contiguous", "off-by-one"):
            raise ValueError(f"layout {layout!r}: use whole, contiguous or off-by-one")
        torch.manual_seed(seed)
        self.proj = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        with torch.no_grad():  # summands of a few units: prefix sums of a few hundred over 1024 tokens
            self.proj.weight.mul_(16.0)
        self.layout, self.ranks = layout, ranks

    def scan(self, h: torch.Tensor) -> torch.Tensor:
        if self.layout == "whole":
            return torch.cumsum(h, dim=1)
        blocks = list(h.chunk(self.ranks, dim=1))  # rank r holds block r
        local = [torch.cumsum(b, dim=1) for b in blocks]
        carry = torch.zeros_like(h[:, :1])
        merged = []
        for block, scanned in zip(blocks, local, strict=True):
            merged.append(scanned + carry)
            total = scanned[:, -1:] if self.layout == "contiguous" else scanned[:, -1:] - block[:, -1:]
            carry = carry + total
        return torch.cat(merged, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(self.scan(self.proj(x)))
        return out


def cp_scan(layout: str = "whole", ranks: int = 4, seed: int = 0) -> nn.Module:
    """Factory of :class:`CPScan` (a module diff target over a request tensor ``x`` [1, L, 16])."""
    return CPScan(16, layout, ranks, seed).eval()


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32's 10-bit mantissa (nearest even), kept in float32: what a
    TF32 tensor core (or Triton's ``tl.dot`` on float32 inputs) does to a product's operands."""
    bits = x.contiguous().view(torch.int32)
    rounded = (bits + 0x0FFF + ((bits >> 13) & 1)) & ~0x1FFF
    return rounded.view(torch.float32)


class IntraChunkScores(nn.Module):
    """The causal scores of one chunk, ``tril(q_c k_c^T)``, with the product's operands in
    ``dtype``: ``"float16"`` casts them (``.to(torch.float16)``: a mixed-precision patch),
    ``"tf32"`` rounds them to TF32 in float32 (emulated tensor cores); the result in float32."""

    def __init__(self, dtype: str = "float32") -> None:
        super().__init__()
        if dtype not in ("float32", "float16", "tf32"):
            raise ValueError(f"dtype {dtype!r}: use float32, float16 or tf32")
        self.dtype = dtype

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        if self.dtype == "tf32":
            q, k = round_tf32(q), round_tf32(k)
        elif self.dtype == "float16":
            q, k = q.to(torch.float16), k.to(torch.float16)
        scores = torch.matmul(q, k.transpose(-1, -2)).float()
        return scores.tril()


class ChunkedAttention(nn.Module):
    """Causal linear attention ``o_t = sum_{s <= t} (q_t . k_s) v_s`` in chunks of ``chunk``:
    the intra-chunk part ``scores(q_c, k_c) v_c`` and the inter-chunk part ``q_c S``."""

    def __init__(self, chunk: int = 16, intra: str = "float32") -> None:
        super().__init__()
        self.chunk = chunk
        self.scores = IntraChunkScores(intra)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch, _, dim = q.shape
        state = q.new_zeros(batch, dim, v.shape[-1])
        outputs = []
        for start in range(0, q.shape[1], self.chunk):
            qc, kc, vc = (t[:, start:start + self.chunk] for t in (q, k, v))
            outputs.append(torch.matmul(self.scores(qc, kc), vc) + torch.matmul(qc, state))
            state = state + torch.matmul(kc.transpose(-1, -2), vc)
        return torch.cat(outputs, dim=1)


class AttentionBlock(nn.Module):
    def __init__(self, dim: int = 32, intra: str = "float32", seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn = ChunkedAttention(16, intra)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        out: torch.Tensor = self.out(self.attn(q, F.normalize(k, dim=-1), v))
        return out


def chunked_attention(intra: str = "float32", seed: int = 0) -> nn.Module:
    """Factory of :class:`AttentionBlock` (a module diff target over ``x`` [1, L, 32])."""
    return AttentionBlock(32, intra, seed).eval()


__all__ = ["chunked_attention", "cp_scan"]
