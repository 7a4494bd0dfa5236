"""Interleaved A/B measurement of two iteration callables in one process.

Both sides are built once, warmed up, then run in alternating order (A B, B A, ...) so that
drift and the bursts of noise of a shared host fall on both sides alike; the interval of the
gap (ratio of medians - 1) comes from a bootstrap over whole rounds, which keeps that pairing. After
``min_repeats`` iterations per side the interval of the gap is checked every few rounds and
the loop stops as soon as it decides; the budget and ``repeats`` bound it otherwise.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from glmfb.errors import TargetFailed
from glmfb.gap.config import GapConfig
from glmfb.stats import Decision, Estimate, decide, paired_median_ratio

CHECK_EVERY = 4  # rounds between looks at the interval
BYTES_SUFFIX = "_bytes"


@dataclass
class SideSamples:
    """Wall times and per-iteration phase dicts of one side."""

    label: str
    times_s: list[float] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)

    def record(self, elapsed_s: float, result: Any) -> None:
        self.times_s.append(elapsed_s)
        self.phases.append(phase_dict(result))


@dataclass(frozen=True)
class Measurement:
    baseline: SideSamples
    candidate: SideSamples
    estimate: Estimate
    decision: Decision
    stopped_by: str  # "decided" | "repeats" | "budget"
    elapsed_s: float


def phase_dict(result: Any) -> dict[str, float]:
    """The numeric entries of what an iteration returned (anything else is ignored)."""
    if not isinstance(result, Mapping):
        return {}
    phases: dict[str, float] = {}
    for key, value in result.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            phases[str(key)] = float(value)
    return phases


def gap_passes(estimate: Estimate, threshold: float) -> bool:
    """A gap passes when its whole interval lies below the threshold (faster is fine too)."""
    return estimate.high < threshold


def settled(estimate: Estimate, threshold: float) -> bool:
    return decide(estimate, threshold) is Decision.REGRESSION or gap_passes(estimate, threshold)


def call_side(side: str, function: Callable[[], Any], stage: str) -> tuple[float, Any]:
    started = time.perf_counter()
    try:
        result = function()
    except (Exception, SystemExit) as exc:  # a target that exits is a failed target
        raise TargetFailed(side, stage, exc) from exc
    return time.perf_counter() - started, result


def measure(
    config: GapConfig,
    baseline: Callable[[], Any],
    candidate: Callable[[], Any],
    progress: Callable[[str], None] = lambda message: None,
) -> Measurement:
    """Run both sides interleaved until the gap interval decides or the limits are reached."""
    started = time.monotonic()
    for index in range(config.warmup):
        progress(f"warm-up {index + 1}/{config.warmup}")
        call_side("baseline", baseline, f"in warm-up iteration {index + 1}")
        call_side("candidate", candidate, f"in warm-up iteration {index + 1}")
    sides = {"baseline": SideSamples("baseline"), "candidate": SideSamples("candidate")}
    functions = {"baseline": baseline, "candidate": candidate}
    stopped_by = "repeats"
    for round_index in range(config.repeats):
        order = ("baseline", "candidate") if round_index % 2 == 0 else ("candidate", "baseline")
        for side in order:
            elapsed_s, result = call_side(side, functions[side], f"in iteration {round_index + 1}")
            sides[side].record(elapsed_s, result)
        done = round_index + 1
        looks = done >= config.min_repeats and (done - config.min_repeats) % CHECK_EVERY == 0
        if looks or done == config.repeats:
            estimate = paired_median_ratio(
                sides["baseline"].times_s, sides["candidate"].times_s, confidence=config.confidence
            )
            progress(f"{done} iterations a side: gap {estimate.value:+.1%} "
                     f"[{estimate.low:+.1%}, {estimate.high:+.1%}]")
            if looks and settled(estimate, config.threshold):
                stopped_by = "decided"
                break
        if time.monotonic() - started > config.budget_s:
            stopped_by = "budget"
            break
    # Recomputed on every sample: the budget can stop the loop between two looks.
    final = paired_median_ratio(
        sides["baseline"].times_s, sides["candidate"].times_s, confidence=config.confidence
    )
    return Measurement(
        baseline=sides["baseline"],
        candidate=sides["candidate"],
        estimate=final,
        decision=decide(final, config.threshold),
        stopped_by=stopped_by,
        elapsed_s=time.monotonic() - started,
    )

