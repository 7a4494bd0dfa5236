"""Which way each metric regresses, as the probe that makes it declares it (never guessed from
its name or unit): :class:`glmfb.core.probe.MetricSpec` in each probe's ``metrics``.

Every built-in probe's metrics are costs: higher is worse. Some are already a change against a
baseline (bench's ``time_change`` is candidate/baseline - 1, gap's ``gap`` the fraction the
candidate's path adds), so two segments of their history are compared by the difference of
their levels (+0.02 is two points of the baseline's time); the others are quantities (seconds,
milliseconds, a relative error), compared by ratio (+5% of the level before). A metric its
probe does not declare, or one of a probe this installation does not know, is read as a cost
compared by ratio. What was read is recorded in each row (``worse``, ``relative``), so a series
keeps its reading when the probe is gone.
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


DEFAULT_KIND = MetricKind()


def metric_kind(probe: str, name: str | None) -> MetricKind:
    """How the history reads metric ``name`` of a ``probe`` verdict: as the probe declares it."""
    from glmfb.core.probe import get_probe, metric_spec
    from glmfb.core.registry import known_kinds

    if not name or probe not in known_kinds():
        return DEFAULT_KIND
    spec = metric_spec(get_probe(probe), name)
    if spec is None:
        return DEFAULT_KIND
    return MetricKind(Worse(spec.worse), spec.relative)


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
