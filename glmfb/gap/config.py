"""The frozen configuration of one gap check; its options are declared here, once."""

from __future__ import annotations

from dataclasses import dataclass

from glmfb.contract.errors import UsageError
from glmfb.contract.options import (
    BOOL,
    FRACTION,
    HERTZ,
    NONNEGATIVE_INT,
    POSITIVE_INT,
    SECONDS,
    SECONDS_OR_ZERO,
    check_declared,
    option,
)
from glmfb.core.targets import Target


@dataclass(frozen=True)
class GapConfig:
    """What ``glmfb gap`` compares and how long it may take.

    ``repeats`` caps the measured iterations per side; the check stops earlier once the
    interval decides (after ``min_repeats``), and says inconclusive when ``budget_s`` or
    ``repeats`` runs out before it decides.
    """

    name: str
    baseline: Target
    candidate: Target
    threshold: float = option(0.05, FRACTION, "Largest acceptable gap: 5% or 0.05.")
    repeats: int = option(40, POSITIVE_INT, "Most measured iterations per side (stops earlier once decided).")
    min_repeats: int = option(8, POSITIVE_INT, "Fewest iterations per side before the interval may decide.")
    warmup: int = option(2, NONNEGATIVE_INT, "Unmeasured iterations per side first.")
    budget_s: float = option(40.0, SECONDS, "Time for the interleaved measurement; inconclusive when spent.",
                             key="budget")
    attribute: bool = option(True, BOOL, "On a failing gap: measure the bandwidth ceiling and run the gil probe.")
    gil_duration_s: float = option(6.0, SECONDS, "Time the gil probe samples the candidate in steady state.",
                                   key="gil_duration")
    gil_startup_s: float = option(60.0, SECONDS_OR_ZERO, "Longest wait for the gil child's imports and set-up.",
                                  key="gil_startup")
    gil_rate_hz: float = option(200.0, HERTZ, "GIL-holder samples per second of the gil probe.", key="gil_rate")
    confidence: float = 0.95

    def __post_init__(self) -> None:
        check_declared(self)
        if not self.name:
            raise UsageError("a gap check needs a name")
        if self.threshold <= 0:
            raise UsageError(f"threshold {self.threshold} must be positive", "use e.g. --threshold 5%")
        if self.repeats < 3:
            raise UsageError(f"--repeats {self.repeats} is too few", "use at least 3 (default 40)")
        if self.min_repeats > self.repeats:
            object.__setattr__(self, "min_repeats", self.repeats)
        if not 0.5 < self.confidence < 1.0:
            raise UsageError(f"confidence {self.confidence} must lie between 0.5 and 1")
