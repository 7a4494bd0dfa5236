"""torch's own fused and decomposed operators as bench targets (``factory(shape, seed) -> kernel``).

The kernels are torch's (``aten::layer_norm``, ``aten::_scaled_dot_product_flash_attention``,
``aten::gelu``, ``aten::sum``, ...). Each factory allocates its inputs once and returns a
zero-argument callable that runs one call. The pairs differ the way user code does: a fused
operator against the same math written out (lost fusion), the same operator on a strided
input or with another algorithm (a slower operator), a reduction recomputed per tile
(redundant recomputation), a broadcast materialized before use (memory traffic). Each
``*_again`` factory has exactly the body of the one it is named after (the clean twins).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

Kernel = Callable[[], torch.Tensor]


def _randn(shape: tuple[int, ...], seed: int, salt: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 * seed + salt))


def _rows(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) != 2:
        raise ValueError(f"shape {shape}: give rows x columns, e.g. 64x4096")
    return shape[0], shape[1]


# ---- layer norm: fused against written out --------------------------------------------------


def layer_norm_fused(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``F.layer_norm`` over the last dimension (one aten::native_layer_norm)."""
    rows, cols = _rows(shape)
    x, w, b = _randn((rows, cols), seed), _randn((cols,), seed, 1), _randn((cols,), seed, 2)
    return lambda: F.layer_norm(x, (cols,), w, b, 1e-5)


def layer_norm_fused_again(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same body as :func:`layer_norm_fused`."""
    rows, cols = _rows(shape)
    x, w, b = _randn((rows, cols), seed), _randn((cols,), seed, 1), _randn((cols,), seed, 2)
    return lambda: F.layer_norm(x, (cols,), w, b, 1e-5)


def layer_norm_written_out(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same layer norm from mean, variance, subtract, divide, scale and shift."""
    rows, cols = _rows(shape)
    x, w, b = _randn((rows, cols), seed), _randn((cols,), seed, 1), _randn((cols,), seed, 2)

    def kernel() -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * w + b

    return kernel


# ---- attention: scaled_dot_product_attention against written out ----------------------------


def _qkv(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if len(shape) != 4:
        raise ValueError(f"shape {shape}: give batch x heads x tokens x head_dim, e.g. 1x4x512x64")
    return _randn(shape, seed), _randn(shape, seed, 1), _randn(shape, seed, 2)


def attention_sdpa(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """Causal ``F.scaled_dot_product_attention`` (torch's fused CPU kernel)."""
    q, k, v = _qkv(shape, seed)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def attention_sdpa_again(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same body as :func:`attention_sdpa`."""
    q, k, v = _qkv(shape, seed)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def attention_written_out(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """Causal attention as matmul, scale, mask, softmax, matmul (the scores materialized)."""
    q, k, v = _qkv(shape, seed)
    tokens = shape[2]
    future = torch.ones(tokens, tokens, dtype=torch.bool).triu(1)
    scale = shape[3] ** -0.5

    def kernel() -> torch.Tensor:
        scores = (q @ k.transpose(-1, -2)) * scale
        out: torch.Tensor = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        return out

    return kernel


# ---- GELU: fused, tanh approximation, written out --------------------------------------------


def gelu_erf(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``F.gelu`` (exact, erf)."""
    x = _randn(_rows(shape), seed)
    return lambda: F.gelu(x)


def gelu_erf_again(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same body as :func:`gelu_erf`."""
    x = _randn(_rows(shape), seed)
    return lambda: F.gelu(x)


def gelu_tanh(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``F.gelu(approximate="tanh")``: the same operator (aten::gelu), another algorithm."""
    x = _randn(_rows(shape), seed)
    return lambda: F.gelu(x, approximate="tanh")


def gelu_written_out(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """GELU as ``x * 0.5 * (1 + erf(x / sqrt(2)))``: five operators instead of aten::gelu."""
    x = _randn(_rows(shape), seed)
    return lambda: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


# ---- a row sum on a contiguous or a strided input --------------------------------------------


def row_sum_contiguous(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``x.sum(-1)`` on a contiguous ``x``."""
    rows, cols = _rows(shape)
    x = _randn((cols, rows), seed).t().contiguous()
    return lambda: x.sum(-1)


def row_sum_contiguous_again(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same body as :func:`row_sum_contiguous`."""
    rows, cols = _rows(shape)
    x = _randn((cols, rows), seed).t().contiguous()
    return lambda: x.sum(-1)


def row_sum_strided(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same ``x.sum(-1)`` on a transposed view (the reduced dimension is strided)."""
    rows, cols = _rows(shape)
    x = _randn((cols, rows), seed).t()
    return lambda: x.sum(-1)


# ---- softmax normalization: statistics once, or once per output tile -------------------------


def softmax_stats_once(shape: tuple[int, ...], seed: int = 0, tiles: int = 4) -> Kernel:
    """Row max and row sum of exponentials computed once, then the output tile by tile."""
    rows, cols = _rows(shape)
    x = _randn((rows, cols), seed)
    width = cols // tiles

    def kernel() -> torch.Tensor:
        top = x.amax(-1, keepdim=True)
        total = (x - top).exp().sum(-1, keepdim=True)
        return torch.cat([(x[:, i * width:(i + 1) * width] - top).exp() / total for i in range(tiles)], -1)

    return kernel


def softmax_stats_once_again(shape: tuple[int, ...], seed: int = 0, tiles: int = 4) -> Kernel:
    """The same body as :func:`softmax_stats_once`."""
    rows, cols = _rows(shape)
    x = _randn((rows, cols), seed)
    width = cols // tiles

    def kernel() -> torch.Tensor:
        top = x.amax(-1, keepdim=True)
        total = (x - top).exp().sum(-1, keepdim=True)
        return torch.cat([(x[:, i * width:(i + 1) * width] - top).exp() / total for i in range(tiles)], -1)

    return kernel


def softmax_stats_per_tile(shape: tuple[int, ...], seed: int = 0, tiles: int = 4) -> Kernel:
    """The same output, with the row max and row sum recomputed for every tile (``tiles`` x)."""
    rows, cols = _rows(shape)
    x = _randn((rows, cols), seed)
    width = cols // tiles

    def kernel() -> torch.Tensor:
        parts = []
        for i in range(tiles):
            top = x.amax(-1, keepdim=True)
            total = (x - top).exp().sum(-1, keepdim=True)
            parts.append((x[:, i * width:(i + 1) * width] - top).exp() / total)
        return torch.cat(parts, -1)

    return kernel


# ---- a per-column scale: broadcast, or materialized first ------------------------------------


def scale_broadcast(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``x * w`` with ``w`` of one row, broadcast by the multiply."""
    rows, cols = _rows(shape)
    x, w = _randn((rows, cols), seed), _randn((cols,), seed, 1)
    return lambda: x * w


def scale_broadcast_again(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same body as :func:`scale_broadcast`."""
    rows, cols = _rows(shape)
    x, w = _randn((rows, cols), seed), _randn((cols,), seed, 1)
    return lambda: x * w


def scale_materialized(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same product with ``w`` expanded to the full ``rows x cols`` and copied first: an
    intermediate as large as the input is written and read again."""
    rows, cols = _rows(shape)
    x, w = _randn((rows, cols), seed), _randn((cols,), seed, 1)
    return lambda: x * w.expand(rows, cols).contiguous()


# ---- user-style changes: the same product through einsum, a Python loop over rows, a debug --
# ---- leftover computing a result twice, a defensive copy ------------------------------------


def _mnk(shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(shape) != 3:
        raise ValueError(f"shape {shape}: give n x k x m, e.g. 256x256x256")
    return shape[0], shape[1], shape[2]


def matmul(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``torch.matmul`` of an n x k by a k x m matrix (one aten::mm)."""
    n, k, m = _mnk(shape)
    a, b = _randn((n, k), seed), _randn((k, m), seed, 1)
    return lambda: torch.matmul(a, b)


def matmul_einsum(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same product as ``torch.einsum("ij,jk->ik")``: other operators on the way (views,
    aten::bmm), the same work."""
    n, k, m = _mnk(shape)
    a, b = _randn((n, k), seed), _randn((k, m), seed, 1)
    return lambda: torch.einsum("ij,jk->ik", a, b)


def softmax_rows(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``x.softmax(-1)`` over a rows x columns input (one aten::_softmax)."""
    x = _randn(_rows(shape), seed)
    return lambda: x.softmax(-1)


def softmax_row_loop(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same softmax, one row at a time in a Python loop, stacked: aten::_softmax once per
    row on a row."""
    x = _randn(_rows(shape), seed)
    return lambda: torch.stack([row.softmax(-1) for row in x])


def linear(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``F.linear`` of a rows x columns input by a columns x columns weight."""
    rows, cols = _rows(shape)
    x, w = _randn((rows, cols), seed), _randn((cols, cols), seed, 1)
    return lambda: F.linear(x, w)


def linear_computed_twice(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same ``F.linear``, with a debug leftover that computes it once more and drops it."""
    rows, cols = _rows(shape)
    x, w = _randn((rows, cols), seed), _randn((cols, cols), seed, 1)

    def kernel() -> torch.Tensor:
        F.linear(x, w)  # computed, thrown away
        return F.linear(x, w)

    return kernel


def silu(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``F.silu`` of a contiguous input."""
    x = _randn(_rows(shape), seed)
    return lambda: F.silu(x)


def silu_of_a_copy(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``F.silu`` of ``x.clone()``: a defensive copy of an input that needed none."""
    x = _randn(_rows(shape), seed)
    return lambda: F.silu(x.clone())


# ---- a defensive copy beside scalar casts: copy_ called from two operators -------------------


class ActivationClamp:
    """Activations clamped to a finite range, as fp16-safe model code writes it (T5's
    ``clamp_value``): the bounds are kept as Python floats and made tensors of the input's dtype
    on every call, through float64 (``torch.tensor(...).to(dtype)``: ``aten::to > aten::_to_copy
    > aten::copy_`` on a scalar, twice a call). ``defensive_copy`` clones the input first so the
    caller's tensor is never touched: one more ``aten::copy_`` a call, of the whole input, inside
    ``aten::clone``."""

    def __init__(self, limit: float = 6.0e4, defensive_copy: bool = False) -> None:
        self.limit = limit
        self.defensive_copy = defensive_copy

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.defensive_copy:
            hidden = hidden.clone()  # never modify the caller's tensor
        low = torch.tensor(-self.limit, dtype=torch.float64).to(hidden.dtype)
        high = torch.tensor(self.limit, dtype=torch.float64).to(hidden.dtype)
        return hidden.clamp(low.item(), high.item())


def clamp_activations(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``ActivationClamp`` on a rows x columns input."""
    x, clamp = _randn(_rows(shape), seed), ActivationClamp()
    return lambda: clamp(x)


def clamp_activations_again(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """The same body as :func:`clamp_activations` (its clean twin)."""
    x, clamp = _randn(_rows(shape), seed), ActivationClamp()
    return lambda: clamp(x)


def clamp_activations_defensive_copy(shape: tuple[int, ...], seed: int = 0) -> Kernel:
    """``ActivationClamp(defensive_copy=True)``: a clone of the input on every call."""
    x, clamp = _randn(_rows(shape), seed), ActivationClamp(defensive_copy=True)
    return lambda: clamp(x)


# ---- the same ops on k times the rows: the size of a slowdown (issue 53) ---------------------


def _scaled_rows(rows: int, scale: float) -> int:
    scaled = round(rows * scale)
    if scaled < 1 or abs(scaled - rows * scale) > 1e-9:
        raise ValueError(f"scale {scale} of {rows} rows is not a whole number of rows")
    return scaled


def rmsnorm_rows(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> Kernel:
    """A gated RMS norm (memory-bound: a few elementwise passes and a row mean) on ``scale``
    times the rows of ``shape``: ``scale=2`` does exactly twice the work of ``scale=1``."""
    rows, cols = _rows(shape)
    rows = _scaled_rows(rows, scale)
    x, g, w = _randn((rows, cols), seed), _randn((rows, cols), seed, 1), _randn((cols,), seed, 2)

    def kernel() -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * F.silu(g)

    return kernel


def matmul_rows(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> Kernel:
    """``torch.matmul`` of an (n * scale) x k by a k x m matrix (compute-bound): ``scale=2``
    does exactly twice the multiply-adds of ``scale=1``."""
    n, k, m = _mnk(shape)
    a, b = _randn((_scaled_rows(n, scale), k), seed), _randn((k, m), seed, 1)
    return lambda: torch.matmul(a, b)
