"""A chunked linear attention (the shape of chunked linear-attention kernels), for the agent's
case of the diff probe: the output of each chunk is its intra-chunk term plus a cross-chunk term
read from a running state. ``make(off_by_one=True)`` is the refactor that broke it: the state
update leaves out the last token of every chunk, so the error starts at position ``chunk`` (the
first token that reads the state) and no rounding explains it."""

from __future__ import annotations

import torch
from torch import nn


class CrossChunk(nn.Module):
    """The cross-chunk term: the chunk's queries against the state of the chunks before it."""

    def forward(self, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return q @ state


class ChunkedAttention(nn.Module):
    def __init__(self, width: int, chunk: int, off_by_one: bool) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(width, width, bias=False) for _ in range(3))
        self.inter = CrossChunk()
        self.chunk, self.off_by_one = chunk, off_by_one

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x)[0], self.k(x)[0], self.v(x)[0]
        state = torch.zeros(q.shape[-1], v.shape[-1])
        outputs = []
        for start in range(0, q.shape[0], self.chunk):
            qc, kc, vc = (t[start:start + self.chunk] for t in (q, k, v))
            intra = torch.tril(qc @ kc.T) @ vc
            outputs.append(intra + self.inter(qc, state))
            end = -1 if self.off_by_one and kc.shape[0] > 1 else kc.shape[0]
            state = state + kc[:end].T @ vc[:end]
        return torch.cat(outputs)[None]


class Layer(nn.Module):
    def __init__(self, width: int, chunk: int, off_by_one: bool) -> None:
        super().__init__()
        self.attn = ChunkedAttention(width, chunk, off_by_one)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x + self.attn(x))


class Model(nn.Module):
    def __init__(self, width: int = 16, chunk: int = 64, off_by_one: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(128, width)
        self.layers = nn.ModuleList([Layer(width, chunk, off_by_one)])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids) * 0.1
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden


def make(off_by_one: bool = False) -> Model:
    return Model(off_by_one=off_by_one).eval()
