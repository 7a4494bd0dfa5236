"""Scripted timings for the measurement core: a fake clock and allocations whose samples
follow a model of a shared host, so decisions and error rates can be checked without timing
anything (tests, and ``benchmarks/measure_error_rates.py``).

The model of one sample of allocation ``k`` of a side, per call::

    base * (1 + effect) * exp(u_k) * exp(noise) + burst(t)

``u_k ~ N(0, between_sd)`` is the allocation's luck (where its buffers landed), drawn once;
``noise ~ N(0, within_sd)`` is each sample's own jitter; ``burst(t)`` adds time during
bursts of host load (seconds long, shared by everything running then). The clock advances
by each sample's duration, so budgets and looks behave as they would in a real run.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from glmfb.core.measure.loop import Arm, Pair


@dataclass
class FakeClock:
    """A monotonic clock that moves only when told to."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class HostModel:
    """Noise shared by everything on the host: bursts of load at random times."""

    burst_rate_per_s: float = 0.0  # bursts started per second
    burst_length_s: float = 2.0
    burst_slowdown: float = 0.5  # a burst adds this fraction to every sample within it
    seed: int = 0
    horizon_s: float = 3600.0  # bursts are drawn up to this time
    _starts: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.burst_rate_per_s <= 0:
            return
        rng = random.Random(self.seed)
        t = rng.expovariate(self.burst_rate_per_s)
        while t < self.horizon_s:
            self._starts.append(t)
            t += rng.expovariate(self.burst_rate_per_s)

    def factor(self, t: float) -> float:
        """1 plus the slowdown of every burst running at ``t``."""
        if not self._starts:
            return 1.0
        running = bisect.bisect_right(self._starts, t) - bisect.bisect_right(self._starts, t - self.burst_length_s)
        return 1.0 + self.burst_slowdown * running


@dataclass
class ScriptedSide:
    """One side of a scripted comparison: its true time per call and its noise."""

    label: str
    base_s: float = 100e-6
    effect: float = 0.0  # true relative change of this side
    between_sd: float = 0.0  # log-scale sd of an allocation's offset
    within_sd: float = 0.01  # log-scale sd of one sample
    calls: int = 10  # calls per sample (the clock advances by calls * time)


def scripted_arm(
    side: ScriptedSide, allocation: int, clock: FakeClock, rng: random.Random,
    host: HostModel | None = None,
) -> Arm:
    """An allocation whose samples follow the model; taking one advances ``clock``."""
    offset = math.exp(rng.gauss(0.0, side.between_sd)) if side.between_sd > 0 else 1.0
    per_call = side.base_s * (1.0 + side.effect) * offset

    def sample() -> float:
        value = per_call * math.exp(rng.gauss(0.0, side.within_sd)) if side.within_sd > 0 else per_call
        if host is not None:
            value *= host.factor(clock.now)
        clock.advance(value * side.calls)
        return value

    return Arm(side.label, allocation, sample)


def scripted_pairs(
    baseline: ScriptedSide, candidate: ScriptedSide, pairs: int, clock: FakeClock, seed: int,
    aa_pairs: int = 0, host: HostModel | None = None,
) -> list[Pair]:
    """``pairs`` A/B pairs and ``aa_pairs`` A/A pairs of independent scripted allocations."""
    rng = random.Random(seed)
    out = [
        Pair("ab", j, scripted_arm(baseline, j, clock, rng, host), scripted_arm(candidate, j, clock, rng, host))
        for j in range(pairs)
    ]
    out += [
        Pair("aa", pairs + j, scripted_arm(baseline, pairs + 2 * j, clock, rng, host),
             scripted_arm(baseline, pairs + 2 * j + 1, clock, rng, host))
        for j in range(aa_pairs)
    ]
    return out


def constant_arm(label: str, allocation: int, values: Callable[[], float], clock: FakeClock,
                 calls: int = 1) -> Arm:
    """An allocation whose samples come from ``values()`` exactly (no model)."""

    def sample() -> float:
        value = values()
        clock.advance(value * calls)
        return value

    return Arm(label, allocation, sample)
