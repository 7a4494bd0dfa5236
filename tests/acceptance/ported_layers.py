"""Layers written the way model repositories write their plain-PyTorch reference paths, as diff
targets, each with a user's mixed-precision patch planted and its clean twin.

- :func:`linear_attention`: a linear-attention layer whose recurrence is flash-linear-attention's
  ``naive_recurrent_linear_attn`` (``fla-core``, loaded by path as ``fla_refs.py`` does): the
  output preallocated with ``torch.empty_like`` and filled by slice (``o[:, t] = ...``), the
  state ``S`` in float32. ``impl="port"`` is that loop copied into the user's code with the state
  kept in ``state`` (``"bfloat16"``: the planted bug) and the outputs written by slice or
  collected with ``torch.stack`` (``collect``).
- :func:`flash_transformer`: a pre-norm transformer whose attention is a flash-attention
  reference in PyTorch (:func:`flash_attention`: one query block at a time over the key blocks up
  to it, an online softmax with a running max and a running sum), its causal mask an additive
  bfloat16 bias as a model run in bfloat16 builds it. ``sum_like="bias"`` is the planted bug: the
  running sum is ``.type_as(bias)``, so from the second key block on it is rounded to bfloat16;
  ``bias_block="key_query"`` a logic twin with no cast: the mask's block taken as
  ``bias[ks:ke, qs:qe]``, the same on the diagonal, fully masked below it, so from the second
  query block on the earlier blocks are never attended to.
- :func:`feed_forward`: an MLP block (``up`` -> SiLU -> ``down``) whose ``up`` has outlier
  weights (outputs past 1e5, as trained layers with outlier features give);
  ``up_dtype="float16"`` runs ``up`` in half precision (its weights and input cast), where those
  values overflow float16's range (65504). ``act="exp"`` is a float32 twin that overflows
  without any float16: SiLU written as ``x * e^x / (1 + e^x)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# ---- a recurrence that fills a preallocated output by slice ---------------------------------


def port_recurrent_linear_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.dtype,
                               collect: str) -> torch.Tensor:
    """fla's ``naive_recurrent_linear_attn`` as a user copied it, the state ``S`` kept in
    ``state`` (in float32 it is fla's loop, bit for bit)."""
    dtype = q.dtype
    scale = q.shape[-1] ** -0.5
    B, T, H, K, V = *q.shape, v.shape[-1]
    q, k, v = (x.to(torch.float32) for x in (q, k, v))
    o = torch.empty_like(v)
    outputs = []
    S = torch.zeros((B, H, K, V), device=q.device, dtype=state)
    for t in range(T):
        S = S + torch.einsum('b h k, b h v -> b h k v', k[:, t], v[:, t]).to(state)
        o_t = torch.einsum('b h k v, b h k -> b h v', S.to(torch.float32), q[:, t] * scale)
        if collect == "slice":
            o[:, t] = o_t
        else:
            outputs.append(o_t)
    if collect == "stack":
        o = torch.stack(outputs, dim=1)
    return o.to(dtype)


class RecurrentScan(nn.Module):
    def __init__(self, impl: str, state: str, collect: str) -> None:
        super().__init__()
        if impl not in ("fla", "port") or collect not in ("slice", "stack"):
            raise ValueError(f"impl {impl!r} / collect {collect!r}: use fla or port / slice or stack")
        if impl == "fla" and (state != "float32" or collect != "slice"):
            raise ValueError("fla's reference keeps its state in float32 and writes by slice: use impl='port'")
        self.impl, self.state, self.collect = impl, getattr(torch, state), collect

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.impl == "fla":
            from fla_refs import reference

            o, _ = reference("linear_attn").naive_recurrent_linear_attn(q, k, v)
            out: torch.Tensor = o
            return out
        return port_recurrent_linear_attn(q, k, v, self.state, self.collect)


class LinearAttentionLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, scan: RecurrentScan) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.attn = scan
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (proj(x).view(B, T, self.heads, -1) for proj in (self.q_proj, self.k_proj, self.v_proj))
        o = self.attn(q, F.normalize(k, dim=-1), v)
        out: torch.Tensor = self.o_proj(o.reshape(B, T, -1))
        return out


def linear_attention(impl: str = "fla", state: str = "float32", collect: str = "slice", seed: int = 0) -> nn.Module:
    """Factory of :class:`LinearAttentionLayer` (hidden 32, 2 heads; a module diff target over
    ``x`` [1, L, 32])."""
    torch.manual_seed(seed)
    return LinearAttentionLayer(32, 2, RecurrentScan(impl, state, collect)).eval()


# ---- a flash-attention reference whose running sum takes the mask's dtype ---------------------


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, chunk_size: int = 64,
                    sum_like: str = "query", bias_block: str = "query_key") -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v over [B, H, T, D], one query block at a time over the key
    blocks up to it, with a running max ``m_i`` and a running sum ``l_i`` (an online softmax)."""
    T, D = q.shape[-2:]
    scale = D ** -0.5
    out = torch.empty_like(q)
    like = bias if sum_like == "bias" else q
    for qs in range(0, T, chunk_size):
        qe = min(qs + chunk_size, T)
        q_blk = q[:, :, qs:qe] * scale
        m_i = l_i = acc = None
        for ks in range(0, qe, chunk_size):
            ke = min(ks + chunk_size, T)
            mask = bias[qs:qe, ks:ke] if bias_block == "query_key" else bias[ks:ke, qs:qe]
            s = q_blk @ k[:, :, ks:ke].transpose(-1, -2) + mask
            if m_i is None or l_i is None or acc is None:
                m_i = s.amax(-1)
                p = torch.exp(s - m_i[..., None])
                l_i = p.sum(-1)
                acc = p @ v[:, :, ks:ke]
                continue
            m_new = torch.maximum(m_i, s.amax(-1))
            alpha = torch.exp(m_i - m_new)
            p = torch.exp(s - m_new[..., None])
            l_i = (l_i * alpha + p.sum(-1)).type_as(like)
            acc = acc * alpha[..., None] + p @ v[:, :, ks:ke]
            m_i = m_new
        assert acc is not None and l_i is not None
        out[:, :, qs:qe] = acc / l_i[..., None]
    return out


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, sum_like: str, bias_block: str) -> None:
        super().__init__()
        self.heads, self.sum_like, self.bias_block = heads, sum_like, bias_block
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (proj(x).view(B, T, self.heads, -1).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        o = flash_attention(q, k, v, bias, sum_like=self.sum_like, bias_block=self.bias_block)
        out: torch.Tensor = self.o_proj(o.transpose(1, 2).reshape(B, T, -1))
        return out


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, sum_like: str, bias_block: str) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads, sum_like, bias_block)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), bias)
        out: torch.Tensor = x + self.mlp(self.mlp_norm(x))
        return out


class FlashTransformer(nn.Module):
    def __init__(self, hidden: int, heads: int, layers: int, sum_like: str, bias_block: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(hidden, heads, sum_like, bias_block) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        bias = torch.full((T, T), torch.finfo(torch.bfloat16).min, dtype=torch.bfloat16).triu(1)
        for layer in self.layers:
            x = layer(x, bias)
        out: torch.Tensor = self.norm(x)
        return out


def flash_transformer(sum_like: str = "query", bias_block: str = "query_key", seed: int = 0) -> nn.Module:
    """Factory of :class:`FlashTransformer` (hidden 64, 4 heads, 2 layers; a module diff target
    over ``x`` [1, L, 64])."""
    if sum_like not in ("query", "bias") or bias_block not in ("query_key", "key_query"):
        raise ValueError(f"sum_like {sum_like!r} / bias_block {bias_block!r}: use query or bias / query_key or key_query")
    torch.manual_seed(seed)
    return FlashTransformer(64, 4, 2, sum_like, bias_block).eval()


# ---- an MLP whose up projection leaves float16's range ---------------------------------------


class ExpSiLU(nn.Module):
    """``x * sigmoid(x)`` written as ``x * e^x / (1 + e^x)``: ``exp`` of an input past 88
    overflows float32 itself, and inf / inf is NaN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = torch.exp(x)
        return x * e / (1 + e)


class FeedForward(nn.Module):
    def __init__(self, hidden: int, inner: int, up_dtype: str, act: str) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, inner)
        self.act: nn.Module = nn.SiLU() if act == "silu" else ExpSiLU()
        self.down = nn.Linear(inner, hidden)
        self.up_dtype = getattr(torch, up_dtype)
        if self.up_dtype != torch.float32:
            self.up.to(self.up_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x.to(self.up_dtype)).to(x.dtype)
        out: torch.Tensor = self.down(self.act(h))
        return out


class MLPBlock(nn.Module):
    def __init__(self, hidden: int, up_dtype: str, act: str) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.mlp = FeedForward(hidden, 4 * hidden, up_dtype, act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.mlp(self.norm(x))
        return out


def feed_forward(up_dtype: str = "float32", act: str = "silu", outlier_scale: float = 1e5,
                 seed: int = 0) -> nn.Module:
    """Factory of :class:`MLPBlock` (hidden 32; a module diff target over ``x`` [1, L, 32]);
    ``up``'s weights scaled by ``outlier_scale`` on both sides before the cast."""
    if act not in ("silu", "exp"):
        raise ValueError(f"act {act!r}: use silu or exp")
    torch.manual_seed(seed)
    block = MLPBlock(32, "float32", act)
    with torch.no_grad():
        block.mlp.up.weight.mul_(outlier_scale)
    dtype = getattr(torch, up_dtype)
    if dtype != torch.float32:
        block.mlp.up.to(dtype)
        block.mlp.up_dtype = dtype
    return block.eval()


__all__ = ["feed_forward", "flash_attention", "flash_transformer", "linear_attention"]
