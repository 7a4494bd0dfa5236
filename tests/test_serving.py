"""``glmfb diff`` between two OpenAI-compatible servers: real llama.cpp servers (llama-cpp-python's
``server``) over the tiny GGUF models of scenarios/serving/make_models.py, started here on loopback
ports and stopped at the end; a server killed mid-run and one that answers 500 are error verdicts.

Needs the ``servers`` extra (llama-cpp-python[server], gguf: ``bash .ci/setup --servers``) and ``serving`` (httpx); skipped without them.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

EXTRA = "needs the servers: bash .ci/setup --servers (llama-cpp-python[server] and gguf, extra 'servers'; httpx, extra 'serving')"
for module in ("llama_cpp", "gguf", "httpx", "uvicorn"):
    pytest.importorskip(module, reason=EXTRA)

from glmfb.cli import app  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
pytestmark = pytest.mark.slow

PROMPTS = ("the cat sat on the", "in the beginning there", "to be or not to be", "a tiny model that",
           "hello there and", "once upon a time", "at the end of the", "it is the")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """A llama.cpp server (llama-cpp-python) on a loopback port, its log in a file."""

    def __init__(self, model: Path, log: Path) -> None:
        self.port = _free_port()
        self.log = log
        self.url = f"http://127.0.0.1:{self.port}/v1"
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                 "--port", str(self.port), "--n_ctx", "512", "--n_threads", "1", "--n_batch", "64",
                 "--verbose", "false"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout_s: float = 90.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/models", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server did not answer in {timeout_s} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    sys.path.insert(0, str(ROOT / "scenarios" / "serving"))
    try:
        from make_models import make_models
    finally:
        sys.path.pop(0)
    return make_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def servers(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    logs = tmp_path_factory.mktemp("server-logs")
    names = {"f32": "f32", "f32-again": "f32", "q8_0": "q8_0", "perturbed": "perturbed", "tie": "tie"}
    started: dict[str, Server] = {}
    try:
        for name, model in names.items():
            started[name] = Server(models[model], logs / f"{name}.log")
        for server in started.values():
            server.wait()
        yield started
    finally:
        for server in started.values():
            server.stop()
    assert all(s.process.poll() is not None for s in started.values())


@pytest.fixture(scope="session")
def requests_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("requests") / "requests.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": p, "max_tokens": 24}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    return path


def diff_sides(baseline: str, candidate: str, requests: Path, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["diff", baseline, candidate, "--requests", str(requests), "--out", str(out),
                                 "--json", *extra])
    return result.exit_code, json.loads(result.stdout)


def diff(baseline: str, candidate: str, requests: Path, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    """``glmfb diff`` of two servers (their API base URLs)."""
    return diff_sides(f"openai:{baseline}", f"openai:{candidate}", requests, out, *extra)


def evidence(verdict: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["kind"]: e for e in verdict["evidence"]}


def test_two_servers_of_one_model_pass(servers: dict[str, Server], requests_file: Path, tmp_path: Path) -> None:
    code, verdict = diff(servers["f32"].url, servers["f32-again"].url, requests_file, tmp_path)
    assert code == 0 and verdict["status"] == "pass", verdict["why"]
    rows = evidence(verdict)["serving_requests"]["rows"]
    assert len(rows) == len(PROMPTS)
    assert all(r["status"] == "same" and r["compared"] == r["baseline_tokens"] == r["candidate_tokens"] for r in rows)
    assert all(r["logprob_diff_max"] == 0.0 for r in rows)
    noise = [e for e in verdict["evidence"] if e["kind"] == "serving_noise"]
    assert {n["side"] for n in noise} == {"baseline", "candidate"} and all(n["noise"] >= n["floor"] for n in noise)
    throughput = evidence(verdict)["serving_throughput"]
    assert throughput["calls"] == 2 * len(PROMPTS) + 2 and throughput["requests_per_s"] > 0
    assert 0 < throughput["glmfb_share"] < 1


def _first_parting(servers: dict[str, Server], other: str, requests_file: Path) -> tuple[str, int]:
    """Where the two servers' outputs first part, asked directly (the expected where)."""
    import httpx

    for line in requests_file.read_text().splitlines():
        request = json.loads(line)
        texts = []
        for name in ("f32", other):
            answer = httpx.post(f"{servers[name].url}/completions", json={
                "prompt": request["prompt"], "max_tokens": 24, "temperature": 0, "repeat_penalty": 1.0, "logprobs": 1},
                timeout=30).json()
            texts.append(answer["choices"][0]["logprobs"]["tokens"])
        if texts[0] != texts[1]:
            position = next(i for i, (a, b) in enumerate(zip(*texts, strict=False)) if a != b)
            return request["id"], position
    raise AssertionError(f"f32 and {other} never part")


@pytest.mark.parametrize("other", ["q8_0", "perturbed"])
def test_a_changed_model_fails_where_the_outputs_first_part(servers: dict[str, Server], requests_file: Path,
                                                            tmp_path: Path, other: str) -> None:
    code, verdict = diff(servers["f32"].url, servers[other].url, requests_file, tmp_path)
    assert code == 1 and verdict["status"] == "fail", verdict["why"]
    request, position = _first_parting(servers, other, requests_file)
    assert verdict["where"]["request"] == request and verdict["where"]["position"] == position
    found = evidence(verdict)
    divergence = found["serving_divergence"]
    assert divergence["request"] == request and divergence["position"] == position
    # the q8_0 model parts where its own two tokens are within its noise, the f32 side preferring
    # its own by more than the tolerance: a one-sided tie flip that moved the distribution (drift)
    assert not divergence["tie_flip"] or (len(divergence["tied"]) == 1 and divergence["preference_moved"] > 0.1)
    assert verdict["where"]["baseline_token"] == divergence["baseline_token"] != divergence["candidate_token"]
    assert found["serving_drift"]["positions"] == position
    assert f"request {request} parts at token {position}" in verdict["why"]
    assert "before it" in verdict["why"] and "KL divergence" in verdict["why"]
    assert Path(verdict["artifacts"]["serving_answers"]).is_file()
    print(f"f32 vs {other}: {verdict['why']}")


def test_a_near_tie_is_a_tie_flip_not_a_regression(servers: dict[str, Server], requests_file: Path,
                                                   tmp_path: Path) -> None:
    code, verdict = diff(servers["f32"].url, servers["tie"].url, requests_file, tmp_path)
    assert code == 0 and verdict["status"] == "pass", verdict["why"]
    rows = evidence(verdict)["serving_requests"]["rows"]
    ties = [r for r in rows if r["status"] == "tie"]
    assert ties, "the tie model never parts from the reference"
    assert {(r["baseline_token"], r["candidate_token"]) for r in ties} <= {(" the", " and"), (" and", " the")}
    assert "tie flip" in verdict["why"]
    print(f"f32 vs tie: {verdict['why']}")


def test_a_server_killed_mid_run_is_an_error_verdict(models: dict[str, Path], tmp_path: Path,
                                                     servers: dict[str, Server]) -> None:
    victim = Server(models["f32"], tmp_path / "victim.log")
    try:
        victim.wait()
        requests = tmp_path / "many.jsonl"
        requests.write_text("".join(json.dumps({"id": f"m{i}", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 48})
                                    + "\n" for i in range(60)))

        def kill_after_first_answer() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "POST /v1/completions" not in victim.log.read_text():
                time.sleep(0.02)
            os.killpg(victim.process.pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_after_first_answer)
        killer.start()
        started = time.monotonic()
        code, verdict = diff(victim.url, servers["f32"].url, requests, tmp_path, "--concurrency", "1")
        killer.join()
    finally:
        victim.stop()
    assert code == 3 and verdict["status"] == "error" and verdict["layer"] == "harness"
    assert f"127.0.0.1:{victim.port}" in verdict["why"] and "baseline server" in verdict["why"]
    assert "could not be reached" in verdict["why"] and "asked 3 times" in verdict["why"]
    assert time.monotonic() - started < 60


class _Failing(http.server.BaseHTTPRequestHandler):
    def _fail(self) -> None:
        body = b'{"error": "the model fell over"}'
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _fail

    def log_message(self, *args: Any) -> None:
        pass


def test_a_server_answering_500_is_an_error_verdict_naming_it(servers: dict[str, Server], requests_file: Path,
                                                              tmp_path: Path) -> None:
    failing = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=failing.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{failing.server_address[1]}/v1"
    try:
        started = time.monotonic()
        code, verdict = diff(servers["f32"].url, url, requests_file, tmp_path)
        elapsed = time.monotonic() - started
    finally:
        failing.shutdown()
        failing.server_close()
    assert code == 3 and verdict["status"] == "error"
    assert f"{url}/models answered HTTP 500" in verdict["why"] and "the model fell over" in verdict["why"]
    assert "candidate server" in verdict["why"] and "asked 3 times" in verdict["why"]
    assert elapsed < 30


def test_an_unreachable_server_is_an_error_not_a_hang(servers: dict[str, Server], requests_file: Path,
                                                      tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
    code, verdict = diff(url, servers["f32"].url, requests_file, tmp_path, "--retries", "0")
    assert code == 3 and verdict["status"] == "error"
    assert f"{url}/models could not be reached" in verdict["why"] and "asked once" in verdict["why"]


def test_a_saved_capture_of_a_server_is_a_side(servers: dict[str, Server], requests_file: Path,
                                               tmp_path: Path) -> None:
    saved = tmp_path / "f32-answers"
    result = runner.invoke(app, ["capture", f"openai:{servers['f32'].url}", "--requests", str(requests_file),
                                 "--out", str(saved)])
    assert result.exit_code == 0, result.output
    assert (saved / "serving-capture.json").is_file()
    code, verdict = diff_sides(str(saved), f"openai:{servers['f32-again'].url}", requests_file, tmp_path)
    assert code == 0 and verdict["status"] == "pass", verdict["why"]
    assert {e["target"] for e in verdict["evidence"] if e["kind"] == "side"} == {
        str(saved), f"openai:{servers['f32-again'].url}"}
    code, verdict = diff_sides(str(saved), f"openai:{servers['q8_0'].url}", requests_file, tmp_path)
    assert code == 1 and verdict["where"]["request"] == _first_parting(servers, "q8_0", requests_file)[0]
