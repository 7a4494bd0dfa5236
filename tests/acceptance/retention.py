"""Multi-scale retention (RetNet) the way torchscale and flash-linear-attention write it: a
recurrent reference and a chunkwise form, each head with its own decay ``gamma_h = 1 - 2^(-5-h)``.

    S_t = gamma S_{t-1} + k_t^T v_t        o_t = q_t S_t

The chunkwise form (fla's ``chunk_retention`` reference, torchscale's
``chunk_recurrent_forward``) splits the sequence into chunks of 32: inside a chunk, the
decayed scores ``(q k^T * D) v``; across chunks, the state carried from the chunks before it,
read by the query at chunk position ``i`` decayed ``i + 1`` steps. The planted bug decays it
``i`` steps (``query_decay="i"``): one decay step short across every chunk boundary, so the
first chunk (no state yet) is exact and every later one is not.

The kernel is a module of its own (``layers.N.retention``), called as kernels are called:

- ``layout="bhtd"``: q, k, v and its output ``[batch, heads, tokens, head_dim]`` (fla, torchscale);
- ``layout="bthd"``: ``[batch, tokens, heads, head_dim]`` (flash-attention's layout);
- :func:`packed_retention`: sequences of different lengths packed into one ``[total_tokens,
  heads, head_dim]`` with their offsets ``cu_seqlens`` (fla's varlen mode), a callable over the
  request (``req["cu_seqlens"]``).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn


def decays(heads: int) -> torch.Tensor:
    """log gamma per head, RetNet's ``1 - 2^(-5 - h)``."""
    return torch.log(1 - 2.0 ** (-5.0 - torch.arange(heads, dtype=torch.float32)))


def recurrent_retention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The reference: one token at a time. q, k, v and the output are [B, H, T, D]."""
    batch, heads, length, dim = q.shape
    gamma = decays(heads).exp()[None, :, None, None]
    q = q * dim ** -0.5
    state = q.new_zeros(batch, heads, dim, v.shape[-1])
    o = torch.empty_like(v)
    for t in range(length):
        state = gamma * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        o[:, :, t] = (q[:, :, t, None, :] @ state).squeeze(-2)
    return o


def chunk_retention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk_size: int = 32,
                    query_decay: str = "i+1") -> torch.Tensor:
    """Chunkwise retention. q, k, v and the output are [B, H, T, D]."""
    batch, heads, length, dim = q.shape
    log_gamma = decays(heads)[None, :, None, None]
    q = q * dim ** -0.5
    state = q.new_zeros(batch, heads, dim, v.shape[-1])
    o = torch.empty_like(v)
    for start in range(0, length, chunk_size):
        end = min(start + chunk_size, length)
        size = end - start
        qc, kc, vc = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        i = torch.arange(size, dtype=torch.float32)
        causal = i[:, None] >= i[None, :]
        inner_decay = torch.where(causal, torch.exp((i[:, None] - i[None, :]) * log_gamma), 0.0)
        inner = (qc @ kc.transpose(-1, -2) * inner_decay) @ vc
        steps = i + 1 if query_decay == "i+1" else i
        cross = (qc * torch.exp(steps[:, None] * log_gamma)) @ state
        o[:, :, start:end] = inner + cross
        k_decay = torch.exp((size - 1 - i)[:, None] * log_gamma)
        state = torch.exp(size * log_gamma) * state + (kc * k_decay).transpose(-1, -2) @ vc
    return o


class Retention(nn.Module):
    """The retention kernel as a layer calls it, in ``layout``."""

    def __init__(self, impl: str, layout: str, query_decay: str) -> None:
        super().__init__()
        self.impl, self.layout, self.query_decay = impl, layout, query_decay

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.layout == "bthd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.impl == "recurrent":
            o = recurrent_retention(q, k, v)
        else:
            o = chunk_retention(q, k, v, query_decay=self.query_decay)
        return o.transpose(1, 2) if self.layout == "bthd" else o


class MultiScaleRetention(nn.Module):
    def __init__(self, hidden: int, heads: int, impl: str, layout: str, query_decay: str) -> None:
        super().__init__()
        self.heads, self.head_dim, self.layout = heads, hidden // heads, layout
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.retention = Retention(impl, layout, query_decay)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            t = t.view(batch, length, self.heads, self.head_dim)
            return t.transpose(1, 2) if self.layout == "bhtd" else t

        o = self.retention(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)))
        if self.layout == "bhtd":
            o = o.transpose(1, 2)
        out: torch.Tensor = self.o_proj(o.reshape(batch, length, -1))
        return out


class RetNetBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, impl: str, layout: str, query_decay: str) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.retention = MultiScaleRetention(hidden, heads, impl, layout, query_decay)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.retention(self.norm(x))
        return out


class RetNet(nn.Module):
    def __init__(self, hidden: int, heads: int, layers: int, impl: str, layout: str, query_decay: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(RetNetBlock(hidden, heads, impl, layout, query_decay) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def retnet(impl: str = "chunk", layout: str = "bhtd", query_decay: str = "i+1", seed: int = 0) -> nn.Module:
    """Factory of :class:`RetNet` (hidden 32, 4 heads of 8, 2 layers; a module diff target over
    ``x`` [1, L, 32]). ``impl``: ``recurrent`` or ``chunk``; ``query_decay``: ``i+1`` (right) or
    ``i`` (the state read one decay step short)."""
    if impl not in ("recurrent", "chunk") or layout not in ("bhtd", "bthd") or query_decay not in ("i+1", "i"):
        raise ValueError(f"impl={impl!r} layout={layout!r} query_decay={query_decay!r}")
    torch.manual_seed(seed)
    return RetNet(32, 4, 2, impl, layout, query_decay).eval()


def packed_retention(impl: str = "chunk", query_decay: str = "i+1") -> Any:
    """A callable over a packed request: ``q``, ``k``, ``v`` [total_tokens, 4, 8] and
    ``cu_seqlens`` (the offsets of its sequences, fla's varlen convention); each sequence runs on
    its own, and the outputs are packed back, [total_tokens, 4, 8]."""
    kernel = Retention(impl, "bhtd", query_decay)

    def run(req: dict[str, Any]) -> torch.Tensor:
        offsets = [int(o) for o in req["cu_seqlens"]]
        q, k, v = req["q"], req["k"], req["v"]
        out = torch.empty_like(v)
        for start, end in itertools.pairwise(offsets):
            part = [t[start:end].transpose(0, 1)[None] for t in (q, k, v)]  # [1, H, T, D]
            out[start:end] = kernel(*part)[0].transpose(0, 1)
        return out

    return run


__all__ = ["packed_retention", "retnet"]
