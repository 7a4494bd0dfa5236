"""``glmfb gil`` through the CLI (CliRunner, JSON checked) and ``glmfb run`` on probes/gil.toml."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import BundledRun
from typer.testing import CliRunner

from glmfb.cli import app
from glmfb.contract.errors import UsageError
from glmfb.contract.verdict import ExitCode, Status, Verdict
from glmfb.gil.config import GilConfig
from glmfb.workflows import suite

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
        ["gil", "--ready", "localhost:8000", "--", "python", "x.py"],  # not an http(s) URL
        ["gil", "--ready", "http://127.0.0.1:8000/health", "--pid", "1"],  # readiness is for a program glmfb starts
        ["gil", "--ready-log", "serving (", "--", "python", "x.py"],  # not a regular expression
        ["gil", "--ready-timeout", "0", "--ready-log", "up", "--", "python", "x.py"],
        ["gil", "--load", "", "--", "python", "x.py"],  # an empty command line
        ["gil", "--load", "python 'unterminated", "--", "python", "x.py"],
    ],
)
def test_cli_usage_errors_exit_2(args: list[str], tmp_path: Path) -> None:
    result = runner.invoke(app, [*args[:1], "--out", str(tmp_path), *args[1:]])
    assert result.exit_code == ExitCode.USAGE, result.output


def test_a_target_where_the_program_goes_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``glmfb gil file.py:make --arg mode=hold --out DIR``: everything after the first word is
    the program's (so a program's own flags need no --), and a target there would run as a
    program that does not exist, with --out read as its argument; instead one line that names
    --target, exit 2."""
    monkeypatch.chdir(tmp_path)  # the --out it swallows leaves the run folder in ./reports
    result = runner.invoke(app, ["gil", f"{DISPATCH}:make", "--arg", "mode=hold", "--out", str(tmp_path)])
    assert result.exit_code == ExitCode.USAGE, result.output
    assert f"give it as --target {DISPATCH}:make" in result.output and "--out" in result.output
    result = runner.invoke(app, ["gil", "--out", str(tmp_path), "scenarios.dispatch_gil.dispatch:make"])
    assert result.exit_code == ExitCode.USAGE and "is a Python target" in result.output
    # the same from a definition or a tool call, where nothing is swallowed: the config refuses it
    with pytest.raises(UsageError, match=r"is a Python target, not a program"):
        GilConfig(command=("scenarios/dispatch_gil/dispatch.py:make",))
    assert GilConfig(command=("python", "-c", "pass")).command[0] == "python"


def test_probe_definitions_resolve_python_and_paths() -> None:
    definitions = {d.name: d for d in suite.load_definitions([ROOT / "probes" / "gil.toml"])}
    hold = definitions["gil-dispatch-holds-gil"].config
    assert hold.command[0] == sys.executable
    assert Path(hold.command[1]) == DISPATCH
    assert hold.duration_s == 3 and hold.starvation_p99_ms == 10.0
    target = definitions["gil-dispatch-target-holds-gil"].config
    assert target.target is not None and target.target.args == {"mode": "hold"}
    assert definitions["gil-dispatch-holds-gil"].expect is not None


def test_ready_and_load_options_come_from_the_declarations(tmp_path: Path) -> None:
    """--ready, --ready-log, --ready-timeout and --load are declared options: a definition gives
    them too, and a definition's load command resolves python and files beside it."""
    (tmp_path / "load.py").write_text("")
    (tmp_path / "serve.toml").write_text(
        '[[probe]]\nname = "served"\nprobe = "gil"\ncommand = ["python", "serve.py"]\n'
        'options = { ready = "http://127.0.0.1:8000/health", ready_log = "Uvicorn running", '
        'ready_timeout = "90s", load = "python ./load.py --clients 16" }\n')
    (definition,) = suite.load_definitions([tmp_path / "serve.toml"])
    config = definition.config
    assert config.ready_url == "http://127.0.0.1:8000/health" and config.ready_log == "Uvicorn running"
    assert config.ready_timeout_s == 90.0
    assert config.load == (sys.executable, str((tmp_path / "load.py").resolve()), "--clients", "16")


def test_the_agent_server_treats_load_as_a_command_line(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    from glmfb.contract.errors import InputError
    from glmfb.workflows.mcp.boundary import Boundary
    from glmfb.workflows.mcp.tools import Toolbox

    (tmp_path / "work.py").write_text("def make():\n    return lambda: None\n")
    arguments = {"target": "work.py:make", "load": ["python", "load.py"], "duration": "1s"}
    with pytest.raises(InputError) as caught:
        Toolbox(Boundary(tmp_path)).prepare("gil", arguments)
    assert "argument 'load'" in str(caught.value) and "--allow-commands" in str(caught.value)
    assert Toolbox(Boundary(tmp_path, allow_commands=True)).prepare("gil", arguments).runs_probes


@pytest.mark.slow
@pytest.mark.bundled("gil.toml")
def test_suite_runs_the_holding_probe_and_meets_its_expectation(bundled_run: BundledRun) -> None:
    """Its verdict in the session's one run of the bundled suite (conftest.py)."""
    verdict = Verdict.from_dict(bundled_run.verdicts("gil.toml")["gil-dispatch-holds-gil"])
    assert verdict.status is Status.FAIL and verdict.expect_met, verdict.why
