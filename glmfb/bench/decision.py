"""Statistics of one comparison: paired block ratios, bootstrap intervals, sequential looks.

In-process the runner yields *paired* blocks: within one ABBA block both sides ran within a
few milliseconds of each other, so a burst of noise on a shared host hits both. The effect
of a block is ``log(candidate / baseline)``; the change is ``exp(median of block effects) - 1``
(the median ratio of paired blocks), with a percentile bootstrap interval over blocks. Saved
files have no pairing: there the change is the ratio of medians, each side resampled on its
own (:func:`unpaired_change`), which is noisier.

Sequential stopping looks at the data after a growing number of blocks. Each look uses a
wider interval than the nominal one (a Pocock-style constant nominal level for up to
:data:`MAX_LOOKS` looks), so looking often does not inflate false alarms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from glmfb.stats import Decision, Estimate, benjamini_hochberg, decide

if TYPE_CHECKING:
    import numpy as np

RESAMPLES = 2000
MAX_LOOKS = 8
# Pocock's constant nominal two-sided level for 8 looks at overall alpha 0.05 is ~0.0141.
LOOK_CONFIDENCE = 0.986


@dataclass(frozen=True)
class Change:
    """A relative change (``candidate / baseline - 1``) with its interval and bootstrap."""

    estimate: Estimate
    pvalue: float  # two-sided, for "no change"
    log_replicates: np.ndarray  # bootstrap replicates of log(ratio), for the geomean
    samples: int  # blocks (paired) or the smaller side's samples (unpaired)
    spread: float  # bootstrap standard error of log(ratio)

    @property
    def ratio(self) -> float:
        return 1.0 + self.estimate.value


def _percentile_change(
    point_log: float, replicates: np.ndarray, confidence: float, samples: int
) -> Change:
    import numpy as np

    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(replicates, [tail, 1.0 - tail])
    below = float(np.mean(replicates <= 0.0))
    above = float(np.mean(replicates >= 0.0))
    pvalue = min(1.0, max(2.0 * min(below, above), 1.0 / replicates.size))
    estimate = Estimate(math.expm1(point_log), math.expm1(float(low)), math.expm1(float(high)), confidence)
    return Change(estimate, pvalue, replicates, samples, float(np.std(replicates)))


def paired_change(
    baseline: Sequence[float] | np.ndarray,
    candidate: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Change:
    """Median of paired ratios ``candidate[i] / baseline[i]`` with a bootstrap over pairs."""
    import numpy as np

    a = np.asarray(baseline, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError("paired samples need two 1-D arrays of the same length (at least 2)")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(a > 0) and np.all(b > 0)):
        raise ValueError("paired samples must be finite and positive")
    effects = np.log(b) - np.log(a)
    rng = np.random.default_rng(seed)
    index = rng.integers(0, effects.size, size=(resamples, effects.size))
    replicates = np.median(effects[index], axis=1)
    return _percentile_change(float(np.median(effects)), replicates, confidence, int(a.size))


def unpaired_change(
    baseline: Sequence[float] | np.ndarray,
    candidate: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Change:
    """Ratio of medians of two independent samples, each resampled on its own."""
    import numpy as np

    a = np.asarray(baseline, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1 or a.size < 2 or b.size < 2:
        raise ValueError("each side needs at least 2 samples")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b)) and np.all(a > 0) and np.all(b > 0)):
        raise ValueError("samples must be finite and positive")
    rng = np.random.default_rng(seed)
    a_med = np.median(a[rng.integers(0, a.size, size=(resamples, a.size))], axis=1)
    b_med = np.median(b[rng.integers(0, b.size, size=(resamples, b.size))], axis=1)
    replicates = np.log(b_med) - np.log(a_med)
    point = math.log(float(np.median(b)) / float(np.median(a)))
    return _percentile_change(point, replicates, confidence, int(min(a.size, b.size)))


def normal_change(
    ratio: float, relative_se: float, samples: int, *, confidence: float = 0.95,
    resamples: int = RESAMPLES, seed: int = 0,
) -> Change:
    """A change known only by its ratio and standard error (summaries without raw data)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    replicates = math.log(ratio) + relative_se * rng.standard_normal(resamples)
    return _percentile_change(math.log(ratio), replicates, confidence, samples)


def decide_with_floor(change: Change, threshold: float, noise_floor: float) -> Decision:
    """:func:`glmfb.stats.decide`, with effects below the A/A noise floor never called an
    effect: regression and improvement need the interval beyond ``max(threshold, floor)``."""
    decision = decide(change.estimate, threshold)
    effective = max(threshold, noise_floor)
    if decision is Decision.REGRESSION and change.estimate.low <= effective:
        return Decision.UNDECIDED
    if decision is Decision.IMPROVEMENT and change.estimate.high >= -effective:
        return Decision.UNDECIDED
    return decision


def noise_floor(aa: Change) -> float:
    """The change the harness reports between the baseline and itself (A/A), in magnitude.

    Identical sides should read 0; whatever an A/A run reads instead (order effects, cache
    state, a host that is busier for one position of the block) is not an effect of the
    candidate, so a regression or improvement must exceed it. The A/A interval is not used as
    the floor: it mostly reflects how short the A/A run was, and the A/B interval already
    carries the sampling noise.
    """
    return abs(aa.estimate.value)


def aa_biased(aa: Change) -> bool:
    """Whether the A/A interval excludes 0: the harness itself sees a difference."""
    return aa.estimate.low > 0 or aa.estimate.high < 0


def look_schedule(first: int, growth: float = 1.6, looks: int = MAX_LOOKS) -> list[int]:
    """Block counts at which the sequential test looks (the last look may come earlier if the
    budget runs out)."""
    counts = [max(2, first)]
    while len(counts) < looks:
        counts.append(max(counts[-1] + 1, math.ceil(counts[-1] * growth)))
    return counts


def samples_needed(change: Change, threshold: float) -> float:
    """Roughly how many samples would make the interval clear the nearest threshold
    (``inf`` when the estimate sits on a threshold)."""
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
    rejected by Benjamini-Hochberg at ``alpha`` across all shapes; the geometric mean of
    the ratios gets its interval from the shapes' bootstrap replicates, combined by index."""
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
    low, high = np.quantile(mean_log, [tail, 1.0 - tail])
    geomean = Estimate(math.expm1(point), math.expm1(float(low)), math.expm1(float(high)), confidence)
    return Combined(final, tuple(significant), geomean)
