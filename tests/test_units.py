"""Units users type: a fraction is 5% or 0.05; a bare 5 is refused, never read as 500%.

Every fraction option of every built-in probe is checked, on the command line and in a TOML
definition, so an option added later is covered without editing this file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from glmfb.contract.options import FRACTION, options_of
from glmfb.contract.units import OptionValueError, parse_fraction
from glmfb.core.probe import get_probe
from glmfb.core.registry import known_kinds

HERE = Path(__file__).resolve()


def fraction_options() -> list[tuple[str, str, str]]:
    """(kind, TOML key, CLI flag) of every fraction option of the built-in probes."""
    found = []
    for kind in known_kinds():
        for spec in options_of(get_probe(kind).config_type):
            if spec.type is FRACTION:
                found.append((kind, spec.key, spec.flag if spec.cli else ""))
    return found


def test_the_probes_have_fraction_options() -> None:
    kinds = {kind for kind, _, _ in fraction_options()}
    assert {"bench", "gap"} <= kinds  # the thresholds; a test that finds none would prove nothing


@pytest.mark.parametrize(
    ("text", "value"),
    [("5%", 0.05), ("0.05", 0.05), (0.05, 0.05), ("2.5%", 0.025), (" 10% ", 0.10), ("0", 0.0), ("150%", 1.5)],
)
def test_fractions_and_percentages(text: str | float, value: float) -> None:
    assert parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize("text", [5, "5", 5.0, "12.5", 1.5, 1])
def test_a_bare_number_of_one_or_more_is_refused_with_the_fix(text: str | float) -> None:
    with pytest.raises(OptionValueError, match="ambiguous") as caught:
        parse_fraction(text)
    assert "%" in caught.value.hint
    if text in (5, "5", 5.0):
        assert caught.value.hint.startswith("write 5% or 0.05")


@pytest.mark.parametrize("text", ["five", True, "nan", "-1%", "-0.1", "inf"])
def test_other_bad_values(text: str | bool) -> None:
    with pytest.raises(OptionValueError):
        parse_fraction(text)


@pytest.mark.parametrize(("kind", "key", "flag"), fraction_options())
def test_every_fraction_option_refuses_a_bare_5_on_the_command_line(kind: str, key: str, flag: str,
                                                                    tmp_path: Path) -> None:
    from glmfb.cli import app

    if not flag:
        pytest.skip(f"{kind}.{key} is not a command-line option")
    result = CliRunner().invoke(app, [kind, f"{HERE}:nothing", f"{HERE}:nothing", flag, "5", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "write 5% or 0.05" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("kind", "key", "flag"), fraction_options())
def test_every_fraction_option_refuses_a_bare_5_in_a_definition(kind: str, key: str, flag: str,
                                                                 tmp_path: Path) -> None:
    from glmfb.cli import app

    definition = tmp_path / "p.toml"
    definition.write_text(f'[[probe]]\nname = "a"\nprobe = "{kind}"\nbaseline = "{HERE}:nothing"\n'
                          f'candidate = "{HERE}:nothing"\noptions = {{ {key} = 5 }}\n')
    result = CliRunner().invoke(app, ["run", str(definition), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "write 5% or 0.05" in result.output and "Traceback" not in result.output
