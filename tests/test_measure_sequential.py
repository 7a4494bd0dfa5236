"""Alpha spending over looks: the levels add up to alpha, skipped looks pass their share on."""

from __future__ import annotations

import pytest

from glmfb.core.measure.sequential import LookPlan, bonferroni_pvalue, decide_with_floor
from glmfb.core.measure.stats import Decision, Estimate


def test_levels_spend_exactly_alpha() -> None:
    plan = LookPlan(alpha=0.05, fractions=(0.25, 0.5, 0.75, 1.0), rho=2.0)
    levels = plan.levels()
    assert sum(1 - level for level in levels) == pytest.approx(0.05)
    assert levels[0] > levels[-1]  # little spent early
    assert 1 - levels[0] == pytest.approx(0.05 / 16)
    # a skipped look (no data yet) passes its share to the next one
    assert 1 - plan.level(0.0, 0.5) == pytest.approx(plan.spent(0.5))


def test_due_counts_the_planned_looks_passed() -> None:
    plan = LookPlan(fractions=(0.25, 0.5, 0.75, 1.0))
    assert plan.due(0, 0.1) == 0
    assert plan.due(0, 0.3) == 1
    assert plan.due(1, 0.8) == 3
    assert plan.due(3, 1.0) == 4


@pytest.mark.parametrize("fractions", [(), (0.5,), (0.5, 0.4, 1.0), (0.0, 1.0)])
def test_bad_plans(fractions: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        LookPlan(fractions=fractions)


def test_floor_only_removes_effects() -> None:
    regression = Estimate(0.09, 0.07, 0.11)
    assert decide_with_floor(regression, 0.05, 0.0) is Decision.REGRESSION
    assert decide_with_floor(regression, 0.05, 0.08) is Decision.UNDECIDED
    improvement = Estimate(-0.09, -0.11, -0.07)
    assert decide_with_floor(improvement, 0.05, 0.08) is Decision.UNDECIDED
    equivalent = Estimate(0.0, -0.01, 0.01)
    assert decide_with_floor(equivalent, 0.05, 0.5) is Decision.EQUIVALENT


def test_bonferroni_pvalue_matches_the_look_level() -> None:
    # a look at 99% excludes zero exactly when p < 0.01, i.e. the adjusted p < 0.05
    assert bonferroni_pvalue(0.01, 0.99, 0.05) == pytest.approx(0.05)
    assert bonferroni_pvalue(0.5, 0.99, 0.05) == 1.0
