"""Two captures side by side: match their taps, then compare them tensor pair by tensor pair.

Two execution paths of one model need not run the same modules (an attention implementation
that returns its weights against one that returns None, a forward that calls ``F.linear`` on a
submodule's weights so that the submodule never runs) nor produce every tap in the same dtype
(a module run in bfloat16). So taps are matched by name: the taps both sides share are
compared (in a common dtype when theirs differ: a dtype difference is a difference to measure),
and the others are listed (:class:`TreeDifferences`). Only one pair of tensors is in flight at
a time (read in chunks by :class:`PairComparer`). Captures that cannot be compared at all
(different request sets, or final outputs that share no name and shape) raise an
:class:`InputError` naming the first mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from glmfb.contract.errors import InputError
from glmfb.diff.capture import OUTPUT
from glmfb.diff.metrics import PairComparer, TensorMetrics, Tolerances
from glmfb.diff.store import CaptureReader, RequestRecord, TapRecord


@dataclass(frozen=True)
class TapResult:
    tap: TapRecord  # the baseline's record (its name, module, call, shape, dtype)
    metrics: TensorMetrics
    candidate: TapRecord | None = None  # the candidate's record of the same tap (None: the same as ``tap``)

    @property
    def other(self) -> TapRecord:
        """The candidate's record of this tap."""
        return self.candidate if self.candidate is not None else self.tap

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
    taps: tuple[TapResult, ...]  # the shared taps, in the baseline's execution order
    offsets: tuple[int, ...] | None = None  # a packed request's sequence offsets (cu_seqlens)

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


@dataclass(frozen=True)
class TapPair:
    """A tap both captures hold, by name: the two records (shapes equal, dtypes may differ)."""

    baseline: TapRecord
    candidate: TapRecord


@dataclass(frozen=True)
class TreeDifferences:
    """What the two captures do not share, over all requests: taps one side only has (by
    name, in execution order), and shared names whose shape or dtype differ."""

    baseline_only: tuple[str, ...] = ()
    candidate_only: tuple[str, ...] = ()
    baseline_only_modules: tuple[str, ...] = ()  # modules with no tap at all in the candidate
    candidate_only_modules: tuple[str, ...] = ()
    shapes: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = ()  # (tap, baseline, candidate): not compared
    dtypes: tuple[tuple[str, str, str], ...] = ()  # (tap, baseline, candidate): compared in a common dtype
    order_differs: bool = False  # the shared taps run in another order in the candidate
    shared: int = 0  # shared taps compared, summed over requests
    baseline_taps: int = 0
    candidate_taps: int = 0

    @property
    def any(self) -> bool:
        return bool(self.baseline_only or self.candidate_only or self.shapes or self.dtypes or self.order_differs)

    def modules_below(self, module: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Submodules of ``module`` that ran on one side only: (baseline only, candidate only)."""
        prefix = module + "."
        return (tuple(m for m in self.baseline_only_modules if m.startswith(prefix)),
                tuple(m for m in self.candidate_only_modules if m.startswith(prefix)))


def tap_module(tap: str) -> str:
    """The module a tap name belongs to: ``layers.0.attn#1[0]`` -> ``layers.0.attn``."""
    return tap.partition("#")[0].partition("[")[0]


def _index_ranges(indices: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 7]`` -> ``0-3, 7``."""
    ordered = sorted(set(indices))
    runs: list[list[int]] = []
    for index in ordered:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def group_names(names: Sequence[str], limit: int = 4, parent: str = "") -> str:
    """Module or tap names, with what repeats across numbered blocks said once:
    ``layers.{0..3}.self_attn.{q,k,v}_proj`` reads ``q_proj, k_proj, v_proj in 4 layers``.

    Names that differ only in their numeric path components (``layers.0``, ``layers.1``) are
    one pattern; patterns that repeat over the same indices under the same container are one
    group, named by what follows the last index (its last component where that is unambiguous).
    A name without an index, or a pattern seen once, is written out. At most ``limit`` groups
    are shown, then ``and N more`` (names). Names relative to a module (``0.mlp.up`` below
    ``layers``) give it as ``parent``: it names the container their first index is in."""
    unique = list(dict.fromkeys(names))
    patterns: dict[tuple[str, ...], list[tuple[int, ...]]] = {}
    for name in unique:
        parts = name.split(".")
        pattern = tuple("*" if part.isdigit() else part for part in parts)
        patterns.setdefault(pattern, []).append(tuple(int(part) for part in parts if part.isdigit()))
    # a group: (the pattern up to its last index, the indices) -> the tails after it
    groups: dict[tuple[tuple[str, ...], tuple[tuple[int, ...], ...]], list[tuple[str, ...]]] = {}
    order: list[tuple[str, object]] = []
    for name in unique:
        parts = name.split(".")
        pattern = tuple("*" if part.isdigit() else part for part in parts)
        indices = patterns[pattern]
        if "*" not in pattern or len(indices) < 2:
            order.append(("name", name))
            continue
        last = max(i for i, part in enumerate(pattern) if part == "*")
        key = (pattern[:last + 1], tuple(sorted(indices)))
        tail = pattern[last + 1:]
        if key not in groups:
            groups[key] = []
            order.append(("group", key))
        if tail not in groups[key]:
            groups[key].append(tail)
    tails = [tail for members in groups.values() for tail in members if tail]
    lasts = [tail[-1] for tail in tails]

    def tail_text(tail: tuple[str, ...]) -> str:
        return tail[-1] if lasts.count(tail[-1]) == 1 else ".".join(tail)

    shown: list[str] = []
    counted = 0
    for what, item in order:
        if len(shown) == limit:
            break
        if what == "name":
            assert isinstance(item, str)
            shown.append(item)
            counted += 1
            continue
        assert isinstance(item, tuple)
        prefix, indices = item
        members = groups[item]
        counted += len(members) * len(indices)
        stars = prefix.count("*")
        container = ".".join(prefix[:prefix.index("*")]) or parent
        named = [tail_text(t) for t in members if t]
        if stars == 1:
            word = container.rpartition(".")[2]
            where = f"{len(indices)} {word}" if word.endswith("s") else f"{len(indices)} of {container}"
            if any(not t for t in members):  # the numbered modules themselves
                named.insert(0, f"{container}.{_index_ranges([i[0] for i in indices])}")
                if len(named) == 1:
                    shown.append(named[0])
                    continue
        else:
            where = f"{len(indices)} places ({'.'.join(prefix)})"
            if any(not t for t in members):
                named.insert(0, ".".join(prefix))
        shown.append(f"{', '.join(named)} in {where}")
    rest = len(unique) - counted
    return ", ".join(shown) + (f" and {rest} more" if rest > 0 else "")


@dataclass
class _Gathered:
    baseline_only: dict[str, None] = field(default_factory=dict)
    candidate_only: dict[str, None] = field(default_factory=dict)
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    dtypes: dict[str, tuple[str, str]] = field(default_factory=dict)
    order_differs: bool = False
    shared: int = 0
    baseline_taps: int = 0
    candidate_taps: int = 0


def _check_request_sets(baseline: Sequence[RequestRecord], candidate: Sequence[RequestRecord],
                        labels: tuple[str, str]) -> None:
    ids_b = [r.id for r in baseline]
    ids_c = [r.id for r in candidate]
    if ids_b == ids_c:
        return
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


def match_taps(baseline: Sequence[RequestRecord], candidate: Sequence[RequestRecord],
               labels: tuple[str, str] = ("baseline", "candidate")) -> tuple[list[list[TapPair]], TreeDifferences]:
    """The taps to compare in each request (shared by name, equal shapes), and what the two
    captures do not share. Raises an :class:`InputError` when the request sets differ or a
    request's final outputs have nothing in common to compare."""
    _check_request_sets(baseline, candidate, labels)
    gathered = _Gathered()
    pairs: list[list[TapPair]] = []
    for request_b, request_c in zip(baseline, candidate, strict=False):
        by_name = {t.name: t for t in request_c.taps}
        names_b = {t.name for t in request_b.taps}
        gathered.baseline_taps += len(request_b.taps)
        gathered.candidate_taps += len(request_c.taps)
        matched: list[TapPair] = []
        first_shape: tuple[str, tuple[int, ...], tuple[int, ...]] | None = None
        for tap_b in request_b.taps:
            tap_c = by_name.get(tap_b.name)
            if tap_c is None:
                gathered.baseline_only.setdefault(tap_b.name, None)
                continue
            if tap_b.shape != tap_c.shape:
                gathered.shapes.setdefault(tap_b.name, (tap_b.shape, tap_c.shape))
                first_shape = first_shape or (tap_b.name, tap_b.shape, tap_c.shape)
                continue
            if tap_b.dtype != tap_c.dtype:
                gathered.dtypes.setdefault(tap_b.name, (tap_b.dtype, tap_c.dtype))
            matched.append(TapPair(tap_b, tap_c))
        for tap_c in request_c.taps:
            if tap_c.name not in names_b:
                gathered.candidate_only.setdefault(tap_c.name, None)
        order_c = [t.name for t in request_c.taps if t.name in names_b]
        order_b = [t.name for t in request_b.taps if t.name in by_name]
        gathered.order_differs = gathered.order_differs or order_b != order_c
        if not any(pair.baseline.module == OUTPUT for pair in matched):
            if first_shape is not None:
                name, shape_b, shape_c = first_shape
                raise InputError(
                    f"request {request_b.id!r}, tap {name!r}: shape {list(shape_b)} in the {labels[0]}, "
                    f"{list(shape_c)} in the {labels[1]}; no final output has the same name and shape on both "
                    "sides, so nothing can be compared",
                    "compare two paths that compute the same outputs",
                )
            raise InputError(
                f"request {request_b.id!r}: no final output has the same name on both sides "
                f"({', '.join(t.name for t in request_b.taps if t.module == OUTPUT) or 'none'} in the {labels[0]}, "
                f"{', '.join(t.name for t in request_c.taps if t.module == OUTPUT) or 'none'} in the {labels[1]})",
                "compare two paths that compute the same outputs",
            )
        gathered.shared += len(matched)
        pairs.append(matched)
    return pairs, _differences(baseline, candidate, gathered)


def _differences(baseline: Sequence[RequestRecord], candidate: Sequence[RequestRecord],
                 gathered: _Gathered) -> TreeDifferences:
    modules_b = {t.module for r in baseline for t in r.taps}
    modules_c = {t.module for r in candidate for t in r.taps}
    only_b = tuple(dict.fromkeys(t.module for r in baseline for t in r.taps if t.module not in modules_c))
    only_c = tuple(dict.fromkeys(t.module for r in candidate for t in r.taps if t.module not in modules_b))
    return TreeDifferences(
        baseline_only=tuple(gathered.baseline_only), candidate_only=tuple(gathered.candidate_only),
        baseline_only_modules=only_b, candidate_only_modules=only_c,
        shapes=tuple((name, b, c) for name, (b, c) in gathered.shapes.items()),
        dtypes=tuple((name, b, c) for name, (b, c) in gathered.dtypes.items()),
        order_differs=gathered.order_differs, shared=gathered.shared,
        baseline_taps=gathered.baseline_taps, candidate_taps=gathered.candidate_taps,
    )


def check_comparable(baseline: Sequence[RequestRecord], candidate: Sequence[RequestRecord],
                     labels: tuple[str, str] = ("baseline", "candidate")) -> TreeDifferences:
    """Raise an :class:`InputError` naming the first difference that prevents a comparison;
    otherwise what the two captures do not share."""
    return match_taps(baseline, candidate, labels)[1]


def compare_captures(baseline: CaptureReader, candidate: CaptureReader, tolerances: Tolerances,
                     comparer: PairComparer, progress: Callable[[str], None] | None = None) -> list[RequestResult]:
    """Metrics of every shared tap of every request, streaming one tensor pair at a time
    (:func:`compare_and_match` also returns what the captures do not share).

    Torch computes on one thread here while the comparer's reader threads (one per side) read
    ahead, mostly waiting on the disk. Torch's own intra-op threads on top of the readers
    oversubscribe small machines and, when other processes compete for the cores,
    made the pass several times slower in measurements (benchmarks/diff_throughput.py)."""
    return compare_and_match(baseline, candidate, tolerances, comparer, progress)[0]


def compare_and_match(baseline: CaptureReader, candidate: CaptureReader, tolerances: Tolerances,
                      comparer: PairComparer, progress: Callable[[str], None] | None = None,
                      ) -> tuple[list[RequestResult], TreeDifferences]:
    """:func:`compare_captures` and the :class:`TreeDifferences` of the two captures."""
    import torch

    pairs, differences = match_taps(baseline.requests, candidate.requests)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _compare_all(baseline, candidate, pairs, tolerances, comparer, progress), differences
    finally:
        torch.set_num_threads(threads)


def _compare_all(baseline: CaptureReader, candidate: CaptureReader, pairs: Sequence[Sequence[TapPair]],
                 tolerances: Tolerances, comparer: PairComparer,
                 progress: Callable[[str], None] | None) -> list[RequestResult]:
    results: list[RequestResult] = []
    for number, (request_b, matched) in enumerate(zip(baseline.requests, pairs, strict=True)):
        if progress is not None:
            progress(f"comparing request {number + 1}/{len(baseline.requests)}: {request_b.id}")
        taps: list[TapResult] = []
        for pair in matched:
            # the baseline is the reference: its dtype sets the default tolerance
            tolerance = tolerances.for_tap(pair.baseline.name, pair.baseline.dtype)
            metrics = comparer.compare_files(baseline.locate(pair.baseline), candidate.locate(pair.candidate), tolerance)
            taps.append(TapResult(pair.baseline, metrics, pair.candidate))
        results.append(RequestResult(request_b.id, request_b.length, tuple(taps), request_b.offsets))
    return results
