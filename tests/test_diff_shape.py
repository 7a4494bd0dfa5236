"""Growth fits, error-shape classes, precision signatures and the diagnosis rules."""

from __future__ import annotations

import math

import pytest
import torch

from glmfb.diff.metrics import typical_relative_error
from glmfb.diff.rules import RULES, DiffFindings
from glmfb.diff.shape import (
    ErrorShape,
    classify,
    growth_fit,
    is_spike,
    position_curve,
    precision_signature,
)
from glmfb.rules import diagnose


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


def _diagnose(findings: DiffFindings) -> tuple[str, tuple[str, ...], str]:
    outcome = diagnose(RULES, findings)
    return outcome.diagnosis.why, outcome.diagnosis.next, outcome.rule.name


def test_diagnosis_rules_pick_the_cause() -> None:
    tf32 = precision_signature(2.2e-4, "test")
    bf16 = precision_signature(1.5e-3, "test")
    fit = growth_fit([64, 128, 256], [1e-3, 2e-3, 4e-3], "requests")
    growing = DiffFindings(failed=True, requests=3, failing_requests=2, module="layers.0.scan", local=True,
                           shape=ErrorShape.GROWING, fit=fit, signature=tf32, dtype="float32", rerun="glmfb diff a b")
    why, steps, rule = _diagnose(growing)
    assert rule == "growing-tf32" and "TF32" in why and "layers.0.scan" in why
    assert steps[-1] == "glmfb diff a b"
    rounded = DiffFindings(failed=True, requests=3, failing_requests=3, module="mlp.down_proj", local=True,
                           shape=ErrorShape.CONSTANT, signature=bf16, dtype="float32")
    why, _, rule = _diagnose(rounded)
    assert rule == "bf16-rounding" and "bfloat16" in why and "mlp.down_proj" in why
    inherited = DiffFindings(failed=True, requests=1, failing_requests=1, local=False, first_divergent="x",
                             shape=ErrorShape.CONSTANT)
    assert _diagnose(inherited)[2] == "inherited-only"
    assert _diagnose(DiffFindings(failed=False, requests=2, failing_requests=0))[2] == "pass"
    assert _diagnose(DiffFindings(failed=True, requests=1, failing_requests=1, shape=ErrorShape.NON_FINITE,
                                  nonfinite_tap="out"))[2] == "non-finite"


def test_the_diagnosis_records_what_the_rule_saw() -> None:
    fit = growth_fit([64, 128, 256], [1e-3, 2e-3, 4e-3], "requests")
    outcome = diagnose(RULES, DiffFindings(failed=True, requests=3, failing_requests=2, module="m", local=True,
                                           shape=ErrorShape.GROWING, fit=fit, dtype="float32"))
    assert outcome.record.rule == "growing" and outcome.record.checked == ("pass", "non-finite", "growing-tf32")
    assert outcome.record.saw["growth_exponent"] == pytest.approx(1.0) and outcome.record.saw["module"] == "m"
