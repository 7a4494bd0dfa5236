"""Two captures side by side: check they match, then compare them tensor pair by tensor pair.

Only one pair of tensors is in flight at a time (read in chunks by :class:`PairComparer`).
Captures that cannot be compared (different request sets, taps, shapes or dtypes) raise an
:class:`InputError` naming the first mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from glmfb.diff.capture import OUTPUT
from glmfb.diff.metrics import PairComparer, TensorMetrics, Tolerances
from glmfb.diff.store import CaptureReader, RequestRecord, TapRecord
from glmfb.errors import InputError


@dataclass(frozen=True)
class TapResult:
    tap: TapRecord
    metrics: TensorMetrics

    @property
    def failed(self) -> bool:
        return self.metrics.failed

    @property
    def is_output(self) -> bool:
        return self.tap.module == OUTPUT


@dataclass(frozen=True)
class RequestResult:
    id: str
    length: int | None
    taps: tuple[TapResult, ...]  # execution order

    @property
    def failed(self) -> bool:
        return any(t.failed for t in self.taps)

    @property
    def first_divergent(self) -> TapResult | None:
        """The first tap in execution order that is outside tolerance (outputs last)."""
        inner = [t for t in self.taps if t.failed and not t.is_output]
        if inner:
            return inner[0]
        return next((t for t in self.taps if t.failed), None)

    @property
    def outputs(self) -> list[TapResult]:
        return [t for t in self.taps if t.is_output]

    @property
    def output_error(self) -> float:
        """Relative L2 error of the final outputs (the worst of them)."""
        return max((t.metrics.rel_l2 for t in self.outputs), default=0.0)

    @property
    def failing_taps(self) -> list[TapResult]:
        return [t for t in self.taps if t.failed]


def check_comparable(baseline: Sequence[RequestRecord], candidate: Sequence[RequestRecord],
                     labels: tuple[str, str] = ("baseline", "candidate")) -> None:
    """Raise an :class:`InputError` naming the first difference that prevents a comparison."""
    ids_b = [r.id for r in baseline]
    ids_c = [r.id for r in candidate]
    if ids_b != ids_c:
        for index, (rid_b, rid_c) in enumerate(zip(ids_b, ids_c, strict=False)):
            if rid_b != rid_c:
                raise InputError(
                    f"the captures hold different request sets: request #{index} is {rid_b!r} in the "
                    f"{labels[0]} and {rid_c!r} in the {labels[1]}",
                    "capture both sides with the same --requests file",
                )
        longer, shorter = (labels[0], labels[1]) if len(ids_b) > len(ids_c) else (labels[1], labels[0])
        extra = (ids_b if len(ids_b) > len(ids_c) else ids_c)[min(len(ids_b), len(ids_c))]
        raise InputError(
            f"the captures hold different request sets: request {extra!r} is in the {longer} only "
            f"({len(ids_b)} vs {len(ids_c)} requests; the {shorter} stops earlier)",
            "capture both sides with the same --requests file",
        )
    for request_b, request_c in zip(baseline, candidate, strict=False):
        names_b = [t.name for t in request_b.taps]
        names_c = [t.name for t in request_c.taps]
        if names_b != names_c:
            set_b, set_c = set(names_b), set(names_c)
            only_b = [n for n in names_b if n not in set_c]
            only_c = [n for n in names_c if n not in set_b]
            if only_b or only_c:
                side, name = (labels[0], only_b[0]) if only_b else (labels[1], only_c[0])
                raise InputError(
                    f"request {request_b.id!r}: tap {name!r} is in the {side} capture only "
                    f"({len(names_b)} vs {len(names_c)} taps)",
                    "capture both sides with the same --tap globs and model structure",
                )
            index = next(i for i, (a, b) in enumerate(zip(names_b, names_c, strict=False)) if a != b)
            raise InputError(
                f"request {request_b.id!r}: taps run in a different order: #{index} is "
                f"{names_b[index]!r} in the {labels[0]} and {names_c[index]!r} in the {labels[1]}"
            )
        for tap_b, tap_c in zip(request_b.taps, request_c.taps, strict=False):
            if tap_b.shape != tap_c.shape:
                raise InputError(
                    f"request {request_b.id!r}, tap {tap_b.name!r}: shape {list(tap_b.shape)} in the "
                    f"{labels[0]}, {list(tap_c.shape)} in the {labels[1]}"
                )
            if tap_b.dtype != tap_c.dtype:
                raise InputError(
                    f"request {request_b.id!r}, tap {tap_b.name!r}: dtype {tap_b.dtype} in the "
                    f"{labels[0]}, {tap_c.dtype} in the {labels[1]}",
                    "cast one side, or compare taps of the same dtype",
                )


def compare_captures(baseline: CaptureReader, candidate: CaptureReader, tolerances: Tolerances,
                     comparer: PairComparer, progress: Callable[[str], None] | None = None) -> list[RequestResult]:
    """Metrics of every tap of every request, streaming one tensor pair at a time.

    Torch computes on one thread here while the comparer's reader thread reads ahead: two
    busy threads for the two streams of work. Torch's own intra-op threads on top of the
    reader oversubscribe small machines and, when other processes compete for the cores,
    made the pass several times slower in measurements (benchmarks/diff_throughput.py)."""
    import torch

    check_comparable(baseline.requests, candidate.requests)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _compare_all(baseline, candidate, tolerances, comparer, progress)
    finally:
        torch.set_num_threads(threads)


def _compare_all(baseline: CaptureReader, candidate: CaptureReader, tolerances: Tolerances,
                 comparer: PairComparer, progress: Callable[[str], None] | None) -> list[RequestResult]:
    results: list[RequestResult] = []
    for number, (request_b, request_c) in enumerate(zip(baseline.requests, candidate.requests, strict=False)):
        if progress is not None:
            progress(f"comparing request {number + 1}/{len(baseline.requests)}: {request_b.id}")
        taps: list[TapResult] = []
        for tap_b, tap_c in zip(request_b.taps, request_c.taps, strict=False):
            tolerance = tolerances.for_tap(tap_b.name, tap_b.dtype)
            metrics = comparer.compare_files(baseline.locate(tap_b), candidate.locate(tap_c), tolerance)
            taps.append(TapResult(tap_b, metrics))
        results.append(RequestResult(request_b.id, request_b.length, tuple(taps)))
    return results
