"""One KDA layer as a model, on one device and context-parallel over torch.distributed ranks.

Both models have the same module tree (so their taps line up one for one) and the same
weights for the same seed::

    embed                        token ids -> vectors
    layers.0.attn.{q,k,v,f,b}_proj   per-token projections (queries, keys, values, gates, beta)
    layers.0.attn.merge          the state entering each sequence segment, [segments, B, H, K, V]
    layers.0.attn.o_proj         the output projection (after a per-head RMS norm)
    layers.0, layers.0.attn      the layer's output

Context parallelism (``ContextParallelKDA``, one instance per rank): the sequence is cut into
segments (``contiguous``: one per rank, in rank order; ``zigzag``: ``2W`` segments, rank ``r``
holding segments ``r`` and ``2W-1-r``, the layout hybrid models use to balance their softmax
attention layers, which the linear layers then share). Each rank runs the chunked form over
its own segments from a zero state, which gives each segment's local state ``S_j`` and its
chunk transitions. Then ``layers.0.attn.merge`` (:class:`ContextParallelMerge`), on every rank:

1. composes its segments' chunk transitions into the segment transition ``M_j``, one product
   per chunk, at ``merge_precision``;
2. all-gathers ``[S_j | M_j]`` from every rank;
3. runs the affine chain ``S_in(j+1) = M_j S_in(j) + S_j`` over the segments in sequence order,
   at ``merge_precision``, and returns the incoming state of its own segments.

Steps 1 and 3 together are the affine chain of a real CP kernel (flash-linear-attention's
``chunk_cp_fwd_kernel_h`` composes ``M`` chunk by chunk and ``chunk_cp_merge_state`` applies
the summaries, both with one ``tl.dot`` precision, which defaulted to TF32 for float32 inputs
and was changed to tf32x3). Each rank then recomputes its outputs from its incoming states.

On one device (``SingleDeviceKDA``) the chunked form runs over the whole sequence in order,
and ``layers.0.attn.merge`` (:class:`BoundaryStates`) reports the recurrent state at the same
segment boundaries: the reference for the CP merge's output, state for state.

Why the error grows with length, and why these parameters (measured by
``benchmarks/kda_cp_errors.py``): TF32 keeps 10 of float32's 23 mantissa bits, so every product
of the chain perturbs what it carries by about 2^-11 relative. The chain carries only what
survives a whole segment: channels whose decay is close to 1 and that keys seldom overwrite.
Their rounding errors are not forgotten, and their number grows with the number of chunks per
segment, that is with context length. With isotropic keys the delta rule erases every
direction within a few hundred tokens and nothing accumulates (no growth), so the defaults
follow what long-context KDA layers look like: L2-normalized keys whose energy is uneven across
channels (a power law, ``key_profile``), most channels forgetting within tens of tokens
(``fast_rates``) and a quarter keeping memory for 1e5 to 1e7 tokens (``slow_rates``), the
channels a 1M-token context model needs. With contiguous segments at world size 2 the chain
never multiplies a non-zero state (rank 1 receives rank 0's local state as is), so the merge
precision cannot matter there; zig-zag gives world size 2 a chain of four segments.

Targets (``glmfb diff`` / ``glmfb capture``)::

    scenarios/kda_cp/model.py:single    --arg world_size=2 --arg layout=zigzag
    scenarios/kda_cp/model.py:cp        --arg merge_precision=tf32 --arg layout=zigzag  (per rank)
    requests: scenarios/kda_cp/requests.jsonl (lengths 512 to 8192)
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from . import kda
from .precision import check_precision

LAYOUTS = ("contiguous", "zigzag")
NORM_EPS = 1e-6  # fixed, not the dtype's epsilon: float32 and float64 runs compute the same function


@dataclass(frozen=True)
class KDAConfig:
    """Sizes and the distributions the weights are drawn from (see the module docstring)."""

    vocab: int = 256
    dim: int = 128
    heads: int = 2
    key_dim: int = 128  # real KDA heads are 128 x 128
    value_dim: int = 128
    chunk: int = kda.CHUNK
    key_profile: float = 1.0  # key channel d has amplitude ~ rank(d)^-key_profile (a power law)
    slow_fraction: float = 0.25  # channels with long memory
    slow_rates: tuple[float, float] = (1e-7, 1e-5)  # per-token decay rates -g, log-uniform
    fast_rates: tuple[float, float] = (0.05, 1.0)
    gate_spread: float = 0.3  # the gate's data-dependent part, std of its pre-activation
    seed: int = 0


def _segments(layout: str, world_size: int) -> int:
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    return world_size if layout == "contiguous" else 2 * world_size


def own_segments(layout: str, rank: int, world_size: int) -> list[int]:
    """The segments rank ``rank`` holds, in the order its local tokens are laid out."""
    if layout == "contiguous":
        return [rank]
    return [rank, 2 * world_size - 1 - rank]


def _inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


class KDAAttention(nn.Module):
    """Projections, gates and the output side of a KDA layer; subclasses run the recurrence.

    ``q = l2norm(q_proj x) / sqrt(K)``, ``k = l2norm(k_proj x)``, ``v = v_proj x``,
    ``g = -softplus(f_proj x)`` (the bias sets each channel's decay rate), ``beta =
    sigmoid(b_proj x)``; the output is ``o_proj(rmsnorm_per_head(o))``."""

    def __init__(self, config: KDAConfig, merge: nn.Module, generator: torch.Generator) -> None:
        super().__init__()
        self.config = config
        h, dk, dv, d = config.heads, config.key_dim, config.value_dim, config.dim
        self.q_proj = nn.Linear(d, h * dk, bias=False)
        self.k_proj = nn.Linear(d, h * dk, bias=False)
        self.v_proj = nn.Linear(d, h * dv, bias=False)
        self.f_proj = nn.Linear(d, h * dk, bias=True)
        self.b_proj = nn.Linear(d, h, bias=False)
        self.merge = merge
        self.o_proj = nn.Linear(h * dv, d, bias=False)
        with torch.no_grad():
            for linear, std in ((self.q_proj, 1.0), (self.v_proj, 1.0), (self.b_proj, 1.0),
                                (self.f_proj, config.gate_spread)):
                linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator) * std / math.sqrt(d))
            ranks = torch.stack([torch.randperm(dk, generator=generator) for _ in range(h)]) + 1
            profile = ranks.to(torch.float32).pow(-config.key_profile).reshape(h * dk, 1)
            self.k_proj.weight.copy_(torch.randn(h * dk, d, generator=generator) * profile / math.sqrt(d))
            slow = torch.rand(h, dk, generator=generator) < config.slow_fraction
            rates = torch.where(slow, _log_uniform(config.slow_rates, (h, dk), generator),
                                _log_uniform(config.fast_rates, (h, dk), generator))
            self.f_proj.bias.copy_(_inverse_softplus(rates.double()).float().reshape(-1))
            self.o_proj.weight.copy_(torch.randn(self.o_proj.weight.shape, generator=generator) / math.sqrt(h * dv))

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``q, k, v, g, beta`` for ``x [B, T, D]``, heads first: ``[B, H, T, *]``, beta ``[B, H, T]``."""
        batch, length, _ = x.shape
        h = self.config.heads

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.reshape(batch, length, h, -1).transpose(1, 2)

        q = nn.functional.normalize(heads(self.q_proj(x)), dim=-1) / math.sqrt(self.config.key_dim)
        k = nn.functional.normalize(heads(self.k_proj(x)), dim=-1)
        v = heads(self.v_proj(x))
        g = -nn.functional.softplus(heads(self.f_proj(x)))
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)
        return q, k, v, g, beta

    def finish(self, o: torch.Tensor) -> torch.Tensor:
        """``o [B, H, T, V]`` -> ``[B, T, D]``."""
        o = nn.functional.rms_norm(o, (o.shape[-1],), eps=NORM_EPS)
        return self.o_proj(o.transpose(1, 2).reshape(o.shape[0], o.shape[2], -1))


def _log_uniform(bounds: tuple[float, float], shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    low, high = math.log(bounds[0]), math.log(bounds[1])
    return torch.exp(low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float64)).float()


# --------------------------------------------------------------------------------------------
# One device
# --------------------------------------------------------------------------------------------


class BoundaryStates(nn.Module):
    """The single-device counterpart of the CP merge: the recurrent state at the start of each
    segment of a W-way split, ``[segments, B, H, K, V]`` in sequence order. A boundary inside a
    chunk is reached by running that chunk's first tokens from the state entering it."""

    def forward(self, states: torch.Tensor, starts: Sequence[int], inputs: Sequence[torch.Tensor],
                chunk: int) -> torch.Tensor:
        result = []
        for start in starts:
            index, offset = divmod(start, chunk)
            state = states[index]
            if offset:
                _, state, _ = kda.forward(kda.prepare_range(inputs, index * chunk, start, chunk), state)
            result.append(state)
        return torch.stack(result)


class SingleDeviceAttention(KDAAttention):
    def __init__(self, config: KDAConfig, generator: torch.Generator, segments: int) -> None:
        super().__init__(config, BoundaryStates(), generator)
        self.segments = segments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inputs = self.project(x)
        chunks = kda.prepare_range(inputs, 0, x.shape[1], self.config.chunk)
        o, _, states = kda.forward(chunks, keep_states=True)
        assert states is not None
        starts = [start for start, _ in kda.segment_bounds(x.shape[1], self.segments)]
        self.merge(states, starts, inputs, self.config.chunk)
        return self.finish(o)


class Block(nn.Module):
    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)


class SingleDeviceKDA(nn.Module):
    """The whole sequence on one device; ``merge`` reports the states at the boundaries of a
    ``world_size``-way split in ``layout``."""

    def __init__(self, config: KDAConfig, world_size: int = 2, layout: str = "contiguous") -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(config.seed)
        self.embed = nn.Embedding(config.vocab, config.dim)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(self.embed.weight.shape, generator=generator))
        self.layers = nn.ModuleList([Block(SingleDeviceAttention(config, generator, _segments(layout, world_size)))])

    @property
    def attention(self) -> SingleDeviceAttention:
        return cast(SingleDeviceAttention, self.layers[0].attn)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids.to(self.embed.weight.device))
        for layer in self.layers:
            x = layer(x)
        return x


# --------------------------------------------------------------------------------------------
# Context parallel
# --------------------------------------------------------------------------------------------


class ContextParallelMerge(nn.Module):
    """The affine chain across segments and ranks (see the module docstring); its output is
    the state entering each of this rank's segments, ``[own segments, B, H, K, V]``."""

    def __init__(self, merge_precision: str, layout: str) -> None:
        super().__init__()
        self.merge_precision = check_precision(merge_precision)
        self.layout = layout

    def forward(self, transitions: Sequence[torch.Tensor], local_states: Sequence[torch.Tensor]) -> torch.Tensor:
        import torch.distributed as dist

        rank, world_size = dist.get_rank(), dist.get_world_size()
        own = own_segments(self.layout, rank, world_size)
        value_dim = local_states[0].shape[-1]
        summary = torch.stack([
            torch.cat([state, kda.compose_transitions(chunk_transitions, self.merge_precision)], dim=-1)
            for chunk_transitions, state in zip(transitions, local_states, strict=True)
        ])  # [own, B, H, K, V + K]: [S_j | M_j]
        gathered = [torch.empty_like(summary) for _ in range(world_size)]
        dist.all_gather(gathered, summary.contiguous())
        in_order: dict[int, torch.Tensor] = {}
        for other, part in enumerate(gathered):
            for position, segment in enumerate(own_segments(self.layout, other, world_size)):
                in_order[segment] = part[position]
        count = len(in_order)
        states = [in_order[j][..., :value_dim] for j in range(count)]
        matrices = [in_order[j][..., value_dim:] for j in range(count)]
        incoming = [torch.zeros_like(states[0])]
        for j in range(count - 1):
            incoming.append(kda.matmul(matrices[j], incoming[-1], self.merge_precision) + states[j])
        return torch.stack([incoming[j] for j in own])


class ContextParallelAttention(KDAAttention):
    def __init__(self, config: KDAConfig, generator: torch.Generator, merge_precision: str, layout: str) -> None:
        super().__init__(config, ContextParallelMerge(merge_precision, layout), generator)

    def forward(self, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """``x``: this rank's tokens, its segments one after the other (``sizes`` tokens each)."""
        inputs = self.project(x)
        pieces = []
        begin = 0
        for size in sizes:
            pieces.append(kda.prepare_range(inputs, begin, begin + size, self.config.chunk))
            begin += size
        local_states = [kda.forward(piece)[1] for piece in pieces]
        incoming = self.merge([piece.transitions() for piece in pieces], local_states)
        outputs = [kda.forward(piece, incoming[i])[0] for i, piece in enumerate(pieces)]
        return self.finish(torch.cat(outputs, dim=-2))


class ContextParallelBlock(nn.Module):
    def __init__(self, attn: ContextParallelAttention) -> None:
        super().__init__()
        self.attn = attn

    def forward(self, x: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        return self.attn(x, sizes)


class ContextParallelKDA(nn.Module):
    """One rank's part: takes the whole request, keeps its own segments' tokens, returns their
    outputs. ``glmfb_layouts`` tells glmfb how to put the ranks' taps back together."""

    def __init__(self, config: KDAConfig, merge_precision: str = "ieee", layout: str = "contiguous") -> None:
        super().__init__()
        _segments(layout, 1)
        generator = torch.Generator().manual_seed(config.seed)
        self.layout = layout
        self.embed = nn.Embedding(config.vocab, config.dim)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(self.embed.weight.shape, generator=generator))
        self.layers = nn.ModuleList([ContextParallelBlock(ContextParallelAttention(config, generator, merge_precision, layout))])
        # sequence taps are sharded along the token axis; the merge's along its segment axis
        self.glmfb_layouts: dict[str, dict[str, Any]] = {
            "layers.*.attn.merge": {"axis": 0, "order": layout},
            "*": {"axis": 1, "order": layout},
        }

    @property
    def attention(self) -> ContextParallelAttention:
        return cast(ContextParallelAttention, self.layers[0].attn)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        rank, world_size = dist.get_rank(), dist.get_world_size()
        bounds = kda.segment_bounds(input_ids.shape[1], _segments(self.layout, world_size))
        own = [bounds[j] for j in own_segments(self.layout, rank, world_size)]
        ids = torch.cat([input_ids[:, start:end] for start, end in own], dim=1).to(self.embed.weight.device)
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, [end - start for start, end in own])
        return x


# --------------------------------------------------------------------------------------------
# Factories (glmfb diff targets)
# --------------------------------------------------------------------------------------------


def _config(seed: int, overrides: dict[str, Any]) -> KDAConfig:
    return KDAConfig(seed=seed, **overrides)


def single(world_size: int = 2, layout: str = "contiguous", seed: int = 0, dtype: str = "float32",
           device: str = "cpu", **overrides: Any) -> SingleDeviceKDA:
    """The single-device model; ``merge`` reports states at a ``world_size``-way split."""
    model = SingleDeviceKDA(_config(seed, overrides), world_size, layout)
    return model.to(device=device, dtype=getattr(torch, dtype)).eval()


def cp(merge_precision: str = "ieee", layout: str = "contiguous", seed: int = 0, device: str = "auto",
       backend: str | None = None, **overrides: Any) -> ContextParallelKDA:
    """One rank of the context-parallel model. Initializes the default process group from the
    torchrun environment if nobody has (gloo on CPU, nccl when CUDA is there)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(chosen)
    if device == "auto":
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if dist.get_backend() == "nccl" else "cpu"
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    model = ContextParallelKDA(_config(seed, overrides), merge_precision, layout)
    return model.to(device).eval()


def emulate_cp(model: SingleDeviceKDA, input_ids: torch.Tensor, segments: int, merge_precision: str,
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The context-parallel computation in one process, op for op as the ranks run it (each
    segment from a zero state, the affine chain at ``merge_precision``, the outputs from the
    incoming states), with ``model``'s weights. Returns ``(output [B, T, D], incoming states
    [segments, B, H, K, V])`` in sequence order. A cross-check of the ranks, and a way to run the
    chain on a GPU's own TF32 (``torch.backends.cuda.matmul.allow_tf32``) with ``ieee``."""
    check_precision(merge_precision)
    attn = model.attention
    inputs = attn.project(model.embed(input_ids.to(model.embed.weight.device)))
    pieces = [kda.prepare_range(inputs, start, end, attn.config.chunk)
              for start, end in kda.segment_bounds(input_ids.shape[1], segments)]
    local_states = [kda.forward(piece)[1] for piece in pieces]
    transitions = [kda.compose_transitions(piece.transitions(), merge_precision) for piece in pieces]
    incoming = [kda.chain(transitions, local_states, j, merge_precision) for j in range(segments)]
    outputs = [kda.forward(piece, incoming[j])[0] for j, piece in enumerate(pieces)]
    return attn.finish(torch.cat(outputs, dim=-2)), torch.stack(incoming)
