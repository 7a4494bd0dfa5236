"""Sequential looks at a corrected level: alpha spending, tested with a Bonferroni split.

A comparison looks at its interval several times and stops as soon as it decides. Looking
at a plain 95% interval every few rounds inflates the error rate (each look is another
chance to be wrong). Here the total error ``alpha`` is *spent* over a fixed schedule of looks
at planned fractions of the budget (time, or repeats, whichever runs out first): by the
fraction ``f`` of the budget at most ``alpha * f**rho`` may have been spent (the Kim-DeMets
power family; ``rho = 2`` spends little early, so early looks stop only clear cases, and
keeps most of ``alpha`` for the last look). Look ``i`` uses a two-sided interval at
``1 - alpha_i``, where ``alpha_i`` is what it may spend. A look that is skipped (too little
data yet) passes its share to the next one. By the union bound, the chance that *any* look's
interval misses the true change is at most the sum of the ``alpha_i``, i.e. at most
``alpha``, whatever the dependence between looks and whenever the comparison stops, so every
decision (fail, equivalent, improvement) made at any look is wrong with probability at most
``alpha`` (at most ``alpha / 2`` in each direction).
"""

from __future__ import annotations

from dataclasses import dataclass

from glmfb.core.measure.stats import Decision, Estimate, decide

DEFAULT_ALPHA = 0.05
DEFAULT_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 1.0)
DEFAULT_RHO = 2.0


@dataclass(frozen=True)
class LookPlan:
    """When to look (fractions of the budget, increasing, ending at 1) and how to spend."""

    alpha: float = DEFAULT_ALPHA
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    rho: float = DEFAULT_RHO

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha {self.alpha} must lie in (0, 1)")
        if not self.fractions or self.fractions[-1] != 1.0:
            raise ValueError("the look fractions must end at 1.0")
        if any(b <= a for a, b in zip(self.fractions, self.fractions[1:], strict=False)):
            raise ValueError("the look fractions must increase")
        if self.fractions[0] <= 0.0 or self.rho <= 0.0:
            raise ValueError("look fractions and rho must be positive")

    @property
    def looks(self) -> int:
        return len(self.fractions)

    def spent(self, fraction: float) -> float:
        """Alpha that may have been spent by ``fraction`` of the budget."""
        return self.alpha * min(1.0, max(0.0, fraction)) ** self.rho

    def level(self, spent_before: float, fraction: float) -> float:
        """Two-sided confidence of a look at ``fraction`` after ``spent_before`` was spent."""
        share = self.spent(fraction) - spent_before
        return 1.0 - max(share, 1e-12)

    def levels(self) -> list[float]:
        """The confidence of each planned look when none is skipped."""
        spent = 0.0
        out = []
        for fraction in self.fractions:
            out.append(self.level(spent, fraction))
            spent = self.spent(fraction)
        return out

    def due(self, done: int, fraction: float) -> int:
        """How many planned looks are due at ``fraction`` (counting from look ``done``)."""
        count = done
        while count < self.looks and self.fractions[count] <= fraction + 1e-12:
            count += 1
        return count


def decide_with_floor(estimate: Estimate, threshold: float, floor: float) -> Decision:
    """:func:`glmfb.core.measure.stats.decide`, with effects below the A/A floor never called an effect:
    a regression or an improvement needs the interval beyond ``max(threshold, floor)``.
    Raising the bar only removes fails and improvements, so it never adds an error; an
    equivalence is judged against the threshold alone."""
    decision = decide(estimate, threshold)
    effective = max(threshold, floor)
    if decision is Decision.REGRESSION and estimate.low <= effective:
        return Decision.UNDECIDED
    if decision is Decision.IMPROVEMENT and estimate.high >= -effective:
        return Decision.UNDECIDED
    return decision


def bonferroni_pvalue(pvalue: float, confidence: float, alpha: float = DEFAULT_ALPHA) -> float:
    """A look's p-value on the overall scale: it is <= ``alpha`` exactly when the look's
    interval (at ``confidence``) excludes zero."""
    share = 1.0 - confidence
    return min(1.0, pvalue * alpha / share) if share > 0 else pvalue

