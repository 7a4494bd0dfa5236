"""Statistics of glmfb bench: changes from intervals, floors, FDR and geomean, saved runs."""

from __future__ import annotations

import math
import random

import pytest

from glmfb.bench.decision import (
    LOOK_CONFIDENCE,
    SavedRun,
    aa_biased,
    change_from_interval,
    combine,
    decide_with_floor,
    noise_floor,
    normal_change,
    pairs_needed,
    samples_needed,
    saved_change,
)
from glmfb.core.measure.intervals import pair_interval
from glmfb.core.measure.stats import Decision


def units(effect: float, pairs: int, between: float, within: float, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(pairs):
        offset = math.log1p(effect) + rng.gauss(0, between)
        out.append([offset + rng.gauss(0, within) for _ in range(20)])
    return out


def test_change_from_interval_keeps_the_interval_and_adjusts_the_pvalue() -> None:
    interval = pair_interval(units(0.10, 12, 0.01, 0.01, 1), 0.99)
    change = change_from_interval(interval)
    assert change.estimate == interval.estimate
    assert change.pvalue == pytest.approx(min(1.0, interval.pvalue * 0.05 / 0.01))
    assert change.samples == 240 and change.spread == interval.log_se
    assert change.log_replicates.mean() == pytest.approx(interval.log_point, abs=0.002)
    assert decide_with_floor(change, 0.05, 0.0) is Decision.REGRESSION
    assert 0.95 < LOOK_CONFIDENCE < 1


def test_equivalence_improvement_and_the_floor() -> None:
    same = change_from_interval(pair_interval(units(0.0, 12, 0.005, 0.01, 2), 0.99))
    assert decide_with_floor(same, 0.05, 0.0) is Decision.EQUIVALENT
    faster = change_from_interval(pair_interval(units(-0.5, 12, 0.005, 0.01, 3), 0.99))
    assert decide_with_floor(faster, 0.05, 0.0) is Decision.IMPROVEMENT
    slower = normal_change(1.06, 0.002, 100)
    assert decide_with_floor(slower, 0.05, 0.0) is Decision.REGRESSION
    assert decide_with_floor(slower, 0.05, 0.08) is Decision.UNDECIDED


def test_aa_floor_and_bias() -> None:
    aa = normal_change(1.03, 0.005, 50)
    assert noise_floor(aa) == pytest.approx(0.03)
    assert aa_biased(aa)
    assert not aa_biased(normal_change(1.001, 0.01, 50))


def test_samples_and_pairs_needed_scale_with_the_gap_to_the_threshold() -> None:
    change = change_from_interval(pair_interval(units(0.08, 6, 0.03, 0.01, 4), 0.99))
    needed = samples_needed(change, 0.05)
    assert math.isfinite(needed) and needed > 0
    assert pairs_needed(change, 0.05) == pytest.approx(needed * 6 / 120)
    assert samples_needed(normal_change(1.05, 0.02, 50), 0.05) == math.inf


def test_combine_applies_benjamini_hochberg_and_gives_a_geomean() -> None:
    strong = [change_from_interval(pair_interval(units(0.2, 8, 0.01, 0.01, s), 0.99)) for s in range(3)]
    weak = normal_change(1.06, 0.03, 20)  # p about 0.05: not significant among four
    changes = [*strong, weak]
    combined = combine(changes, [Decision.REGRESSION] * 4)
    assert combined.decisions[:3] == (Decision.REGRESSION,) * 3
    assert combined.significant == (True, True, True, False)
    assert combined.decisions[3] is Decision.UNDECIDED
    expected = math.exp(sum(math.log1p(c.estimate.value) for c in changes) / 4) - 1
    assert combined.geomean.value == pytest.approx(expected)
    assert combined.geomean.low < combined.geomean.value < combined.geomean.high


def run_of(median: float, n: int, seed: int, sd: float = 0.01, allocations: int = 0) -> SavedRun:
    rng = random.Random(seed)
    values = [median * math.exp(rng.gauss(0, sd)) for _ in range(n)]
    owners = [i % allocations for i in range(n)] if allocations else None
    return SavedRun(values, owners, sorted(values)[n // 2], 0.0, n)


def test_saved_one_run_a_side_carries_the_process_floor() -> None:
    a, b = run_of(1e-4, 200, 1), run_of(1.03e-4, 200, 2)
    with_floor = saved_change([a], [b], same_process=False, process_sd=0.02, process_df=14)
    assert with_floor.uses_floor and with_floor.method == "one run a side + process floor"
    low, high = with_floor.change.estimate.ci
    assert low < 0 < 0.03 < high  # +3% is far inside what two processes differ by
    assert decide_with_floor(with_floor.change, 0.05, 0.0) is Decision.UNDECIDED
    with pytest.raises(ValueError, match="floor"):
        saved_change([a], [b], same_process=False, process_sd=None, process_df=None)
    one_process = saved_change([a], [b], same_process=True, process_sd=None, process_df=None)
    assert one_process.method == "one process" and one_process.change.estimate.low > 0


def test_saved_runs_are_the_units_when_there_are_several() -> None:
    rng = random.Random(5)
    base = [run_of(1e-4 * math.exp(rng.gauss(0, 0.03)), 100, s) for s in range(3)]
    cand = [run_of(1.3e-4 * math.exp(rng.gauss(0, 0.03)), 100, 10 + s) for s in range(3)]
    change = saved_change(base, cand, same_process=False, process_sd=None, process_df=None)
    assert change.method == "runs" and not change.uses_floor
    assert change.change.interval is not None and change.change.interval.df == 4
    assert decide_with_floor(change.change, 0.05, 0.0) is Decision.REGRESSION


def test_saved_allocations_of_one_process_are_the_units() -> None:
    a, b = run_of(1e-4, 120, 1, allocations=6), run_of(1e-4, 120, 2, allocations=6)
    change = saved_change([a], [b], same_process=True, process_sd=None, process_df=None)
    assert change.method == "allocations"
    assert change.change.interval is not None and change.change.interval.units == 12
    assert decide_with_floor(change.change, 0.05, 0.0) is Decision.EQUIVALENT
