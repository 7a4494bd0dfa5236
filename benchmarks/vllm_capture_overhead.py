"""What recording a capture inside a vLLM server (glmfb's vLLM plugin, ``GLMFB_CAPTURE_DIR``)
costs the server's throughput.

One run starts three servers of one model folder at once, and asks each the same requests:

- ``compiled``: as vLLM starts by default (its CPU build compiles the model with torch.compile);
- ``eager``: ``--enforce-eager``, no plugin: what the plugin's recording needs (module outputs
  exist only eagerly), without the recording;
- ``capture``: ``GLMFB_CAPTURE_DIR`` and ``GLMFB_CAPTURE_MARK`` set (the plugin turns
  torch.compile off in the worker itself), and ``GLMFB_CAPTURE_REQUESTS``: the marked requests
  it is sent, so that the capture is complete when the last is answered.

Three kinds of requests: unmarked ones one at a time and 4 at once (the plugin's hooks run but
write nothing), and marked ones one at a time (the capture server writes every module output of
every step of them; the others just answer them). Each round asks every server ``--requests``
requests of each kind, one server after the other (the order rotating from round to round; an
idle vLLM server takes no CPU), so the servers share the host's load; each figure is the median
over ``--rounds`` rounds, and each ratio the median of the rounds' own ratios.

    .venv/bin/python benchmarks/vllm_capture_overhead.py [--model DIR] [--requests 32] [--rounds 5]
    .venv/bin/python benchmarks/vllm_capture_overhead.py --smoke   # the capture server alone, 1 round of 2: the path, not the figure

Without ``--model``, the tiny Llama of scenarios/serving/make_hf_models.py is written to a
temporary folder. Needs vLLM's CPU build and glmfb's plugin in ``.venv-vllm``
(``bash .ci/setup --servers``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARK = "w250 w251 w252"  # token ids 253, 254, 255 in the tiny models' vocabulary
MARK_IDS = "253,254,255"
STARTUP_S = 400.0
SMOKE_NOTE = "smoke run (--smoke): the capture server alone, 1 round of 2 requests; the figures are not the benchmark's"


def prompts(count: int, words: int, seed: int, marked: bool) -> list[str]:
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(200)]
    head = [MARK] if marked else []
    return [" ".join([*head, *rng.choices(vocabulary, k=words)]) for _ in range(count)]


def ask(base_url: str, model: str, prompt: str, max_tokens: int) -> None:
    import httpx

    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    answer = httpx.post(f"{base_url}/completions", json=body, timeout=120)
    answer.raise_for_status()


def requests_per_s(base_url: str, model: str, batch: Sequence[str], max_tokens: int, concurrency: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(lambda prompt: ask(base_url, model, prompt, max_tokens), batch))
    return len(batch) / (time.perf_counter() - started)


KINDS = {"unmarked, 1 at a time": (False, 1), "unmarked, 4 at once": (False, 4), "marked, 1 at a time": (True, 1)}


def start_servers(servers: dict[str, tuple[list[str], dict[str, str]]], logs: Path) -> dict[str, Any]:
    """Every server started (each with its own environment added), all ready."""
    sys.path.insert(0, str(ROOT))
    from glmfb.diff.servers import start, wait_ready

    started: dict[str, Any] = {}
    try:
        for name, (command, environment) in servers.items():
            saved = dict(os.environ)
            os.environ.update(environment)
            try:
                started[name] = start(name, command, "openai:http://127.0.0.1:{port}/v1", logs / f"{name}.log", None)
            finally:
                os.environ.clear()
                os.environ.update(saved)
        wait_ready(list(started.values()), STARTUP_S)
    except BaseException:
        for server in started.values():
            server.stop()
        raise
    return started


def measure(started: dict[str, Any], options: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Requests per second of each server and kind, round by round."""
    import httpx

    urls = {name: server.endpoint.removeprefix("openai:") for name, server in started.items()}
    models = {name: httpx.get(f"{url}/models").json()["data"][0]["id"] for name, url in urls.items()}
    for name, url in urls.items():  # warm-up (and the compilation, if any)
        for prompt in prompts(4, options.words, 99, marked=False):
            ask(url, models[name], prompt, options.max_tokens)
    rates: dict[str, dict[str, list[float]]] = {name: {kind: [] for kind in KINDS} for name in started}
    names = list(started)
    for round_index in range(options.rounds):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for kind, (marked, concurrency) in KINDS.items():
            batch = prompts(options.requests, options.words, round_index, marked)
            for name in order:
                rates[name][kind].append(requests_per_s(urls[name], models[name], batch, options.max_tokens,
                                                        concurrency))
        print(f"  round {round_index + 1}/{options.rounds} (order {', '.join(order)}), "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    return rates


def capture_size(directory: Path) -> str:
    folder = directory / "rank0"
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        return f"no capture in {folder}"
    manifest = json.loads(manifest_path.read_text())
    files = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    live = manifest["live"]
    return (f"{len(manifest['requests'])} requests, {live['bytes'] / 2**20:.1f} MiB of tensors "
            f"({files / 2**20:.1f} MiB on disk, {files / max(len(manifest['requests']), 1) / 2**20:.2f} MiB a request), "
            f"complete={manifest['complete']}, stopped={live['stopped']}, not kept: {len(live['not_kept'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a Hugging Face model folder (default: the tiny Llama, written here)")
    parser.add_argument("--vllm-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    parser.add_argument("--requests", type=int, default=32, help="requests per round and kind")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--words", type=int, default=16, help="prompt length in words (the mark's 3 besides)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--smoke", action="store_true", help="the capture server alone, 1 round of 2 requests per "
                        "kind (CI checks the script runs; no ratio)")
    options = parser.parse_args()
    if options.smoke:
        options.rounds, options.requests = 1, 2
        print(SMOKE_NOTE, flush=True)
        if not options.vllm_python.is_file():
            print(f"no vLLM at {options.vllm_python}: 0 servers measured (bash .ci/setup --servers)")
            return

    with tempfile.TemporaryDirectory(prefix="glmfb-vllm-overhead-") as scratch:
        work = Path(scratch)
        model = options.model
        if model is None:
            sys.path.insert(0, str(ROOT / "scenarios" / "serving"))
            from make_hf_models import make_models

            model = make_models(work / "models")["llama"]
        command = [str(options.vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                   "--dtype", "float32", "--max-model-len", "512", "--host", "127.0.0.1", "--port", "{port}"]
        kv = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        captures = work / "captures"
        marked_requests = options.rounds * options.requests
        servers = {
            "compiled": (command, kv),
            "eager": ([*command, "--enforce-eager"], kv),
            "capture": (command, {**kv, "GLMFB_CAPTURE_DIR": str(captures), "GLMFB_CAPTURE_MARK": MARK_IDS,
                                  "GLMFB_CAPTURE_REQUESTS": str(marked_requests)}),
        }
        if options.smoke:
            servers = {"capture": servers["capture"]}
        print(f"model {model}; {options.rounds} rounds of {options.requests} requests per kind and server, "
              f"{options.words}-word prompts, {options.max_tokens} tokens each; {os.cpu_count()} CPUs", flush=True)
        started = start_servers(servers, work / "logs")
        try:
            rates = measure(started, options)
        finally:
            for server in started.values():
                server.stop()

        print(f"\n{'server':>9}  " + "  ".join(f"{k:>22}" for k in KINDS) + "   (median over rounds)")
        for name, by_kind in rates.items():
            print(f"{name:>9}  " + "  ".join(f"{statistics.median(by_kind[k]):>16.1f} req/s" for k in KINDS))
        for reference in [name for name in ("eager", "compiled") if name in rates]:
            print(f"capture / {reference}: " + ", ".join(
                f"{k} {ratio(rates['capture'][k], rates[reference][k])}" for k in KINDS))
        print(f"capture: {capture_size(captures)}")
        notes = captures / "rank0.note.txt"
        if notes.is_file():
            print(f"notes: {notes.read_text().strip()}")


def ratio(capture: list[float], reference: list[float]) -> str:
    """The median of the rounds' own ratios, and their range."""
    ratios = [c / r for c, r in zip(capture, reference, strict=True)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


if __name__ == "__main__":
    main()
