"""The shape of an error: against context length, against position, and against precision.

- :func:`growth_fit`: error against length across requests (or positions within one):
  least-squares slope and r², and the log-log exponent with its r².
- :func:`classify`: growing with length, constant, a localized spike, or non-finite.
- :func:`precision_signature`: an observed relative error set against the unit roundoff
  ``u = 2^-p`` of bf16, fp16, TF32 and fp32. Rounding to nearest gives a median relative
  error of about ``0.35 u``; a few roundings compounded (operands of a product, then the
  sum) give up to about ``u``. The format whose ``u / 2`` is closest (in log scale) to the
  observed median is "nearest"; formats 8x apart (bf16 vs TF32) are told apart while the
  observation stays within a factor 2.8 of ``u / 2``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
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
SPIKE_POSITION_FRACTION = 0.05  # at most this fraction of positions fail, and ...
SPIKE_CONTRAST = 10.0  # ... the worst position's error is this many times the median one


class ErrorShape(str, Enum):
    GROWING = "growing"
    CONSTANT = "constant"
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "basis": self.basis, "points": self.points, "slope": self.slope, "r2": self.r2,
            "loglog_exponent": self.exponent, "loglog_r2": self.exponent_r2,
            "lengths": list(self.lengths), "errors": list(self.errors),
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
    slope, _, r2 = _linear_fit(xs, ys)
    positive = [(math.log(x), math.log(y)) for x, y in pairs if y > 0]
    if len({lx for lx, _ in positive}) >= 3:
        exponent, _, exponent_r2 = _linear_fit([p[0] for p in positive], [p[1] for p in positive])
    else:
        exponent, exponent_r2 = 0.0, 0.0
    return GrowthFit(basis, len(pairs), slope, r2, exponent, exponent_r2, tuple(xs), tuple(ys))


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


def is_spike(position_errors: Sequence[float], failing_positions: int) -> bool:
    """A few positions carry the error: few fail and the worst stands far above the median."""
    finite = sorted(e for e in position_errors if math.isfinite(e))
    if not finite or failing_positions == 0:
        return False
    median = finite[len(finite) // 2]
    few = failing_positions <= max(1, int(SPIKE_POSITION_FRACTION * len(position_errors)))
    return few and finite[-1] > SPIKE_CONTRAST * max(median, 1e-300)


def classify(fit: GrowthFit | None, *, nonfinite: bool, spike: bool, any_error: bool) -> ErrorShape:
    if nonfinite:
        return ErrorShape.NON_FINITE
    if not any_error:
        return ErrorShape.NONE
    if fit is not None and fit.exponent >= GROWING_EXPONENT and fit.exponent_r2 >= GROWING_R2 and fit.slope > 0:
        return ErrorShape.GROWING
    if spike:
        return ErrorShape.SPIKE
    return ErrorShape.CONSTANT


@dataclass(frozen=True)
class PrecisionSignature:
    """An observed relative error against the unit roundoff of the usual formats."""

    observed: float
    source: str  # what was measured, e.g. "local error of layers.0.scan, first 8 positions"
    ratios: dict[str, float]  # observed / u
    nearest: str  # "bf16", "tf32/fp16", "fp32" or "none"
    factor: float  # how far (multiplicatively) observed is from nearest's u/2

    @property
    def consistent(self) -> bool:
        return self.nearest != "none" and self.factor <= 4.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "observed_rel_error": self.observed, "source": self.source,
            "ratio_to_unit_roundoff": self.ratios, "nearest": self.nearest,
            "factor_from_nearest": self.factor, "consistent": self.consistent,
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
