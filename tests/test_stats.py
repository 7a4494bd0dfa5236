from __future__ import annotations

import numpy as np
import pytest

from glmfb.core.measure.stats import (
    Decision,
    Estimate,
    benjamini_hochberg,
    block_quantile,
    decide,
    geometric_mean,
    median_ratio,
    paired_median_ratio,
)


def test_median_ratio_finds_a_planted_change() -> None:
    rng = np.random.default_rng(1)
    baseline = rng.normal(1.0, 0.02, 200)
    candidate = rng.normal(1.2, 0.02, 200)
    estimate = median_ratio(baseline, candidate)
    assert 0.17 < estimate.low <= estimate.value <= estimate.high < 0.23
    same = median_ratio(baseline, rng.normal(1.0, 0.02, 200))
    assert same.low < 0 < same.high


def test_paired_bootstrap_cancels_shared_noise() -> None:
    rng = np.random.default_rng(2)
    load = rng.uniform(1.0, 3.0, 60)  # a burst slows both sides of a round alike
    baseline = load * 1.0
    candidate = load * 1.1
    paired = paired_median_ratio(baseline, candidate)
    unpaired = median_ratio(baseline, candidate)
    assert paired.high - paired.low < unpaired.high - unpaired.low


def test_block_quantile_keeps_bursts_together() -> None:
    """A p99 driven by a few bursts (runs of late samples): resampling stretches of the series
    gives a wider, honest interval than resampling single values would; and the point is the
    nearest-rank quantile."""
    rng = np.random.default_rng(3)
    series = rng.exponential(1.0, 4000)
    for start in (500, 1700, 3100):  # three bursts of 30 late samples each
        series[start:start + 30] += 10.0
    estimate = block_quantile(series, 0.99, resamples=300)
    assert estimate.value == sorted(series)[int(np.ceil(0.99 * series.size)) - 1]
    assert estimate.low <= estimate.value <= estimate.high
    independent = block_quantile(series, 0.99, blocks=series.size, resamples=300)
    assert estimate.high - estimate.low > independent.high - independent.low
    with pytest.raises(ValueError, match="at least 2"):
        block_quantile([1.0], 0.99)


@pytest.mark.parametrize(
    ("low", "high", "decision"),
    [
        (0.06, 0.2, Decision.REGRESSION),
        (-0.2, -0.06, Decision.IMPROVEMENT),
        (-0.02, 0.03, Decision.EQUIVALENT),
        (0.01, 0.09, Decision.UNDECIDED),
        (-0.09, 0.02, Decision.UNDECIDED),
    ],
)
def test_decide_needs_the_whole_interval_past_the_threshold(
    low: float, high: float, decision: Decision
) -> None:
    assert decide(Estimate((low + high) / 2, low, high), 0.05) is decision


def test_benjamini_hochberg_step_up() -> None:
    assert benjamini_hochberg([0.01, 0.02, 0.03, 0.5], alpha=0.05) == [True, True, True, False]
    assert benjamini_hochberg([0.01, 0.04, 0.03, 0.5], alpha=0.05) == [True, False, False, False]
    # step-up: the larger p-value passing its bound carries the smaller one with it
    assert benjamini_hochberg([0.04, 0.045], alpha=0.05) == [True, True]
    assert benjamini_hochberg([0.02, 0.5], alpha=0.05) == [True, False]
    assert benjamini_hochberg([0.04, 0.5], alpha=0.05) == [False, False]
    assert benjamini_hochberg([]) == []


def test_geometric_mean_and_bad_samples() -> None:
    assert geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        geometric_mean([1.0, -1.0])
    with pytest.raises(ValueError, match="NaN"):
        median_ratio([1.0, float("nan")], [1.0, 1.0])
