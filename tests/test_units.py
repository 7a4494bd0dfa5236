"""Units users type: a threshold is 5% or 0.05; a bare 5 is refused, never read as 500%."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from glmfb.errors import UsageError
from glmfb.units import parse_fraction

HERE = Path(__file__).resolve()


@pytest.mark.parametrize(
    ("text", "value"),
    [("5%", 0.05), ("0.05", 0.05), (0.05, 0.05), ("2.5%", 0.025), (" 10% ", 0.10), (1, 1.0), ("0", 0.0),
     ("150%", 1.5)],
)
def test_fractions_and_percentages(text: str | float, value: float) -> None:
    assert parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", [5, "5", 5.0, "12.5", 1.5])
def test_a_bare_number_above_one_is_refused_with_the_fix(text: str | float) -> None:
    with pytest.raises(UsageError, match=r"bare number above 1 .*write .*% or 0\.") as caught:
        parse_fraction(text)
    if text in (5, "5", 5.0):
        assert str(caught.value).endswith("write 5% or 0.05")


@pytest.mark.parametrize("text", ["five", True, "nan", "-1%", "-0.1", "inf"])
def test_other_bad_values(text: str | bool) -> None:
    with pytest.raises(UsageError):
        parse_fraction(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", ["bench", "gap"])
def test_cli_threshold_5_exits_2_with_the_hint(command: str) -> None:
    from glmfb.cli import app

    extra = ["--shape", "8x8"] if command == "bench" else []
    result = CliRunner().invoke(app, [command, f"{HERE}:nothing", f"{HERE}:nothing", *extra, "--threshold", "5"])
    assert result.exit_code == 2
    assert "write 5% or 0.05" in result.output and "Traceback" not in result.output
