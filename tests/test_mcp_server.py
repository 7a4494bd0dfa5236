"""``glmfb mcp`` as a subprocess, driven by the MCP SDK's own client, over stdio and once over
streamable HTTP: the tools and their schemas, a planted slow kernel's fail verdict (validated
against ``glmfb schema``), its first machine-readable next step followed, a long gap call
cancelled (the cancelled error verdict within 5 s, no process left), paths outside the root
refused, the suite tools (list_probes, run, gate, explain)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import anyio
import jsonschema
import psutil
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from glmfb.contract.step import Step
from glmfb.core.commandline import shell_line

REPO = Path(__file__).resolve().parents[1]
KERNELS = "scenarios/decode_norm/kernels.py"
FUSED = f"{KERNELS}:gated_norm_fused"
TILED = f"{KERNELS}:gated_norm_tiled"
GAP_BASELINE = "scenarios/kv_transfer/scenario.py:prefill_only"
GAP_CANDIDATE = "scenarios/kv_transfer/scenario.py:prefill_transfer_holding"
CANCEL_BOUND_S = 5.0  # the issue's bound: from the cancellation to the cancelled verdict
BENCH_TOML = f"""[[probe]]
name = "tiled-vs-fused"
probe = "bench"
baseline = "../{FUSED}"
candidate = "../{TILED}"
options = {{ shapes = ["8x4096"], threshold = "5%", budget = 2 }}
expect = {{ status = "fail", layer = "kernel", where = {{ kernel = "gated_norm_tiled", shape = "8x4096" }} }}
"""


@pytest.fixture(scope="module")
def glmfb_schema() -> dict[str, Any]:
    """What ``glmfb schema`` prints."""
    printed = subprocess.run([sys.executable, "-m", "glmfb", "schema"], capture_output=True, text=True, check=True,
                             timeout=120)
    schema: dict[str, Any] = json.loads(printed.stdout)
    return schema


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A project: the decode-norm kernels, the kv-transfer scenario, one bench definition."""
    project = tmp_path / "project"
    (project / "scenarios").mkdir(parents=True)
    shutil.copytree(REPO / "scenarios" / "decode_norm", project / "scenarios" / "decode_norm")
    for scenario in ("kv_transfer", "numerics"):
        shutil.copytree(REPO / "scenarios" / scenario, project / "scenarios" / scenario,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (project / "probes").mkdir()
    (project / "probes" / "bench.toml").write_text(BENCH_TOML)
    return project


def stdio(root: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "glmfb", "mcp", "--root", str(root), *extra],
                                 env=dict(os.environ), cwd=str(root.parent))


def serve(params: Any, session: Callable[[Client], Awaitable[None]]) -> None:
    async def main() -> None:
        async with Client(params) as client:
            await session(client)

    anyio.run(main)


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content[0].text
    data = result.structured_content
    assert isinstance(data, dict)
    return data


def text(result: Any) -> str:
    return str(result.content[0].text)


def bench_arguments(**extra: Any) -> dict[str, Any]:
    return {"baseline": FUSED, "candidate": TILED, "shapes": ["8x4096"], "budget": "2s", **extra}


def server_process() -> psutil.Process:
    """The glmfb mcp process this test's client started."""
    children = []
    for child in psutil.Process().children():
        try:
            if "mcp" in child.cmdline():
                children.append(child)
        except psutil.Error:  # a zombie or a process gone meanwhile is not the server
            continue
    assert len(children) == 1, children
    return children[0]


def probes_of(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The processes of the probes among ``processes`` (the server's descendants, while the
    server runs): all but the server's warm workers, which are glmfb's own (glmfb.core.workers: the
    zygote, a child of the server, lives as long as it; a job's reaper, a child of the zygote,
    exits once the job is done). A job's process and whatever it left (reparented to the
    reaper) are the probe's."""
    own: set[int] = set()
    for process in processes:
        try:
            if "glmfb.core.zygote" in " ".join(process.cmdline()):
                parent = process.parent()
                if parent is not None and "glmfb.core.zygote" not in " ".join(parent.cmdline()):
                    own.add(process.pid)  # the zygote
        except psutil.Error:
            continue
    reapers = set()
    for process in processes:
        try:
            if process.ppid() in own:
                reapers.add(process.pid)
        except psutil.Error:
            continue
    return [process for process in processes if process.pid not in own | reapers]


def alive(processes: list[psutil.Process]) -> list[int]:
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process.pid)
        except psutil.NoSuchProcess:
            pass
    return left


def bench_and_next_step(root: Path, glmfb_schema: dict[str, Any]) -> Callable[[Client], Awaitable[None]]:
    """List the tools; bench the planted slow kernel (a fail verdict that validates); follow the
    verdict's first machine-readable next step; read the runs back."""

    async def session(client: Client) -> None:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert {"diff", "capture", "bench", "gil", "gap", "run", "gate", "list_probes", "explain"} <= set(tools)
        bench = tools["bench"].input_schema
        assert bench["required"] == ["baseline"] and bench["additionalProperties"] is False
        assert {"shapes", "threshold", "budget", "timeout", "args"} <= set(bench["properties"])
        assert "5% or 0.05" in bench["properties"]["threshold"]["description"]
        assert tools["bench"].output_schema is not None

        progress: list[str] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(message or "")

        first = structured(await client.call_tool("bench", bench_arguments(), progress_callback=on_progress))
        verdict = first["verdict"]
        jsonschema.validate(verdict, glmfb_schema)
        assert (verdict["status"], verdict["layer"]) == ("fail", "kernel"), verdict["why"]
        # and the line of the operator with the largest share of the change (which one: the host's timing)
        assert {k: v for k, v in verdict["where"].items() if k != "line"} == {
            "kernel": "gated_norm_tiled", "shape": "8x4096", "file": "scenarios/decode_norm/kernels.py",
            "function": "gated_norm_tiled_op"}, verdict["where"]
        assert isinstance(verdict["where"]["line"], int), verdict["where"]
        assert progress[0].startswith(f"run {first['run']['id']}") and len(progress) >= 3, progress
        run_file = root / first["run"]["folder"] / "run.json"
        assert json.loads(run_file.read_text())["verdicts"][0] == verdict

        # the first machine-readable next step, passed straight back
        call = next(c for c in first["next_calls"] if "arguments" in c)
        assert call["tool"] == "bench" and shell_line(Step.from_json(verdict["next"][call["index"]])) == call["text"]
        followed = structured(await client.call_tool(call["tool"], call["arguments"]))
        jsonschema.validate(followed["verdict"], glmfb_schema)
        assert followed["verdict"]["probe"] == "bench" and followed["verdict"]["status"] == "fail"
        assert followed["verdict"]["where"]["kernel"] == "gated_norm_tiled"
        assert followed["run"]["id"] != first["run"]["id"]

        # the runs as resources
        latest = await client.read_resource("glmfb://runs/latest")
        assert json.loads(latest.contents[0].text)["id"] == followed["run"]["id"]  # type: ignore[union-attr]
        samples_uri = first["artifacts"]["samples"]
        samples = await client.read_resource(samples_uri)
        assert json.loads(samples.contents[0].text)  # type: ignore[union-attr]
        explained = structured(await client.call_tool("explain", {"source": first["run"]["id"]}))
        assert explained["verdicts"][0]["why"] == verdict["why"]
        gated = structured(await client.call_tool("gate", {"source": first["run"]["id"]}))
        assert gated["exit_code"] == 1 and gated["rows"][0]["decision"] == "failed"

    return session


@pytest.mark.slow
def test_stdio_tools_a_fail_verdict_that_validates_and_its_next_step_followed(root: Path,
                                                                             glmfb_schema: dict[str, Any]) -> None:
    serve(stdio(root), bench_and_next_step(root, glmfb_schema))


def cancel_gap(measured: dict[str, float]) -> Callable[[Client], Awaitable[None]]:
    """Cancel a long gap call twice: by the client's own cancellation, then with the cancel
    tool; each time the cancelled verdict, and no process left of the probe's."""

    async def start_gap(client: Client, group: anyio.abc.TaskGroup, answers: list[Any]) -> tuple[str, list[Any]]:
        started = anyio.Event()
        messages: list[str] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            messages.append(message or "")
            if message and message.startswith("warm-up"):  # the scenario's processes are up
                started.set()

        async def call() -> None:
            answers.append(await client.call_tool(
                "gap", {"baseline": GAP_BASELINE, "candidate": GAP_CANDIDATE, "budget": "120s", "timeout": "5min"},
                progress_callback=on_progress))

        group.start_soon(call)
        with anyio.fail_after(180):
            await started.wait()
        run_id = messages[0].split()[1]
        descendants = probes_of(server_process().children(recursive=True))
        assert len(descendants) >= 2, descendants  # the probe's child and the scenario's receiver
        return run_id, descendants

    async def session(client: Client) -> None:
        # 1. the client's own cancellation (notifications/cancelled): no response, by the protocol;
        #    the run folder keeps the cancelled verdict
        answers: list[Any] = []
        async with anyio.create_task_group() as group:
            run_id, descendants = await start_gap(client, group, answers)
            cancelled_at = time.monotonic()
            group.cancel_scope.cancel()
        assert answers == []
        while True:
            try:
                read = await client.read_resource(f"glmfb://runs/{run_id}")
                break
            except MCPError:
                if time.monotonic() - cancelled_at > 30:
                    raise
                await anyio.sleep(0.05)
        measured["client_cancel_s"] = time.monotonic() - cancelled_at
        document = json.loads(read.contents[0].text)  # type: ignore[union-attr]
        verdict = document["verdicts"][0]
        assert verdict["status"] == "error" and "cancelled" in verdict["why"], verdict["why"]
        assert document["interrupted"] is True
        assert alive(descendants) == [] and alive(probes_of(server_process().children(recursive=True))) == []

        # 2. the cancel tool: the cancelled call itself answers with the cancelled verdict
        answers = []
        async with anyio.create_task_group() as group:
            run_id, descendants = await start_gap(client, group, answers)
            cancelled_at = time.monotonic()
            said = structured(await client.call_tool("cancel", {"run_id": run_id}))
            assert said == {"run_id": run_id, "cancelled": True}
        measured["cancel_tool_s"] = time.monotonic() - cancelled_at
        answer = structured(answers[0])
        assert answer["verdict"]["status"] == "error" and "cancelled" in answer["verdict"]["why"]
        assert alive(descendants) == [] and alive(probes_of(server_process().children(recursive=True))) == []

    return session


@pytest.mark.slow
def test_stdio_cancelling_a_long_gap_call_stops_every_process_and_keeps_the_cancelled_verdict(root: Path) -> None:
    measured: dict[str, float] = {}
    serve(stdio(root), cancel_gap(measured))
    print(f"cancelled verdict after {measured['client_cancel_s']:.2f} s (client cancellation), "
          f"{measured['cancel_tool_s']:.2f} s (cancel tool)")
    assert measured["client_cancel_s"] < CANCEL_BOUND_S, measured
    assert measured["cancel_tool_s"] < CANCEL_BOUND_S, measured


def refusals(root: Path, tmp_path: Path) -> Callable[[Client], Awaitable[None]]:
    """Paths outside the root (symlinks too), a command line, a bad option: tool errors that
    name the argument; the server keeps serving."""
    outside = tmp_path / "outside.py"
    outside.write_text("def f(shape):\n    return lambda: None\n")
    (root / "escape.py").symlink_to(outside)

    async def session(client: Client) -> None:
        for arguments, named in (
            (bench_arguments(baseline=str(outside) + ":f"), "argument 'baseline'"),
            (bench_arguments(candidate="../outside.py:f"), "argument 'candidate'"),
            (bench_arguments(candidate="escape.py:f"), "argument 'candidate'"),
            (bench_arguments(save="/tmp/samples.json"), "argument 'save'"),
        ):
            result = await client.call_tool("bench", arguments)
            assert result.is_error and named in text(result) and "outside the root" in text(result), text(result)
        refused = await client.call_tool("gil", {"command": ["python", "-c", "pass"]})
        assert refused.is_error and "argument 'command'" in text(refused) and "--allow-commands" in text(refused)
        bad = await client.call_tool("bench", bench_arguments(threshold=5))
        assert bad.is_error and "option 'threshold'" in text(bad) and "5%" in text(bad)
        with pytest.raises(MCPError):
            await client.read_resource("glmfb://runs/x/artifacts/../../../etc/passwd")
        assert len((await client.list_tools()).tools) >= 9  # still serving
        assert server_process().is_running()

    return session


def test_stdio_refuses_paths_outside_the_root_and_stays_up(root: Path, tmp_path: Path) -> None:
    serve(stdio(root), refusals(root, tmp_path))


@pytest.mark.slow
def test_stdio_list_probes_run_gate_explain(root: Path, glmfb_schema: dict[str, Any]) -> None:
    async def session(client: Client) -> None:
        listed = structured(await client.call_tool("list_probes", {}))
        [definition] = listed["definitions"]
        assert definition["name"] == "tiled-vs-fused" and definition["probe"] == "bench"
        assert definition["expect"]["status"] == "fail" and definition["options"]["shapes"] == [[8, 4096]]
        ran = structured(await client.call_tool(definition["call"]["tool"], definition["call"]["arguments"]))
        jsonschema.validate(ran["run"], glmfb_schema)
        [verdict] = ran["run"]["verdicts"]
        assert verdict["expect_met"] is True, verdict["why"]
        assert (root / ran["ref"]["folder"] / "report.html").is_file()
        gated = structured(await client.call_tool("gate", {}))
        assert gated["exit_code"] == 0 and gated["passed"] is True
        explained = structured(await client.call_tool("explain", {"name": "tiled-*"}))
        assert explained["verdicts"][0]["why"] == verdict["why"]

    serve(stdio(root), session)


@pytest.mark.slow
def test_stdio_capture_then_diff_the_captures(root: Path, glmfb_schema: dict[str, Any]) -> None:
    requests = "scenarios/numerics/scan_requests.jsonl"

    async def session(client: Client) -> None:
        for side in ("fp32", "tf32"):
            captured = structured(await client.call_tool("capture", {
                "target": f"scenarios/numerics/scan.py:{side}", "requests": requests, "out": f"captures/{side}"}))
            assert captured["out"] == f"captures/{side}" and captured["requests"] == 5 and captured["tensors"] > 0
        outside = await client.call_tool("capture", {"target": "scenarios/numerics/scan.py:fp32",
                                                     "requests": requests, "out": "../captures"})
        assert outside.is_error and "argument 'out'" in text(outside)
        diffed = structured(await client.call_tool("diff", {"baseline": "captures/fp32", "candidate": "captures/tf32",
                                                            "rtol": 0.01, "atol": 0.05}))
        jsonschema.validate(diffed["verdict"], glmfb_schema)
        assert (diffed["verdict"]["status"], diffed["verdict"]["layer"]) == ("fail", "numerics")
        assert diffed["verdict"]["where"]["request"] == "scan-1024"

    serve(stdio(root), session)


@dataclass(frozen=True)
class HttpServer:
    url: str
    token: str  # the bearer token the server printed once at start

    def transport(self, token: str | None = None) -> Any:
        """A streamable HTTP transport that sends ``Authorization: Bearer <token>`` (the
        server's own token by default)."""
        from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

        client = create_mcp_http_client(headers={"Authorization": f"Bearer {token or self.token}"})
        return streamable_http_client(self.url, http_client=client)


@pytest.fixture
def http_server(root: Path) -> Iterator[HttpServer]:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "GLMFB_MCP_TOKEN"}
    process = subprocess.Popen([sys.executable, "-m", "glmfb", "mcp", "--root", str(root), "--http",
                                f"127.0.0.1:{port}"], cwd=root.parent, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None
    announced = process.stderr.readline()  # the token, printed once before the server listens
    token = re.search(r"Authorization: Bearer ([\w-]+)", announced)
    assert token is not None, announced
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            assert process.poll() is None, "glmfb mcp --http exited"
            assert time.monotonic() < deadline, "glmfb mcp --http did not listen within 60 s"
            time.sleep(0.1)
    try:
        yield HttpServer(f"http://127.0.0.1:{port}/mcp", token.group(1))
    finally:
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(timeout=30)
        assert returncode == 0


def test_over_http_a_client_without_the_token_is_refused(http_server: HttpServer) -> None:
    """On a machine several users share, loopback is no boundary: a request without the token,
    or with another one, gets 401 and never reaches a tool; with the token it is served."""
    import httpx2 as httpx  # the MCP SDK's HTTP client

    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": http_server.token}):
        refused = httpx.post(http_server.url, json=initialize, headers={**accept, **headers}, timeout=30)
        assert refused.status_code == 401 and "bearer token" in refused.text, (headers, refused.text)

    async def refused_session() -> None:
        async with Client(http_server.transport("wrong")) as client:
            await client.list_tools()

    with pytest.raises(BaseException) as raised:
        anyio.run(refused_session)
    assert "error response" in repr(raised.value), repr(raised.value)  # the SDK's word for the 401 above

    async def served() -> None:
        async with Client(http_server.transport()) as client:
            assert "bench" in {tool.name for tool in (await client.list_tools()).tools}

    anyio.run(served)


def test_over_http_an_empty_token_is_bad_input(root: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "glmfb", "mcp", "--root", str(root), "--http", "127.0.0.1:1",
                             "--token", " "], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--token is empty" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_the_same_over_streamable_http(root: Path, tmp_path: Path, http_server: HttpServer,
                                       glmfb_schema: dict[str, Any]) -> None:
    measured: dict[str, float] = {}
    checks = [bench_and_next_step(root, glmfb_schema), cancel_gap(measured), refusals(root, tmp_path)]

    async def session(client: Client) -> None:
        for check in checks:
            await check(client)

    serve(http_server.transport(), session)
    print(f"over HTTP: cancelled verdict after {measured['client_cancel_s']:.2f} s (client cancellation), "
          f"{measured['cancel_tool_s']:.2f} s (cancel tool)")
    assert measured["client_cancel_s"] < CANCEL_BOUND_S, measured
    assert measured["cancel_tool_s"] < CANCEL_BOUND_S, measured


def _rpc(process: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert process.stdin is not None
    process.stdin.write((json.dumps(message) + "\n").encode())
    process.stdin.flush()


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["sigterm", "stdin-closed"])
def test_a_server_stopped_mid_call_leaves_no_process_and_keeps_the_cancelled_verdict(root: Path, stop: str) -> None:
    """The client goes away (closes stdin) or the server gets SIGTERM while a gap call runs:
    the probe's processes are stopped, its run is written, the server exits 0."""
    server = subprocess.Popen([sys.executable, "-m", "glmfb", "mcp", "--root", str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, cwd=root.parent)
    assert server.stdout is not None
    _rpc(server, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}})
    assert json.loads(server.stdout.readline())["id"] == 1
    _rpc(server, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    _rpc(server, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "gap", "arguments": {"baseline": GAP_BASELINE, "candidate": GAP_CANDIDATE, "budget": "120s"},
        "_meta": {"progressToken": "p"}}})
    run_id = ""
    while True:
        message = json.loads(server.stdout.readline())
        text_ = message.get("params", {}).get("message", "")
        run_id = run_id or text_.split()[1]
        if text_.startswith("warm-up"):
            break
    descendants = psutil.Process(server.pid).children(recursive=True)
    probes = probes_of(descendants)  # told apart while the server, the zygote's parent, is there
    assert len(probes) >= 2
    stopped_at = time.monotonic()
    if stop == "sigterm":
        server.send_signal(signal.SIGTERM)
    else:
        assert server.stdin is not None
        server.stdin.close()
    assert server.wait(timeout=30) == 0
    print(f"{stop}: the server exited {time.monotonic() - stopped_at:.2f} s later")
    assert alive(probes) == []
    deadline = time.monotonic() + 5  # the server's warm workers read end-of-file as it exits
    while alive(descendants) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive(descendants) == []
    document = json.loads((root / "reports" / run_id / "run.json").read_text())
    assert document["interrupted"] is True and "cancelled" in document["verdicts"][0]["why"]
