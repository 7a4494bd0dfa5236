"""KDA-style linear attention (a gated delta rule with per-channel decay), from the math.

Per head, with keys ``k_t`` (L2-normalized) and queries ``q_t`` in R^K, values ``v_t`` in R^V,
per-channel log-decays ``g_t <= 0`` (``alpha_t = exp(g_t)``) and a write strength
``beta_t`` in (0, 1), the state ``S_t`` is a K x V matrix::

    S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T q_t

(decay the state channel by channel, then replace what it stores under key ``k_t`` by ``v_t``,
by a fraction ``beta_t``).

Chunked form (chunks of C = 64 tokens, positions ``i = 1..C`` inside a chunk, entering state
``S0``). Let ``G_i`` be the cumulative log-decay inside the chunk and ``gamma_i = exp(G_i)``.
Writing ``S_i = Diag(gamma_i) X_i`` turns the recurrence into
``X_i = X_{i-1} + (k_i / gamma_i) delta_i^T`` with the corrections
``delta_i = beta_i (v_i - X_{i-1}^T (gamma_i * k_i))``. Collecting them in rows of ``Delta``::

    (I + A) Delta = Diag(beta) (V - (Gamma * K) S0),   A_is = beta_i k_i . (exp(G_i - G_s) * k_s), s < i

so, with ``W = (I + A)^-1 Diag(beta) (Gamma * K)`` and ``U = (I + A)^-1 Diag(beta) V`` (the
WY / UT representation: one unit-lower-triangular solve per chunk), ``Delta = U - W S0`` and::

    O   = (Gamma * Q) S0 + P Delta,            P_is = q_i . (exp(G_i - G_s) * k_s), s <= i
    S_C = Diag(gamma_C) S0 + Kend^T Delta,     Kend_s = exp(G_C - G_s) * k_s

Hence each chunk is an affine map of its entering state, ``S_C = M_c S0 + h_c`` with the
transition ``M_c = Diag(gamma_C) - Kend^T W`` (K x K) and the local state ``h_c = Kend^T U``
(K x V). Decays enter only as ``exp`` of non-positive differences of cumulative log-decays,
so nothing overflows however fast a channel decays.

Shapes: ``[..., T, K]`` for q, k, g; ``[..., T, V]`` for v; ``[..., T]`` for beta; states
``[..., K, V]``. The leading dimensions (heads, batch) are independent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .precision import matmul

CHUNK = 64
BLOCK = 16  # sub-blocks of a chunk: decays are taken relative to a block's last position
BUDGET_ELEMENTS = 1 << 23  # per group of chunks, the largest intermediate tensor


def recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive reference: the recurrence token by token. Returns ``(o, final state)``."""
    state = _zero_state(k, v) if initial_state is None else initial_state.clone()
    outputs = []
    for t in range(k.shape[-2]):
        k_t, v_t = k[..., t, :], v[..., t, :]
        state = state * torch.exp(g[..., t, :])[..., None]
        stored = torch.einsum("...k,...kv->...v", k_t, state)  # what the state holds under k_t
        state = state + beta[..., t, None, None] * k_t[..., :, None] * (v_t - stored)[..., None, :]
        outputs.append(torch.einsum("...k,...kv->...v", q[..., t, :], state))
    if not outputs:
        return torch.zeros(*v.shape[:-2], 0, v.shape[-1], dtype=v.dtype, device=v.device), state
    return torch.stack(outputs, dim=-2), state


def _zero_state(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.zeros(*k.shape[:-2], k.shape[-1], v.shape[-1], dtype=k.dtype, device=k.device)


@dataclass(frozen=True)
class Chunks:
    """The state-independent part of the chunked form, for ``n`` chunks of ``C`` tokens.

    Every tensor has the input's leading dimensions, then ``n``: ``q_decayed`` ``Gamma * Q``
    and ``w`` ``W`` as ``[.., n, C, K]``; ``u`` ``U`` as ``[.., n, C, V]``; ``scores`` ``P`` as
    ``[.., n, C, C]``; ``k_to_end`` ``Kend`` as ``[.., n, C, K]``; ``decay_end`` ``gamma_C`` as
    ``[.., n, K]``. ``length`` is the number of real tokens (the last chunk is zero-padded)."""

    q_decayed: torch.Tensor
    w: torch.Tensor
    u: torch.Tensor
    scores: torch.Tensor
    k_to_end: torch.Tensor
    decay_end: torch.Tensor
    length: int

    @property
    def count(self) -> int:
        return self.w.shape[-3]

    def transitions(self) -> torch.Tensor:
        """``M_c = Diag(gamma_C) - Kend^T W`` for every chunk: ``[.., n, K, K]`` (plain
        float32 or float64 products; the affine chain that composes them has its own precision)."""
        return torch.diag_embed(self.decay_end) - self.k_to_end.transpose(-1, -2) @ self.w

    def local_states(self) -> torch.Tensor:
        """``h_c = Kend^T U`` for every chunk: ``[.., n, K, V]``, each chunk's state from zero."""
        return self.k_to_end.transpose(-1, -2) @ self.u


def _pad_to_chunks(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """``[.., T, D]`` zero-padded and reshaped to ``[.., n, C, D]``."""
    length = x.shape[-2]
    padded = -(-length // chunk) * chunk
    if padded != length:
        x = torch.nn.functional.pad(x, (0, 0, 0, padded - length))
    return x.reshape(*x.shape[:-2], padded // chunk, chunk, x.shape[-1])


def prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            chunk: int = CHUNK) -> Chunks:
    """The chunked form's per-chunk quantities (see the module docstring). Padding tokens get
    ``k = q = v = 0``, ``g = 0``, ``beta = 0``: they neither decay nor write the state."""
    length = k.shape[-2]
    qc, kc, vc, gc = (_pad_to_chunks(x, chunk) for x in (q, k, v, g))
    bc = _pad_to_chunks(beta[..., None], chunk)[..., 0]  # [.., n, C]
    cumulative = gc.cumsum(dim=-2)  # G_i, [.., n, C, K]
    strictly_lower = torch.ones(chunk, chunk, dtype=torch.bool, device=k.device).tril(-1)

    kk, scores = _decayed_scores(qc, kc, cumulative)
    a = (bc[..., :, None] * kk).masked_fill(~strictly_lower, 0.0)
    eye = torch.eye(chunk, dtype=k.dtype, device=k.device)
    gamma = torch.exp(cumulative)
    rhs = bc[..., None] * torch.cat([gamma * kc, vc], dim=-1)  # Diag(beta) [Gamma*K | V]
    solved = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    w, u = solved.split([k.shape[-1], v.shape[-1]], dim=-1)
    last = cumulative[..., -1:, :]
    return Chunks(
        q_decayed=gamma * qc, w=w, u=u, scores=scores,
        k_to_end=torch.exp(last - cumulative) * kc, decay_end=torch.exp(last[..., 0, :]),
        length=length,
    )


def prepare_range(inputs: Sequence[torch.Tensor], start: int, end: int, chunk: int = CHUNK) -> Chunks:
    """:func:`prepare` on tokens ``[start, end)`` of ``inputs = (q, k, v, g, beta)``."""
    q, k, v, g, beta = inputs
    return prepare(q[..., start:end, :], k[..., start:end, :], v[..., start:end, :], g[..., start:end, :],
                   beta[..., start:end], chunk)


def _decayed_scores(qc: torch.Tensor, kc: torch.Tensor, cumulative: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[k_i . (exp(G_i - G_s) * k_s)]`` and ``[q_i . (exp(G_i - G_s) * k_s)]`` for ``s <= i``
    (zero above the diagonal), ``[.., n, C, C]`` each.

    ``exp(G_i - G_s)`` is split at the last position ``r`` of the sub-block holding ``s``:
    ``exp(G_i - G_r) * exp(G_r - G_s)`` for rows past that block, both factors at most 1 (so a
    product of two matrices, and no overflow however strong the decay); inside a diagonal
    sub-block the decays are taken pairwise, ``[.., B, B, K]``."""
    chunk, dim = kc.shape[-2], kc.shape[-1]
    if kc.shape[-3] == 0:
        empty = kc.new_zeros(*kc.shape[:-1], chunk)
        return empty, empty.clone()
    block = BLOCK if chunk % BLOCK == 0 else chunk
    blocks = chunk // block
    positions = torch.arange(chunk, device=kc.device)
    reference = positions.view(blocks, block)[:, -1]  # the last position of each sub-block
    past = positions[None, :] > reference[:, None]  # [blocks, C]: row i lies past block j
    inside = torch.ones(block, block, dtype=torch.bool, device=kc.device).tril()
    same_block = torch.eye(blocks, dtype=kc.dtype, device=kc.device)[:, None, :, None]
    per_chunk = max(1, math.prod(kc.shape[:-3])) * chunk * block * dim
    step = max(1, BUDGET_ELEMENTS // per_chunk)
    kk_parts: list[torch.Tensor] = []
    qk_parts: list[torch.Tensor] = []
    for start in range(0, kc.shape[-3], step):
        part = slice(start, min(kc.shape[-3], start + step))
        g, k, q = cumulative[..., part, :, :], kc[..., part, :, :], qc[..., part, :, :]
        shape = g.shape[:-2]  # [.., m]
        g_ref = g[..., reference, :]  # [.., m, blocks, K]
        to_ref = (g[..., None, :, :] - g_ref[..., :, None, :]).masked_fill(~past[:, :, None], float("-inf")).exp()
        g_blocks = g.reshape(*shape, blocks, block, dim)
        k_blocks = k.reshape(*shape, blocks, block, dim)
        right = k_blocks * torch.exp(g_ref[..., :, None, :] - g_blocks)  # [.., m, blocks, B, K]
        pair = (g_blocks[..., :, None, :] - g_blocks[..., None, :, :]).masked_fill(~inside[:, :, None], float("-inf")).exp()
        k_pair = pair * k_blocks[..., None, :, :]  # [.., m, blocks, i, s, K]
        for x, parts in ((k, kk_parts), (q, qk_parts)):
            left = x[..., None, :, :] * to_ref  # [.., m, blocks, C, K]
            across = torch.einsum("...jik,...jsk->...ijs", left, right).reshape(*shape, chunk, chunk)
            diagonal = torch.einsum("...bik,...bisk->...bis", x.reshape(*shape, blocks, block, dim), k_pair)
            within = (diagonal[..., :, :, None, :] * same_block).reshape(*shape, chunk, chunk)
            parts.append(across + within)
    return torch.cat(kk_parts, dim=-3), torch.cat(qk_parts, dim=-3)


def forward(chunks: Chunks, initial_state: torch.Tensor | None = None,
            keep_states: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Run the chunks in order from ``initial_state`` (zeros if None).

    Returns ``(o [.., T, V], final state, states)``; ``states`` (with ``keep_states``) holds the
    state entering each chunk and the final one, ``[n + 1, .., K, V]``."""
    if initial_state is None:
        state = torch.zeros(*chunks.w.shape[:-3], chunks.w.shape[-1], chunks.u.shape[-1],
                            dtype=chunks.w.dtype, device=chunks.w.device)
    else:
        state = initial_state
    kept = [state] if keep_states else []
    outputs = []
    for c in range(chunks.count):
        delta = chunks.u[..., c, :, :] - chunks.w[..., c, :, :] @ state
        outputs.append(chunks.q_decayed[..., c, :, :] @ state + chunks.scores[..., c, :, :] @ delta)
        state = chunks.decay_end[..., c, :, None] * state + chunks.k_to_end[..., c, :, :].transpose(-1, -2) @ delta
        if keep_states:
            kept.append(state)
    if not outputs:
        empty = torch.zeros(*chunks.u.shape[:-3], 0, chunks.u.shape[-1], dtype=chunks.u.dtype, device=chunks.u.device)
        return empty, state, torch.stack(kept) if keep_states else None
    o = torch.cat(outputs, dim=-2)[..., : chunks.length, :]
    return o, state, torch.stack(kept) if keep_states else None


def chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            initial_state: torch.Tensor | None = None, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked form end to end: ``(o, final state)``, equal to :func:`recurrent` in exact
    arithmetic."""
    o, state, _ = forward(prepare(q, k, v, g, beta, chunk), initial_state)
    return o, state


# --------------------------------------------------------------------------------------------
# The affine chain (context parallelism)
# --------------------------------------------------------------------------------------------


def compose_transitions(transitions: torch.Tensor, precision: str) -> torch.Tensor:
    """``M_{n-1} ... M_1 M_0`` from ``[.., n, K, K]``, one product per chunk at ``precision``:
    the transition of a whole shard (left-composed, as the state meets the chunks in order)."""
    count = transitions.shape[-3]
    if count == 0:  # an empty shard leaves the state as it is
        eye = torch.eye(transitions.shape[-1], dtype=transitions.dtype, device=transitions.device)
        return eye.expand(*transitions.shape[:-3], -1, -1).clone()
    composed = transitions[..., 0, :, :]
    for c in range(1, count):
        composed = matmul(transitions[..., c, :, :], composed, precision)
    return composed


def chain(transitions: Sequence[torch.Tensor], local_states: Sequence[torch.Tensor], upto: int,
          precision: str) -> torch.Tensor:
    """The state entering shard ``upto``: ``S_in(0) = 0``, ``S_in(j+1) = M_j S_in(j) + S_j``,
    every product at ``precision``."""
    state = torch.zeros_like(local_states[0])
    for j in range(upto):
        state = matmul(transitions[j], state, precision) + local_states[j]
    return state


def segment_bounds(length: int, segments: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ``segments`` contiguous pieces of ``length`` tokens, as
    ``torch.tensor_split`` cuts them: sizes differ by at most one, earlier pieces larger. A
    piece may be empty when there are fewer tokens than pieces."""
    base, extra = divmod(length, segments)
    bounds = []
    start = 0
    for j in range(segments):
        end = start + base + (1 if j < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds
