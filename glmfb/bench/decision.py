"""Statistics of one bench comparison, on top of :mod:`glmfb.core.measure`.

In process the estimator is the **mean over allocation pairs of each pair's median block
log-ratio** ``log(candidate / baseline)``, reported as ``exp(.) - 1``, with a t interval over
the pairs (:func:`glmfb.core.measure.intervals.pair_interval`, a random-effects interval: the
pairs are independent allocations, the blocks within a pair are not). A block's time per
side is the faster of its two samples. Sequential looks spend alpha over a fixed schedule
(:mod:`glmfb.core.measure.sequential`).

Saved files (other processes) are compared by :func:`saved_change`: with several runs a
side, a two-sample t over the runs' statistics; with one run a side, each run's batch-means
error plus the between-process floor measured on this machine (:mod:`glmfb.core.measure.floor`).

:func:`combine` carries the decisions across shapes (Benjamini-Hochberg on look-adjusted
p-values) and the geometric mean of the changes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from glmfb.core.measure.intervals import (
    Interval,
    RunStatistic,
    batch_means,
    relative_change,
    runs_interval,
    single_runs_interval,
)
from glmfb.core.measure.sequential import LookPlan, bonferroni_pvalue
from glmfb.core.measure.sequential import decide_with_floor as _decide_with_floor
from glmfb.core.measure.stats import Decision, Estimate, benjamini_hochberg

if TYPE_CHECKING:
    import numpy as np

RESAMPLES = 2000
PLAN = LookPlan()
MAX_LOOKS = PLAN.looks
# The level of the last planned look when no look was skipped: what the geomean is shown at.
LOOK_CONFIDENCE = round(PLAN.levels()[-1], 4)
STATISTIC = (
    "mean over independent allocation pairs of the median paired ABBA block log-ratio (each "
    "side's faster sample per block), t interval over pairs (random effects), alpha spent "
    "over sequential looks"
)


@dataclass(frozen=True)
class Change:
    """A relative change (``candidate / baseline - 1``) with its interval."""

    estimate: Estimate
    pvalue: float  # two-sided, for "no change", adjusted for the look it was made at
    log_replicates: np.ndarray  # draws of log(ratio) from its sampling distribution, for the geomean
    samples: int  # blocks (in process) or samples (saved)
    spread: float  # standard error of log(ratio)
    interval: Interval | None = None

    @property
    def ratio(self) -> float:
        return 1.0 + self.estimate.value


def _t_draws(point: float, se: float, df: float, resamples: int, seed: int) -> np.ndarray:
    import numpy as np

    rng = np.random.default_rng(seed)
    if se == 0.0:
        return np.full(resamples, point)
    if math.isfinite(df) and df < 1e5:
        return point + se * rng.standard_t(df, resamples)
    return point + se * rng.standard_normal(resamples)


def change_from_interval(
    interval: Interval, *, alpha: float = PLAN.alpha, resamples: int = RESAMPLES, seed: int = 0
) -> Change:
    """A :class:`Change` from a :class:`~glmfb.core.measure.intervals.Interval` at its level; the
    p-value is put on the overall scale of ``alpha`` (Bonferroni for the look's share)."""
    return Change(
        estimate=interval.estimate,
        pvalue=bonferroni_pvalue(interval.pvalue, interval.confidence, alpha),
        log_replicates=_t_draws(interval.log_point, interval.log_se, interval.df, resamples, seed),
        samples=interval.samples,
        spread=interval.log_se,
        interval=interval,
    )


def normal_change(
    ratio: float, relative_se: float, samples: int, *, confidence: float = 0.95,
    resamples: int = RESAMPLES, seed: int = 0,
) -> Change:
    """A change known only by its ratio and standard error (summaries without raw data)."""
    interval = Interval(math.log(ratio), relative_se, math.inf, confidence, 2, samples,
                        "ratio and standard error only, normal interval")
    return change_from_interval(interval, alpha=1.0 - confidence, resamples=resamples, seed=seed)


def decide_with_floor(change: Change, threshold: float, noise_floor: float) -> Decision:
    """:func:`glmfb.core.measure.sequential.decide_with_floor` on a :class:`Change`."""
    return _decide_with_floor(change.estimate, threshold, noise_floor)


def noise_floor(aa: Change) -> float:
    """The change the harness reads between the baseline and itself (A/A pairs), in magnitude.

    Identical sides should read 0; what independent A/A allocation pairs read instead is not
    an effect of the candidate, so a regression or improvement must exceed it. Its interval
    is not used as the floor: the A/B interval already carries the sampling noise.
    """
    return abs(aa.estimate.value)


def aa_biased(aa: Change) -> bool:
    """Whether the A/A interval excludes 0: the harness itself sees a difference."""
    return aa.estimate.low > 0 or aa.estimate.high < 0


def samples_needed(change: Change, threshold: float) -> float:
    """Roughly how many samples (blocks, at the same blocks per allocation pair, so as many
    more pairs) would make the interval clear the nearest threshold (``inf`` when the
    estimate sits on a threshold)."""
    point = math.log1p(change.estimate.value)
    half_width = (math.log1p(change.estimate.high) - math.log1p(change.estimate.low)) / 2.0
    upper, lower = math.log1p(threshold), math.log1p(-threshold) if threshold < 1 else -math.inf
    if point >= upper:
        room = point - upper
    elif point <= lower:
        room = lower - point
    else:
        room = min(upper - point, point - lower)
    if room <= 1e-4 or half_width <= 0:
        return math.inf
    return change.samples * (half_width / room) ** 2


def pairs_needed(change: Change, threshold: float) -> float:
    """Like :func:`samples_needed`, in allocation pairs (``inf`` when undecidable)."""
    if change.interval is None or change.samples <= 0:
        return math.inf
    return samples_needed(change, threshold) * change.interval.units / change.samples


@dataclass(frozen=True)
class Combined:
    """Across shapes: which shape decisions survive Benjamini-Hochberg, and the geomean."""

    decisions: tuple[Decision, ...]
    significant: tuple[bool, ...]
    geomean: Estimate


def combine(
    changes: Sequence[Change], decisions: Sequence[Decision], *, alpha: float = 0.05,
    confidence: float = 0.95,
) -> Combined:
    """A regression or improvement on a shape stands only if its "no change" hypothesis is
    rejected by Benjamini-Hochberg at ``alpha`` across all shapes; the geometric mean of the
    ratios gets its interval from the shapes' draws, combined by index (shapes independent)."""
    import numpy as np

    significant = benjamini_hochberg([c.pvalue for c in changes], alpha)
    final = tuple(
        Decision.UNDECIDED
        if d in (Decision.REGRESSION, Decision.IMPROVEMENT) and not sig
        else d
        for d, sig in zip(decisions, significant, strict=True)
    )
    size = min(c.log_replicates.size for c in changes)
    stacked = np.stack([c.log_replicates[:size] for c in changes])
    mean_log = stacked.mean(axis=0)
    point = float(np.mean([math.log1p(c.estimate.value) for c in changes]))
    tail = (1.0 - confidence) / 2.0
    centred = mean_log - float(np.mean(mean_log)) + point
    low, high = np.quantile(centred, [tail, 1.0 - tail])
    geomean = Estimate(relative_change(point), relative_change(float(low)), relative_change(float(high)), confidence)
    return Combined(final, tuple(significant), geomean)


# --------------------------------------------------------------------------------------------
# Saved runs (other processes)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SavedRun:
    """One run of one side for one shape or benchmark: raw samples in the order taken (and
    their allocations, when saved), or only a median and its relative standard error."""

    samples: Sequence[float] | None
    allocations: Sequence[int] | None
    median_s: float
    relative_se: float = 0.0
    rounds: int = 0


def run_statistic(run: SavedRun) -> RunStatistic:
    """A run's log time per call and its error: batch means over raw samples, else the
    summary's median with its normal-approximation error."""
    if run.samples is not None and len(run.samples) >= 4:
        return batch_means(run.samples)
    return RunStatistic(math.log(run.median_s), run.relative_se, math.inf, run.rounds, 0)


def _allocation_logs(run: SavedRun) -> list[float]:
    assert run.samples is not None and run.allocations is not None
    groups: dict[int, list[float]] = {}
    for value, owner in zip(run.samples, run.allocations, strict=True):
        groups.setdefault(owner, []).append(value)
    return [math.log(statistics.median(values)) for values in groups.values()]


@dataclass(frozen=True)
class SavedChange:
    """A saved comparison's change and how it was formed."""

    change: Change
    method: str  # "runs", "allocations", "one run a side + process floor", "one process"
    uses_floor: bool


def saved_change(
    baseline: Sequence[SavedRun], candidate: Sequence[SavedRun], *, same_process: bool,
    process_sd: float | None, process_df: float | None, confidence: float = 0.95, seed: int = 0,
) -> SavedChange:
    """The change between saved runs, honest about what varies between processes.

    - Several runs (3 or more in all): each run's statistic is one unit; a pooled two-sample
      t over runs ("resample runs", in its random-effects form).
    - Both sides from one file (one process, interleaved) with their allocations saved: the
      allocations are the units, the same way.
    - One run a side from separate processes: each run's batch-means error plus twice the
      between-process variance measured on this machine (``process_sd``); without it the
      caller must not compare (it raises ``ValueError``).
    """
    total = sum(len(run.samples) if run.samples is not None else run.rounds for run in [*baseline, *candidate])
    if len(baseline) + len(candidate) >= 3:
        interval = runs_interval([run_statistic(r).log_value for r in baseline],
                                 [run_statistic(r).log_value for r in candidate], confidence, total)
        return SavedChange(change_from_interval(interval, alpha=1 - confidence, seed=seed), "runs", False)
    (a,), (b,) = baseline, candidate
    if same_process and a.allocations and b.allocations and len(set(a.allocations)) >= 2 and len(set(b.allocations)) >= 2:
        interval = runs_interval(_allocation_logs(a), _allocation_logs(b), confidence, total)
        return SavedChange(change_from_interval(interval, alpha=1 - confidence, seed=seed), "allocations", False)
    if same_process:
        interval = single_runs_interval(run_statistic(a), run_statistic(b), 0.0, math.inf, confidence)
        return SavedChange(change_from_interval(interval, alpha=1 - confidence, seed=seed), "one process", False)
    if process_sd is None or process_df is None:
        raise ValueError("one run a side needs the between-process floor")
    interval = single_runs_interval(run_statistic(a), run_statistic(b), process_sd, process_df, confidence)
    return SavedChange(change_from_interval(interval, alpha=1 - confidence, seed=seed),
                       "one run a side + process floor", True)
