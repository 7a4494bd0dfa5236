"""The frozen configurations of ``glmfb diff`` and ``glmfb capture``; options declared once."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmfb.contract.errors import TargetError
from glmfb.contract.options import (
    BOOL,
    DIR,
    FILE,
    GLOBS,
    NONNEGATIVE_INT,
    POSITIVE_INT,
    SECONDS,
    ValueType,
    command_type,
    nonnegative_float,
    option,
)
from glmfb.contract.units import OptionValueError, parse_number, parse_str
from glmfb.diff.metrics import DEFAULT_CHUNK_ELEMENTS, Tolerances
from glmfb.diff.requests import DEFAULT_MAX_ELEMENTS

PerTap = tuple[tuple[str, float | None, float | None], ...]


def _tolerance_number(raw: Any, what: str) -> float | None:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    value = parse_number(raw, f"a {what}", "write it as a number, e.g. 1e-3")
    if value < 0:
        raise OptionValueError(f"{what} {raw!r} is negative", "tolerances are non-negative")
    return value


def parse_per_tap(raw: Any) -> PerTap:
    """Per-tap tolerances: ``GLOB=RTOL,ATOL`` strings (the CLI's repeated ``--tol``; either
    number may be left empty) or a TOML table ``{ "glob" = { rtol = X, atol = Y } }``."""
    parsed: list[tuple[str, float | None, float | None]] = []
    if isinstance(raw, Mapping):
        for glob, entry in raw.items():
            if not isinstance(entry, Mapping) or set(entry) - {"rtol", "atol"}:
                raise OptionValueError(f"tolerances.{glob} must be {{ rtol = X, atol = Y }}",
                                       'write tolerances = { "layers.*" = { rtol = 1e-3 } }')
            parsed.append((str(glob), _tolerance_number(entry.get("rtol"), "rtol"),
                           _tolerance_number(entry.get("atol"), "atol")))
        return tuple(parsed)
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    for item in items:
        text = str(item)
        glob, sep, numbers = text.rpartition("=")
        rtol_text, comma, atol_text = numbers.partition(",")
        if not sep or not glob or not comma:
            raise OptionValueError(f"{text!r} does not parse",
                                   "write it as 'GLOB=RTOL,ATOL', e.g. 'layers.*=1e-3,1e-5'")
        parsed.append((glob, _tolerance_number(rtol_text, "rtol"), _tolerance_number(atol_text, "atol")))
    return tuple(parsed)


def _tolerance_text(glob: str, rtol: float | None, atol: float | None) -> str:
    """One per-tap tolerance as ``--tol`` and a definition's list take it: ``GLOB=RTOL,ATOL``."""
    return f"{glob}={'' if rtol is None else repr(rtol)},{'' if atol is None else repr(atol)}"


def _knob_text(knob: str, values: tuple[Any, ...]) -> str:
    """One counterfactual as ``--counterfactual`` takes it: ``KNOB=V1,V2`` (values as JSON
    where they are not strings)."""
    return f"{knob}=" + ",".join(v if isinstance(v, str) else json.dumps(v) for v in values)


def _parse_knobs(raw: Any) -> Any:
    from glmfb.diff.counterfactual import parse_counterfactuals

    return parse_counterfactuals(raw)


COUNTERFACTUALS = ValueType(
    "counterfactual", "KNOB=V1,V2", str, lambda v: "none" if not v else ", ".join(k for k, _ in v),
    {"type": ["object", "array"],
     "description": "knob -> [values] (an argument of the candidate's factory, or torch.float32_matmul_precision, "
                    "torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32), or 'KNOB=V1,V2' strings"},
    repeatable=True, parse_all=_parse_knobs, check=_parse_knobs, write=lambda v: [_knob_text(k, vs) for k, vs in v])
PER_TAP = ValueType("tolerance", "GLOB=RTOL,ATOL", str, lambda v: "none" if not v else str(len(v)),
                    {"type": ["object", "array"], "description": "glob -> {rtol, atol}, or 'GLOB=RTOL,ATOL' strings"},
                    repeatable=True, parse_all=parse_per_tap, write=lambda v: [_tolerance_text(*entry) for entry in v])
TOLERANCE = nonnegative_float("tolerance")


def _parse_target(raw: Any) -> str:
    from glmfb.core.targets import split_ref

    text = parse_str(raw).strip()
    try:
        split_ref(text)
    except TargetError as exc:
        raise OptionValueError(exc.message, exc.hint or "") from None
    return text


# A command line: a string (split as a shell would) or a list of strings. The MCP server runs
# none unless it allows commands (glmfb/workflows/mcp/tools/probes.py checks the type's name).
COMMAND = command_type("a command line: a string split as a shell would, or a list of strings; {port} is a free "
                       "loopback port (also in the side's URL), {python} this interpreter",
                       '["{python}", "server.py", "--port", "{port}"]')
# A torch factory (path/file.py:attr or package.module:attr), resolved like a diff target.
TARGET_REF = ValueType("target", "TARGET", _parse_target, lambda v: v or "none",
                       {"type": "string", "description": "path/file.py:attr or package.module:attr"})


@dataclass(frozen=True)
class DiffConfig:
    """Everything one diff needs. Sides are capture directories or target references."""

    name: str
    baseline: str
    candidate: str
    baseline_args: Mapping[str, Any] = field(default_factory=dict)
    candidate_args: Mapping[str, Any] = field(default_factory=dict)
    base_dir: Path | None = None
    requests: Path | None = option(None, FILE, "Requests, one JSON object per line (needed when a side is a target).")
    tokenizer: Path | None = option(None, DIR, "A Hugging Face tokenizer folder for requests given as text (prompt); "
                                    "default: the baseline target's own (a tokenizer attribute, or tokenize() in its "
                                    "module).")
    rtol: float | None = option(None, TOLERANCE, "Relative tolerance for every tap (default: by dtype).")
    atol: float | None = option(None, TOLERANCE, "Absolute tolerance for every tap (default: by dtype).")
    per_tap: PerTap = option((), PER_TAP, "Per-tap tolerance (first match wins). Repeatable.",
                             key="tolerances", flag="--tol")
    taps: tuple[str, ...] = option((), GLOBS, "Only tap submodules whose name matches this glob. Repeatable.",
                                   flag="--tap")
    localize: bool = option(True, BOOL, "Measure each suspect module's own error on the baseline's inputs.")
    minimize: bool = option(True, BOOL, "Search the shortest failing prefix of the worst request.")
    max_suspects: int = option(16, POSITIVE_INT, "Most modules whose local error is measured.")
    counterfactuals: tuple[tuple[str, tuple[Any, ...]], ...] = option(
        (), COUNTERFACTUALS, "On a failing diff, rerun the candidate with each value of a knob (an argument of its "
        "factory, or one of torch's precision switches) and report which closes the gap. Repeatable.",
        flag="--counterfactual")
    keep_captures: bool = option(False, BOOL, "Keep a live diff's captures of every request (default: only of "
                                 "failing requests).")
    max_elements: int = option(DEFAULT_MAX_ELEMENTS, POSITIVE_INT,
                               "Largest request (tokens, or tensor elements) read before allocating it.")
    baseline_nproc: int = option(0, NONNEGATIVE_INT, "Run a target baseline on N torch.distributed ranks "
                                 "(torch.distributed.run); 0: one process.")
    candidate_nproc: int = option(0, NONNEGATIVE_INT, "Run a target candidate on N torch.distributed ranks; "
                                  "0: one process.")
    rank_timeout_s: float = option(300.0, SECONDS, "Longest a rank may go without progress before the "
                                   "distributed capture is stopped.", key="rank_timeout")
    # serving endpoints (openai:http://HOST:PORT/v1 sides; docs/diff.md, Serving endpoints)
    top_logprobs: int = option(5, POSITIVE_INT, "Serving endpoints: top-k logprobs asked for every generated token.")
    max_tokens: int = option(16, POSITIVE_INT, "Serving endpoints: tokens generated per request that gives no "
                             "max_tokens.")
    logprob_tolerance: float = option(0.1, TOLERANCE, "Serving endpoints: largest difference (nats) of a chosen "
                                      "token's logprob before the outputs part.")
    kl_tolerance: float = option(0.01, TOLERANCE, "Serving endpoints: largest KL divergence (nats) of the top-k "
                                 "distributions on their shared support before the outputs part.")
    noise_floor: float = option(1e-3, TOLERANCE, "Serving endpoints: the least noise (nats) assumed of a server "
                                "for the tie-flip rule (a deterministic server shows none).")
    http_timeout_s: float = option(30.0, SECONDS, "Serving endpoints: timeout of one HTTP call.", key="http_timeout")
    retries: int = option(2, NONNEGATIVE_INT, "Serving endpoints: retries of a call after a connection error, a "
                          "timeout or a 5xx answer (with exponential backoff).")
    concurrency: int = option(4, POSITIVE_INT, "Serving endpoints: requests in flight per server.")
    baseline_batch: int | None = option(
        None, POSITIVE_INT, "Serving endpoints: ask each of the baseline's requests, one at a time, while N-1 "
        "companion requests (other prompts of the set, answers discarded) are in flight to the same server: does "
        "its output depend on the batch? A side without a batch is then asked alone; replaces --concurrency.")
    candidate_batch: int | None = option(
        None, POSITIVE_INT, "Serving endpoints: ask each of the candidate's requests among N-1 companion requests "
        "(as --baseline-batch).")
    baseline_server: tuple[str, ...] = option(
        (), COMMAND, "Serving endpoints: a command that starts the baseline's server, which glmfb waits for (GET "
        "<base>/models answering 200) and stops at the end; run in the definition's folder.")
    candidate_server: tuple[str, ...] = option(
        (), COMMAND, "Serving endpoints: a command that starts the candidate's server (as --baseline-server).")
    server_startup_s: float = option(120.0, SECONDS, "Serving endpoints: longest a started server may take to "
                                     "answer GET <base>/models with 200.", key="server_startup")
    baseline_model: str | None = option(
        None, TARGET_REF, "Serving endpoints: the torch factory the baseline's server serves (its keyword arguments: "
        "baseline_args); with candidate_model, a failing serving diff offers the module-level diff of the two on the "
        "failing request as its next step.")
    candidate_model: str | None = option(
        None, TARGET_REF, "Serving endpoints: the torch factory the candidate's server serves (its keyword "
        "arguments: candidate_args).")
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS

    @property
    def tolerances(self) -> Tolerances:
        return Tolerances(self.rtol, self.atol, self.per_tap)


@dataclass(frozen=True)
class CaptureConfig:
    """``glmfb capture``: one target over a request set into a capture directory."""

    target: str
    out: Path
    args: Mapping[str, Any] = field(default_factory=dict)
    base_dir: Path | None = None
    requests: Path | None = option(None, FILE, "Requests, one JSON object per line.")
    tokenizer: Path | None = option(None, DIR, "A Hugging Face tokenizer folder for requests given as text (prompt); "
                                    "default: the target's own (a tokenizer attribute, or tokenize() in its module).")
    taps: tuple[str, ...] = option((), GLOBS, "Only tap submodules whose name matches this glob. Repeatable.",
                                   flag="--tap")
    max_elements: int = option(DEFAULT_MAX_ELEMENTS, POSITIVE_INT,
                               "Largest request (tokens, or tensor elements) read before allocating it.")
    nproc: int = option(0, NONNEGATIVE_INT, "Launch N torch.distributed ranks (torch.distributed.run), each "
                        "capturing its taps; 0: one process.")
    rank_timeout_s: float = option(300.0, SECONDS, "Longest a rank may go without progress.", key="rank_timeout")
    force: bool = option(False, BOOL, "Replace an existing capture directory at --out (whole).", toml=False)
    # a serving endpoint target (openai:http://HOST:PORT/v1): its answers are saved
    top_logprobs: int = option(5, POSITIVE_INT, "Serving endpoint: top-k logprobs asked for every generated token.")
    max_tokens: int = option(16, POSITIVE_INT, "Serving endpoint: tokens generated per request that gives no "
                             "max_tokens.")
    http_timeout_s: float = option(30.0, SECONDS, "Serving endpoint: timeout of one HTTP call.", key="http_timeout")
    retries: int = option(2, NONNEGATIVE_INT, "Serving endpoint: retries of a call after a connection error, a "
                          "timeout or a 5xx answer (with exponential backoff).")
    concurrency: int = option(4, POSITIVE_INT, "Serving endpoint: requests in flight.")
