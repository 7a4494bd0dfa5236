"""Student's t without scipy: quantiles against published table values, CDF identities."""

from __future__ import annotations

import math

import pytest

from glmfb.core.measure.tdist import betainc, t_cdf, t_quantile, t_two_sided_pvalue


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 1, 12.706205),  # the classic tables
        (0.975, 3, 3.182446),
        (0.975, 10, 2.228139),
        (0.995, 7, 3.499483),
        (0.999, 30, 3.385185),
        (0.95, 2, 2.919986),
        (0.975, 1e6, 1.959966),  # the normal limit
    ],
)
def test_quantiles_match_tables(p: float, df: float, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, rel=1e-5)
    assert t_quantile(1 - p, df) == pytest.approx(-expected, rel=1e-5)


def test_cdf_identities() -> None:
    assert t_cdf(0.0, 5) == pytest.approx(0.5)
    for df in (1, 2.5, 9):
        for t in (-3.0, -0.4, 0.7, 4.0):
            assert t_cdf(t, df) + t_cdf(-t, df) == pytest.approx(1.0)
            assert t_cdf(t_quantile(t_cdf(t, df), df), df) == pytest.approx(t_cdf(t, df))
    # df = 1 is the Cauchy distribution
    assert t_cdf(1.0, 1) == pytest.approx(0.75)
    assert t_two_sided_pvalue(2.228139, 10) == pytest.approx(0.05, rel=1e-4)
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-4)
    assert t_cdf(math.inf, 3) == 1.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        t_cdf(1.0, 0)
