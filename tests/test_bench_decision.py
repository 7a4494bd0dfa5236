"""Statistics of glmfb bench: paired and unpaired changes, floors, looks, FDR, geomean."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from glmfb.bench.decision import (
    LOOK_CONFIDENCE,
    aa_biased,
    combine,
    decide_with_floor,
    look_schedule,
    noise_floor,
    normal_change,
    paired_change,
    samples_needed,
    unpaired_change,
)
from glmfb.stats import Decision


def noisy(n: int, scale: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 100e-6 * np.exp(rng.normal(0.0, scale, n))


def test_paired_change_recovers_a_planted_ratio_despite_drift() -> None:
    rng = np.random.default_rng(1)
    drift = np.exp(np.linspace(0.0, 0.5, 400))  # the host slows down by 65% during the run
    base = 100e-6 * drift * np.exp(rng.normal(0, 0.02, 400))
    cand = 1.10 * 100e-6 * drift * np.exp(rng.normal(0, 0.02, 400))
    change = paired_change(base, cand)
    assert change.estimate.low < 0.10 < change.estimate.high
    assert change.estimate.high - change.estimate.low < 0.02
    assert decide_with_floor(change, 0.05, 0.0) is Decision.REGRESSION
    assert change.pvalue < 0.01


def test_unpaired_change_is_wider_than_paired_on_drifting_data() -> None:
    rng = np.random.default_rng(2)
    drift = np.exp(np.linspace(0.0, 0.5, 300))
    base = drift * np.exp(rng.normal(0, 0.02, 300))
    cand = 1.05 * drift * np.exp(rng.normal(0, 0.02, 300))
    paired = paired_change(base, cand).estimate
    unpaired = unpaired_change(base, cand).estimate
    assert (unpaired.high - unpaired.low) > 3 * (paired.high - paired.low)


def test_equivalence_and_improvement() -> None:
    base = noisy(300, 0.01, 3)
    same = paired_change(base, base * np.exp(np.random.default_rng(4).normal(0, 0.01, 300)))
    assert decide_with_floor(same, 0.05, 0.0) is Decision.EQUIVALENT
    faster = paired_change(base, base * 0.5)
    assert faster.estimate.value == pytest.approx(-0.5)
    assert decide_with_floor(faster, 0.05, 0.0) is Decision.IMPROVEMENT


def test_noise_floor_keeps_small_effects_from_being_called() -> None:
    base = noisy(200, 0.005, 5)
    change = paired_change(base, base * 1.06)
    assert decide_with_floor(change, 0.05, 0.0) is Decision.REGRESSION
    assert decide_with_floor(change, 0.05, 0.08) is Decision.UNDECIDED


def test_aa_floor_and_bias() -> None:
    base = noisy(200, 0.01, 6)
    aa = paired_change(base, base * 1.03)
    assert noise_floor(aa) == pytest.approx(0.03, abs=1e-6)
    assert aa_biased(aa)
    unbiased = paired_change(base, noisy(200, 0.01, 7) * 1.0)
    assert not aa_biased(unbiased) or abs(unbiased.estimate.value) < 0.01


def test_bad_samples_are_rejected() -> None:
    with pytest.raises(ValueError):
        paired_change([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_change([1.0, math.nan], [1.0, 1.0])
    with pytest.raises(ValueError):
        unpaired_change([1.0], [1.0, 2.0])


def test_look_schedule_grows_and_is_bounded() -> None:
    looks = look_schedule(16)
    assert looks[0] == 16 and len(looks) == 8
    assert all(b > a for a, b in itertools.pairwise(looks))
    assert 0.95 < LOOK_CONFIDENCE < 1


def test_samples_needed_scales_with_the_gap_to_the_threshold() -> None:
    base = noisy(100, 0.05, 8)
    change = paired_change(base, base * np.exp(np.random.default_rng(9).normal(0.08, 0.05, 100)))
    needed = samples_needed(change, 0.05)
    assert math.isfinite(needed) and needed > 0
    at_threshold = normal_change(1.05, 0.02, 50)
    assert samples_needed(at_threshold, 0.05) == math.inf


def test_combine_applies_benjamini_hochberg_and_gives_a_geomean() -> None:
    strong = [paired_change(noisy(100, 0.01, s), noisy(100, 0.01, s) * 1.2) for s in range(3)]
    weak = normal_change(1.06, 0.03, 20)  # p about 0.05: not significant among four
    changes = [*strong, weak]
    decisions = [Decision.REGRESSION] * 3 + [Decision.REGRESSION]
    combined = combine(changes, decisions)
    assert combined.decisions[:3] == (Decision.REGRESSION,) * 3
    assert combined.significant[:3] == (True, True, True)
    expected = math.exp(sum(math.log1p(c.estimate.value) for c in changes) / 4) - 1
    assert combined.geomean.value == pytest.approx(expected)
    assert combined.geomean.low < combined.geomean.value < combined.geomean.high
