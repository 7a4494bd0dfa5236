"""The shape of an error: against context length, against position, and against precision.

- :func:`growth_fit`: error against length across requests (or positions within one):
  least-squares slope and r², and the log-log exponent with its r².
- :func:`classify`: a step along positions, growing with length, constant, a localized spike,
  or non-finite.
- :func:`position_profile`: error along one request's positions: zero up to an onset and a
  step there (a mask, a window, a table), or growing along the sequence.
- :func:`quiet_run`: whether the quiet positions before a claimed onset are more than chance:
  a run of ``n`` positions each quiet with probability ``p`` (estimated from the positions
  after it) happens by chance with probability ``p ** n``; a boundary is claimed only where
  that is below :data:`CHANCE_LEVEL`.
- :func:`precision_signature`: an observed relative error set against the unit roundoff
  ``u = 2^-p`` of bf16, fp16, TF32 and fp32. Rounding to nearest gives a median relative
  error of about ``0.35 u``; a few roundings compounded (operands of a product, then the
  sum) give up to about ``u``. The format whose ``u / 2`` is closest (in log scale) to the
  observed median is "nearest"; formats 8x apart (bf16 vs TF32) are told apart while the
  observation stays within a factor 2.8 of ``u / 2``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

# Unit roundoff 2^-p, p = significand bits including the implicit one.
UNIT_ROUNDOFF: dict[str, float] = {
    "bf16": 2.0**-8,
    "fp16": 2.0**-11,
    "tf32": 2.0**-11,
    "fp32": 2.0**-24,
}
ROUNDING_FACTOR = 0.5  # typical median relative error / u after one to a few roundings

GROWING_EXPONENT = 0.3  # log-log exponent above which error counts as growing with length
GROWING_R2 = 0.7
GROWING_FACTOR = 2.0  # ... and the fit must predict at least this much growth over the span measured
STEP_CONTRAST = 100.0  # before an onset, the error is this many times below what follows (or is predicted)
STEP_FAILING_SHARE = 0.5  # ... and at least this share of the positions from the onset on fail
RISE_FACTOR = 4.0  # an error that rises and saturates: the later half this many times the first bin, ...
RISE_RANK_CORRELATION = 0.5  # ... and the error ranked against the position correlates at least this well
SPIKE_POSITION_FRACTION = 0.05  # at most this fraction of positions fail, and ...
SPIKE_CONTRAST = 10.0  # ... the worst position's error is this many times the median one
CHANCE_LEVEL = 0.01  # a quiet run before an onset backs a boundary only when chance gives it less often than this
ZERO_RUN_FLOOR = 4  # ... and an exactly-zero region in reordering noise is at least this many positions long


class ErrorShape(str, Enum):
    GROWING = "growing"
    CONSTANT = "constant"
    STEP = "step"  # within one request: zero up to a position, large from there on
    SPIKE = "spike"
    NON_FINITE = "non-finite"
    NONE = "none"  # no error at all


@dataclass(frozen=True)
class GrowthFit:
    """Error against length: linear slope and r², log-log exponent and r²."""

    basis: str  # "requests" (one point per request length) or "positions" (within a request)
    points: int
    slope: float
    r2: float
    exponent: float
    exponent_r2: float
    lengths: tuple[float, ...]
    errors: tuple[float, ...]
    intercept: float = 0.0  # error = intercept + slope * length
    log_intercept: float = 0.0  # log(error) = log_intercept + exponent * log(length)

    @property
    def growth_factor(self) -> float:
        """How much the log-log fit says the error grows from the shortest length to the longest."""
        low, high = min(self.lengths), max(self.lengths)
        return (high / low) ** self.exponent if low > 0 else math.inf

    @property
    def growing(self) -> bool:
        """A real growth: exponent >= 0.3 with r² >= 0.7, increasing, and at least 2x over the span."""
        return (self.exponent >= GROWING_EXPONENT and self.exponent_r2 >= GROWING_R2 and self.slope > 0
                and self.growth_factor >= GROWING_FACTOR)

    def predict(self, length: float) -> float:
        """The log-log fit's error at ``length`` (0 at length 0 when it grows)."""
        if length <= 0:
            return 0.0 if self.exponent > 0 else math.exp(self.log_intercept)
        return math.exp(self.log_intercept + self.exponent * math.log(length))

    def to_dict(self) -> dict[str, Any]:
        return {
            "basis": self.basis, "points": self.points, "slope": self.slope, "r2": self.r2,
            "loglog_exponent": self.exponent, "loglog_r2": self.exponent_r2,
            "lengths": list(self.lengths), "errors": list(self.errors),
            "intercept": self.intercept, "loglog_intercept": self.log_intercept,
        }


def _linear_fit(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """Least squares ``y = a + s x``: (slope, intercept, r²)."""
    n = len(x)
    mean_x = sum(x) / n
    mean_y = sum(y) / n
    sxx = sum((xi - mean_x) ** 2 for xi in x)
    syy = sum((yi - mean_y) ** 2 for yi in y)
    sxy = sum((xi - mean_x) * (yi - mean_y) for xi, yi in zip(x, y, strict=False))
    if sxx == 0:
        return 0.0, mean_y, 0.0
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy) if syy > 0 else 1.0
    return slope, mean_y - slope * mean_x, r2


def growth_fit(lengths: Sequence[float], errors: Sequence[float], basis: str) -> GrowthFit | None:
    """Fit error against length; None with fewer than three distinct positive lengths."""
    pairs = [(float(x), float(y)) for x, y in zip(lengths, errors, strict=False) if x > 0 and math.isfinite(y)]
    if len({x for x, _ in pairs}) < 3:
        return None
    xs = [x for x, _ in pairs]
    ys = [y for _, y in pairs]
    slope, intercept, r2 = _linear_fit(xs, ys)
    positive = [(math.log(x), math.log(y)) for x, y in pairs if y > 0]
    if len({lx for lx, _ in positive}) >= 3:
        exponent, log_intercept, exponent_r2 = _linear_fit([p[0] for p in positive], [p[1] for p in positive])
    else:
        exponent, log_intercept, exponent_r2 = 0.0, math.log(max(ys)) if max(ys) > 0 else 0.0, 0.0
    return GrowthFit(basis, len(pairs), slope, r2, exponent, exponent_r2, tuple(xs), tuple(ys), intercept,
                     log_intercept)


def position_curve(errors: Sequence[float], points: int = 32) -> tuple[list[float], list[float]]:
    """Error against position (1-based), averaged over up to ``points`` equal bins."""
    n = len(errors)
    if n == 0:
        return [], []
    bins = min(points, n)
    xs: list[float] = []
    ys: list[float] = []
    for index in range(bins):
        start, end = index * n // bins, (index + 1) * n // bins
        chunk = [e for e in errors[start:end] if math.isfinite(e)]
        if chunk:
            xs.append((start + end + 1) / 2)
            ys.append(sum(chunk) / len(chunk))
    return xs, ys


def position_bins(count: int, points: int = 32) -> list[tuple[int, int]]:
    """Up to ``points`` equal bins over ``count`` positions, as ``(start, end)`` (0-based, end
    exclusive): the bins :func:`position_curve` averages over."""
    bins = min(points, count)
    return [(i * count // bins, (i + 1) * count // bins) for i in range(bins)] if count else []


def binned_from(errors: Sequence[float], start: int, points: int = 32) -> tuple[list[float], list[float]]:
    """Error against 0-based position from ``start`` on (position 0 left out: a power law in the
    position is 0 there), averaged over up to ``points`` bins: the points of a growth fit."""
    first = max(start, 1)
    tail = list(errors[first:])
    xs: list[float] = []
    ys: list[float] = []
    for begin, end in position_bins(len(tail), points):
        chunk = [e for e in tail[begin:end] if math.isfinite(e)]
        if chunk:
            xs.append(first + (begin + end - 1) / 2)
            ys.append(sum(chunk) / len(chunk))
    return xs, ys


@dataclass(frozen=True)
class QuietRun:
    """The first ``length`` positions of a request, whose error is at most ``level`` (0: exactly
    zero), against chance: ``rate`` is the share of the positions after them that are as quiet
    (the estimated chance that one position is), ``chance = rate ** length`` the probability of
    such a run where nothing changes at its end, and ``needed`` the shortest run whose chance is
    below :data:`CHANCE_LEVEL` (at least ``floor``). The run backs a boundary at its end only
    when it is at least ``needed`` long: one position of zero error in a reordered sum, where a
    third of all positions come out exactly zero, is no boundary."""

    length: int
    positions: int
    level: float
    rate: float
    chance: float
    needed: int
    floor: int = 1

    @property
    def beyond_chance(self) -> bool:
        return 0 < self.length < self.positions and self.length >= self.needed


def run_needed(rate: float, floor: int = 1, level: float = CHANCE_LEVEL) -> int:
    """The shortest run of positions, each quiet with probability ``rate``, whose chance
    ``rate ** n`` is below ``level``; at least ``floor``. A rate of 1 (every position after the
    run is as quiet) needs a run no request holds."""
    if rate <= 0.0:
        return floor
    if rate >= 1.0:
        return 1 << 62
    needed = max(floor, math.ceil(math.log(level) / math.log(rate)))
    while rate ** needed >= level:
        needed += 1
    return needed


def quiet_run(errors: Sequence[float], length: int | None = None, level: float = 0.0,
              floor: int = 1) -> QuietRun:
    """The run of quiet positions at the start of ``errors`` (per-position errors of one
    request) against chance. ``length`` None: the leading positions whose error is at most
    ``level``; else the run is given (the positions before an onset). The chance that one
    position is that quiet is estimated from the positions after the run."""
    values = list(errors)
    if length is None:
        length = next((i for i, e in enumerate(values) if not (math.isfinite(e) and e <= level)), len(values))
    after = [e for e in values[length:] if math.isfinite(e)]
    rate = sum(1 for e in after if e <= level) / len(after) if after else 1.0
    chance = rate ** length if length else 1.0
    return QuietRun(length=length, positions=len(values), level=level, rate=rate, chance=chance,
                    needed=min(run_needed(rate, floor), len(values) + 1), floor=floor)


@dataclass(frozen=True)
class ZeroRun:
    """Another request's exactly-zero region at the same tap: its id, its positions, the
    leading positions of zero error."""

    request: str
    positions: int
    length: int


@dataclass(frozen=True)
class ZeroRegion:
    """The exactly-zero region at the start of the worst request (``run``) and the same region
    in the other requests whose error at that tap is not zero everywhere (``others``). It backs
    a boundary at its end (a block of a reordered sum starts there) only when the run is longer
    than chance allows (:attr:`QuietRun.beyond_chance`, at least :data:`ZERO_RUN_FLOOR`) and,
    where other requests show the error, one of them has its region end at the same position or
    at the same fraction of its length (a block boundary of a fixed size, or one that moves
    with the length: context-parallel shards)."""

    run: QuietRun
    others: tuple[ZeroRun, ...] = ()

    def agrees(self, other: ZeroRun) -> bool:
        if other.length <= 0 or other.length >= other.positions:
            return False
        if other.length == self.run.length:
            return True
        fraction = self.run.length / self.run.positions
        return abs(other.length / other.positions - fraction) <= 1.0 / min(other.positions, self.run.positions)

    @property
    def agreeing(self) -> tuple[ZeroRun, ...]:
        return tuple(o for o in self.others if self.agrees(o))

    @property
    def backed(self) -> bool:
        return self.run.beyond_chance and (not self.others or bool(self.agreeing))

    @property
    def same_position(self) -> bool:
        """Every agreeing request has its region end at the very same position."""
        return all(o.length == self.run.length for o in self.agreeing)


@dataclass(frozen=True)
class PositionShape:
    """Error along one request's positions, from its onset (the first failing position)."""

    onset: int
    positions: int
    failing_after: float
    before_max: float
    after_median: float
    fit: GrowthFit | None  # error against position from the first position with any error (at least 1) on
    predicted_before: float | None  # the fit's error at onset - 1 (None: no fit, or onset 0)
    rise: float = 1.0  # median error of the later half of the bins over the first bin's
    rank_correlation: float = 0.0  # Spearman's rank correlation of error and position (the bins)
    start: int = 1  # the first position the growth is fitted from (the first with any error, at least 1)
    quiet: QuietRun | None = None  # the positions before the onset (as quiet as its largest error) against chance
    zeros: QuietRun | None = None  # the leading positions of exactly zero error against chance (floor 4)

    @property
    def rises(self) -> bool:
        """The error climbs from the onset and levels off (a bounded quantity such as a rotary
        angle's cosine saturates, so a power law fits it loosely)."""
        return self.rise >= RISE_FACTOR and self.rank_correlation >= RISE_RANK_CORRELATION

    @property
    def growing(self) -> bool:
        return self.fit is not None and (self.fit.growing or self.rises)

    @property
    def step(self) -> bool:
        """Zero up to the onset and large from there on: the error before the onset is far below
        what follows (flat after it) or below what its growth predicts just before the onset (a
        growth from position 0 predicts 0 there, so onset 1 with growth is not a step), and the
        quiet positions before the onset are more than chance gives (:class:`QuietRun`)."""
        if self.onset < 1 or self.failing_after < STEP_FAILING_SHARE:
            return False
        if self.quiet is not None and not self.quiet.beyond_chance:
            return False  # positions as quiet are common after the onset: a run this short is chance
        if not self.growing:
            return self.before_max * STEP_CONTRAST <= self.after_median
        if self.predicted_before is None or self.onset < 2:
            return False
        return self.before_max * STEP_CONTRAST <= self.predicted_before


def position_profile(rel_l2: Sequence[float], outside: Sequence[int]) -> PositionShape | None:
    """The shape of the error along positions (per-position relative L2 error and elements
    outside tolerance). None when no position fails."""
    onset = next((i for i, count in enumerate(outside) if count > 0), None)
    if onset is None:
        return None
    positions = len(rel_l2)
    after = [e for e in rel_l2[onset:] if math.isfinite(e)]
    before = [e for e in rel_l2[:onset] if math.isfinite(e)]
    failing_after = sum(1 for count in outside[onset:] if count > 0) / max(1, positions - onset)
    # the growth is fitted from the first position with any error (within tolerance or not): an
    # error that accumulates from the start crosses the tolerance late, a step starts at its onset
    start = next((i for i, e in enumerate(rel_l2[:onset + 1]) if math.isfinite(e) and e > 0), onset)
    xs, ys = binned_from(rel_l2, start)
    fit = growth_fit(xs, ys, "positions")
    predicted = fit.predict(onset - 1) if fit is not None and onset >= 1 else None
    after_sorted = sorted(after)
    later = sorted(ys[len(ys) // 2:])
    rise = later[len(later) // 2] / ys[0] if ys and ys[0] > 0 and later else (math.inf if later and later[-1] > 0 else 1.0)
    return PositionShape(
        onset=onset, positions=positions, failing_after=failing_after, before_max=max(before, default=0.0),
        after_median=after_sorted[len(after_sorted) // 2] if after_sorted else 0.0, fit=fit,
        predicted_before=predicted, rise=rise, rank_correlation=rank_correlation(ys), start=max(start, 1),
        quiet=quiet_run(rel_l2, onset, max(before, default=0.0)) if onset else None,
        zeros=quiet_run(rel_l2, floor=ZERO_RUN_FLOOR),
    )


def rank_correlation(values: Sequence[float]) -> float:
    """Spearman's rank correlation of ``values`` with their index (ties ranked by order)."""
    n = len(values)
    if n < 3:
        return 0.0
    order = sorted(range(n), key=lambda i: values[i])
    ranks = [0] * n
    for rank, index in enumerate(order):
        ranks[index] = rank
    mean = (n - 1) / 2
    covariance = sum((i - mean) * (ranks[i] - mean) for i in range(n))
    variance = sum((i - mean) ** 2 for i in range(n))
    return covariance / variance if variance else 0.0


def is_spike(position_errors: Sequence[float], failing_positions: int) -> bool:
    """A few positions carry the error: few fail and the worst stands far above the median."""
    finite = sorted(e for e in position_errors if math.isfinite(e))
    if not finite or failing_positions == 0:
        return False
    median = finite[len(finite) // 2]
    few = failing_positions <= max(1, int(SPIKE_POSITION_FRACTION * len(position_errors)))
    return few and finite[-1] > SPIKE_CONTRAST * max(median, 1e-300)


def classify(fit: GrowthFit | None, *, nonfinite: bool, spike: bool, any_error: bool,
             step: bool = False) -> ErrorShape:
    """The error's class. A step along positions (``PositionShape.step``) comes before the
    fits, as the why puts it first: the same bug read at 65 tokens (one failing position after
    the onset) and at 300 is a step both times, not a spike at one length and constant at the other."""
    if nonfinite:
        return ErrorShape.NON_FINITE
    if not any_error:
        return ErrorShape.NONE
    if step:
        return ErrorShape.STEP
    if fit is not None and fit.growing:
        return ErrorShape.GROWING
    if spike:
        return ErrorShape.SPIKE
    return ErrorShape.CONSTANT


@dataclass(frozen=True)
class PrecisionSignature:
    """An observed relative error against the unit roundoff of the usual formats.

    The size alone says only that the error *could* be that format's rounding; a size that
    matches by chance (a bug whose error happens to be near 2^-9) is no evidence. So once the
    rounding test has rounded the baseline to the nearest format, its outcome is recorded, and
    the signature is ``consistent`` only when the size matches and that test, where it ran, did
    not refute it."""

    observed: float
    source: str  # what was measured, e.g. "local error of layers.0.scan, first 8 positions"
    ratios: dict[str, float]  # observed / u
    nearest: str  # "bf16", "tf32/fp16", "fp32" or "none"
    factor: float  # how far (multiplicatively) observed is from nearest's u/2
    rounding_test: str | None = None  # "reproduced", "not reproduced", or None (the nearest format not tried)

    @property
    def size_consistent(self) -> bool:
        """The size is within a factor 4 of the nearest format's typical rounding error."""
        return self.nearest != "none" and self.factor <= 4.0

    @property
    def consistent(self) -> bool:
        return self.size_consistent and self.rounding_test != "not reproduced"

    def tested(self, tried: Collection[str], reproduced_by: str | None) -> PrecisionSignature:
        """The signature after the rounding test: ``tried``, the formats it rounded to, and
        ``reproduced_by``, the one that reproduced the error (None: none did)."""
        formats = {"tf32/fp16": ("tf32", "fp16")}.get(self.nearest, (self.nearest,))
        if not any(f in tried for f in formats):
            return self
        outcome = "reproduced" if reproduced_by in formats else "not reproduced"
        return replace(self, rounding_test=outcome)

    def to_dict(self) -> dict[str, Any]:
        return {
            "observed_rel_error": self.observed, "source": self.source,
            "ratio_to_unit_roundoff": self.ratios, "nearest": self.nearest,
            "factor_from_nearest": self.factor, "size_consistent": self.size_consistent,
            "rounding_test": self.rounding_test, "consistent": self.consistent,
            "unit_roundoff": UNIT_ROUNDOFF,
        }


def precision_signature(observed: float, source: str) -> PrecisionSignature:
    """Which format's rounding the observed relative error looks like (fp16 and TF32 share a
    10-bit mantissa, so they are one candidate: ``tf32/fp16``)."""
    ratios = {name: observed / u for name, u in UNIT_ROUNDOFF.items()}
    if not (observed > 0 and math.isfinite(observed)):
        return PrecisionSignature(observed, source, ratios, "none", math.inf)
    best, best_distance = "none", math.inf
    for name, u in UNIT_ROUNDOFF.items():
        distance = abs(math.log2(observed / (ROUNDING_FACTOR * u)))
        if distance < best_distance:
            best, best_distance = name, distance
    nearest = "tf32/fp16" if best in ("tf32", "fp16") else best
    return PrecisionSignature(observed, source, ratios, nearest, 2.0**best_distance)
