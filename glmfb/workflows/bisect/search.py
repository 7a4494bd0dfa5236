"""Where to look next: binary search over the commits under test, around the ones that could
not be judged.

The commits are indexed oldest first, ``0 .. count - 1``; index ``-1`` is GOOD (good by
definition) and ``count - 1`` is BAD (bad once confirmed). Each evaluated commit is good,
bad, skipped (its set-up or its probe failed) or unknown (still inconclusive with the most
budget allowed). The regression lies after the newest good commit before the oldest bad one
(:attr:`Search.low`, :attr:`Search.high`); the next commit to test is the untested one
nearest the middle of that range, so a skipped commit costs one more evaluation (its
neighbour), not a restart. When no untested commit is left in the range, the search is done:
a culprit when the range is one commit wide, else a range that could not be split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum


class Outcome(str, Enum):
    """What one commit came out as."""

    BAD = "bad"  # the probe fails: the regression is there
    GOOD = "good"  # the probe passes (or warns)
    SKIPPED = "skipped"  # its set-up failed or the probe could not run (it does not import)
    UNKNOWN = "unknown"  # inconclusive, also with the most budget allowed


@dataclass
class Search:
    """The state of one bisection over ``count`` commits (the last one is BAD)."""

    count: int
    outcomes: dict[int, Outcome] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError("a bisection needs at least one commit under test")
        self.outcomes.setdefault(self.count - 1, Outcome.BAD)

    def record(self, index: int, outcome: Outcome) -> None:
        self.outcomes[index] = outcome

    @property
    def high(self) -> int:
        """The oldest commit known to be bad."""
        return min(i for i, o in self.outcomes.items() if o is Outcome.BAD)

    @property
    def low(self) -> int:
        """The newest commit known to be good before :attr:`high` (-1: GOOD itself). A good
        commit after a bad one (a noisy evaluation, or a regression fixed and reintroduced) is
        not used: the search stays in the oldest range that holds the change."""
        high = self.high
        return max((i for i, o in self.outcomes.items() if o is Outcome.GOOD and i < high), default=-1)

    def next_index(self) -> int | None:
        """The commit to evaluate next: the untested one nearest the middle of the range (the
        older of two equally near); None when none is left."""
        low, high = self.low, self.high
        untested = [i for i in range(low + 1, high) if i not in self.outcomes]
        if not untested:
            return None
        middle = (low + high) / 2
        return min(untested, key=lambda i: (abs(i - middle), i))

    @property
    def culprit(self) -> int | None:
        """The first bad commit, when the newest good one is right before it."""
        return self.high if self.high - self.low == 1 else None

    def unsplit(self) -> tuple[int, int]:
        """The range (first, last index, inclusive) that holds the first bad commit."""
        return self.low + 1, self.high

    def judged(self, outcome: Outcome) -> Mapping[int, Outcome]:
        return {i: o for i, o in self.outcomes.items() if o is outcome}
