"""The smallest input that still shows the error: bisect a failing request's length.

Both sides run on shortened requests (:meth:`Request.shrink`: the same form as the original,
so a target that reads ``req["length"]`` still gets one), with hooks only on the modules whose
taps failed on the full request; a shortened request fails when any of those taps (or a final
output) that both sides produce is outside tolerance. Bisection assumes failures are monotone in
length (true for the error that accumulates with context, or that starts at a position); it
reports every length it tried, so a reader can see whether that held.

A minimizer that cannot run (a request that cannot be shortened in its form, a target that
raises on a shorter request) leaves the diff's verdict as it was and says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from glmfb.contract.errors import TargetFailed
from glmfb.diff.capture import LoadedSide, MemorySink, run_requests
from glmfb.diff.metrics import PairComparer, Tolerances
from glmfb.diff.requests import NotShrinkable, Request


@dataclass(frozen=True)
class MinimalPrefix:
    request: Request  # the shortened request, as a request of its own
    original_length: int
    tried: tuple[tuple[int, bool], ...]  # (length, failed) in the order tried
    length: int


@dataclass(frozen=True)
class Minimized:
    """What the minimizer found (``prefix``), or why it stopped (``note``), with every length tried."""

    prefix: MinimalPrefix | None
    note: str | None = None
    tried: tuple[tuple[int, bool], ...] = ()


def prefix_fails(baseline: LoadedSide, candidate: LoadedSide, request: Request, modules: Sequence[str],
                 tolerances: Tolerances, comparer: PairComparer) -> bool:
    """Whether both sides differ beyond tolerance on ``request`` (only ``modules`` tapped; taps
    one side lacks are not compared)."""
    globs = list(modules) or ["\0none"]
    sides = []
    for side in (baseline, candidate):
        sink = MemorySink()
        run_requests(side, [request], globs if side.kind == "module" else [], sink)
        sides.append(sink.tensors())
    base, cand = sides
    for name, base_tensor in base.items():
        cand_tensor = cand.get(name)
        if cand_tensor is None or cand_tensor.shape != base_tensor.shape:
            continue
        tolerance = tolerances.for_tap(name, str(base_tensor.dtype).removeprefix("torch."))
        if comparer.compare_tensors(base_tensor, cand_tensor, tolerance).failed:
            return True
    return False


def declared_axes(side: LoadedSide) -> Mapping[str, int] | int | None:
    """The sequence axis a target declares for named tensors (``glmfb_sequence_axis``)."""
    value = getattr(side.obj, "glmfb_sequence_axis", None)
    if isinstance(value, (int, Mapping)) and not isinstance(value, bool):
        return value
    return None


def shortest_failing_prefix(baseline: LoadedSide, candidate: LoadedSide, request: Request,
                            modules: Sequence[str], tolerances: Tolerances, comparer: PairComparer,
                            progress: Callable[[str], None] | None = None) -> Minimized:
    """Bisect to the shortest form of ``request`` that still fails. The full request is taken
    as failing (it did)."""
    declared = declared_axes(candidate) or declared_axes(baseline)
    try:
        total = request.shrinkable_length(declared)
    except NotShrinkable as exc:
        return Minimized(None, f"{exc.message}; {exc.hint}" if exc.hint else exc.message)
    low, high = 1, total  # invariant: the request at length ``high`` fails
    tried: list[tuple[int, bool]] = []
    while low < high:
        middle = (low + high) // 2
        if progress is not None:
            progress(f"minimizing {request.id}: trying length {middle} (between {low} and {high})")
        try:
            shorter = request.shrink(middle, declared)
            failed = prefix_fails(baseline, candidate, shorter, modules, tolerances, comparer)
        except NotShrinkable as exc:
            return Minimized(None, exc.message, tuple(tried))
        except TargetFailed as exc:
            return Minimized(None, f"the {exc.side} raised on the request shortened to length {middle} "
                                   f"({exc.error_line[:200]}), so the minimizer "
                                   "stopped; the failure on the full request stands", tuple(tried))
        tried.append((middle, failed))
        if failed:
            high = middle
        else:
            low = middle + 1
    shortest = request.shrink(high, declared) if high < total else request
    return Minimized(MinimalPrefix(shortest, total, tuple(tried), high), None, tuple(tried))
