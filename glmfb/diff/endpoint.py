"""A diff side that is a running server: ``openai:http://HOST:PORT/v1`` (optionally ``#MODEL``),
asked through its OpenAI-compatible API for greedy completions with the top-k logprobs of every
generated token.

The client is httpx: every call has a timeout, a connection error, a timeout or a 5xx answer is
retried a bounded number of times with exponential backoff, a 4xx answer is not, and what a
server answered last (its status and the head of its body) is what :class:`EndpointError` says.
Requests go out from a small thread pool, so at most ``concurrency`` are in flight per server.
With a batch (``--candidate-batch N``, :func:`ask_batched`) the requests go one at a time, each among N-1
companion requests in flight to the same server instead.
The completions API is asked first; a server without it (404 or 405) is asked through chat
completions, for text prompts only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import HarnessError, InputError, TargetFailed, UsageError

if TYPE_CHECKING:
    from glmfb.diff.evidence import ServedBy

SCHEME = "openai:"
BODY_HEAD = 200  # characters of a failing answer's body quoted in the error
DEFAULT_MAX_TOKENS = 16
# Greedy decoding, and nothing that changes the choice after the logprobs are taken: the OpenAI
# penalties, and the repetition penalty under the names servers give it (llama.cpp's server and
# llama-cpp-python default theirs to 1.1, so greedy would not pick the top logprob).
GREEDY: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "seed": 0, "presence_penalty": 0.0,
                          "frequency_penalty": 0.0, "repeat_penalty": 1.0, "repetition_penalty": 1.0}


def is_endpoint(ref: str) -> bool:
    """Whether a side names a server (``openai:http://...``) rather than a target or a capture."""
    return ref.startswith(SCHEME)


@dataclass(frozen=True)
class Endpoint:
    """A server's API base (``http://host:port/v1``) and the model to ask (None: the first the
    server lists)."""

    base_url: str
    model: str | None = None

    @property
    def ref(self) -> str:
        return SCHEME + self.base_url + (f"#{self.model}" if self.model else "")


def parse_endpoint(ref: str) -> Endpoint:
    """``openai:http://127.0.0.1:8000/v1#tiny`` -> ``Endpoint("http://127.0.0.1:8000/v1", "tiny")``.
    Raises :class:`UsageError` on anything else."""
    if not is_endpoint(ref):
        raise UsageError(f"{ref!r} is not a serving endpoint", "write it as openai:http://HOST:PORT/v1")
    url, _, model = ref[len(SCHEME):].partition("#")
    if not url.startswith(("http://", "https://")) or "//" not in url or not url.split("//", 1)[1]:
        raise UsageError(f"endpoint {ref!r} has no http(s) URL", "write it as openai:http://HOST:PORT/v1")
    return Endpoint(url.rstrip("/"), model or None)


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingRequest:
    """One request to a server: a text ``prompt`` or token ids (``input_ids``, where the server
    takes them), and the number of tokens to generate greedily."""

    id: str
    prompt: str | tuple[int, ...]
    max_tokens: int

    def to_dict(self) -> dict[str, Any]:
        prompt: Any = self.prompt if isinstance(self.prompt, str) else list(self.prompt)
        key = "prompt" if isinstance(self.prompt, str) else "input_ids"
        return {"id": self.id, key: prompt, "max_tokens": self.max_tokens}


def parse_serving_request(data: Any, label: str, default_max_tokens: int) -> ServingRequest:
    if not isinstance(data, dict):
        raise InputError(f"{label}: expected a JSON object, got {type(data).__name__}")
    rid = data.get("id")
    if not isinstance(rid, str) or not rid:
        raise InputError(f"{label}: needs a non-empty string 'id'")
    kinds = [k for k in ("prompt", "input_ids") if k in data]
    if len(kinds) != 1:
        raise InputError(f"{label}: request {rid!r} to a server needs exactly one of prompt, input_ids",
                         f"got {', '.join(kinds) or 'none'}")
    prompt: str | tuple[int, ...]
    if "prompt" in data:
        if not isinstance(data["prompt"], str) or not data["prompt"]:
            raise InputError(f"{label}: prompt must be a non-empty string")
        prompt = data["prompt"]
    else:
        ids = data["input_ids"]
        if not isinstance(ids, list) or not ids or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise InputError(f"{label}: input_ids must be a non-empty list of non-negative ints")
        prompt = tuple(ids)
    max_tokens = data.get("max_tokens", default_max_tokens)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise InputError(f"{label}: max_tokens must be an integer >= 1, got {max_tokens!r}")
    return ServingRequest(rid, prompt, max_tokens)


def read_serving_requests(path: Path, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> list[ServingRequest]:
    """The requests of a JSONL file for servers (``id``, ``prompt`` or ``input_ids``, optional
    ``max_tokens``), read as a model's requests are (:func:`glmfb.diff.requests.read_jsonl_requests`)."""
    from glmfb.diff.requests import read_jsonl_requests

    return read_jsonl_requests(path, lambda data, label: parse_serving_request(data, label, default_max_tokens))


# --------------------------------------------------------------------------------------------
# Answers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenStep:
    """One generated token: its text, its logprob, and the top-k candidates (text -> logprob)."""

    token: str
    logprob: float
    top: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "top": dict(self.top)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenStep:
        return cls(str(data["token"]), float(data["logprob"]), {str(k): float(v) for k, v in data["top"].items()})


@dataclass(frozen=True)
class Answer:
    """What a server answered to one request: the generated tokens, why it stopped, which API
    it was asked through, and how long the call took (seconds, retries included)."""

    request: str
    steps: tuple[TokenStep, ...]
    finish_reason: str | None = None
    api: str = "completions"
    seconds: float = 0.0
    attempts: int = 1

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(step.token for step in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {"request": self.request, "finish_reason": self.finish_reason, "api": self.api,
                "seconds": self.seconds, "attempts": self.attempts, "steps": [s.to_dict() for s in self.steps]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Answer:
        return cls(str(data["request"]), tuple(TokenStep.from_dict(s) for s in data["steps"]),
                   data.get("finish_reason"), str(data.get("api", "completions")), float(data.get("seconds", 0.0)),
                   int(data.get("attempts", 1)))


class EndpointError(HarnessError):
    """A server could not be reached or answered with an error; the message names the URL and
    what it answered last (status and body head, or the connection error)."""


@dataclass(frozen=True)
class ClientSettings:
    """How a server is asked: per-call timeout, retries after the first attempt, the first
    backoff (doubled each retry), requests in flight, top-k logprobs asked."""

    timeout_s: float = 30.0
    retries: int = 2
    backoff_s: float = 0.25
    concurrency: int = 4
    top_logprobs: int = 5


@dataclass
class EndpointClient:
    """One server's client; use as a context manager (it owns an httpx connection pool)."""

    endpoint: Endpoint
    settings: ClientSettings = field(default_factory=ClientSettings)
    sleep: Callable[[float], None] = time.sleep
    _client: Any = None
    _model: str | None = None
    _chat: bool = False
    _listed: Any = None

    def __enter__(self) -> EndpointClient:
        import httpx

        timeout = httpx.Timeout(self.settings.timeout_s, connect=min(self.settings.timeout_s, 10.0))
        limits = httpx.Limits(max_connections=self.settings.concurrency)
        self._client = httpx.Client(timeout=timeout, limits=limits, trust_env=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # ---- HTTP with bounded retries -----------------------------------------------------------

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None,
              sent: Callable[[], None] | None = None) -> tuple[Any, int]:
        """The decoded JSON answer and the attempts it took. Retries connection errors,
        timeouts and 5xx answers ``settings.retries`` times; raises :class:`EndpointError`.
        ``sent`` is called once the request's body is written to its connection (each attempt)."""
        import httpx

        url = f"{self.endpoint.base_url}{path}"
        attempts = self.settings.retries + 1
        last = ""
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                self.sleep(self.settings.backoff_s * 2 ** (attempt - 2))
            try:
                response = self._client.request(method, url, json=body,
                                                extensions={"trace": _when_sent(sent)} if sent else None)
            except httpx.TimeoutException as exc:
                last = f"timed out after {self.settings.timeout_s:g} s ({type(exc).__name__})"
                continue
            except httpx.TransportError as exc:
                last = f"could not be reached ({type(exc).__name__}: {exc})"
                continue
            if response.status_code >= 500 or response.status_code == 429:
                last = _answered(response)
                continue
            if response.status_code >= 400:
                raise EndpointError(f"{url} {_answered(response)}")
            try:
                return response.json(), attempt
            except ValueError:
                raise EndpointError(f"{url} answered HTTP {response.status_code} with a body that is not JSON: "
                                    f"{_head(response.text)!r}") from None
        tries = "once" if attempts == 1 else f"{attempts} times"
        raise EndpointError(f"{url} {last} (asked {tries})")

    def model(self) -> str:
        """The model to ask: the endpoint's, else the first the server lists at ``/models``
        (this call is also the reachability check)."""
        if self._model is None:
            listed, _ = self._call("GET", "/models")
            self._listed = listed
            data = listed.get("data") if isinstance(listed, dict) else None
            if self.endpoint.model is not None:
                self._model = self.endpoint.model
            elif isinstance(data, list) and data and isinstance(data[0], dict) and "id" in data[0]:
                self._model = str(data[0]["id"])
            else:
                raise EndpointError(f"{self.endpoint.base_url}/models lists no model: {_head(json.dumps(listed))!r}")
        return self._model

    # ---- what it serves -----------------------------------------------------------------------

    def _root_call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """One call at the server's root (``/version``, ``/tokenize``: beside ``/v1``, not
        under it), never retried; None for any failure (these are optional extras)."""
        import httpx

        root = self.endpoint.base_url.removesuffix("/v1")
        try:
            response = self._client.request(method, f"{root}{path}", json=body)
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def describe(self, side: str) -> ServedBy:
        """What this server serves (:mod:`glmfb.diff.served`): its listed model, a local model
        folder, the engine's version, and on this host its process and weights' format."""
        from glmfb.diff.served import describe

        self.model()
        return describe(side, self.endpoint.base_url, self._listed, self._root_call("GET", "/version"))

    def token_ids(self, request: ServingRequest, generated: int) -> tuple[list[int], list[int]] | None:
        """The server's own token ids of ``request``'s prompt (``POST /tokenize``) and of the
        first ``generated`` tokens it generates for it (greedy, with ``return_tokens_as_token_ids``):
        vLLM answers both; None where the server does not."""
        model = self.model()
        if isinstance(request.prompt, str):
            tokenized = self._root_call("POST", "/tokenize", {"model": model, "prompt": request.prompt})
            prompt = tokenized.get("tokens") if isinstance(tokenized, dict) else None
            if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
                return None
        else:
            prompt = list(request.prompt)
        if generated == 0:
            return prompt, []
        body = {"model": model, "prompt": request.prompt if isinstance(request.prompt, str) else prompt,
                "max_tokens": generated, **GREEDY, "logprobs": 1, "stream": False, "return_tokens_as_token_ids": True}
        try:
            answer, _ = self._call("POST", "/completions", body)
            tokens = _choice(answer, self.endpoint)["logprobs"]["tokens"]
            ids = [int(str(t).removeprefix("token_id:")) for t in tokens]
        except (EndpointError, KeyError, TypeError, ValueError):
            return None
        return (prompt, ids[:generated]) if all(str(t).startswith("token_id:") for t in tokens) else None

    # ---- one request -------------------------------------------------------------------------

    def complete(self, request: ServingRequest, sent: Callable[[], None] | None = None) -> Answer:
        """Greedy generation with the top-k logprobs of every token. Raises :class:`EndpointError`.
        ``sent``: called once the request is written to the server (:meth:`_call`)."""
        started = time.perf_counter()
        model = self.model()
        if not self._chat:
            prompt = request.prompt if isinstance(request.prompt, str) else list(request.prompt)
            body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": request.max_tokens, **GREEDY,
                                    "logprobs": self.settings.top_logprobs, "echo": False, "stream": False}
            try:
                answer, attempts = self._call("POST", "/completions", body, sent)
                return _completion_answer(request.id, answer, time.perf_counter() - started, attempts, self.endpoint)
            except EndpointError as exc:
                if not _missing_api(str(exc)) or not isinstance(request.prompt, str):
                    raise
                self._chat = True
        if not isinstance(request.prompt, str):
            raise EndpointError(f"{self.endpoint.base_url} has no completions API, and request {request.id!r} "
                                "gives token ids, which chat completions cannot take")
        chat: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": request.prompt}],
                                "max_tokens": request.max_tokens, **GREEDY, "logprobs": True,
                                "top_logprobs": self.settings.top_logprobs, "stream": False}
        answer, attempts = self._call("POST", "/chat/completions", chat, sent)
        return _chat_answer(request.id, answer, time.perf_counter() - started, attempts, self.endpoint)


def _when_sent(sent: Callable[[], None]) -> Callable[[str, Any], None]:
    """An httpcore trace callback that calls ``sent`` when a request's body has been written."""
    def trace(event: str, info: Any) -> None:
        if event.endswith("send_request_body.complete"):
            sent()

    return trace


def _head(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= BODY_HEAD else flat[:BODY_HEAD] + "..."


def _answered(response: Any) -> str:
    reason = f" {response.reason_phrase}" if getattr(response, "reason_phrase", "") else ""
    return f"answered HTTP {response.status_code}{reason}: {_head(response.text)!r}"


def _missing_api(message: str) -> bool:
    return "answered HTTP 404" in message or "answered HTTP 405" in message


def _choice(answer: Any, endpoint: Endpoint) -> Mapping[str, Any]:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EndpointError(f"{endpoint.base_url} answered with no choices: {_head(json.dumps(answer))!r}")
    return choices[0]


def _completion_answer(rid: str, answer: Any, seconds: float, attempts: int, endpoint: Endpoint) -> Answer:
    """Steps from a completions answer: ``logprobs = {tokens, token_logprobs, top_logprobs}``."""
    choice = _choice(answer, endpoint)
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("tokens"), list):
        raise EndpointError(f"{endpoint.base_url} answered without logprobs: {_head(json.dumps(choice))!r}")
    tokens, values, tops = logprobs["tokens"], logprobs.get("token_logprobs") or [], logprobs.get("top_logprobs") or []
    if not len(tokens) == len(values) == len(tops):
        raise EndpointError(f"{endpoint.base_url} answered {len(tokens)} tokens but {len(values)} logprobs "
                            f"and {len(tops)} top-k lists")
    steps = tuple(TokenStep(str(t), _number(v), {str(k): _number(p) for k, p in (top or {}).items()})
                  for t, v, top in zip(tokens, values, tops, strict=True))
    return Answer(rid, steps, choice.get("finish_reason"), "completions", seconds, attempts)


def _chat_answer(rid: str, answer: Any, seconds: float, attempts: int, endpoint: Endpoint) -> Answer:
    """Steps from a chat answer: ``logprobs.content = [{token, logprob, top_logprobs: [...]}]``."""
    choice = _choice(answer, endpoint)
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        raise EndpointError(f"{endpoint.base_url} answered without logprobs: {_head(json.dumps(choice))!r}")
    steps = tuple(TokenStep(str(item["token"]), _number(item["logprob"]),
                            {str(c["token"]): _number(c["logprob"]) for c in item.get("top_logprobs") or []})
                  for item in content)
    return Answer(rid, steps, choice.get("finish_reason"), "chat", seconds, attempts)


def _number(value: Any) -> float:
    """A logprob; None (some servers' first token) and -inf are -inf."""
    if value is None:
        return float("-inf")
    return float(value)


def ask_all(client: EndpointClient, side: str, requests: Sequence[ServingRequest],
            progress: Callable[[str], None] | None = None, what: str = "requests") -> dict[str, Answer]:
    """Every request asked of one server, at most ``concurrency`` in flight; a failing request
    raises :class:`TargetFailed` naming the side, the request and what the server answered."""
    def one(request: ServingRequest) -> Answer:
        try:
            return client.complete(request)
        except EndpointError as exc:
            raise TargetFailed(f"{side} server", f"on request {request.id}", exc) from exc

    answers: dict[str, Answer] = {}
    pool = ThreadPoolExecutor(max_workers=client.settings.concurrency)
    try:
        for done, answer in enumerate(pool.map(one, requests), start=1):
            answers[answer.request] = answer
            if progress is not None:
                progress(f"{side}: {done}/{len(requests)} {what} answered")
    finally:  # on a failure, the requests not yet sent are not sent; those in flight end by their timeout
        pool.shutdown(wait=True, cancel_futures=True)
    return answers


# --------------------------------------------------------------------------------------------
# Asking among companions (--baseline-batch, --candidate-batch)
# --------------------------------------------------------------------------------------------

COMPANION_LEAD_S = 0.02  # how long a request's companions are in flight before it is sent


@dataclass
class Companions:
    """The companion requests one side's batch sent (their answers discarded), and how many of
    them ended before the request they accompanied (that request then ran part of its time in
    a smaller batch: a companion that stopped at its end of sequence)."""

    sent: int = 0
    ended_early: int = 0


def companions_of(request: ServingRequest, pool: Sequence[ServingRequest], count: int) -> list[ServingRequest]:
    """The ``count`` companions of ``request``: the other prompts of ``pool`` (the whole set), from
    the one after it in file order, cycled (its own prompt where the set holds no other), each
    generating twice the request's tokens, so that it is still in flight when the request ends.
    The same request gets the same companions every time it is asked (its repeat too)."""
    at = next((i for i, r in enumerate(pool) if r.id == request.id), -1)
    others = [r for r in (*pool[at + 1:], *pool[:max(at, 0)]) if r.id != request.id] or [request]
    return [ServingRequest(f"{request.id}~companion{k + 1}", others[k % len(others)].prompt, 2 * request.max_tokens)
            for k in range(count)]


def ask_batched(client: EndpointClient, side: str, requests: Sequence[ServingRequest], batch: int,
                pool: Sequence[ServingRequest], companions: Companions,
                progress: Callable[[str], None] | None = None, what: str = "requests") -> dict[str, Answer]:
    """Every request asked of one server one at a time, each while ``batch - 1`` companion
    requests (:func:`companions_of`) are in flight to the same server: they are sent first, the
    request :data:`COMPANION_LEAD_S` after the last of them is written to its connection (for the
    server to take them in), and the next request waits until every companion has answered, so
    that the server runs each request in a batch of ``batch`` (1: alone). Only the
    requests' answers are returned; ``companions`` counts what was sent beside them. A failing
    request or companion raises :class:`TargetFailed` naming the side and the request."""
    import threading

    count = batch - 1
    answers: dict[str, Answer] = {}
    executor = ThreadPoolExecutor(max_workers=max(count, 1))
    try:
        for done, request in enumerate(requests, start=1):
            group = companions_of(request, pool, count)
            sent = [threading.Event() for _ in group]

            def accompany(companion: ServingRequest, sent: threading.Event, request: ServingRequest = request) -> float:
                try:
                    client.complete(companion, sent.set)
                except EndpointError as exc:
                    raise TargetFailed(f"{side} server", f"on a companion request ({companion.max_tokens} tokens) of "
                                       f"request {request.id}", exc) from exc
                finally:
                    sent.set()  # (a companion that failed before it was sent: its error is raised below)
                return time.perf_counter()

            futures = [executor.submit(accompany, c, e) for c, e in zip(group, sent, strict=True)]
            if count:
                for event in sent:
                    event.wait()
                time.sleep(COMPANION_LEAD_S)
            try:
                answer = client.complete(request)
            except EndpointError as exc:
                raise TargetFailed(f"{side} server", f"on request {request.id}", exc) from exc
            ended = time.perf_counter()
            companions.sent += count
            companions.ended_early += sum(future.result() < ended for future in futures)
            answers[request.id] = answer
            if progress is not None:
                among = "alone" if count == 0 else f"each among {count} others"
                progress(f"{side}: {done}/{len(requests)} {what} answered ({among})")
    finally:  # on a failure, the companions in flight end by their timeout
        executor.shutdown(wait=True, cancel_futures=True)
    return answers
