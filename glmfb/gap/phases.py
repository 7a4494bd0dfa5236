"""Phase-by-phase comparison of the two sides.

An iteration may return a dict of numbers. By convention (docs/gap.md):

- ``*_bytes``: a count of bytes moved in the iteration (used for bandwidth, not compared; it
  pairs by name with the time it moved in, see :mod:`glmfb.gap.bandwidth`);
- ``*_busy_s``: busy time of a background activity that overlaps the others (a transfer
  thread): compared, but not on the critical path, so never ranked as a phase that grew;
- anything else: a wall-clock phase in seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from glmfb.core.measure.stats import median_ratio

BUSY_SUFFIX = "_busy_s"
BYTES_SUFFIX = "_bytes"


@dataclass(frozen=True)
class PhaseChange:
    """One phase on both sides: medians in seconds, the change and its interval."""

    name: str
    baseline_s: float | None  # None: the phase exists only on the candidate
    candidate_s: float | None  # None: only on the baseline
    change: float | None = None  # candidate / baseline - 1 of the medians
    ci: tuple[float, float] | None = None
    concurrent: bool = False  # a *_busy_s activity, off the critical path

    @property
    def delta_s(self) -> float:
        return (self.candidate_s or 0.0) - (self.baseline_s or 0.0)

    def grew(self, threshold: float) -> bool:
        """Longer on the candidate beyond noise: new, or interval above ``threshold``."""
        if self.baseline_s is None:
            return (self.candidate_s or 0.0) > 0.0
        return self.ci is not None and self.ci[0] > threshold




def _column(samples: Sequence[dict[str, float]], key: str) -> list[float]:
    return [sample[key] for sample in samples if key in sample]


def compare_phases(
    baseline: Sequence[dict[str, float]],
    candidate: Sequence[dict[str, float]],
    confidence: float = 0.95,
) -> list[PhaseChange]:
    """Every timing phase seen on either side, largest growth on the critical path first."""
    keys: list[str] = []
    for sample in [*baseline, *candidate]:
        for key in sample:
            if key not in keys and not key.endswith(BYTES_SUFFIX):
                keys.append(key)
    changes: list[PhaseChange] = []
    for key in keys:
        a, b = _column(baseline, key), _column(candidate, key)
        concurrent = key.endswith(BUSY_SUFFIX)
        if a and b:
            a_median, b_median = statistics.median(a), statistics.median(b)
            if a_median > 0:
                estimate = median_ratio(a, b, confidence=confidence)
                changes.append(PhaseChange(key, a_median, b_median, estimate.value, estimate.ci, concurrent))
            else:
                changes.append(PhaseChange(key, a_median, b_median, None, None, concurrent))
        elif b:
            changes.append(PhaseChange(key, None, statistics.median(b), concurrent=concurrent))
        elif a:
            changes.append(PhaseChange(key, statistics.median(a), None, concurrent=concurrent))
    changes.sort(key=lambda change: (change.concurrent, -change.delta_s))
    return changes


def grown_phases(changes: Sequence[PhaseChange], threshold: float) -> list[PhaseChange]:
    """Critical-path phases that grew, largest first."""
    return [c for c in changes if not c.concurrent and c.grew(threshold) and c.delta_s > 0]


def median_bytes(samples: Sequence[dict[str, float]]) -> dict[str, float]:
    """The median of every ``*_bytes`` counter."""
    keys = {key for sample in samples for key in sample if key.endswith(BYTES_SUFFIX)}
    return {key: statistics.median(_column(samples, key)) for key in sorted(keys)}
