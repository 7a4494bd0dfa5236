"""The frozen configuration of one gap check."""

from __future__ import annotations

from dataclasses import dataclass

from glmfb.errors import UsageError
from glmfb.targets import Target


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
    threshold: float = 0.05
    repeats: int = 40
    min_repeats: int = 8
    warmup: int = 2
    budget_s: float = 40.0
    confidence: float = 0.95
    attribute: bool = True  # on a failing gap: bandwidth ceiling and the gil probe
    gil_duration_s: float = 6.0  # steady-state sampling of the candidate by the gil probe
    gil_startup_s: float = 60.0  # longest wait for the gil child's imports and target set-up
    gil_rate_hz: float = 200.0

    def __post_init__(self) -> None:
        if not self.name:
            raise UsageError("a gap check needs a name")
        if self.threshold <= 0:
            raise UsageError(f"threshold {self.threshold} must be positive", "use e.g. --threshold 5%")
        if self.repeats < 3:
            raise UsageError(f"--repeats {self.repeats} is too few", "use at least 3 (default 40)")
        if self.min_repeats > self.repeats:
            object.__setattr__(self, "min_repeats", self.repeats)
        if self.warmup < 0:
            raise UsageError(f"warm-up {self.warmup} must not be negative")
        if self.budget_s <= 0:
            raise UsageError(f"--budget {self.budget_s} must be positive", "give seconds, e.g. --budget 30")
        if not 0.5 < self.confidence < 1.0:
            raise UsageError(f"confidence {self.confidence} must lie between 0.5 and 1")
        if self.gil_duration_s <= 0 or self.gil_rate_hz <= 0 or self.gil_startup_s < 0:
            raise UsageError("the gil attribution needs a positive duration and rate")
