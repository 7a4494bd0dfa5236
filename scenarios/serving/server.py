"""A small OpenAI-compatible server over a torch factory, for the bundled serving scenario: what
``glmfb diff openai:...`` compares when no llama.cpp is at hand.

    python scenarios/serving/server.py scenarios/numerics/llama.py:clean --port 8000 --arg init_std=1.0

The factory is resolved as a diff target is (``path/file.py:attr`` or ``package.module:attr``,
``--arg KEY=VALUE`` its keyword arguments, JSON where the value parses) and must return a
``torch.nn.Module`` that maps token ids ``[1, T]`` to logits ``[1, T, vocab]`` (a Hugging Face
causal LM's output, or a tensor). It answers:

- ``GET /v1/models``: the one model it serves (``--model-name``, default the factory's name);
- ``POST /v1/completions``: greedy generation of ``max_tokens`` tokens (no end-of-sequence: the
  finish reason is always ``length``), with ``logprobs: k`` answered in the OpenAI completions
  format (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``). ``prompt`` is a
  list of token ids (the OpenAI API allows that) or a text.

There is no tokenizer. Token ``i`` is named ``<i>`` (that text is what ``tokens`` and the keys of
``top_logprobs`` hold, and a completion's ``text`` is those names joined). A text prompt is read
as its UTF-8 bytes, one token id each (the vocabulary must hold 256 ids). Sampling is refused: a
``temperature`` above 0 is answered 400, as is ``n`` other than 1 or ``stream``.

Every forward is the whole sequence again (no KV cache: the models are tiny and the requests
short), under one lock and on ``--threads`` torch threads, so that a request's answer does not
depend on what else is in flight: the server is deterministic, and glmfb measures no jitter.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_TOKENS_CAP = 4096


class BadRequest(ValueError):
    """A request this server answers 400."""


class Model:
    """The factory's module and how it is asked: greedy steps with the top-k logprobs."""

    def __init__(self, factory: str, args: dict[str, Any], threads: int) -> None:
        import torch

        from glmfb.core.targets import resolve

        torch.set_num_threads(threads)
        self.module = resolve(factory)(**args)
        if not isinstance(self.module, torch.nn.Module):
            raise TypeError(f"{factory} returned a {type(self.module).__name__}, not a torch.nn.Module")
        self.module.eval()
        self.lock = threading.Lock()
        self.vocab = int(self._logits([0]).shape[-1])

    def _logits(self, ids: list[int]) -> Any:
        """The logits of the last position for the sequence ``ids``."""
        import torch

        with self.lock, torch.inference_mode():
            out = self.module(torch.tensor([ids], dtype=torch.long))
        logits = getattr(out, "logits", out)
        if isinstance(logits, (tuple, list)):
            logits = logits[0]
        return logits[0, -1].float()

    def prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise BadRequest("prompt is empty")
            if self.vocab < 256:
                raise BadRequest(f"a text prompt is read as UTF-8 bytes, and this model's vocabulary has only "
                                 f"{self.vocab} ids; give token ids")
            return list(prompt.encode("utf-8"))
        if (isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list)):
            prompt = prompt[0]  # one prompt given as a batch of one
        if (not isinstance(prompt, list) or not prompt
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)):
            raise BadRequest("prompt must be a text or a non-empty list of token ids")
        if any(not 0 <= i < self.vocab for i in prompt):
            raise BadRequest(f"token ids must be in [0, {self.vocab})")
        return list(prompt)

    def generate(self, ids: list[int], max_tokens: int, top_k: int) -> dict[str, Any]:
        """Greedy steps: the OpenAI completions ``logprobs`` object and the joined text."""
        import torch

        ids = list(ids)
        tokens: list[str] = []
        values: list[float] = []
        tops: list[dict[str, float]] = []
        offsets: list[int] = []
        offset = 0
        for _ in range(max_tokens):
            logprobs = torch.log_softmax(self._logits(ids).double(), dim=-1)
            chosen = int(torch.argmax(logprobs))
            name = token_name(chosen)
            tokens.append(name)
            values.append(float(logprobs[chosen]))
            if top_k > 0:
                best = torch.topk(logprobs, min(top_k, self.vocab))
                tops.append({token_name(int(i)): float(v) for v, i in zip(best.values, best.indices, strict=True)})
            offsets.append(offset)
            offset += len(name)
            ids.append(chosen)
        logprobs_object = {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                           "text_offset": offsets} if top_k > 0 else None
        return {"text": "".join(tokens), "logprobs": logprobs_object}


def token_name(token: int) -> str:
    """The text a token id is answered as (there is no tokenizer)."""
    return f"<{token}>"


def _completion(model: Model, name: str, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if float(body.get("temperature", 0.0) or 0.0) > 0:
        raise BadRequest("this server generates greedily only: give temperature 0")
    if body.get("n", 1) != 1 or body.get("stream", False) or body.get("echo", False):
        raise BadRequest("n other than 1, stream and echo are not served")
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_TOKENS_CAP:
        raise BadRequest(f"max_tokens must be an integer in [1, {MAX_TOKENS_CAP}]")
    top_k = body.get("logprobs") or 0
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 0 <= top_k <= 20:
        raise BadRequest("logprobs must be an integer in [0, 20]")
    ids = model.prompt_ids(body.get("prompt"))
    generated = model.generate(ids, max_tokens, top_k)
    return {
        "id": f"cmpl-{time.monotonic_ns()}", "object": "text_completion", "created": int(time.time()),
        "model": name,
        "choices": [{"index": 0, "text": generated["text"], "logprobs": generated["logprobs"],
                     "finish_reason": "length"}],
        "usage": {"prompt_tokens": len(ids), "completion_tokens": max_tokens, "total_tokens": len(ids) + max_tokens},
    }


def make_handler(model: Model, name: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": "invalid_request_error", "code": status}})

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "glmfb"}]})
            else:
                self._error(404, f"no such path {self.path}")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path.rstrip("/") != "/v1/completions":
                self._error(404, f"no such path {self.path}")
                return
            try:
                body = json.loads(raw or b"null")
                self._send(200, _completion(model, name, body))
            except (json.JSONDecodeError, UnicodeDecodeError):
                self._error(400, "the body is not JSON")
            except (BadRequest, TypeError, ValueError) as exc:
                self._error(400, str(exc))

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the log holds the start line and errors only

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("factory", help="path/file.py:attr or package.module:attr returning a torch.nn.Module")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                        help="keyword argument for the factory (JSON where it parses); repeatable")
    parser.add_argument("--model-name", default=None, help="the model's id at /v1/models (default: the factory's name)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    options = parser.parse_args(argv)

    from glmfb.core.targets import parse_args

    model = Model(options.factory, parse_args(options.arg), options.threads)
    name = options.model_name or options.factory.rpartition(":")[2]
    server = ThreadingHTTPServer((options.host, options.port), make_handler(model, name))
    server.daemon_threads = True
    print(f"serving {options.factory} ({model.vocab} tokens) as {name!r} on http://{options.host}:{options.port}/v1",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
