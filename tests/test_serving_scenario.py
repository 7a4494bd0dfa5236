"""The serving scenario that needs no llama.cpp: servers glmfb starts itself (``baseline_server``,
``candidate_server``), the torch server of scenarios/serving/server.py, the bundled definitions of
probes/serving.toml, and the next step from a failing serving diff into the in-process module
diff, followed for real.

Fast: the options' parsing, the one-line refusals of bad combinations, the next steps a failing
request gives. Slow (they start processes): a server command that exits at once and one that
never answers are error verdicts naming the command; the bundled definitions meet their
expectations; following the bug's next step names the planted module.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import BundledRun
from typer.testing import CliRunner

from glmfb.cli import app
from glmfb.contract.options import options_of, options_schema
from glmfb.contract.step import Step
from glmfb.contract.units import OptionValueError
from glmfb.core.commandline import argv
from glmfb.core.probe import ProbeContext
from glmfb.diff.config import DiffConfig
from glmfb.diff.endpoint import ServingRequest
from glmfb.diff.servers import parse_command
from glmfb.diff.serving import MODULE_DIFF_REQUESTS, next_steps

pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "scenarios" / "serving" / "server.py"
LLAMA = ROOT / "scenarios" / "numerics" / "llama.py"
REQUESTS = ROOT / "scenarios" / "serving" / "requests.jsonl"
URL = "openai:http://127.0.0.1:{port}/v1"
runner = CliRunner()


def glmfb(*args: str) -> Any:
    return runner.invoke(app, list(args))


def verdict_of(result: Any) -> dict[str, Any]:
    data = json.loads(result.stdout)
    return data.get("verdict", data)


# ---- fast: options, refusals, next steps ---------------------------------------------------


def test_a_server_command_is_a_string_split_as_a_shell_would_or_a_list() -> None:
    assert parse_command("{python} server.py --name 'a b' --port {port}") == (
        "{python}", "server.py", "--name", "a b", "--port", "{port}")
    assert parse_command(["{python}", "-c", "print(1)"]) == ("{python}", "-c", "print(1)")
    for bad in ("", [], "'unclosed", [1, 2], ["a", ""]):
        with pytest.raises(OptionValueError):
            parse_command(bad)


def test_the_server_and_model_options_are_declared_once_for_the_cli_toml_and_mcp() -> None:
    specs = {spec.key: spec for spec in options_of(DiffConfig)}
    assert specs["baseline_server"].flag == "--baseline-server" and specs["candidate_server"].flag == "--candidate-server"
    assert specs["server_startup"].default == 120.0
    schema = options_schema(DiffConfig)["properties"]
    assert {"baseline_server", "candidate_server", "server_startup", "baseline_model", "candidate_model"} <= set(schema)
    assert schema["baseline_server"]["type"] == ["string", "array"]
    assert specs["baseline_server"].write(("{python}", "s.py")) == ["{python}", "s.py"]


@pytest.mark.parametrize(("args", "says"), [
    (["a.py:f", URL, "--candidate-server", "x"], "is not a serving endpoint"),
    ([URL, "openai:http://127.0.0.1:9/v1"], "has {port}, which only a server glmfb starts fills in"),
    (["openai:http://127.0.0.1:8000/v1", "openai:http://127.0.0.1:9/v1", "--baseline-server", "srv --port {port}"],
     "does not, so it would not reach that server"),
    (["openai:http://127.0.0.1:8000/v1", "openai:http://127.0.0.1:9/v1", "--baseline-model", f"{LLAMA}:clean"],
     "baseline_model is given but not candidate_model"),
    (["openai:http://127.0.0.1:8000/v1", "openai:http://127.0.0.1:9/v1", "--baseline-model", "nowhere.py:clean",
      "--candidate-model", f"{LLAMA}:clean"], "baseline_model"),
    ([f"{LLAMA}:clean", f"{LLAMA}:clean", "--baseline-model", f"{LLAMA}:clean", "--candidate-model",
      f"{LLAMA}:clean"], "baseline_model is for serving endpoint sides"),
    (["openai:http://127.0.0.1:8000/v1", "openai:http://127.0.0.1:9/v1", "--baseline-server", "'unclosed"],
     "--baseline-server"),
])
def test_bad_combinations_are_one_line_usage_errors(args: list[str], says: str, tmp_path: Path) -> None:
    result = glmfb("diff", *args, "--requests", str(REQUESTS), "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output


def _config(tmp_path: Path, **models: str) -> DiffConfig:
    return DiffConfig(name="srv", baseline="openai:http://127.0.0.1:1/v1", candidate="openai:http://127.0.0.1:2/v1",
                      baseline_args={"init_std": 1.0}, candidate_args={"init_std": 1.0, "module": "m"},
                      requests=REQUESTS, **models)  # type: ignore[arg-type]


def test_a_failing_request_of_token_ids_gives_a_diff_step_and_its_requests_file(tmp_path: Path) -> None:
    ctx = ProbeContext(run_id="r", artifact_dir=tmp_path / "art")
    config = _config(tmp_path, baseline_model=f"{LLAMA}:clean", candidate_model=f"{LLAMA}:bf16_output")
    (step,) = next_steps(config, ctx, ServingRequest("r7", (5, 6, 7), 8), 2, {}, None)
    assert step.command == "diff"
    assert step.arguments["baseline"] == f"{LLAMA}:clean" and step.arguments["candidate"] == f"{LLAMA}:bf16_output"
    assert step.arguments["baseline_args"] == {"init_std": 1.0}
    assert step.arguments["candidate_args"] == {"init_std": 1.0, "module": "m"}
    written = Path(step.arguments["requests"])
    assert written == tmp_path / "art" / MODULE_DIFF_REQUESTS
    assert [json.loads(line) for line in written.read_text().splitlines()] == [{"id": "r7", "input_ids": [5, 6, 7]}]
    assert "baseline_server" not in step.arguments and "logprob_tolerance" not in step.arguments
    assert argv(step)[:4] == ["glmfb", "diff", f"{LLAMA}:clean", f"{LLAMA}:bf16_output"]


def test_without_both_models_or_with_a_text_prompt_the_step_is_words_only(tmp_path: Path) -> None:
    ctx = ProbeContext(run_id="r", artifact_dir=tmp_path / "art")
    (plain,) = next_steps(_config(tmp_path), ctx, ServingRequest("r7", (5, 6), 8), 1, {}, None)
    assert plain.command is None and "give baseline_model and candidate_model" in plain.why
    with_models = _config(tmp_path, baseline_model=f"{LLAMA}:clean", candidate_model=f"{LLAMA}:bf16_output")
    (text,) = next_steps(with_models, ctx, ServingRequest("r8", "the cat", 8), 1, {}, None)
    assert text.command is None and "text prompt" in text.why and "tokenize" in text.why
    assert not (tmp_path / "art" / MODULE_DIFF_REQUESTS).exists(), "no requests file for a step that cannot use it"


def test_servers_of_a_local_model_folder_give_the_module_diff_of_that_folder(tmp_path: Path) -> None:
    """Both servers serve one Hugging Face folder, in float32 and bfloat16 as their command
    lines said: the step loads that folder in-process in each format, on the prompt's ids and
    the tokens the baseline generated before the parting, as the baseline server gave them; a
    side whose format was not seen is loaded in the folder's stored format, said so."""
    from glmfb.diff.evidence import ServedBy
    from glmfb.diff.hf import FACTORY

    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text('{"torch_dtype": "float32"}')
    ctx = ProbeContext(run_id="r", artifact_dir=tmp_path / "art")
    served = {side: ServedBy(side=side, server=f"http://127.0.0.1:{port}/v1", folder=str(folder), dtype=dtype,
                             dtype_source=f"--dtype {dtype} on pid {port}")
              for side, port, dtype in (("baseline", 1, "float32"), ("candidate", 2, "bfloat16"))}
    (step,) = next_steps(_config(tmp_path), ctx, ServingRequest("r3", "w1 w2", 8), 2, served, ([4, 5], [9, 11]))
    assert step.command == "diff" and step.arguments["baseline"] == step.arguments["candidate"] == FACTORY
    assert step.arguments["baseline_args"] == {"path": str(folder), "dtype": "float32"}
    assert step.arguments["candidate_args"] == {"path": str(folder), "dtype": "bfloat16"}
    written = Path(step.arguments["requests"])
    assert [json.loads(line) for line in written.read_text().splitlines()] == [{"id": "r3", "input_ids": [4, 5, 9, 11]}]
    assert "2 prompt tokens and the 2 the baseline generated before it" in step.why and "up to token 2" in step.why
    assert "--dtype bfloat16 on pid 2" in step.why
    (one,) = next_steps(_config(tmp_path), ctx, ServingRequest("r3", "w1 w2", 8), 2, {"baseline": served["baseline"]},
                        ([4, 5], [9, 11]))
    assert one.command is None and "local Hugging Face folder" in one.why
    (no_ids,) = next_steps(_config(tmp_path), ctx, ServingRequest("r3", "w1 w2", 8), 2, served, None)
    assert no_ids.command is None and "did not give its token ids" in no_ids.why


# ---- slow: processes -----------------------------------------------------------------------


def _diff(tmp_path: Path, *extra: str) -> dict[str, Any]:
    result = glmfb("diff", URL, URL, "--requests", str(REQUESTS), "--out", str(tmp_path / "reports"), "--json",
                   "--no-history", *extra)
    assert result.exit_code in (0, 1, 3), result.output
    return verdict_of(result)


@pytest.mark.slow
def test_a_server_command_that_exits_at_once_is_an_error_verdict_naming_it(tmp_path: Path) -> None:
    dies = f"{shlex.quote(sys.executable)} -c \"import sys; print('no model at --port {{port}}', flush=True); sys.exit(3)\""
    fine = f"{shlex.quote(sys.executable)} {shlex.quote(str(SERVER))} {LLAMA}:clean --port {{port}}"
    started = time.monotonic()
    verdict = _diff(tmp_path, "--baseline-server", fine, "--candidate-server", dies)
    assert time.monotonic() - started < 60, "an exit is seen when it happens, not at the startup timeout"
    assert (verdict["status"], verdict["layer"]) == ("error", "harness")
    why = verdict["why"]
    assert why.startswith("the candidate's server exited with status 3 before it answered GET http://127.0.0.1:")
    assert "sys.exit(3)" in why and "no model at --port " in why, why
    log = Path(verdict["artifacts"]["candidate_server_log"])
    assert "no model at --port" in log.read_text()
    target_error = next(e for e in verdict["evidence"] if e["kind"] == "target_error")
    assert target_error["side"] == "candidate" and target_error["stage"] == "while starting its server"


@pytest.mark.slow
def test_a_server_that_never_answers_is_an_error_verdict_and_is_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    silent = [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
              "print('listening soon', flush=True); time.sleep(120)"]
    verdict = _diff(tmp_path, "--baseline-server", shlex.join(silent), "--candidate-server", shlex.join(silent),
                    "--server-startup", "1.5s")
    assert (verdict["status"], verdict["layer"]) == ("error", "harness")
    assert "the baseline's server did not answer GET http://127.0.0.1:" in verdict["why"]
    assert "with 200 within 1.5 s" in verdict["why"] and "time.sleep(120)" in verdict["why"]
    assert "listening soon" in verdict["why"]
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "the server glmfb started is stopped when the diff ends"


DIES_ON_FIRST_COMPLETION = """
import http.server, os, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"object": "list", "data": [{"id": "m"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        print("dying on the first completion", flush=True)
        os._exit(7)

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@pytest.mark.slow
def test_a_started_server_that_dies_mid_run_is_an_error_verdict_saying_how_it_ended(tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text(DIES_ON_FIRST_COMPLETION)
    command = shlex.join([sys.executable, str(script), "{port}"])
    verdict = _diff(tmp_path, "--baseline-server", command, "--candidate-server", command, "--retries", "0")
    assert (verdict["status"], verdict["layer"]) == ("error", "harness")
    assert verdict["why"].startswith("the baseline server raised EndpointError"), verdict["why"]
    assert "the baseline's server had exited with status 7" in verdict["why"]
    assert "dying on the first completion" in verdict["why"]
    assert Path(verdict["artifacts"]["baseline_server_log"]).is_file()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not running
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.bundled("serving.toml")
def test_the_bundled_definitions_meet_their_expectations_and_the_next_step_names_the_module(
    tmp_path: Path, bundled_run: BundledRun
) -> None:
    """probes/serving.toml's verdicts in the session's one run of the bundled suite (conftest.py):
    the exit code of that run's part is what ``glmfb run probes/serving.toml`` exits with."""
    pytest.importorskip("transformers")
    assert bundled_run.part("serving.toml").exit_code == 0, bundled_run.stderr[-2000:]
    verdicts = bundled_run.verdicts("serving.toml")
    bug, twin = verdicts["serving-down-proj-bf16"], verdicts["serving-clean-vs-itself"]
    assert bug["status"] == "fail" and bug["expect_met"] and twin["status"] == "pass" and twin["expect_met"]
    assert bug["where"] == {"request": "serve-68", "position": 3, "baseline_token": "<51>", "candidate_token": "<264>"}
    assert "so the greedy outputs part for more than noise" in bug["why"]
    assert twin["metric"]["value"] == 0.0
    (step,) = (Step.from_json(s) for s in bug["next"])
    assert step.command == "diff"
    # followed as the verdict gives it: the in-process module diff names the planted module
    words = [*argv(step)[1:], "--out", str(tmp_path / "followed"), "--json", "--no-history"]
    followed = verdict_of(glmfb(*words))
    assert followed["status"] == "fail" and followed["where"]["module"] == "model.layers.1.mlp.down_proj"
    assert followed["where"]["request"] == "serve-68"


# ---- slow: the MCP server's diff tool --------------------------------------------------------


def _mcp_root(tmp_path: Path) -> Path:
    import shutil

    project = tmp_path / "project"
    for scenario in ("serving", "numerics"):
        shutil.copytree(ROOT / "scenarios" / scenario, project / "scenarios" / scenario,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return project


def _server(factory: str, *args: str) -> list[str]:
    command = ["{python}", "scenarios/serving/server.py", f"scenarios/numerics/llama.py:{factory}", "--port", "{port}",
               "--arg", "init_std=1.0"]
    for arg in args:
        command += ["--arg", arg]
    return command


@pytest.mark.slow
def test_the_mcp_diff_tool_takes_servers_and_its_next_call_is_the_module_diff(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    pytest.importorskip("transformers")
    from test_mcp_server import serve, stdio, structured

    root = _mcp_root(tmp_path)
    bug = {"baseline": URL, "candidate": URL, "requests": "scenarios/serving/requests.jsonl",
           "baseline_args": {"init_std": 1.0}, "candidate_args": {"init_std": 1.0, "module": "model.layers.1.mlp.down_proj"},
           "baseline_server": _server("clean"),
           "candidate_server": _server("bf16_output", "module=model.layers.1.mlp.down_proj"),
           "baseline_model": "scenarios/numerics/llama.py:clean",
           "candidate_model": "scenarios/numerics/llama.py:bf16_output"}

    async def without_commands(client: Any) -> None:
        refused = await client.call_tool("diff", bug)
        text = refused.content[0].text
        assert refused.is_error and "argument 'baseline_server'" in text and "--allow-commands" in text, text
        # an endpoint side is taken (no server started): nothing listens there, an error verdict says so
        unreachable = structured(await client.call_tool("diff", {
            "baseline": "openai:http://127.0.0.1:9/v1", "candidate": "openai:http://127.0.0.1:9/v1",
            "requests": "scenarios/serving/requests.jsonl", "retries": 0}))
        assert unreachable["verdict"]["status"] == "error"
        assert "http://127.0.0.1:9/v1/models could not be reached" in unreachable["verdict"]["why"]

    async def with_commands(client: Any) -> None:
        first = structured(await client.call_tool("diff", bug))
        verdict = first["verdict"]
        assert verdict["status"] == "fail", verdict["why"]
        assert (verdict["where"]["request"], verdict["where"]["position"]) == ("serve-68", 3)
        (call,) = first["next_calls"]
        assert call["tool"] == "diff" and "error" not in call, call
        followed = structured(await client.call_tool(call["tool"], call["arguments"]))
        assert followed["verdict"]["status"] == "fail"
        assert followed["verdict"]["where"]["module"] == "model.layers.1.mlp.down_proj"

    serve(stdio(root), without_commands)
    serve(stdio(root, "--allow-commands"), with_commands)
