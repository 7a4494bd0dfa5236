"""The smallest input that still shows the error: bisect a failing request's length.

Both sides run on prefixes of the request's tokens, with hooks only on the modules whose
taps failed on the full request; a prefix fails when any of those taps (or a final output)
is outside tolerance. Bisection assumes failures are monotone in length (true for the error
that accumulates with context); it reports every length it tried, so a reader can see
whether that held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from glmfb.diff.capture import LoadedSide, MemorySink, run_requests
from glmfb.diff.metrics import PairComparer, Tolerances
from glmfb.diff.requests import Request


@dataclass(frozen=True)
class MinimalPrefix:
    request: Request  # the prefix, as a request of its own
    original_length: int
    tried: tuple[tuple[int, bool], ...]  # (length, failed) in the order tried

    @property
    def length(self) -> int:
        return len(self.request.input_ids or ())


def prefix_fails(baseline: LoadedSide, candidate: LoadedSide, request: Request, modules: Sequence[str],
                 tolerances: Tolerances, comparer: PairComparer) -> bool:
    """Whether both sides differ beyond tolerance on ``request`` (only ``modules`` tapped)."""
    globs = list(modules) or ["\0none"]
    sides = []
    for side in (baseline, candidate):
        sink = MemorySink()
        run_requests(side, [request], globs if side.kind == "module" else [], sink)
        sides.append(sink.tensors())
    base, cand = sides
    if list(base) != list(cand):
        return True
    for name, base_tensor in base.items():
        cand_tensor = cand[name]
        if cand_tensor.shape != base_tensor.shape or cand_tensor.dtype != base_tensor.dtype:
            return True
        tolerance = tolerances.for_tap(name, str(base_tensor.dtype).removeprefix("torch."))
        if comparer.compare_tensors(base_tensor, cand_tensor, tolerance).failed:
            return True
    return False


def shortest_failing_prefix(baseline: LoadedSide, candidate: LoadedSide, request: Request,
                            modules: Sequence[str], tolerances: Tolerances, comparer: PairComparer,
                            progress: Callable[[str], None] | None = None) -> MinimalPrefix | None:
    """Bisect to the shortest prefix of ``request`` that still fails (None for requests
    without token ids). The full request is taken as failing (it did)."""
    if request.input_ids is None:
        return None
    total = len(request.input_ids)
    low, high = 1, total  # invariant: prefix(high) fails
    tried: list[tuple[int, bool]] = []
    while low < high:
        middle = (low + high) // 2
        if progress is not None:
            progress(f"minimizing {request.id}: trying length {middle} (between {low} and {high})")
        failed = prefix_fails(baseline, candidate, request.prefix(middle), modules, tolerances, comparer)
        tried.append((middle, failed))
        if failed:
            high = middle
        else:
            low = middle + 1
    return MinimalPrefix(request.prefix(high), total, tuple(tried))
