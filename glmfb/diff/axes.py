"""Which axis of a tap indexes tokens, found from the requests themselves.

A tap's token axis is the axis whose size is each request's length (its token count; for a
packed request, its sequences' tokens together): ``[B, T, ...]``, ``[B, H, T, D]``,
``[T, ...]``, and a packed ``[total_tokens, H, D]`` alike, whatever comes before it. Across
requests of different lengths an axis that *follows* the length is the token axis; two that
both follow it (the ``[T, T]`` scores of attention) leave it ambiguous, and glmfb reads no
positions there rather than pick one. When every request has the same length, an axis can only
be matched by its size: the one axis of that size is taken, and the evidence says it was
matched by size alone; of two of that size, the one along which the requests' inputs hold their
tokens (``hint``: axis 1 of token ids ``[1, L]``, or the tensors' declared sequence axis) is
taken and the evidence says so, else they are ambiguous too.

A packed request names its sequences' offsets (``cu_seqlens``, as flash-attention's and fla's
varlen kernels take them: ``[0, 20, 150]`` is two sequences, tokens 0-19 and 20-149): its
positions are read within one sequence (:func:`segment_of`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

FOLLOWS = "follows the length"  # the axis's size is the length in requests of different lengths
SIZE = "size only"  # every request has one length: the only axis of that size
AMBIGUOUS = "ambiguous"
NONE = "none"


@dataclass(frozen=True)
class TokenAxis:
    """The token axis of one tap (``axis`` None: not found, and ``basis`` says why)."""

    tap: str
    axis: int | None
    basis: str  # FOLLOWS, SIZE, AMBIGUOUS or NONE
    shape: tuple[int, ...]  # the tap's shape in the request it is read in
    lengths: tuple[int, ...]  # the distinct request lengths it was read against, ascending
    candidates: tuple[int, ...] = ()  # axes whose size is the length in every request
    requests: int = 0  # requests the tap was read in
    hint: int | None = None  # the inputs' own sequence axis, when it broke a tie of sizes

    @property
    def found(self) -> bool:
        return self.axis is not None

    def describe(self) -> str:
        """One sentence: which axis was read as tokens and why, or why none was."""
        shape = "[" + ", ".join(map(str, self.shape)) + "]"
        lengths = ", ".join(map(str, self.lengths))
        count = f"{self.requests} request{'' if self.requests == 1 else 's'}"
        if self.basis == FOLLOWS:
            return (f"axis {self.axis} of {self.tap} {shape} is read as tokens: its size follows the length of "
                    f"{count} ({lengths})")
        if self.basis == SIZE:
            text = (f"axis {self.axis} of {self.tap} {shape} is read as tokens by its size alone: every one of "
                    f"{count} has length {lengths}, so no axis could be seen to follow the length")
            if self.hint is not None and len(self.candidates) > 1:
                return (text + f"; axes {' and '.join(map(str, self.candidates))} have that size, and axis "
                        f"{self.axis} is taken as the axis along which the requests' inputs hold their tokens")
            return text + ", and it is the only axis of that size"
        if self.basis == AMBIGUOUS:
            axes = " and ".join(map(str, self.candidates))
            how = (f"both follow the length of {count} ({lengths})" if len(self.lengths) > 1 else
                   f"both have size {lengths}, the length of every one of {count}")
            return f"no token axis read in {self.tap} {shape}: axes {axes} {how}, so neither is taken"
        if not self.lengths:
            return f"no token axis read in {self.tap} {shape}: its requests have no length"
        return (f"no token axis read in {self.tap} {shape}: no axis has the request's length in every one of "
                f"{count} ({lengths})")


def find_token_axis(tap: str, observed: Sequence[tuple[Sequence[int], int | None]],
                    hint: int | None = None) -> TokenAxis:
    """The token axis of ``tap`` from ``(shape, request length)`` of each request it was read in
    (a packed request's length is its total tokens); ``hint``: the axis along which the requests'
    inputs hold their tokens, taken only among axes that tie by size when every request has one
    length."""
    seen = [(tuple(shape), length) for shape, length in observed]
    first = seen[0][0] if seen else ()
    known = [(shape, length) for shape, length in seen if length is not None]
    lengths = tuple(sorted({length for _, length in known}))
    ranks = {len(shape) for shape, _ in known}
    base = TokenAxis(tap, None, NONE, first, lengths, (), len(known))
    if not known or len(ranks) != 1:
        return base
    rank = ranks.pop()
    candidates = tuple(axis for axis in range(rank) if all(shape[axis] == length for shape, length in known))
    if len(candidates) > 1 and len(lengths) == 1 and hint in candidates:
        return TokenAxis(tap, hint, SIZE, first, lengths, candidates, len(known), hint)
    if len(candidates) != 1:
        return TokenAxis(tap, None, AMBIGUOUS if candidates else NONE, first, lengths, candidates, len(known))
    return TokenAxis(tap, candidates[0], FOLLOWS if len(lengths) > 1 else SIZE, first, lengths, candidates, len(known))


def check_offsets(offsets: Sequence[int], length: int | None) -> str | None:
    """What is wrong with a packed request's offsets (None: nothing): integers from 0, strictly
    increasing, the last one the request's length."""
    if len(offsets) < 2 or offsets[0] != 0:
        return "must start at 0 and hold at least two offsets ([0, n])"
    if any(not isinstance(o, int) or isinstance(o, bool) for o in offsets):
        return "must hold integers"
    if any(b <= a for a, b in itertools.pairwise(offsets)):
        return "must increase strictly (no empty sequence)"
    if length is not None and offsets[-1] != length:
        return f"must end at the request's length, {length} (it ends at {offsets[-1]})"
    return None


@dataclass(frozen=True)
class Segment:
    """One sequence of a packed request: its index and its tokens ``start`` to ``end - 1``."""

    index: int
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


def segments(offsets: Sequence[int]) -> list[Segment]:
    return [Segment(i, start, end) for i, (start, end) in enumerate(itertools.pairwise(offsets))]


def segment_of(offsets: Sequence[int], failing: Sequence[int]) -> Segment:
    """The sequence a packed request's positions are read in: the one holding its first failing
    packed position (``failing``: the failing packed positions, ascending), else the longest."""
    parts = segments(offsets)
    if failing:
        first = failing[0]
        return next(p for p in parts if p.start <= first < p.end)
    return max(parts, key=lambda p: (p.length, -p.index))


class TokenAxes:
    """The token axis of each tap of a comparison, found once from every request it was read in
    (``observed``: tap name -> ``(shape, request length)`` per request; ``hint``: the axis along
    which the requests' inputs hold their tokens, see :func:`find_token_axis`)."""

    def __init__(self, observed: Mapping[str, Sequence[tuple[Sequence[int], int | None]]],
                 hint: int | None = None) -> None:
        self._observed = observed
        self._hint = hint
        self._found: dict[str, TokenAxis] = {}

    def of(self, tap: str, shape: Sequence[int] = (), length: int | None = None) -> TokenAxis:
        """``tap``'s token axis; a tap the comparison did not read is judged on ``shape`` and
        ``length`` alone (one request: by size only)."""
        if tap not in self._found:
            observed = self._observed.get(tap) or [(shape, length)]
            self._found[tap] = find_token_axis(tap, observed, self._hint)
        found = self._found[tap]
        return replace(found, shape=tuple(shape)) if shape and len(shape) == len(found.shape) else found
