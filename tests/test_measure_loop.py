"""The measurement loop on scripted timings: block order, looks, budget, decisions, and the
error rates of the decision rule in small simulations (no real timing anywhere)."""

from __future__ import annotations

import math
import random
from collections import Counter
from itertools import count, pairwise

import pytest

from glmfb.core.measure import Settings, compare
from glmfb.core.measure.intervals import pair_interval
from glmfb.core.measure.loop import Arm, Pair
from glmfb.core.measure.simulate import (
    FakeClock,
    HostModel,
    ScriptedSide,
    constant_arm,
    scripted_pairs,
)
from glmfb.core.measure.stats import Decision


def sides(effect: float, between_sd: float = 0.0, within_sd: float = 0.01) -> tuple[ScriptedSide, ScriptedSide]:
    return (ScriptedSide("baseline", between_sd=between_sd, within_sd=within_sd),
            ScriptedSide("candidate", effect=effect, between_sd=between_sd, within_sd=within_sd))


def run(effect: float, threshold: float, *, pairs: int = 8, aa: int = 2, between_sd: float = 0.0,
        within_sd: float = 0.01, budget_s: float = 1.0, seed: int = 0, host: HostModel | None = None,
        **settings: object):
    clock = FakeClock()
    baseline, candidate = sides(effect, between_sd, within_sd)
    built = scripted_pairs(baseline, candidate, pairs, clock, seed, aa_pairs=aa, host=host)
    return compare(built, Settings(threshold=threshold, budget_s=budget_s, seed=seed, **settings), clock)  # type: ignore[arg-type]


def test_blocks_alternate_abba_and_baab_on_every_pair() -> None:
    comparison = run(0.0, 0.05, pairs=3, aa=0, budget_s=0.2)
    by_pair: dict[int, list[str]] = {}
    for sample in comparison.samples:
        by_pair.setdefault(sample.pair, []).append("A" if sample.label == "baseline" else "B")
    for letters in by_pair.values():
        blocks = ["".join(letters[i:i + 4]) for i in range(0, len(letters) - 3, 4)]
        assert set(blocks) <= {"ABBA", "BAAB"}
        assert all(a != b for a, b in pairwise(blocks))  # alternating
    # every round visits every pair: the block counts differ by at most one
    assert max(len(p) for p in comparison.pairs) - min(len(p) for p in comparison.pairs) <= 1


def test_block_value_is_the_faster_sample_and_the_effect_its_log_ratio() -> None:
    clock = FakeClock()
    a_values = iter([2.0, 1.0] * 100)
    b_values = iter([3.0, 1.5] * 100)
    pairs = [Pair("ab", j, constant_arm("baseline", j, lambda: next(a_values), clock),
                  constant_arm("candidate", j, lambda: next(b_values), clock)) for j in range(2)]
    comparison = compare(pairs, Settings(threshold=0.05, budget_s=30.0, seed=1), clock)
    for pair in comparison.pairs:
        assert set(pair.a_blocks) == {1.0} and set(pair.b_blocks) == {1.5}
        assert pair.effects[0] == pytest.approx(math.log(1.5))
    assert comparison.decision is Decision.REGRESSION
    assert comparison.final is not None and comparison.final.interval.estimate.value == pytest.approx(0.5)


def test_planted_two_fold_slowdown_stops_at_the_first_look() -> None:
    comparison = run(1.0, 0.05, budget_s=4.0)
    assert comparison.decision is Decision.REGRESSION
    assert comparison.stopped_by == "decided"
    assert len(comparison.looks) == 1 and comparison.final is not None
    assert comparison.final.confidence == pytest.approx(1 - 0.05 * 0.1**2)
    assert comparison.elapsed_s < 0.8  # a tenth of the budget, plus the round in flight


def test_identical_sides_are_equivalent_and_an_improvement_is_one() -> None:
    assert run(0.0, 0.05).decision is Decision.EQUIVALENT
    assert run(-0.5, 0.05).decision is Decision.IMPROVEMENT


def test_a_change_on_the_threshold_ends_undecided_at_the_budget() -> None:
    comparison = run(0.05, 0.05, budget_s=1.0)
    assert comparison.decision is Decision.UNDECIDED
    assert comparison.stopped_by == "budget"
    levels = [look.confidence for look in comparison.looks]
    assert sum(1 - level for level in levels) == pytest.approx(0.05)  # all of alpha, no more
    assert comparison.elapsed_s == pytest.approx(1.0, abs=0.05)


def test_between_allocation_variance_widens_the_interval_instead_of_failing() -> None:
    """Identical code whose allocations differ by a few percent: every one-allocation-a-side
    reading is tight around that allocation's luck, the pairs interval is not."""
    wide = run(0.0, 0.02, pairs=8, between_sd=0.03, within_sd=0.002, budget_s=1.0, seed=3)
    assert wide.decision is not Decision.REGRESSION
    final = wide.final
    assert final is not None and final.interval.between_sd is not None
    assert final.interval.between_sd > 5 * (final.interval.within_sd or 0.0) / math.sqrt(40)
    # the same data read the old way: one pair's blocks as if independent
    offsets = [pair_interval([[e] for e in pair.effects], 0.95).estimate for pair in wide.ab]
    assert any(e.low > 0.02 or e.high < -0.02 for e in offsets)


def test_repeats_cap_and_the_rounds_always_run() -> None:
    comparison = run(0.0, 0.0001, budget_s=100.0, max_rounds=5)
    assert comparison.rounds == 5 and comparison.stopped_by == "repeats"
    tiny = run(0.0, 0.05, budget_s=1e-6, min_rounds=1, min_blocks_per_pair=1)
    assert tiny.rounds == 1 and tiny.final is not None
    nothing = run(0.0, 0.05, budget_s=1e-6)
    assert nothing.final is None and nothing.decision is Decision.UNDECIDED


def test_aa_pairs_give_the_floor_and_it_never_adds_a_fail() -> None:
    comparison = run(0.08, 0.05, pairs=8, aa=4, between_sd=0.01, budget_s=1.0, seed=5)
    final = comparison.final
    assert final is not None and final.aa is not None
    assert final.floor == pytest.approx(abs(final.aa.estimate.value))
    assert len(comparison.aa) == 4 and all(p.pair.kind == "aa" for p in comparison.aa)


def test_a_bad_sample_is_an_error_not_a_reading() -> None:
    clock = FakeClock()
    ticks = count()
    pairs = [Pair("ab", j, Arm("baseline", j, lambda: 1e-4), Arm("candidate", j,
                  lambda: math.nan if next(ticks) > 3 else 1e-4)) for j in range(2)]
    with pytest.raises(ValueError, match="candidate read nan"):
        compare(pairs, Settings(threshold=0.05, budget_s=1.0), clock)


def error_rates(effect: float, threshold: float, trials: int, **kwargs: object) -> Counter[str]:
    return Counter(run(effect, threshold, seed=s, **kwargs).decision.value for s in range(trials))  # type: ignore[arg-type]


def test_error_rates_on_a_noisy_host() -> None:
    """Small simulations with allocation luck, sample jitter and bursts of load: A/A never
    fails, a true +6% is never called equivalent at 5%, a +10% is detected."""
    noise = {"pairs": 8, "aa": 2, "between_sd": 0.01, "within_sd": 0.03, "budget_s": 0.6}
    hosts = iter(HostModel(burst_rate_per_s=0.5, burst_length_s=0.2, seed=s) for s in range(10_000))
    aa = Counter(run(0.0, 0.05, seed=s, host=next(hosts), **noise).decision.value for s in range(60))  # type: ignore[arg-type]
    assert aa["regression"] == 0 and aa["improvement"] == 0
    six = error_rates(0.06, 0.05, 60, **noise)
    assert six["equivalent"] == 0 and six["improvement"] == 0
    ten = error_rates(0.10, 0.05, 30, **noise)
    assert ten["regression"] >= 27


def test_error_rate_at_the_threshold_is_at_most_half_alpha() -> None:
    """A true change exactly at the threshold is a fail or an equivalence only by an interval
    that misses the truth: over all looks that happens in at most alpha / 2 of trials each way."""
    rng = random.Random(0)
    outcomes = Counter(
        run(0.05, 0.05, pairs=6, aa=0, between_sd=0.02, within_sd=0.02, budget_s=0.3,
            seed=rng.randrange(1 << 30)).decision.value
        for _ in range(300)
    )
    assert outcomes["regression"] <= 0.025 * 300 + 5  # binomial slack for 300 trials
    assert outcomes["equivalent"] <= 0.025 * 300 + 5
