"""Bug 3 of docs/background.md: a gated RMS normalization over decode outputs, tiled vs fused.

The decode kernel's epilogue normalizes each output row ``o`` (length V) by its root mean
square and gates it elementwise with ``silu(g)``::

    out = o * rsqrt(mean(o**2) + eps) * weight * silu(g)

``gated_norm_tiled`` is the slow version from the report: it splits V into 4 tiles, and
because the normalization needs the whole row, each tile recomputes the row's mean of
squares, the reciprocal square root and the gate before using its own slice. The result is
the same; the reductions are done 4 times. ``gated_norm_fused`` computes them once.

Both are glmfb bench factories: ``factory(shape, **args)`` returns a zero-argument callable
that runs the kernel on inputs allocated once. ``shape`` is ``(rows, V)`` (rows = batch x
heads of the decode step) or ``(batch, heads, V)``. The callables declare ``flops_per_call``
and ``bytes_per_call`` (the useful work of the fused kernel, the same for both) so glmfb can
place them against the machine's measured ceilings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

TILES = 4
EPS = 1e-6


def reference(o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """The gated RMS norm in float64, to check both kernels against."""
    o64, g64, w64 = o.double(), g.double(), weight.double()
    rstd = torch.rsqrt(o64.pow(2).mean(-1, keepdim=True) + eps)
    return (o64 * rstd * w64 * F.silu(g64)).to(o.dtype)


def gated_norm_fused_op(
    o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float = EPS
) -> torch.Tensor:
    """Norm and gate computed once per row, then applied to the whole row."""
    rstd = torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
    gate = F.silu(g)
    torch.mul(o, rstd, out=out)
    out.mul_(weight).mul_(gate)
    return out


def gated_norm_tiled_op(
    o: torch.Tensor,
    g: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    eps: float = EPS,
    tiles: int = TILES,
) -> torch.Tensor:
    """Tiled over V: every tile recomputes the row's norm and gate (the planted regression)."""
    width = o.shape[-1]
    step = -(-width // tiles)
    for start in range(0, width, step):
        stop = min(start + step, width)
        rstd = torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)  # whole row, again
        gate = F.silu(g)  # whole row, again
        tile = out[..., start:stop]
        torch.mul(o[..., start:stop], rstd, out=tile)
        tile.mul_(weight[start:stop]).mul_(gate[..., start:stop])
    return out


def _inputs(
    shape: tuple[int, ...], seed: int, dtype: str, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if len(shape) not in (2, 3):
        raise ValueError(f"gated norm takes a shape (rows, V) or (batch, heads, V), got {shape}")
    torch_dtype = getattr(torch, dtype)
    generator = torch.Generator().manual_seed(seed)
    o = torch.randn(shape, generator=generator).to(device=device, dtype=torch_dtype)
    g = torch.randn(shape, generator=generator).to(device=device, dtype=torch_dtype)
    weight = (1.0 + 0.1 * torch.randn(shape[-1], generator=generator)).to(device=device, dtype=torch_dtype)
    return o, g, weight, torch.empty_like(o)


def _declare_work(kernel: Callable[[], Any], shape: tuple[int, ...], element_bytes: int) -> None:
    elements = 1
    for dim in shape:
        elements *= dim
    # Useful work of one gated norm: square+sum, scale, weight, silu (~4 flops), gate.
    kernel.flops_per_call = 10 * elements  # type: ignore[attr-defined]
    # Read o, g (and the weight once), write out.
    kernel.bytes_per_call = (3 * elements + shape[-1]) * element_bytes  # type: ignore[attr-defined]


def gated_norm_fused(
    shape: tuple[int, ...], seed: int = 0, dtype: str = "float32", device: str = "cpu"
) -> Callable[[], torch.Tensor]:
    """glmfb bench factory for the fused kernel."""
    o, g, weight, out = _inputs(shape, seed, dtype, device)

    def kernel() -> torch.Tensor:
        return gated_norm_fused_op(o, g, weight, out)

    _declare_work(kernel, shape, o.element_size())
    return kernel


def gated_norm_tiled(
    shape: tuple[int, ...], seed: int = 0, dtype: str = "float32", device: str = "cpu", tiles: int = TILES
) -> Callable[[], torch.Tensor]:
    """glmfb bench factory for the tiled kernel that recomputes the norm per tile."""
    o, g, weight, out = _inputs(shape, seed, dtype, device)

    def kernel() -> torch.Tensor:
        return gated_norm_tiled_op(o, g, weight, out, tiles=tiles)

    _declare_work(kernel, shape, o.element_size())
    return kernel
