"""Which way each headline metric regresses, as data (never guessed from its name or unit).

Every built-in probe's headline metric is a cost: higher is worse. Some are already a change
against a baseline (bench's ``time_change`` is candidate/baseline - 1, gap's ``gap`` the
fraction the candidate's path adds), so two segments of their history are compared by the
difference of their levels (+0.02 is two points of the baseline's time); the others are
quantities (seconds, milliseconds, a relative error), compared by ratio (+5% of the level
before). A metric this table does not name (a probe from another package) is read as a cost
compared by ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Worse(str, Enum):
    """Which way a metric regresses."""

    HIGHER = "higher"
    LOWER = "lower"


@dataclass(frozen=True)
class MetricKind:
    """``worse``: which way it regresses; ``relative``: the value is already a change
    against a baseline (segments compared by difference, not ratio)."""

    worse: Worse = Worse.HIGHER
    relative: bool = False


METRIC_KINDS: dict[str, MetricKind] = {
    "time_change": MetricKind(Worse.HIGHER, relative=True),  # bench: candidate / baseline - 1
    "geomean_time_change": MetricKind(Worse.HIGHER, relative=True),  # bench, over shapes
    "median_time": MetricKind(Worse.HIGHER),  # bench with one side: seconds per call
    "starvation_p99": MetricKind(Worse.HIGHER),  # gil: ms a thread waits for the GIL
    "gap": MetricKind(Worse.HIGHER, relative=True),  # gap: the fraction the candidate's path adds
    "output_rel_l2": MetricKind(Worse.HIGHER),  # diff: ||c - b|| / ||b||
}
DEFAULT_KIND = MetricKind()


def metric_kind(name: str | None) -> MetricKind:
    return METRIC_KINDS.get(name or "", DEFAULT_KIND)


def regression(before: float, after: float, kind: MetricKind) -> float:
    """How much worse ``after`` is than ``before`` (negative: better), in the metric's own
    terms: the difference for a relative metric, else the change as a fraction of
    ``before`` (infinite when ``before`` is 0 and ``after`` is not)."""
    sign = 1.0 if kind.worse is Worse.HIGHER else -1.0
    delta = sign * (after - before)
    if kind.relative:
        return delta
    if before == 0:
        return 0.0 if delta == 0 else float("inf") if delta > 0 else float("-inf")
    return delta / abs(before)
