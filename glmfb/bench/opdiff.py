"""Why one kernel is slower: a torch.profiler pass of each side and the operator diff.

Each side runs a few calls under ``torch.profiler``; per operator we keep calls and self time
*per kernel call*. The diff ranks operators by how much of the added (or saved) time they
account for, and says how much more often they were called ("aten::mean called 4x as often,
+31% of the added time"). :func:`explain` holds the diagnosis rules in one place.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from glmfb.bench.timers import Kernel

# Operators that reduce along a dimension: repeating them is the signature of recomputation.
REDUCTION_PATTERN = re.compile(
    r"(mean|sum|norm|var|std|amax|amin|max|min|softmax|logsumexp|prod|argmax|argmin|cumsum|"
    r"reduce|all_reduce|topk|sort)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class OpStats:
    name: str
    calls_per_call: float  # operator calls per kernel call
    self_us_per_call: float  # operator self time per kernel call (CPU, or device on CUDA)


@dataclass(frozen=True)
class OpDelta:
    name: str
    baseline: OpStats | None
    candidate: OpStats | None
    added_us: float  # candidate - baseline self time per kernel call
    share: float  # of the total added (or saved) time

    @property
    def count_ratio(self) -> float:
        base = self.baseline.calls_per_call if self.baseline else 0.0
        cand = self.candidate.calls_per_call if self.candidate else 0.0
        if base == 0:
            return math.inf if cand > 0 else 1.0
        return cand / base

    @property
    def is_reduction(self) -> bool:
        return bool(REDUCTION_PATTERN.search(self.name))

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.name,
            "baseline_calls": self.baseline.calls_per_call if self.baseline else 0.0,
            "candidate_calls": self.candidate.calls_per_call if self.candidate else 0.0,
            "baseline_self_us": self.baseline.self_us_per_call if self.baseline else 0.0,
            "candidate_self_us": self.candidate.self_us_per_call if self.candidate else 0.0,
            "added_us": self.added_us,
            "share": self.share,
            "reduction": self.is_reduction,
        }


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 while the profiler starts and stops: its native library
    prints trace lines there that would clutter the CLI's output."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _profile_once(kernels: Sequence[Kernel], calls: int, device: str) -> dict[str, OpStats]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with _quiet_stderr(), profile(activities=activities) as prof:
        for index in range(calls):
            kernels[index % len(kernels)]()
        if device == "cuda":
            torch.cuda.synchronize()
    stats: dict[str, OpStats] = {}
    for event in prof.key_averages():
        name = str(event.key)
        if name.startswith("ProfilerStep") or name.startswith("[memory]"):
            continue
        if device == "cuda":
            self_us = float(getattr(event, "self_device_time_total", 0.0) or 0.0)
            if self_us == 0.0:
                self_us = float(getattr(event, "self_cpu_time_total", 0.0))
        else:
            self_us = float(getattr(event, "self_cpu_time_total", 0.0))
        stats[name] = OpStats(name, event.count / calls, self_us / calls)
    return stats


def profile_pair(
    baseline: Sequence[Kernel], candidate: Sequence[Kernel], calls: int, device: str, rounds: int = 5
) -> tuple[dict[str, OpStats], dict[str, OpStats]]:
    """Profile both sides in alternating rounds; per operator keep the calls per kernel call
    (deterministic) and the *smallest* self time per call over the rounds, so a preemption
    during one round (noise only adds time) does not rewrite the diff."""
    per_round = max(2, calls // rounds)
    merged: tuple[dict[str, OpStats], dict[str, OpStats]] = ({}, {})
    for _ in range(rounds):
        for side, kernels in enumerate((baseline, candidate)):
            for name, stats in _profile_once(kernels, per_round, device).items():
                seen = merged[side].get(name)
                if seen is None or stats.self_us_per_call < seen.self_us_per_call:
                    merged[side][name] = stats
    return merged


def diff_ops(
    baseline: dict[str, OpStats], candidate: dict[str, OpStats], slower: bool | None = None
) -> list[OpDelta]:
    """Operators ordered by their part of the change in self time, largest first.

    ``slower`` is the direction the timing measurement established; the profile's own net
    change decides it only when it is not given (a noisy profile must not flip the story)."""
    names = set(baseline) | set(candidate)
    raw = []
    for name in names:
        a, b = baseline.get(name), candidate.get(name)
        added = (b.self_us_per_call if b else 0.0) - (a.self_us_per_call if a else 0.0)
        raw.append((name, a, b, added))
    net = sum(item[3] for item in raw)
    sign = (1.0 if net >= 0 else -1.0) if slower is None else (1.0 if slower else -1.0)
    # Share of the added time (all increases) when the candidate is slower, of the saved time
    # (all decreases) when it is faster; shares of the same sign sum to 1.
    denominator = sum(item[3] for item in raw if item[3] * sign > 0) or sign
    deltas = [OpDelta(name, a, b, added, added / denominator) for name, a, b, added in raw]
    deltas.sort(key=lambda d: sign * d.added_us, reverse=True)
    return deltas


def _times(ratio: float) -> str:
    if math.isinf(ratio):
        return "only in the candidate"
    if ratio >= 1:
        return f"{ratio:.3g}x as often"
    return f"{1 / ratio:.3g}x less often" if ratio > 0 else "no longer"


def describe_delta(delta: OpDelta, slower: bool) -> str:
    """``aten::mean called 4x as often (4 vs 1 per call), +31% of the added time``."""
    base = delta.baseline.calls_per_call if delta.baseline else 0.0
    cand = delta.candidate.calls_per_call if delta.candidate else 0.0
    what = "added" if slower else "saved"
    if abs(delta.count_ratio - 1.0) < 0.05:
        calls = f"called as often ({cand:.3g} per call), {abs(delta.added_us):.3g} µs more self time" if (
            delta.added_us > 0
        ) else f"called as often ({cand:.3g} per call), {abs(delta.added_us):.3g} µs less self time"
    else:
        calls = f"called {_times(delta.count_ratio)} ({cand:.3g} vs {base:.3g} per call)"
    share = f"{delta.share:+.0%}" if slower else f"{delta.share:.0%}"
    return f"{delta.name} {calls}, {share} of the {what} time"


@dataclass(frozen=True)
class Explanation:
    """What the operator diff says: one clause for the why, the rule that fired, next steps."""

    clause: str
    rule: str | None
    repeated_reductions: tuple[str, ...]
    next: tuple[str, ...]


def explain(deltas: Sequence[OpDelta], slower: bool, top: int = 3) -> Explanation:
    """Diagnosis rules over the operator diff (kept here, in one place):

    - *redundant recomputation*: most of the added time is in operators called k>1 times as
      often, and reductions are among them (the same norm or statistic computed k times:
      CONTEXT.md bug 3);
    - *redundant work*: most of the added time is in operators called more often, no reduction;
    - *slower operator*: the same operators, called as often, each take longer (a different
      algorithm, layout or dtype path).

    For a faster candidate the same rules read in reverse ("fewer repeated reductions").
    """
    contributors = [d for d in deltas if d.share > 0.05][:top] or list(deltas[:1])
    if not contributors:
        return Explanation("the profiler saw no operators", None, (), ())
    clause = "; ".join(describe_delta(d, slower) for d in contributors)

    def repeated(d: OpDelta) -> bool:
        if slower:
            return d.added_us > 0 and d.count_ratio > 1.5
        return d.added_us < 0 and d.count_ratio < 1 / 1.5

    more_often = [d for d in deltas if repeated(d)]
    repeated_share = sum(d.share for d in more_often)
    reductions = tuple(d.name for d in more_often if d.is_reduction)
    factors = sorted(d.count_ratio if slower else 1 / d.count_ratio
                     for d in more_often if d.is_reduction and d.count_ratio > 0)
    factor = factors[len(factors) // 2] if factors else math.nan
    factor_text = f"{factor:.3g}x" if math.isfinite(factor) else "several times"
    listed = ", ".join(reductions[:4])
    if slower and reductions and repeated_share > 0.5:
        return Explanation(
            f"{clause}; the reductions {listed} also run {factor_text} as often: the same "
            f"reductions are recomputed {factor_text} per call (redundant recomputation)",
            "redundant-recomputation",
            reductions,
            (
                "compute each reduction once and reuse it (one block per row, keep intermediates "
                "in registers, a warp-level reduction instead of recomputing per tile)",
            ),
        )
    if not slower and reductions and repeated_share > 0.5:
        return Explanation(
            f"{clause}; the reductions {listed} run {factor_text} less often: repeated reductions "
            "removed",
            "recomputation-removed",
            reductions,
            (),
        )
    if slower and repeated_share > 0.5:
        return Explanation(
            f"{clause}: more operator calls for the same result (redundant work)",
            "redundant-work",
            (),
            ("look for work repeated per tile, per head or per step that could be hoisted",),
        )
    if slower:
        return Explanation(
            f"{clause}: the same operators take longer per call",
            "slower-operator",
            (),
            ("compare the operators' input layouts, dtypes and dispatch paths (torch.profiler with "
             "record_shapes=True)",),
        )
    return Explanation(clause, None, (), ())
