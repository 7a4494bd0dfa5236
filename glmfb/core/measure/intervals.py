"""Intervals for a relative change in time per call, on the log scale, with Student's t.

Every comparison here has the same shape: the change is ``exp(theta) - 1`` where ``theta`` is
a difference of log times, estimated from a few *independent units* (allocation pairs in one
process, or separate runs of a benchmark), each of which may hold many correlated samples.

**Why a t interval over units, not a bootstrap over samples.** Timing noise has two levels:
samples within one allocation (or run) share its luck (where the buffers landed, the code
layout of that process), so they are not independent; only the units are. An interval that
resamples samples within one allocation per side is tight around the wrong value (identical
code read +8% [+8.05, +8.09]). The honest interval treats the unit as the replicate. Taking
one robust statistic per unit (the median of its block log-ratios) and a t interval across
units is the summary-statistics form of the one-way random-effects model
``m_j = theta + u_j + e_j`` (``u_j`` between allocations, ``e_j`` the unit's own sampling
error): the sample variance of the ``m_j`` estimates ``var(u) + var(e)/n`` directly, whatever
the split, so the interval is exact for normal unit statistics in a balanced design and
needs no estimate of the split. It is used in preference to a hierarchical bootstrap
(resample units, then blocks within them) because glmfb has few units (6 to 24 pairs, 2 to 5
runs) and decides at corrected levels (99% and beyond): a bootstrap over K clusters
understates the variance by (K-1)/K and uses normal-like tails, which at K = 6 and a 99.4%
level gives an interval about 40% too narrow, whereas the t quantile with K-1 degrees of
freedom is exact for the model. The between/within split is still estimated, for the
evidence (how much of the noise lives between allocations).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from glmfb.core.measure.stats import Estimate
from glmfb.core.measure.tdist import t_quantile, t_two_sided_pvalue

# Variance of a sample median of n normal values is about (pi / 2) sigma^2 / n.
MEDIAN_EFFICIENCY = math.pi / 2.0



def relative_change(log_ratio: float) -> float:
    """``exp(log_ratio) - 1``, and +inf where that overflows: an interval's end with one or two
    degrees of freedom (two allocations a side on a loaded host) can lie hundreds of units out
    in log space, and an unbounded end is what it says, not an error."""
    try:
        return math.expm1(log_ratio)
    except OverflowError:
        return math.inf

@dataclass(frozen=True)
class Interval:
    """``theta`` (a log ratio, candidate over baseline) with a t interval.

    ``units`` independent units stand behind it (allocation pairs or runs), ``samples`` the
    blocks or samples they hold. ``between_sd`` / ``within_sd`` split the noise (log scale,
    roughly a fraction): between units (allocations, processes) and within one unit.
    """

    log_point: float
    log_se: float
    df: float
    confidence: float
    units: int
    samples: int
    method: str
    between_sd: float | None = None
    within_sd: float | None = None

    @property
    def quantile(self) -> float:
        if self.log_se == 0.0:
            return 0.0
        return t_quantile(1.0 - (1.0 - self.confidence) / 2.0, self.df)

    @property
    def log_low(self) -> float:
        return self.log_point - self.quantile * self.log_se

    @property
    def log_high(self) -> float:
        return self.log_point + self.quantile * self.log_se

    @property
    def estimate(self) -> Estimate:
        """The relative change ``candidate / baseline - 1`` with its interval."""
        return Estimate(relative_change(self.log_point), relative_change(self.log_low),
                        relative_change(self.log_high), self.confidence)

    @property
    def pvalue(self) -> float:
        """Two-sided p-value for "no change" (not adjusted for looks)."""
        if self.log_se == 0.0:
            return 0.0 if self.log_point != 0.0 else 1.0
        return t_two_sided_pvalue(self.log_point / self.log_se, self.df)

    def at(self, confidence: float) -> Interval:
        """The same estimate at another confidence level."""
        return replace(self, confidence=confidence)


def _check_logs(values: Sequence[float], what: str) -> None:
    for value in values:
        if not math.isfinite(value):
            raise ValueError(f"{what} holds NaN or Inf")


def _robust_within_sd(units: Sequence[Sequence[float]]) -> float | None:
    """The sd of block effects within a pair, from the median absolute deviation (1.4826 MAD,
    pooled over pairs): a burst that hits a few blocks does not inflate it, as it does not
    move the pair's median."""
    deviations = [abs(x - statistics.median(unit)) for unit in units if len(unit) >= 3 for x in unit]
    if not deviations:
        return None
    return 1.4826 * statistics.median(deviations)


def pair_interval(effects_by_unit: Sequence[Sequence[float]], confidence: float) -> Interval:
    """The random-effects interval of paired block effects (``log(B / A)`` per block),
    grouped by allocation pair: the mean over pairs of each pair's median block effect,
    with a t interval on K-1 degrees of freedom (K pairs with at least one block each)."""
    units = [list(unit) for unit in effects_by_unit if len(unit) > 0]
    if len(units) < 2:
        raise ValueError("an interval over allocation pairs needs at least 2 pairs with data")
    for unit in units:
        _check_logs(unit, "block effects")
    medians = [statistics.median(unit) for unit in units]
    k = len(medians)
    point = statistics.fmean(medians)
    spread = statistics.stdev(medians)
    within_sd = _robust_within_sd(units)
    between_sd: float | None = None
    if within_sd is not None:
        own = statistics.fmean(MEDIAN_EFFICIENCY * within_sd**2 / len(unit) for unit in units)
        between_sd = math.sqrt(max(0.0, spread**2 - own))
    return Interval(
        log_point=point, log_se=spread / math.sqrt(k), df=k - 1, confidence=confidence, units=k,
        samples=sum(len(unit) for unit in units),
        method="mean over allocation pairs of the median block log-ratio, t interval on pairs",
        between_sd=between_sd, within_sd=within_sd,
    )


def runs_interval(
    baseline: Sequence[float], candidate: Sequence[float], confidence: float,
    samples: int = 0,
) -> Interval:
    """Two groups of independent unit statistics (log times: one per run or allocation),
    pooled-variance two-sample t: ``mean(candidate) - mean(baseline)`` on
    ``len(a) + len(b) - 2`` degrees of freedom. The spread between units carries every source
    of noise they differ by (processes, allocations, host load), which is the point."""
    a, b = list(baseline), list(candidate)
    _check_logs(a + b, "run statistics")
    if not a or not b or len(a) + len(b) < 3:
        raise ValueError("a comparison of runs needs at least one run a side and 3 in all")
    df = len(a) + len(b) - 2
    squares = sum((x - statistics.fmean(a)) ** 2 for x in a) + sum((x - statistics.fmean(b)) ** 2 for x in b)
    pooled_sd = math.sqrt(squares / df)
    return Interval(
        log_point=statistics.fmean(b) - statistics.fmean(a),
        log_se=pooled_sd * math.sqrt(1.0 / len(a) + 1.0 / len(b)), df=df, confidence=confidence,
        units=len(a) + len(b), samples=samples,
        method="difference of mean log medians of independent runs, pooled two-sample t",
        between_sd=pooled_sd,
    )


@dataclass(frozen=True)
class RunStatistic:
    """One run's log time per call, its standard error from batch means, and their df."""

    log_value: float
    se: float
    df: float
    samples: int
    batches: int


def batch_means(times_s: Sequence[float], batches: int = 8) -> RunStatistic:
    """A run's statistic from its samples in the order they were taken: split them into
    ``batches`` consecutive batches, take each batch's median log time; the run's value is
    their mean and its standard error their spread over sqrt(batches). Consecutive batches
    keep the slow drift and the seconds-long bursts of a shared host in the error, which a
    resampling of the samples as if independent would average away."""
    values = [math.log(t) for t in times_s]
    _check_logs(values, "samples")
    count = min(batches, len(values) // 2)
    if count < 2:
        raise ValueError("batch means need at least 4 samples")
    size = len(values) / count
    medians = [statistics.median(values[round(i * size):round((i + 1) * size)]) for i in range(count)]
    return RunStatistic(statistics.fmean(medians), statistics.stdev(medians) / math.sqrt(count),
                        count - 1, len(values), count)


def time_interval(samples_s: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float] | None:
    """One run's own time from its samples in the order they were taken, with its interval,
    ``(value, low, high)`` seconds: the :func:`batch_means` statistic with its t interval, as
    the history's change points read one run (bench's time per call, gap's time per
    iteration). None with fewer than 4 usable samples."""
    from glmfb.core.measure.tdist import t_quantile

    usable = [s for s in samples_s if math.isfinite(s) and s > 0]
    if len(usable) < 4:
        return None
    run = batch_means(usable)
    half = t_quantile(0.5 + confidence / 2, run.df) * run.se
    return math.exp(run.log_value), math.exp(run.log_value - half), math.exp(run.log_value + half)


def processes_interval(values_s: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float] | None:
    """A run's own time over several fresh processes, each contributing its own time
    (:func:`time_interval`'s value): the geometric mean, with the t interval of their log
    spread (k - 1 degrees of freedom). A process's memory layout moves a time by more than its
    samples scatter, so the processes are the run's independent units. None below 2."""
    from glmfb.core.measure.tdist import t_quantile

    logs = [math.log(v) for v in values_s if math.isfinite(v) and v > 0]
    if len(logs) < 2:
        return None
    mean = statistics.fmean(logs)
    half = t_quantile(0.5 + confidence / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def single_runs_interval(
    baseline: RunStatistic, candidate: RunStatistic, process_sd: float, process_df: float,
    confidence: float,
) -> Interval:
    """One run a side: each run's own batch-means error plus, for each side, the variance
    between processes measured on this machine (``process_sd`` with ``process_df``), combined
    with Welch-Satterthwaite degrees of freedom."""
    process_var = 2.0 * process_sd**2
    variance = baseline.se**2 + candidate.se**2 + process_var
    if variance == 0.0:
        df = math.inf
    else:
        terms = baseline.se**4 / baseline.df + candidate.se**4 / candidate.df
        if process_var > 0:
            terms += process_var**2 / process_df
        df = variance**2 / terms if terms > 0 else math.inf
    return Interval(
        log_point=candidate.log_value - baseline.log_value, log_se=math.sqrt(variance),
        df=min(df, 1e6), confidence=confidence, units=2, samples=baseline.samples + candidate.samples,
        method="one run a side: batch-means error of each run plus the between-process floor, "
               "Welch-Satterthwaite t",
        between_sd=process_sd,
        within_sd=math.sqrt((baseline.se**2 + candidate.se**2) / 2.0),
    )
