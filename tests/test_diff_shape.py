"""Growth fits, error-shape classes, the error along positions, precision signatures."""

from __future__ import annotations

import math

import pytest
import torch

from glmfb.diff.metrics import typical_relative_error
from glmfb.diff.shape import (
    ErrorShape,
    classify,
    growth_fit,
    is_spike,
    position_curve,
    position_profile,
    precision_signature,
)


def test_growth_fit_recovers_a_power_law() -> None:
    lengths = [64, 128, 256, 512, 1024]
    fit = growth_fit(lengths, [1e-4 * (n / 64) ** 0.5 for n in lengths], "requests")
    assert fit is not None
    assert fit.exponent == pytest.approx(0.5)
    assert fit.exponent_r2 == pytest.approx(1.0)
    assert fit.slope > 0
    assert classify(fit, nonfinite=False, spike=False, any_error=True) is ErrorShape.GROWING


def test_constant_error_and_too_few_lengths() -> None:
    fit = growth_fit([8, 16, 32, 64], [1e-3, 1.1e-3, 0.95e-3, 1.02e-3], "requests")
    assert fit is not None and abs(fit.exponent) < 0.1
    assert classify(fit, nonfinite=False, spike=False, any_error=True) is ErrorShape.CONSTANT
    assert growth_fit([8, 8, 16], [1.0, 2.0, 3.0], "requests") is None
    assert classify(None, nonfinite=False, spike=True, any_error=True) is ErrorShape.SPIKE
    assert classify(fit, nonfinite=True, spike=False, any_error=True) is ErrorShape.NON_FINITE
    assert classify(None, nonfinite=False, spike=False, any_error=False) is ErrorShape.NONE


def test_spike_and_position_curve() -> None:
    errors = [1e-7] * 200
    errors[117] = 1e-2
    assert is_spike(errors, failing_positions=1)
    assert not is_spike([1e-3] * 200, failing_positions=200)
    xs, ys = position_curve([float(i) for i in range(100)], points=10)
    assert len(xs) == 10 and ys[0] == pytest.approx(4.5) and xs[0] == pytest.approx(5.5)


@pytest.mark.parametrize(
    ("base_dtype", "rounded_to", "nearest"),
    [
        (torch.float32, torch.bfloat16, "bf16"),
        (torch.float32, torch.float16, "tf32/fp16"),
        (torch.float64, torch.float32, "fp32"),
    ],
)
def test_precision_signature_names_the_rounding(base_dtype: torch.dtype, rounded_to: torch.dtype, nearest: str) -> None:
    base = torch.randn(1, 64, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(base_dtype)
    cand = base.to(rounded_to).to(base_dtype)
    observed = typical_relative_error(base, cand, dim=1)
    assert observed is not None
    signature = precision_signature(observed, "test")
    assert signature.nearest == nearest
    assert signature.consistent


def test_precision_signature_of_nothing() -> None:
    assert precision_signature(0.0, "none").nearest == "none"
    assert not precision_signature(math.nan, "nan").consistent
    same = torch.ones(1, 4, 3)
    assert typical_relative_error(same, same.clone(), dim=1) is None


def test_position_profile_tells_a_step_from_growth() -> None:
    # a window: zero up to position 15, then an error that grows (more tokens masked out)
    window = [0.0] * 16 + [0.05 * (1 + i) for i in range(48)]
    step = position_profile(window, [0] * 16 + [64] * 48)
    assert step is not None and step.onset == 16 and step.step and step.growing
    # a rotary angle error: zero at position 0 only, growing from 0: growth, not a step
    rotary = [0.0] + [1e-3 * i for i in range(1, 64)]
    growth = position_profile(rotary, [0] + [64] * 63)
    assert growth is not None and growth.onset == 1 and growth.growing and not growth.step
    # a table re-drawn from row 24 on: zero, then flat
    table = position_profile([0.0] * 24 + [0.9] * 16, [0] * 24 + [64] * 16)
    assert table is not None and table.step and not table.growing
    # a corrupt row 1 on: onset 1 and flat is a step too
    first_row = position_profile([0.0] + [0.5] * 40, [0] + [64] * 40)
    assert first_row is not None and first_row.step
    # rounding noise from position 0: neither
    noise = [1e-3 * (1 + 0.1 * math.sin(i)) for i in range(64)]
    flat = position_profile(noise, [64] * 64)
    assert flat is not None and flat.onset == 0 and not flat.step and not flat.growing
    # growth whose early positions are within tolerance but not zero: still growth
    early = [1e-4 * (i + 1) for i in range(64)]
    ramp = position_profile(early, [0] * 10 + [64] * 54)
    assert ramp is not None and ramp.onset == 10 and ramp.growing and not ramp.step
    assert position_profile([0.0] * 8, [0] * 8) is None


def test_an_error_that_rises_and_saturates_grows_along_the_sequence() -> None:
    # the cosine of a drifting angle: it climbs, then levels off near sqrt(2) (a loose power law)
    saturating = [0.0] + [min(1.4, 0.05 * i) + 0.2 * math.sin(0.7 * i) ** 2 for i in range(1, 64)]
    profile = position_profile(saturating, [0] + [64] * 63)
    assert profile is not None and profile.rises and profile.growing and not profile.step
    assert profile.rise >= 4 and profile.rank_correlation >= 0.5


def test_growth_needs_a_real_factor_over_the_span() -> None:
    # three lengths 16..64 whose errors wobble by 20%: a high r² on three points is not growth
    fit = growth_fit([16, 32, 64], [1.0e-3, 1.12e-3, 1.2e-3], "requests")
    assert fit is not None and fit.exponent_r2 > 0.9 and fit.growth_factor < 2 and not fit.growing
    doubling = growth_fit([16, 32, 64], [1e-3, 2e-3, 4e-3], "requests")
    assert doubling is not None and doubling.growing and doubling.growth_factor == pytest.approx(4.0)
    assert doubling.predict(128) == pytest.approx(8e-3)
    assert doubling.log_intercept == pytest.approx(math.log(1e-3 / 16))


def test_a_step_is_labelled_a_step_whatever_the_fits_say() -> None:
    """The position-onset pattern is the label too: one failing position after the onset (a short
    request) would otherwise read as a spike, and many (a long one) as constant."""
    flat = growth_fit([16, 32, 64], [1e-3, 1.1e-3, 1.05e-3], "requests")
    assert classify(flat, nonfinite=False, spike=True, any_error=True, step=True) is ErrorShape.STEP
    assert classify(flat, nonfinite=False, spike=False, any_error=True, step=True) is ErrorShape.STEP
    assert classify(flat, nonfinite=True, spike=False, any_error=True, step=True) is ErrorShape.NON_FINITE


def test_a_signature_refuted_by_the_rounding_test_is_not_consistent() -> None:
    """An error the size of bf16's rounding is consistent with bf16 only until rounding the
    baseline to bf16 fails to reproduce it; a format that was not tried leaves it as it was."""
    signature = precision_signature(2.0**-9, "test")
    assert signature.nearest == "bf16" and signature.consistent and signature.rounding_test is None
    refuted = signature.tested({"bf16", "fp16", "tf32"}, None)
    assert refuted.size_consistent and not refuted.consistent and refuted.rounding_test == "not reproduced"
    assert refuted.to_dict()["consistent"] is False and refuted.to_dict()["size_consistent"] is True
    confirmed = signature.tested({"bf16"}, "bf16")
    assert confirmed.consistent and confirmed.rounding_test == "reproduced"
    assert signature.tested({"fp16"}, "fp16").rounding_test is None  # bf16 itself never tried
    ten_bit = precision_signature(2.0**-12, "test")
    assert ten_bit.nearest == "tf32/fp16" and ten_bit.tested({"tf32"}, "tf32").rounding_test == "reproduced"
