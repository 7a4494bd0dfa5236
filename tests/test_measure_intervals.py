"""The intervals of the measurement core on hand-computed and simulated data."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from glmfb.core.measure.intervals import (
    RunStatistic,
    batch_means,
    pair_interval,
    runs_interval,
    single_runs_interval,
)


def test_pair_interval_by_hand() -> None:
    # three pairs; medians 0.10, 0.12, 0.08 -> mean 0.10, sd 0.02, se 0.02/sqrt(3), df 2
    units = [[0.09, 0.10, 0.30], [0.12, 0.11, 0.13], [0.08, 0.0, 0.2]]
    interval = pair_interval(units, 0.95)
    assert interval.log_point == pytest.approx(0.10)
    assert interval.log_se == pytest.approx(0.02 / math.sqrt(3))
    assert interval.df == 2 and interval.units == 3 and interval.samples == 9
    assert interval.log_high - interval.log_point == pytest.approx(4.302653 * 0.02 / math.sqrt(3), rel=1e-5)
    estimate = interval.estimate
    assert estimate.value == pytest.approx(math.expm1(0.10))
    assert estimate.low < estimate.value < estimate.high


def test_pair_interval_needs_two_pairs_and_finite_values() -> None:
    with pytest.raises(ValueError, match="at least 2 pairs"):
        pair_interval([[0.1, 0.2], []], 0.95)
    with pytest.raises(ValueError, match="NaN"):
        pair_interval([[0.1], [math.nan]], 0.95)


def test_between_and_within_split_recovers_planted_values() -> None:
    rng = random.Random(4)
    units = []
    for _ in range(400):
        offset = rng.gauss(0.0, 0.03)  # between allocations
        units.append([offset + rng.gauss(0.0, 0.02) for _ in range(50)])  # within
    interval = pair_interval(units, 0.95)
    assert interval.within_sd == pytest.approx(0.02, rel=0.05)
    assert interval.between_sd == pytest.approx(0.03, rel=0.1)


def test_coverage_with_between_allocation_variance() -> None:
    """Over many simulated comparisons the 95% interval covers the truth about 95% of the
    time, even with 6 pairs and most of the noise between allocations."""
    rng = random.Random(7)
    truth = 0.05
    covered = 0
    trials = 1000
    for _ in range(trials):
        units = []
        for _ in range(6):
            offset = truth + rng.gauss(0.0, 0.04)
            units.append([offset + rng.gauss(0.0, 0.01) for _ in range(15)])
        interval = pair_interval(units, 0.95)
        covered += interval.log_low <= truth <= interval.log_high
    assert 0.93 <= covered / trials <= 0.97


def test_runs_interval_pooled_t() -> None:
    a, b = [0.0, 0.02, -0.02], [0.10, 0.12]
    interval = runs_interval(a, b, 0.95)
    assert interval.log_point == pytest.approx(0.11)
    pooled = math.sqrt((0.0004 + 0.0004 + 0.0001 + 0.0001) / 3)
    assert interval.between_sd == pytest.approx(pooled)
    assert interval.log_se == pytest.approx(pooled * math.sqrt(1 / 3 + 1 / 2))
    assert interval.df == 3
    with pytest.raises(ValueError):
        runs_interval([0.0], [0.1], 0.95)


def test_batch_means_keeps_drift_in_the_error() -> None:
    steady = [1e-4 * (1 + 0.001 * (i % 3)) for i in range(80)]
    drifting = [1e-4 * math.exp(0.2 * i / 80) for i in range(80)]
    assert batch_means(drifting).se > 20 * batch_means(steady).se
    stat = batch_means(steady)
    assert stat.batches == 8 and stat.df == 7 and stat.samples == 80
    assert math.exp(stat.log_value) == pytest.approx(statistics.median(steady), rel=0.01)
    with pytest.raises(ValueError):
        batch_means([1.0, 1.0, 1.0])


def test_single_runs_interval_adds_the_process_floor() -> None:
    a = RunStatistic(math.log(1e-4), 0.001, 7, 100, 8)
    b = RunStatistic(math.log(1.1e-4), 0.001, 7, 100, 8)
    without = single_runs_interval(a, b, 0.0, math.inf, 0.95)
    floor = single_runs_interval(a, b, 0.02, 14, 0.95)
    assert without.log_point == pytest.approx(math.log(1.1))
    assert floor.log_se == pytest.approx(math.sqrt(2 * 0.001**2 + 2 * 0.02**2))
    assert floor.log_high - floor.log_low > 10 * (without.log_high - without.log_low)
    assert 14 <= floor.df < 15  # the floor's df dominates


def test_an_interval_whose_end_overflows_is_unbounded_not_an_error() -> None:
    """Two allocations a side on a loaded host: one degree of freedom at a sequential look's
    level puts the upper end hundreds of units out in log space. ``glmfb bench`` broke there
    with "OverflowError: math range error" (2 of 30 runs of a real history); the end is +inf."""
    from glmfb.core.measure.intervals import Interval

    wide = Interval(log_point=-0.5, log_se=4.0, df=1.0, confidence=0.99687, units=2, samples=9, method="pairs")
    assert wide.log_high > 709  # past what math.expm1 can return
    estimate = wide.estimate
    assert estimate.high == math.inf and estimate.low >= -1.0 and math.isfinite(estimate.value)
