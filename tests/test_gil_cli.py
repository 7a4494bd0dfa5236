"""``glmfb gil`` through the CLI (CliRunner, JSON checked) and ``glmfb run`` on probes/gil.toml."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from glmfb import suite
from glmfb.cli import app
from glmfb.verdict import ExitCode, Status

ROOT = Path(__file__).resolve().parents[1]
DISPATCH = ROOT / "scenarios" / "dispatch_gil" / "dispatch.py"
runner = CliRunner()


@pytest.mark.slow
def test_cli_json_holding_dispatch_fails_with_exit_1(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "gil",
            "--json",
            "--duration",
            "1.5",
            "--out",
            str(tmp_path),
            "--",
            sys.executable,
            str(DISPATCH),
            "--mode",
            "hold",
            "--duration",
            "30",
        ],
    )
    assert result.exit_code == ExitCode.REGRESSION, result.output
    data = json.loads(result.stdout)
    assert data["schema"] == "glmfb.verdict/2" and data["probe"] == "gil"
    assert data["status"] == "fail"
    assert data["where"]["function"] == "intranode_dispatch"
    assert Path(data["artifacts"]["pyspy_raw"]).parent.parent.parent == tmp_path


def test_cli_command_not_found_is_exit_3_json(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["gil", "--json", "--out", str(tmp_path), "--", "no-such-command-glmfb"]
    )
    assert result.exit_code == ExitCode.HARNESS_ERROR
    data = json.loads(result.stdout)
    assert data["status"] == "error" and data["layer"] == "harness"
    assert "command not found" in data["why"]


@pytest.mark.parametrize(
    "args",
    [
        ["gil", "--json"],  # nothing to trace
        ["gil", "--pid", "1", "--", "python", "x.py"],  # two things to trace
        ["gil", "--arg", "k=v", "--", "python", "x.py"],  # --arg without --target
        ["gil", "--starvation-p99", "soon", "--", "python", "x.py"],
        ["gil", "--rate", "0", "--", "python", "x.py"],
        ["gil", "--trace", "--", "bash", "-c", "true"],  # viztracer needs python
    ],
)
def test_cli_usage_errors_exit_2(args: list[str], tmp_path: Path) -> None:
    result = runner.invoke(app, [*args[:1], "--out", str(tmp_path), *args[1:]])
    assert result.exit_code == ExitCode.USAGE, result.output


def test_probe_definitions_resolve_python_and_paths() -> None:
    definitions = {d.name: d for d in suite.load_definitions([ROOT / "probes" / "gil.toml"])}
    hold = definitions["gil-dispatch-holds-gil"].config
    assert hold.command[0] == sys.executable
    assert Path(hold.command[1]) == DISPATCH
    assert hold.duration_s == 3 and hold.starvation_p99_ms == 10.0
    target = definitions["gil-dispatch-target-holds-gil"].config
    assert target.target is not None and target.target.args == {"mode": "hold"}
    assert definitions["gil-dispatch-holds-gil"].expect is not None


@pytest.mark.slow
def test_suite_runs_the_holding_probe_and_meets_its_expectation(tmp_path: Path) -> None:
    definitions = suite.select(
        suite.load_definitions([ROOT / "probes" / "gil.toml"]), ["gil-dispatch-holds-gil"]
    )
    run = suite.run_suite(definitions, suite.SuiteContext("t", tmp_path))
    (verdict,) = run.verdicts
    assert verdict.status is Status.FAIL and verdict.expect_met, verdict.why
