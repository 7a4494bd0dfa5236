"""Statistics that say what they are: bootstrap intervals, interval decisions, FDR control.

A regression needs both significance (the interval excludes the threshold) and a minimum
effect (the threshold itself); an interval that straddles the threshold is "undecided", which
a probe reports as inconclusive, never as a pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


class Decision(str, Enum):
    REGRESSION = "regression"  # interval entirely above +threshold
    IMPROVEMENT = "improvement"  # interval entirely below -threshold
    EQUIVALENT = "equivalent"  # interval entirely inside (-threshold, +threshold)
    UNDECIDED = "undecided"  # interval straddles a threshold: need more evidence


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a confidence interval (``low`` <= ``value`` <= ``high`` typically)."""

    value: float
    low: float
    high: float
    confidence: float = 0.95

    @property
    def ci(self) -> tuple[float, float]:
        return (self.low, self.high)


def decide(change: Estimate, threshold: float) -> Decision:
    """Classify a relative change (``ratio - 1``) against a symmetric threshold."""
    if change.low > threshold:
        return Decision.REGRESSION
    if change.high < -threshold:
        return Decision.IMPROVEMENT
    if -threshold < change.low and change.high < threshold:
        return Decision.EQUIVALENT
    return Decision.UNDECIDED


def _as_array(values: Sequence[float] | np.ndarray) -> np.ndarray:
    import numpy as np

    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError("need a non-empty 1-D sample")
    if not np.all(np.isfinite(array)):
        raise ValueError("sample holds NaN or Inf")
    return array


def median_ratio(
    baseline: Sequence[float] | np.ndarray,
    candidate: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """Relative change ``median(candidate) / median(baseline) - 1`` with a percentile
    bootstrap interval (each side resampled independently)."""
    import numpy as np

    a = _as_array(baseline)
    b = _as_array(candidate)
    rng = np.random.default_rng(seed)
    a_medians = np.median(a[rng.integers(0, a.size, size=(resamples, a.size))], axis=1)
    b_medians = np.median(b[rng.integers(0, b.size, size=(resamples, b.size))], axis=1)
    return _median_ratio_estimate(a, b, b_medians / a_medians - 1.0, confidence)


def paired_median_ratio(
    baseline: Sequence[float] | np.ndarray,
    candidate: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """Like :func:`median_ratio`, for samples taken in pairs (interleaved rounds): the same
    statistic, ``median(candidate) / median(baseline) - 1``, with a bootstrap that resamples
    whole rounds, so noise shared by both sides of a round (a burst of load) cancels out."""
    import numpy as np

    a = _as_array(baseline)
    b = _as_array(candidate)
    if a.size != b.size:
        raise ValueError(f"paired samples need equal sizes, got {a.size} and {b.size}")
    rng = np.random.default_rng(seed)
    rounds = rng.integers(0, a.size, size=(resamples, a.size))
    replicates = np.median(b[rounds], axis=1) / np.median(a[rounds], axis=1) - 1.0
    return _median_ratio_estimate(a, b, replicates, confidence)


def _median_ratio_estimate(
    a: np.ndarray, b: np.ndarray, replicates: np.ndarray, confidence: float
) -> Estimate:
    """``median(b) / median(a) - 1`` with the percentile interval of its bootstrap replicates."""
    import numpy as np

    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(replicates, [tail, 1.0 - tail])
    point = float(np.median(b) / np.median(a) - 1.0)
    return Estimate(point, float(low), float(high), confidence)


def block_quantile(
    values: Sequence[float] | np.ndarray,
    q: float,
    *,
    blocks: int = 40,
    confidence: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> Estimate:
    """The nearest-rank ``q`` quantile (0-1) of a time series with a block-bootstrap interval:
    the series is cut into ``blocks`` contiguous stretches, and each replicate draws as many
    stretches with replacement. Neighbouring values of a time series are not independent (one
    stall makes many late samples in a row); resampling whole stretches keeps that, where
    resampling single values would make the interval too narrow."""
    import numpy as np

    series = _as_array(values)
    count = min(blocks, series.size)
    if count < 2:
        raise ValueError("a block bootstrap needs at least 2 values")
    stretches = np.array_split(series, count)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, count, size=(resamples, count))
    replicates = np.array([np.quantile(np.concatenate([stretches[i] for i in row]), q, method="inverted_cdf")
                           for row in picks])
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(replicates, [tail, 1.0 - tail])
    point = float(np.quantile(series, q, method="inverted_cdf"))
    return Estimate(point, float(low), float(high), confidence)


def benjamini_hochberg(pvalues: Sequence[float], alpha: float = 0.05) -> list[bool]:
    """Which hypotheses are rejected at false discovery rate ``alpha`` (step-up procedure)."""
    m = len(pvalues)
    if m == 0:
        return []
    order = sorted(range(m), key=lambda i: pvalues[i])
    largest = -1
    for rank, index in enumerate(order, start=1):
        if pvalues[index] <= alpha * rank / m:
            largest = rank
    rejected = [False] * m
    for rank, index in enumerate(order, start=1):
        rejected[index] = rank <= largest
    return rejected


def geometric_mean(ratios: Sequence[float]) -> float:
    """Geometric mean of positive ratios (1.08 means 8% slower on average)."""
    if not ratios or any(r <= 0 for r in ratios):
        raise ValueError("geometric mean needs positive ratios")
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))
