"""The measurement core of bench and gap: interleaved blocks over independent allocation
pairs, a random-effects interval over the pairs, sequential looks at a corrected level, the
time budget and the A/A floor (:mod:`glmfb.core.measure.loop`); the intervals and Student's t
(:mod:`glmfb.core.measure.intervals`, :mod:`glmfb.core.measure.tdist`); alpha spending
(:mod:`glmfb.core.measure.sequential`); the between-process floor of this machine, for saved
comparisons (:mod:`glmfb.core.measure.floor`).

Importing this package imports neither torch nor numpy.
"""

from __future__ import annotations

from glmfb.core.measure.intervals import (
    Interval,
    RunStatistic,
    batch_means,
    pair_interval,
    runs_interval,
)
from glmfb.core.measure.loop import Arm, Comparison, Look, Pair, Sample, Settings, compare
from glmfb.core.measure.sequential import LookPlan, decide_with_floor

__all__ = [
    "Arm",
    "Comparison",
    "Interval",
    "Look",
    "LookPlan",
    "Pair",
    "RunStatistic",
    "Sample",
    "Settings",
    "batch_means",
    "compare",
    "decide_with_floor",
    "pair_interval",
    "runs_interval",
]
