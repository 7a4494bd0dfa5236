"""``glmfb diff openai:A openai:A --candidate-batch N``: does a server's output depend on what else
is in its batch? Each candidate request is asked among N-1 companion requests in flight to the
same server, each baseline request alone.

The servers are started here, in threads of the test's process, on loopback ports: a small
OpenAI-compatible server (completions API) over a tiny torch model that batches the requests
in flight the way serving engines do (continuous batching: every step runs one token of every
request in flight). The batch is padded to the next captured size (1, 2, 4, 8, 16, as CUDA
graphs are), and the output projection is a bfloat16 GEMM whose split-K, as a GEMM kernel's
tiling does, follows that size: each split's partial sums are rounded to bfloat16, so the
logits of one request round differently in a batch of 8 than alone. The batch-invariant twin
computes every request alone (one split), whatever is in flight. The scheduler records, per
request, the batch sizes its steps ran in, and the server its peak number of requests at once.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

httpx = pytest.importorskip("httpx")
torch = pytest.importorskip("torch")

from glmfb.cli import app  # noqa: E402

pytestmark = pytest.mark.slow
runner = CliRunner()

VOCAB, WIDTH = 64, 64
SEED = 4
TWIN = 3e-3  # how far apart the two tokens of a twin pair are (their columns' noise)
STEP_S = 0.004  # a step's time (a GPU's, roughly): companions must still be generating when the request runs
MAX_TOKENS = 16
BATCH = 8
PROMPTS = ([5, 17, 33], [9, 2], [41, 7, 7, 30], [12], [60, 3, 28], [22, 50])
SPLITS = {1: 2, 2: 2, 4: 4, 8: 8, 16: 16}  # padded batch -> the GEMM's split-K


def token_name(token: int) -> str:
    return f"<{token}>"


class TinyModel:
    """The next-token logits of a sequence: a hidden state from its last two tokens and its
    length (float64), projected to the vocabulary by a bfloat16 GEMM split ``splits`` ways.
    Tokens come in near-twin pairs (``2i`` and ``2i + 1``, as a real vocabulary's " the" and
    "the"), so that where a twin pair leads, the rounding decides between the two."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(SEED)
        self.embed = torch.randn(VOCAB, WIDTH, generator=g, dtype=torch.float64)
        self.position = 0.5 * torch.randn(16, WIDTH, generator=g, dtype=torch.float64)
        self.out = 3.0 * torch.randn(WIDTH, VOCAB, generator=g, dtype=torch.float64) / math.sqrt(WIDTH)
        self.out[:, 1::2] = self.out[:, 0::2] + TWIN * torch.randn(WIDTH, VOCAB // 2, generator=g, dtype=torch.float64)

    def hidden(self, ids: list[int]) -> Any:
        previous = self.embed[ids[-2]] if len(ids) > 1 else torch.zeros(WIDTH, dtype=torch.float64)
        return torch.tanh(self.embed[ids[-1]] + 0.5 * previous + self.position[len(ids) % 16])

    def logits(self, rows: list[list[int]], padded: int) -> Any:
        """``[len(rows), VOCAB]`` logits of a batch padded to ``padded`` rows: split-K by the
        padded size, each split's partial product rounded to bfloat16 (the kernel's workspace)
        and the partials summed in float32."""
        hidden = torch.zeros(padded, WIDTH, dtype=torch.float64)
        hidden[:len(rows)] = torch.stack([self.hidden(ids) for ids in rows])
        splits = SPLITS[padded]
        width = WIDTH // splits
        total = torch.zeros(padded, VOCAB, dtype=torch.float32)
        for k in range(splits):
            part = hidden[:, k * width:(k + 1) * width] @ self.out[k * width:(k + 1) * width]
            total += part.to(torch.bfloat16).float()
        return total[:len(rows)].double()


@dataclass
class Sequence_:
    ids: list[int]
    max_tokens: int
    top_k: int
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[dict[str, float]] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)  # the batch size of each of its steps
    done: threading.Event = field(default_factory=threading.Event)


class BatchServer:
    """The OpenAI-compatible server (``GET /v1/models``, ``POST /v1/completions`` with token-id
    prompts, greedy, ``logprobs: k``) over :class:`TinyModel`, with a scheduler thread that
    steps every request in flight together. ``invariant``: each request computed alone."""

    def __init__(self, invariant: bool) -> None:
        self.invariant = invariant
        self.model = TinyModel()
        self.cond = threading.Condition()
        self.pending: list[Sequence_] = []
        self.stopping = False
        self.in_flight = 0
        self.running = 0  # requests the scheduler has taken in and not finished
        self.peak = 0
        self.finished: list[Sequence_] = []
        self.scheduler = threading.Thread(target=self._schedule, daemon=True)
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        self.serving = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self) -> BatchServer:
        self.scheduler.start()
        self.serving.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.shutdown()
        self.http.server_close()
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.scheduler.join(5)

    def reset(self) -> None:
        with self.cond:
            self.finished.clear()
            self.peak = 0

    # ---- the engine: continuous batching ---------------------------------------------------

    def _schedule(self) -> None:
        active: list[Sequence_] = []
        while True:
            with self.cond:
                while not self.pending and not active and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
                active += self.pending
                self.pending.clear()
                self.running = len(active)
            if self.invariant:
                logits = torch.cat([self.model.logits([s.ids], 1) for s in active])
            else:
                padded = next(size for size in SPLITS if size >= len(active))
                logits = self.model.logits([s.ids for s in active], padded)
            time.sleep(STEP_S)
            for seq, row in zip(active, logits, strict=True):
                logprobs = torch.log_softmax(row, dim=-1)
                chosen = int(torch.argmax(logprobs))
                seq.tokens.append(token_name(chosen))
                seq.logprobs.append(float(logprobs[chosen]))
                best = torch.topk(logprobs, seq.top_k)
                seq.tops.append({token_name(int(i)): float(v) for v, i in zip(best.values, best.indices, strict=True)})
                seq.batches.append(len(active))
                seq.ids.append(chosen)
            for seq in [s for s in active if len(s.tokens) >= s.max_tokens]:
                active.remove(seq)
                with self.cond:
                    self.finished.append(seq)
                    self.running = len(active)
                seq.done.set()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["prompt"]
        seq = Sequence_(list(prompt), int(body.get("max_tokens", 16)), int(body.get("logprobs") or 1))
        with self.cond:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.pending.append(seq)
            self.cond.notify_all()
        try:
            seq.done.wait(30)
        finally:
            with self.cond:
                self.in_flight -= 1
        logprobs = {"tokens": seq.tokens, "token_logprobs": seq.logprobs, "top_logprobs": seq.tops,
                    "text_offset": [0] * len(seq.tokens)}
        return {"id": "cmpl", "object": "text_completion", "model": "tiny",
                "choices": [{"index": 0, "text": "".join(seq.tokens), "logprobs": logprobs, "finish_reason": "length"}]}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no such path {self.path}"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                if self.path.rstrip("/") != "/v1/completions":
                    self._send(404, {"error": {"message": f"no such path {self.path}"}})
                    return
                self._send(200, server.complete(body))

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, BatchServer]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: a thread pool's wake-ups on a loaded host cost ms each
    try:
        with BatchServer(invariant=True) as invariant, BatchServer(invariant=False) as dependent:
            yield {"invariant": invariant, "dependent": dependent}
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def requests_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("requests") / "requests.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "input_ids": p, "max_tokens": MAX_TOKENS}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    return path


def diff(url: str, requests: Path, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    """``glmfb diff openai:URL openai:URL`` (one server, both sides), its verdict."""
    result = runner.invoke(app, ["diff", f"openai:{url}", f"openai:{url}", "--requests", str(requests),
                                 "--out", str(out), "--no-history", "--json", *extra])
    return result.exit_code, json.loads(result.stdout)


def evidence(verdict: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in verdict["evidence"] if e["kind"] == kind]


def ask_directly(server: BatchServer, prompt: list[int], companions: int = 0) -> list[str]:
    """The server's greedy tokens for ``prompt``, asked here: alone, or once the server runs
    ``companions`` long requests sent before it, which are still generating when it ends."""
    def ask(ids: list[int], max_tokens: int) -> list[str]:
        answer = httpx.post(f"{server.url}/completions", json={
            "model": "tiny", "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1}, timeout=30).json()
        return list(answer["choices"][0]["logprobs"]["tokens"])

    threads = [threading.Thread(target=ask, args=([1 + k], 4 * MAX_TOKENS)) for k in range(companions)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while server.running < companions and time.monotonic() < deadline:
        time.sleep(0.001)
    tokens = ask(prompt, MAX_TOKENS)
    for thread in threads:
        thread.join()
    return tokens


def test_a_batch_invariant_server_among_8_passes_and_the_why_names_the_regime(
        servers: dict[str, BatchServer], requests_file: Path, tmp_path: Path) -> None:
    code, verdict = diff(servers["invariant"].url, requests_file, tmp_path, "--candidate-batch", str(BATCH))
    assert code == 0 and verdict["status"] == "pass", verdict["why"]
    assert verdict["why"].startswith("the baseline asked each request alone, the candidate asked each request among "
                                     f"{BATCH - 1} others; all {len(PROMPTS)} requests agree"), verdict["why"]
    assert verdict["why"].count("among") == 1
    sides = {e["side"]: e for e in evidence(verdict, "side")}
    assert sides["baseline"]["batch"] == 1 and sides["baseline"]["companions"] == 0
    asked = len(PROMPTS) + 1  # every request, and the first again (the noise)
    assert sides["candidate"]["batch"] == BATCH and sides["candidate"]["companions"] == asked * (BATCH - 1)
    assert sides["candidate"]["companions_ended_early"] == 0
    throughput = evidence(verdict, "serving_throughput")[0]
    assert throughput["calls"] == 2 * asked and throughput["companion_calls"] == asked * (BATCH - 1)
    assert throughput["tokens"] == 2 * asked * MAX_TOKENS
    print(f"invariant, --candidate-batch {BATCH}: {verdict['why']}")


def test_a_batch_dependent_server_fails_where_alone_and_among_8_part(
        servers: dict[str, BatchServer], requests_file: Path, tmp_path: Path) -> None:
    server = servers["dependent"]
    server.reset()
    expected = None
    for i, prompt in enumerate(PROMPTS):
        alone, among = ask_directly(server, prompt), ask_directly(server, prompt, BATCH - 1)
        if alone != among:
            expected = (f"r{i}", next(p for p, (a, b) in enumerate(zip(alone, among, strict=True)) if a != b),
                        alone, among)
            break
    assert expected is not None, "the batch-dependent server answers the same alone and among 8"
    asked = [s.batches for s in server.finished if s.max_tokens == MAX_TOKENS]
    assert all(set(batches) in ({1}, {BATCH}) for batches in asked), asked  # alone, or among 7 every step
    request, position, alone, among = expected
    code, verdict = diff(server.url, requests_file, tmp_path, "--candidate-batch", str(BATCH))
    assert code == 1 and verdict["status"] == "fail", verdict["why"]
    assert verdict["where"]["request"] == request and verdict["where"]["position"] == position, verdict["why"]
    assert verdict["where"]["baseline_token"] == alone[position]
    assert verdict["where"]["candidate_token"] == among[position]
    assert verdict["why"].startswith("the baseline asked each request alone, the candidate asked each request among "
                                     f"{BATCH - 1} others; request {request} parts at token {position}"), verdict["why"]
    print(f"dependent, --candidate-batch {BATCH}: {verdict['why']}")


def test_the_companions_are_in_flight_for_every_step_of_each_measured_request(
        servers: dict[str, BatchServer], requests_file: Path, tmp_path: Path) -> None:
    server = servers["invariant"]
    server.reset()
    code, verdict = diff(server.url, requests_file, tmp_path, "--baseline-batch", "4", "--candidate-batch", str(BATCH))
    assert code == 0, verdict["why"]
    assert verdict["why"].startswith("the baseline asked each request among 3 others, the candidate asked each "
                                     f"request among {BATCH - 1} others; "), verdict["why"]
    assert server.peak == BATCH
    measured = [s for s in server.finished if s.max_tokens == MAX_TOKENS]
    companions = [s for s in server.finished if s.max_tokens != MAX_TOKENS]
    asked = len(PROMPTS) + 1
    assert len(measured) == 2 * asked and len(companions) == asked * (3 + BATCH - 1)
    assert all(s.max_tokens == 2 * MAX_TOKENS for s in companions)
    # each measured request ran among all its companions (a batch of 4, the baseline's, or 8), to its last step;
    # its first steps may miss a companion the server had not taken in yet, which an overloaded host shows
    assert sorted((max(s.batches), s.batches[-1]) for s in measured) == [(4, 4)] * asked + [(BATCH, BATCH)] * asked
    steps = [b == max(s.batches) for s in measured for b in s.batches]
    assert sum(steps) >= 0.9 * len(steps), [s.batches for s in measured]
    assert all(e["companions_ended_early"] == 0 for e in evidence(verdict, "side"))


def test_the_why_names_each_sides_regime_once_and_companions_that_ended_early() -> None:
    from glmfb.diff.endpoint import Companions
    from glmfb.diff.serving import _regime_text

    none = {"baseline": Companions(), "candidate": Companions()}
    assert _regime_text({"baseline": None, "candidate": None}, none, {}) is None
    assert _regime_text({"baseline": 4, "candidate": 4}, none, {}) == "both sides asked each request among 3 others"
    early = {"baseline": Companions(), "candidate": Companions(sent=14, ended_early=3)}
    assert _regime_text({"baseline": 1, "candidate": 8}, early, {}) == (
        "the baseline asked each request alone, the candidate asked each request among 7 others (3 of its 14 "
        "companion requests ended before the request they accompanied)")
    assert _regime_text({"baseline": None, "candidate": 8}, none, {"baseline": object()}) == (
        "the baseline gave its saved answers, the candidate asked each request among 7 others")


@pytest.mark.parametrize("value", ["0", "-2", "2.5", "eight"])
def test_a_bad_batch_is_a_one_line_usage_error(value: str, requests_file: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["diff", "openai:http://127.0.0.1:9/v1", "openai:http://127.0.0.1:9/v1",
                                 "--requests", str(requests_file), "--candidate-batch", value,
                                 "--out", str(tmp_path / "reports")])
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and "--candidate-batch" in result.output
    assert "Traceback" not in result.output


def _definition(tmp_path: Path, requests: Path, baseline: str, options: str) -> Path:
    path = tmp_path / "batch.toml"
    path.write_text(f'[[probe]]\nname = "batch"\nprobe = "diff"\nbaseline = "{baseline}"\n'
                    f'candidate = "openai:http://127.0.0.1:9/v1"\noptions = {{ requests = "{requests}", {options} }}\n')
    return path


@pytest.mark.parametrize(("baseline", "options", "says"), [
    ("openai:http://127.0.0.1:9/v1", "candidate_batch = 0", "must be at least 1"),
    ("openai:http://127.0.0.1:9/v1", "candidate_batch = true", "expected an integer"),
    ("openai:http://127.0.0.1:9/v1", "candidate_batch = 8, concurrency = 2", "leave --concurrency out"),
    ("SAVED", "baseline_batch = 8", "is saved answers, not a live server"),
])
def test_bad_batch_definitions_and_combinations_are_one_line_usage_errors(
        baseline: str, options: str, says: str, requests_file: Path, tmp_path: Path) -> None:
    if baseline == "SAVED":
        saved = tmp_path / "saved"
        saved.mkdir()
        (saved / "serving-capture.json").write_text("{}")
        baseline = str(saved)
    result = runner.invoke(app, ["run", str(_definition(tmp_path, requests_file, baseline, options)),
                                 "--out", str(tmp_path / "out"), "--no-history"])
    assert result.exit_code == 2, result.output
    assert says in result.output and result.output.strip().count("\n") == 0, result.output
    assert "Traceback" not in result.output
