"""Change points in a series of runs: where a metric's level moved, by how much, how surely.

The method is E-divisive's shape as Otava runs it (binary segmentation proposes, a test with a
minimum segment length disposes, the weakest point is merged away and its neighbours re-tested),
with each run's own interval in the test and the test calibrated for the search:

1. **Candidates.** A binary segmentation (ruptures' ``Binseg``, least-squares cost: a change in
   mean, written here split for split so a run does not import ruptures and scipy) on the point values proposes every split it can make with segments of at least
   ``min_segment`` runs: more than any series holds for real.
2. **The test.** A candidate is tested between its neighbours with Welch's t statistic. A
   segment's level is the mean of its runs; the variance of that mean is the one-way
   random-effects model's, ``(tau^2 + mean(v_i)) / n``: ``v_i = (half-width / z)^2`` from
   run ``i``'s own interval, ``tau^2`` the scatter between runs beyond it (Hedges' moment
   estimator, ``max(0, s^2 - mean(v_i))``). So the variance is ``max(s^2, mean(v_i)) / n``: a
   segment of runs with wide intervals is as uncertain as its intervals say even when its
   values happen to sit close, and a run without an interval contributes its scatter only.
3. **Its p-value.** A split the search chose is the best of many, so the t distribution's
   p-value is too small (on Gaussian noise, 15% of 30-run series showed a change at 1%).
   ``calibrated`` (the default) takes E-divisive's own remedy (Matteson and James'
   permutation test): the share of random orders of the window's runs, each run keeping its
   interval, whose best admissible split scores a t at least the observed split's. That
   scan's t pools the scatter of both sides (the null is one level), so every split has the
   same degrees of freedom and the best is not an edge's three runs with a t of heavy
   tails. Otherwise the t distribution's p-value decides, as in Otava.
4. **Merging.** Otava's loop: of the candidates that fail (t p-value or permutation p-value
   above ``alpha``) drop the one of largest t p-value (the t-test ranks: the first windows
   are a few runs wide, where a permutation test has few distinct values), or, once all
   pass, the smallest relative change while it is below ``min_change``; re-test its two
   neighbours on their grown segments, and repeat.

5. **Where.** A point's split is the best of its window, and on a noisy series a neighbour
   may score almost as well. ``earliest`` and ``latest`` bound where the new segment starts:
   a residual bootstrap (each segment's level plus its own residuals drawn with replacement,
   each run keeping its interval) rescans the window 999 times, and the bounds are the
   ``confidence`` quantiles of where the best split fell. That nominal level is not the
   coverage: a bootstrap around the chosen split leans towards it. On simulated +9% steps
   (7 runs, then 8) with Gaussian noise of 2, 4 and 6% of the level, the true start lay within
   the bounds in 96, 88 and 77% of the steps found, against 95, 72 and 51% for ``index``
   alone (``tests/test_history_changepoints.py``).

The plain mean (not one weighted by ``1 / (tau^2 + v_i)``) keeps one run with a wrongly
narrow interval from carrying a segment, and its statistic is a few cumulative sums, so the
permutation test scans every split of 999 orders at once. A spike cannot become a change
point: a segment holds at least ``min_segment`` runs, and first (``despike``) a Hampel filter
gives each burst shorter than that its neighbours' level, so that a preempted run, common on a
shared machine, does not widen the segment it sits in and hide a step beside it. docs/history.md gives the measured precision and recall beside ruptures'
defaults and a per-run threshold gate.

A creep through noise makes no step the test can confirm; :func:`trend` gives the
least-squares line of a window of runs, with the same variance floor, for ``--check``
(:meth:`glmfb.workflows.history.series.Series.judge`).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

from glmfb.core.measure.tdist import t_quantile, t_two_sided_pvalue

if TYPE_CHECKING:
    import numpy as np

PERMUTATIONS = 999  # orders per permutation test: p-values down to 0.001
HAMPEL = 4.0  # robust deviations from the running median that make a run a spike


@dataclass(frozen=True)
class Observation:
    """One run of a series, in time order: the metric's point value and, when the run has
    one, its confidence interval (at ``interval_confidence`` of :func:`change_points`)."""

    value: float
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Level:
    """A segment's level: the mean of its runs, the variance of that mean (its scatter or its
    runs' own intervals, whichever is wider), the degrees of freedom behind it and the runs."""

    value: float
    variance: float
    df: float
    runs: int


@dataclass(frozen=True)
class ChangePoint:
    """A change in level at ``index``, the first observation of the new segment; ``change``
    is ``after - before`` in the metric's unit, with its interval at ``confidence``."""

    index: int
    before: float
    after: float
    change: float
    change_low: float
    change_high: float
    p_value: float
    confidence: float = 0.95
    before_runs: int = 0  # the runs of the segment before (it starts at index - before_runs)
    after_runs: int = 0  # the runs of the segment after
    earliest: int | None = None  # where the new segment starts, at ``confidence``: from earliest ...
    latest: int | None = None  # ... to latest (indices like ``index``)

    @property
    def relative_change(self) -> float | None:
        """``change / before`` (a fraction), or None when the level before is zero."""
        return self.change / abs(self.before) if self.before else None

    @property
    def relative_interval(self) -> tuple[float, float] | None:
        """The interval on the change as fractions of the level before."""
        if not self.before:
            return None
        return (self.change_low / abs(self.before), self.change_high / abs(self.before))


def run_variance(observation: Observation, interval_confidence: float = 0.95) -> float:
    """The variance of one run's value from its own interval (0 when it has none):
    ``(half-width / z)^2`` with ``z`` the normal quantile of the interval's confidence."""
    if observation.low is None or observation.high is None:
        return 0.0
    z = NormalDist().inv_cdf(0.5 + interval_confidence / 2.0)
    return ((observation.high - observation.low) / 2.0 / z) ** 2


def segment_level(observations: Sequence[Observation], interval_confidence: float = 0.95) -> Level:
    """The level of a segment and its random-effects variance (see the module's docstring)."""
    runs = len(observations)
    if runs == 0:
        raise ValueError("a segment needs at least one run")
    values = [o.value for o in observations]
    mean = math.fsum(values) / runs
    scatter = math.fsum((v - mean) ** 2 for v in values) / (runs - 1) if runs > 1 else 0.0
    own = math.fsum(run_variance(o, interval_confidence) for o in observations) / runs
    return Level(mean, max(scatter, own) / runs, max(runs - 1, 1), runs)


def _welch_df(before: Level, after: Level) -> float:
    variance = before.variance + after.variance
    terms = before.variance**2 / before.df + after.variance**2 / after.df
    return variance**2 / terms if terms > 0 else math.inf


def _t(before: Level, after: Level) -> float:
    """Welch's t of ``after - before`` (infinite for a change between exact levels)."""
    change = after.value - before.value
    variance = before.variance + after.variance
    if variance == 0.0:
        return math.copysign(math.inf, change) if change else 0.0
    return change / math.sqrt(variance)


def _scan(values: np.ndarray, own: np.ndarray, min_segment: int) -> np.ndarray:
    """``|t|`` of every admissible split (``min_segment`` runs or more a side) of each row of
    ``values`` (runs in order; ``own`` their interval variances, in the same order), from
    cumulative sums: shape (rows, splits). The scatter is pooled over both sides (the
    permutation test's null: one level, exchangeable runs), so every split's t has the same
    degrees of freedom and the scan's best is not an edge's, three runs a side with a t of
    heavy tails; each side's variance is floored by its runs' own intervals, as in
    :func:`segment_level`."""
    import numpy as np

    length = values.shape[1]
    split = np.arange(min_segment, length - min_segment + 1)
    centred = values - values.mean(axis=1, keepdims=True)

    def prefix(a: np.ndarray) -> np.ndarray:
        return np.concatenate([np.zeros((a.shape[0], 1)), np.cumsum(a, axis=1)], axis=1)

    sums, squares, owns = prefix(centred), prefix(centred**2), prefix(own)
    left_runs, right_runs = split, length - split
    left_sum, right_sum = sums[:, split], sums[:, -1:] - sums[:, split]
    left_mean, right_mean = left_sum / left_runs, right_sum / right_runs
    squared = (squares[:, split] - left_sum * left_mean
               + squares[:, -1:] - squares[:, split] - right_sum * right_mean)
    pooled = np.maximum(squared, 0.0) / max(length - 2, 1)
    left_own, right_own = owns[:, split] / left_runs, (owns[:, -1:] - owns[:, split]) / right_runs
    variance = np.maximum(pooled, left_own) / left_runs + np.maximum(pooled, right_own) / right_runs
    change = np.abs(right_mean - left_mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(variance > 0, change / np.sqrt(variance), np.where(change > 0, np.inf, 0.0))


def _permutation_p(index: int, window: Sequence[Observation], min_segment: int,
                   interval_confidence: float, seed: Sequence[int]) -> float:
    """The share of random orders of ``window`` (each run keeping its interval) whose best
    admissible split scores ``|t|`` (pooled, :func:`_scan`) at least that of the split at
    ``index`` in the observed order, counting the observed order."""
    import numpy as np

    values = np.array([o.value for o in window], dtype=np.float64)
    own = np.array([run_variance(o, interval_confidence) for o in window], dtype=np.float64)
    orders = np.random.default_rng(list(seed)).permuted(
        np.tile(np.arange(len(window)), (PERMUTATIONS + 1, 1)), axis=1)
    orders[0] = np.arange(len(window))
    t = _scan(values[orders], own[orders], min_segment)
    observed = t[0, index - min_segment]
    exceed = int(np.count_nonzero(t[1:].max(axis=1) >= observed * (1.0 - 1e-9)))
    return (1 + exceed) / (PERMUTATIONS + 1)


def _despiked(observations: Sequence[Observation], min_segment: int) -> list[Observation]:
    """The series with each burst shorter than ``min_segment`` runs replaced by its
    neighbours' level (a Hampel filter): a run more than ``HAMPEL`` robust deviations (the
    scaled median absolute deviation of all runs from their running medians) from the median
    of the ``2 min_segment - 1`` runs around it takes that median as its value and keeps its
    own interval's width. A window that wide holds a majority of any segment of
    ``min_segment`` runs, so a real level survives; a shorter burst (a preempted run, a
    spike) does not, and does not inflate the scatter of the segment it sits in."""
    values = [o.value for o in observations]
    reach = min_segment - 1
    if reach < 1 or len(values) < 3:
        return list(observations)
    medians = [statistics.median(values[max(0, i - reach):i + reach + 1]) for i in range(len(values))]
    residuals = [abs(v - m) for v, m in zip(values, medians, strict=True)]
    scale = 1.4826 * statistics.median(residuals)
    if scale == 0.0:
        return list(observations)
    despiked = []
    for o, median, residual in zip(observations, medians, residuals, strict=True):
        if residual > HAMPEL * scale:
            shift = median - o.value
            o = Observation(median, None if o.low is None else o.low + shift,
                            None if o.high is None else o.high + shift)
        despiked.append(o)
    return despiked


def _candidates(values: Sequence[float], min_segment: int) -> list[int]:
    """Every split a binary segmentation with the l2 cost makes with segments of
    ``min_segment`` runs or more (the first index of each new segment): ruptures'
    ``Binseg(model="l2", min_size=min_segment, jump=1).predict(n_bkps=len // min_segment - 1)``,
    split for split (``tests/test_history_changepoints.py`` checks it against ruptures). Written
    here: importing ruptures brings scipy, 1.5 s of every recording run's report."""
    most = len(values) // min_segment - 1
    if most < 1:
        return []
    import functools

    import numpy as np

    signal = np.asarray(values, dtype=np.float64).reshape(-1, 1)

    def cost(start: int, end: int) -> float:  # ruptures' CostL2.error
        return float(signal[start:end].var(axis=0).sum() * (end - start))

    @functools.cache
    def best_split(start: int, end: int) -> tuple[int | None, float]:  # ruptures' Binseg.single_bkp
        whole = cost(start, end)
        gains = [(whole - cost(start, split) - cost(split, end), split) for split in range(start, end)
                 if split - start >= min_segment and end - split >= min_segment]
        if not gains:
            return None, 0.0
        gain, split = max(gains)
        return split, gain

    ends = [len(values)]
    while len(ends) - 1 < most:
        split, _ = max((best_split(start, end) for start, end in zip([0, *ends], ends, strict=False)),
                       key=lambda found: found[1])
        if split is None:
            break
        ends = sorted([*ends, split])
    return [e for e in ends if e < len(values)]


@dataclass(frozen=True)
class _Test:
    start: int  # the window the point was tested in: [start, stop)
    stop: int
    before: Level
    after: Level
    t: float  # |t|
    t_p: float  # the t distribution's p-value

    @property
    def relative(self) -> float:
        """The size of the change as a fraction of the level before (inf from a zero level)."""
        change = abs(self.after.value - self.before.value)
        return change / abs(self.before.value) if self.before.value else math.inf


def change_points(
    observations: Sequence[Observation],
    *,
    min_segment: int = 3,
    alpha: float = 0.01,
    min_change: float = 0.0,
    confidence: float = 0.95,
    interval_confidence: float = 0.95,
    calibrated: bool = True,
    despike: bool = True,
    seed: int = 0,
) -> list[ChangePoint]:
    """The significant change points of a series, in order (see the module's docstring).

    ``min_segment``: the fewest runs a segment holds (a spike shorter than this is never a
    segment); ``alpha``: the significance level of each point's test; ``min_change``: the
    smallest relative change kept (a fraction of the level before, as Otava's minimum
    magnitude); ``confidence``: of the intervals on the changes; ``interval_confidence``: of
    the observations' own intervals; ``calibrated``: confirm each point with the permutation
    test (else the t distribution's p-value decides, as Otava's); ``despike``: take a burst
    shorter than ``min_segment`` runs out first (:func:`_despiked`); ``seed``: of the
    permutations (the answer is deterministic)."""
    if min_segment < 1:
        raise ValueError(f"min_segment {min_segment} must be at least 1")
    if any(not math.isfinite(o.value) for o in observations):
        raise ValueError("a value is NaN or infinite")
    observations = _despiked(observations, min_segment) if despike else list(observations)
    points = _candidates([o.value for o in observations], min_segment)
    permuted: dict[tuple[int, int, int], float] = {}

    def test(at: int) -> _Test:
        start = points[at - 1] if at > 0 else 0
        stop = points[at + 1] if at + 1 < len(points) else len(observations)
        before = segment_level(observations[start:points[at]], interval_confidence)
        after = segment_level(observations[points[at]:stop], interval_confidence)
        t = _t(before, after)
        t_p = t_two_sided_pvalue(t, _welch_df(before, after)) if math.isfinite(t) else 0.0
        return _Test(start, stop, before, after, abs(t), t_p)

    def p_value(at: int) -> float:
        """The point's calibrated p-value (its permutation test, run once per window)."""
        if not calibrated:
            return tests[at].t_p
        key = (tests[at].start, points[at], tests[at].stop)
        if key not in permuted:
            permuted[key] = _permutation_p(key[1] - key[0], observations[key[0]:key[2]],
                                           min_segment, interval_confidence, (seed, *key))
        return permuted[key]

    tests = [test(at) for at in range(len(points))]
    while points:
        # The t-test ranks (its p-values separate a real step from the noise even in the
        # small windows of the first candidates, where a permutation test has few distinct
        # values); the permutation test decides. The weakest goes: the one of largest t
        # p-value among those that fail, else the smallest change below min_change.
        failing = [at for at in range(len(points)) if tests[at].t_p > alpha or p_value(at) > alpha]
        if failing:
            weakest = max(failing, key=lambda at: (tests[at].t_p, -tests[at].t))
        else:
            weakest = min(range(len(points)), key=lambda at: tests[at].relative)
            if tests[weakest].relative >= min_change:
                break
        del points[weakest], tests[weakest]
        for at in (weakest - 1, weakest):
            if 0 <= at < len(points):
                tests[at] = test(at)
    return [_change_point(index, t, p_value(at), confidence,
                          _location(index, t, observations, min_segment, confidence, interval_confidence, seed))
            for at, (index, t) in enumerate(zip(points, tests, strict=True))]


def _location(index: int, test: _Test, observations: Sequence[Observation], min_segment: int, confidence: float,
              interval_confidence: float, seed: int) -> tuple[int, int]:
    """Where the new segment starts, at ``confidence`` (module docstring, point 5): the
    quantiles of the best split of the window over residual bootstraps of its two segments."""
    import numpy as np

    window = observations[test.start:test.stop]
    split = index - test.start
    values = np.array([o.value for o in window], dtype=np.float64)
    own = np.array([run_variance(o, interval_confidence) for o in window], dtype=np.float64)
    rng = np.random.default_rng([seed, test.start, index, test.stop])
    drawn = np.empty((PERMUTATIONS, len(window)))
    for lo, hi in ((0, split), (split, len(window))):
        level = values[lo:hi].mean()
        drawn[:, lo:hi] = level + rng.choice(values[lo:hi] - level, size=(PERMUTATIONS, hi - lo), replace=True)
    best = _scan(drawn, np.tile(own, (PERMUTATIONS, 1)), min_segment).argmax(axis=1) + min_segment + test.start
    tail = (1.0 - confidence) / 2.0
    earliest, latest = (int(v) for v in np.quantile(best, [tail, 1.0 - tail], method="inverted_cdf"))
    return min(earliest, index), max(latest, index)


def _change_point(index: int, test: _Test, p_value: float, confidence: float,
                  location: tuple[int, int] | None = None) -> ChangePoint:
    """The change point at ``index`` with a Welch interval on its change."""
    change = test.after.value - test.before.value
    variance = test.before.variance + test.after.variance
    half = t_quantile(0.5 + confidence / 2.0, _welch_df(test.before, test.after)) * math.sqrt(variance)
    earliest, latest = location if location is not None else (index, index)
    return ChangePoint(index=index, before=test.before.value, after=test.after.value, change=change,
                       change_low=change - half, change_high=change + half, p_value=p_value,
                       confidence=confidence, before_runs=test.before.runs, after_runs=test.after.runs,
                       earliest=earliest, latest=latest)


def segments(observations: Sequence[Observation], points: Sequence[ChangePoint]) -> list[tuple[int, int]]:
    """``[start, stop)`` of each segment the change points cut the series into."""
    bounds = [0, *(p.index for p in points), len(observations)]
    return [(start, stop) for start, stop in itertools.pairwise(bounds) if stop > start]


# --------------------------------------------------------------------------------------------
# A trend: the creep a step test does not see
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trend:
    """The least-squares line through a window of runs (index 0 .. runs - 1): its level at the
    window's first run (``start``), its change over the window (``change``: slope x (runs - 1))
    with the standard error of that change, and what the runs' noise was (``scatter``: the sd
    of the residuals; ``own``: the root mean of the runs' own interval variances). The
    change's variance is the random-effects one of :func:`segment_level`: the residuals'
    variance floored by the runs' own, so runs that say they are uncertain are read so."""

    runs: int
    start: float
    change: float
    se: float
    df: float
    scatter: float
    own: float

    def bound(self, confidence: float, upper: bool) -> float:
        """A one-sided bound on ``change`` at ``confidence``."""
        half = t_quantile(confidence, self.df) * self.se
        return self.change + half if upper else self.change - half


def trend(observations: Sequence[Observation], *, interval_confidence: float = 0.95, despike: bool = True,
          min_segment: int = 3) -> Trend | None:
    """The :class:`Trend` of a window of runs (in time order), None with fewer than 4 (two
    degrees of freedom). ``despike``: a burst shorter than ``min_segment`` runs takes its
    neighbours' level first (:func:`_despiked`), as for the change points."""
    runs = len(observations)
    if runs < 4:
        return None
    if any(not math.isfinite(o.value) for o in observations):
        raise ValueError("a value is NaN or infinite")
    window = _despiked(observations, min_segment) if despike else list(observations)
    xs = [float(i) for i in range(runs)]
    x_mean = (runs - 1) / 2.0
    ys = [o.value for o in window]
    y_mean = math.fsum(ys) / runs
    sxx = math.fsum((x - x_mean) ** 2 for x in xs)
    slope = math.fsum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys, strict=True)) / sxx
    start = y_mean - slope * x_mean
    residual = math.fsum((y - start - slope * x) ** 2 for x, y in zip(xs, ys, strict=True)) / (runs - 2)
    own = math.fsum(run_variance(o, interval_confidence) for o in window) / runs
    se = math.sqrt(max(residual, own) / sxx) * (runs - 1)
    return Trend(runs=runs, start=start, change=slope * (runs - 1), se=se, df=float(runs - 2),
                 scatter=math.sqrt(residual), own=math.sqrt(own))
