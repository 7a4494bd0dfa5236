"""Why one kernel is slower: a torch.profiler pass of each side and the operator diff.

Each side runs a few calls under ``torch.profiler``; per operator we keep calls and self time
*per kernel call*. The diff ranks operators by how much of the added (or saved) time they
account for; the rules in :mod:`glmfb.bench.rules` read it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from glmfb.bench.evidence import OpRow
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
) -> list[OpRow]:
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
    rows = [
        OpRow(
            op=name,
            baseline_calls=a.calls_per_call if a else 0.0,
            candidate_calls=b.calls_per_call if b else 0.0,
            baseline_self_us=a.self_us_per_call if a else 0.0,
            candidate_self_us=b.self_us_per_call if b else 0.0,
            added_us=added,
            share=added / denominator,
            reduction=bool(REDUCTION_PATTERN.search(name)),
        )
        for name, a, b, added in raw
    ]
    rows.sort(key=lambda row: sign * row.added_us, reverse=True)
    return rows
