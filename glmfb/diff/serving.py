"""``glmfb diff`` between two serving endpoints: per request, where the greedy outputs first
part, and how the top-k distributions drifted before they did.

Each side is asked every request once (greedy, the top-k logprobs of every generated token).
Per request, the positions before the first divergent token are compared: top-1 agreement, the
chosen token's logprob difference, and the KL divergence of the two top-k distributions on
their shared support (renormalized there), with the probability mass outside that support
reported beside it (what the KL cannot see). At the divergence, each side's token is looked up
in the other's top-k.

Noise: each server is asked the first request again, and every request whose outputs part; the
largest logprob difference a server shows between two answers to the same request is its
jitter. A divergence where, on either side, the two tokens are closer in logprob than that
side's noise (its jitter, at least ``noise_floor``: a deterministic server shows none) is a tie
flip: that side chose between equals (a bfloat16 server's logits tie exactly more often than a
float32 one's), so which token comes first is its tie-break, not a preference. Where only one
side was tied, the other preferred its token by more than its noise: the two distributions
differ there by the sum of the two gaps (how far the preference between the two tokens moved),
which counts as drift at that position against ``logprob_tolerance``, as any position before it
does; a tie on both sides is noise on both.

A side may also be a folder ``glmfb capture openai:...`` wrote (``serving-capture.json``: the
server's answers to every request and its repeat of the first): it is compared as the server
answered then, with the noise of that repeat.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmfb.contract.errors import TargetFailed, UsageError
from glmfb.contract.evidence import Evidence
from glmfb.contract.step import Intent, Step
from glmfb.contract.verdict import Layer, Metric, Status, Verdict
from glmfb.core.probe import ProbeContext
from glmfb.core.rules import Diagnosis, Rule, diagnose
from glmfb.diff.endpoint import (
    Answer,
    ClientSettings,
    Companions,
    EndpointClient,
    ServingRequest,
    TokenStep,
    ask_all,
    ask_batched,
    is_endpoint,
    parse_endpoint,
    read_serving_requests,
)
from glmfb.diff.evidence import (
    ServedBy,
    ServingDivergence,
    ServingDrift,
    ServingDriftRow,
    ServingNoise,
    ServingRequestRow,
    ServingRequests,
    ServingThroughput,
    SideRun,
)
from glmfb.diff.servers import ServerStartFailed, StartedServer, started_servers

SIDES = ("baseline", "candidate")
DRIFT_ROWS = 200  # per-position rows kept in the verdict's drift evidence


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PositionDrift:
    """One position before the divergence: the chosen token, its logprob difference (candidate
    minus baseline), the KL of the renormalized top-k on the shared support, the mass outside it
    (the larger of the two sides'), and whether the two top-1 tokens agree."""

    position: int
    token: str
    logprob_diff: float
    kl_shared: float
    mass_outside: float
    top1_agree: bool


@dataclass(frozen=True)
class Divergence:
    """Where two answers first part. A token is None where that side stopped generating.
    ``*_rank``: the 1-based rank of the *other* side's token in this side's top-k (None: not in
    it). ``*_gap``: this side's logprob of its own token minus that of the other's (None: the
    other's is not in its top-k). ``tied``: the sides whose gap is within their noise (either:
    a tie flip)."""

    position: int
    baseline_token: str | None
    candidate_token: str | None
    baseline_logprob: float | None
    candidate_logprob: float | None
    baseline_rank: int | None
    candidate_rank: int | None
    baseline_gap: float | None
    candidate_gap: float | None
    tied: tuple[str, ...] = ()
    shift: float | None = None  # baseline_gap + candidate_gap: how far the preference between the two tokens moved

    @property
    def tie_flip(self) -> bool:
        return bool(self.tied)

    @property
    def moved(self) -> float:
        """How far the preference between the two tokens moved beyond the tied side's noise,
        for a tie on one side only (on both, or no tie: 0, which counts nowhere)."""
        if len(self.tied) != 1 or self.shift is None:
            return 0.0
        return self.shift


@dataclass(frozen=True)
class RequestComparison:
    """One request's two answers compared. ``status``: ``same`` (no divergence, within the
    tolerances), ``tie`` (they part at a tie flip), ``diverged`` (they part, not at a tie),
    ``drift`` (the distributions drifted past a tolerance, and the outputs do not part or part at
    a tie flip)."""

    request: str
    baseline_tokens: int
    candidate_tokens: int
    drift: tuple[PositionDrift, ...]
    divergence: Divergence | None
    status: str = "same"

    @property
    def failed(self) -> bool:
        return self.status in ("diverged", "drift")

    def worst(self, key: Callable[[PositionDrift], float]) -> PositionDrift | None:
        return max(self.drift, key=key, default=None)

    @property
    def logprob_diff_max(self) -> float:
        return max((abs(d.logprob_diff) for d in self.drift), default=0.0)

    @property
    def kl_max(self) -> float:
        return max((d.kl_shared for d in self.drift), default=0.0)

    @property
    def mass_outside_max(self) -> float:
        return max((d.mass_outside for d in self.drift), default=0.0)


def shared_kl(baseline: Mapping[str, float], candidate: Mapping[str, float]) -> tuple[float, float]:
    """KL(baseline || candidate) of the two top-k distributions renormalized on the tokens both
    list, and the mass outside that support: 1 minus the smaller of the two sides' shared
    probability (nothing shared: KL 0 over nothing, mass outside 1)."""
    shared = [t for t in baseline if t in candidate and math.isfinite(baseline[t]) and math.isfinite(candidate[t])]
    if not shared:
        return 0.0, 1.0
    p = [math.exp(baseline[t]) for t in shared]
    q = [math.exp(candidate[t]) for t in shared]
    p_mass, q_mass = sum(p), sum(q)
    kl = sum(pi / p_mass * math.log((pi / p_mass) / (qi / q_mass)) for pi, qi in zip(p, q, strict=True) if pi > 0)
    return max(kl, 0.0), max(0.0, 1.0 - min(p_mass, q_mass))


def _rank(token: str | None, top: Mapping[str, float]) -> int | None:
    if token is None or token not in top:
        return None
    ordered = sorted(top.items(), key=lambda item: -item[1])
    return 1 + [t for t, _ in ordered].index(token)


def _gap(own: TokenStep, other: str | None) -> float | None:
    if other is None or other not in own.top:
        return None
    return own.logprob - own.top[other]


def compare_answers(baseline: Answer, candidate: Answer, noise: Mapping[str, float],
                    logprob_tolerance: float, kl_tolerance: float) -> RequestComparison:
    """Two answers to one request compared position by position (see the module docstring);
    ``noise`` is each side's noise (nats) for the tie-flip rule."""
    drift: list[PositionDrift] = []
    divergence: Divergence | None = None
    length = max(len(baseline.steps), len(candidate.steps))
    for i in range(length):
        b = baseline.steps[i] if i < len(baseline.steps) else None
        c = candidate.steps[i] if i < len(candidate.steps) else None
        if b is None or c is None or b.token != c.token:
            divergence = _divergence(i, b, c, noise)
            break
        kl, outside = shared_kl(b.top, c.top)
        top1 = (max(b.top, key=b.top.__getitem__) == max(c.top, key=c.top.__getitem__)) if b.top and c.top else True
        drift.append(PositionDrift(i, b.token, c.logprob - b.logprob, kl, outside, top1))
    comparison = RequestComparison(baseline.request, len(baseline.steps), len(candidate.steps), tuple(drift), divergence)
    drifted = (comparison.logprob_diff_max > logprob_tolerance or comparison.kl_max > kl_tolerance
               or (divergence is not None and divergence.moved > logprob_tolerance))
    if divergence is not None and not divergence.tie_flip:
        status = "diverged"  # where the outputs part is the place to look, however they drifted before
    elif drifted:
        status = "drift"
    else:
        status = "same" if divergence is None else "tie"
    return RequestComparison(comparison.request, comparison.baseline_tokens, comparison.candidate_tokens,
                             comparison.drift, divergence, status)


def _divergence(position: int, b: TokenStep | None, c: TokenStep | None, noise: Mapping[str, float]) -> Divergence:
    b_token = b.token if b is not None else None
    c_token = c.token if c is not None else None
    b_gap = _gap(b, c_token) if b is not None else None
    c_gap = _gap(c, b_token) if c is not None else None
    tied = tuple(side for side, gap in (("baseline", b_gap), ("candidate", c_gap))
                 if gap is not None and abs(gap) <= noise[side])
    # the preference between the two tokens, baseline minus candidate; a token missing from a
    # side's top-k is below all it lists, so that side's gap is at least its top-k's span
    gaps = [g if g is not None else _span(own) for g, own in ((b_gap, b), (c_gap, c)) if own is not None]
    shift = sum(gaps) if len(gaps) == 2 else None
    return Divergence(
        position=position, baseline_token=b_token, candidate_token=c_token,
        baseline_logprob=b.logprob if b is not None else None, candidate_logprob=c.logprob if c is not None else None,
        baseline_rank=_rank(c_token, b.top) if b is not None else None,
        candidate_rank=_rank(b_token, c.top) if c is not None else None,
        baseline_gap=b_gap, candidate_gap=c_gap, tied=tied, shift=shift,
    )


def _span(step: TokenStep) -> float:
    """A side's logprob of its own token minus the lowest it lists (what a token outside its
    top-k is at least below it by)."""
    finite = [v for v in step.top.values() if math.isfinite(v)]
    return step.logprob - min(finite) if finite else math.inf


def jitter(first: Answer, second: Answer) -> tuple[float, int | None]:
    """The largest logprob difference between two answers of one server to one request, over
    the positions where they agree (every top-k token both list), and the position where the
    server parted from itself (None: it did not); where it did, the two tokens' gap counts too
    (the server chose either, so its noise is at least that)."""
    largest = 0.0
    for i, (a, b) in enumerate(zip(first.steps, second.steps, strict=False)):
        values = [abs(a.logprob - b.logprob)] if a.token == b.token else []
        values += [abs(a.top[t] - b.top[t]) for t in a.top if t in b.top
                   and math.isfinite(a.top[t]) and math.isfinite(b.top[t])]
        finite = [v for v in values if math.isfinite(v)]
        largest = max([largest, *finite])
        if a.token != b.token:
            gaps = [g for g in (_gap(a, b.token), _gap(b, a.token)) if g is not None]
            return max([largest, *(abs(g) for g in gaps)]), i
    if len(first.steps) != len(second.steps):
        return largest, min(len(first.steps), len(second.steps))
    return largest, None


# --------------------------------------------------------------------------------------------
# Findings and rules
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingFindings:
    """What a serving diff established, in the terms the rules speak."""

    requests: int
    comparisons: tuple[RequestComparison, ...]
    noise: Mapping[str, float]
    floor: float
    logprob_tolerance: float
    kl_tolerance: float
    next_steps: tuple[Step, ...] = ()  # what a failing verdict offers (built by the run, which knows the models)

    @property
    def first_failing(self) -> RequestComparison | None:
        return next((c for c in self.comparisons if c.failed), None)

    @property
    def ties(self) -> tuple[RequestComparison, ...]:
        return tuple(c for c in self.comparisons if c.status == "tie")

    def saw(self) -> Mapping[str, Any]:
        failing = self.first_failing
        return {"requests": self.requests, "failing": sum(c.failed for c in self.comparisons),
                "tie_flips": len(self.ties), "request": failing.request if failing else None,
                "status": failing.status if failing else None,
                "noise_baseline": self.noise["baseline"], "noise_candidate": self.noise["candidate"]}


def _token_text(token: str | None) -> str:
    return "(it stopped)" if token is None else repr(token)


def _drift_text(comparison: RequestComparison) -> str:
    """How the distributions drifted over the positions compared (the prose of the why)."""
    n = len(comparison.drift)
    if n == 0:
        return "they part at the first token, so nothing before it is compared"
    worst_lp = comparison.worst(lambda d: abs(d.logprob_diff))
    worst_kl = comparison.worst(lambda d: d.kl_shared)
    assert worst_lp is not None and worst_kl is not None
    first_lp = abs(comparison.drift[0].logprob_diff)
    last_lp = abs(comparison.drift[-1].logprob_diff)
    tokens = "token" if n == 1 else f"{n} tokens"
    return (f"over the {tokens} before it the chosen token's logprob differed by up to {worst_lp.logprob_diff:+.3g} nats "
            f"(at token {worst_lp.position}; {first_lp:.3g} at the first, {last_lp:.3g} at the last), the KL "
            f"divergence on the shared top-k reached {worst_kl.kl_shared:.3g} nats (token {worst_kl.position}), "
            f"with at most {comparison.mass_outside_max:.2%} of the mass outside the shared support")


def _divergence_text(comparison: RequestComparison, findings: ServingFindings) -> str:
    d = comparison.divergence
    assert d is not None
    ranks = []
    if d.candidate_rank is not None:
        ranks.append(f"the baseline's token is #{d.candidate_rank} in the candidate's top-k")
    elif d.candidate_token is not None and d.baseline_token is not None:
        ranks.append("the baseline's token is not in the candidate's top-k")
    if d.baseline_rank is not None:
        ranks.append(f"the candidate's is #{d.baseline_rank} in the baseline's")
    elif d.candidate_token is not None and d.baseline_token is not None:
        ranks.append("the candidate's is not in the baseline's")
    gaps = ", ".join(_gap_text(side, g, findings.noise[side], side in d.tied)
                     for side, g in (("baseline", d.baseline_gap), ("candidate", d.candidate_gap)) if g is not None)
    text = (f"request {comparison.request} parts at token {d.position}: the baseline generated "
            f"{_token_text(d.baseline_token)}, the candidate {_token_text(d.candidate_token)}")
    if ranks:
        text += f" ({'; '.join(ranks)})"
    if gaps:
        text += f"; {gaps}"
    return text


def _gap_text(side: str, gap: float, noise: float, tied: bool) -> str:
    if tied and gap == 0:
        return f"the {side}'s two tokens are tied exactly (its noise {noise:.3g})"
    if tied:
        return f"the {side}'s two tokens are tied within its noise ({abs(gap):.3g} nats apart, its noise {noise:.3g})"
    return f"the {side} prefers its own by {gap:.3g} nats (its noise {noise:.3g})"


def _tie_text(d: Divergence, findings: ServingFindings) -> str:
    """What a tie flip means for the comparison: on both sides, noise; on one, that side's
    tie-break, and the other side's preference is how far the distributions moved there."""
    if len(d.tied) == 2:
        return "a tie flip on both sides: each server chose between equals, so the order is noise"
    [tied] = d.tied
    other = "candidate" if tied == "baseline" else "baseline"
    moved = "beyond" if d.moved > findings.logprob_tolerance else "within"
    return (f"a tie flip: only the {tied} was tied, so which token it generated there is its tie-break, not a "
            f"preference; the {other} preferred its own, so the preference between the two moved by {d.moved:.3g} "
            f"nats at that token ({moved} the logprob tolerance {findings.logprob_tolerance:g})")


def _passes(f: ServingFindings) -> Diagnosis | None:
    if f.first_failing is not None:
        return None
    compared = sum(len(c.drift) for c in f.comparisons)
    lp = max((c.logprob_diff_max for c in f.comparisons), default=0.0)
    kl = max((c.kl_max for c in f.comparisons), default=0.0)
    why = (f"all {f.requests} requests agree within the tolerances: {compared} tokens compared, the chosen token's "
           f"logprob at most {lp:.3g} nats apart (tolerance {f.logprob_tolerance:g}), the KL on the shared top-k at most "
           f"{kl:.3g} (tolerance {f.kl_tolerance:g})")
    if f.ties:
        parts = "; ".join(f"{c.request} at token {c.divergence.position} ({_tied_sides(c.divergence)})"
                          for c in f.ties if c.divergence)
        why += (f"; {len(f.ties)} part at a tie flip, where a server's two leading tokens are closer than its noise "
                f"({parts}), which is not a regression")
        if any(len(c.divergence.tied) == 1 for c in f.ties if c.divergence):
            why += (": where one side tied, its token there is its tie-break, and the other side's preference is how "
                    "far the two distributions moved at that token, within the logprob tolerance")
    return Diagnosis(Status.PASS, why)


def _tied_sides(d: Divergence) -> str:
    if len(d.tied) == 2:
        return "both sides tied"
    other = "candidate" if d.tied[0] == "baseline" else "baseline"
    return f"the {d.tied[0]} tied, the {other} preferring its own by {d.moved:.3g} nats"


def _drifted(f: ServingFindings) -> Diagnosis | None:
    c = f.first_failing
    if c is None or c.status != "drift":
        return None
    lp_tol, kl_tol = max(f.logprob_tolerance, 1e-12), max(f.kl_tolerance, 1e-12)
    worst = c.worst(lambda d: max(abs(d.logprob_diff) / lp_tol, d.kl_shared / kl_tol))
    d = c.divergence
    at_tie = d is not None and d.moved > f.logprob_tolerance and (
        worst is None or d.moved / lp_tol >= max(abs(worst.logprob_diff) / lp_tol, worst.kl_shared / kl_tol))
    if at_tie:
        assert d is not None
        why = (f"request {c.request}: the distributions moved past the tolerance where the outputs part: "
               f"{_divergence_text(c, f)}; {_tie_text(d, f)}; {_drift_text(c)}")
        where = {"request": c.request, "position": d.position,
                 "baseline_token": d.baseline_token, "candidate_token": d.candidate_token}
        return Diagnosis(Status.FAIL, why, f.next_steps, where)
    assert worst is not None
    why = (f"request {c.request}: the distributions drift past the tolerances: at token "
           f"{worst.position} ({worst.token!r}) the chosen token's logprob differs by {worst.logprob_diff:+.3g} nats "
           f"(tolerance {f.logprob_tolerance:g}) and the KL on the shared top-k is {worst.kl_shared:.3g} "
           f"(tolerance {f.kl_tolerance:g}); {_drift_text(c)}")
    if d is not None:
        why += f"; then {_divergence_text(c, f)}, {_tie_text(d, f)}"
    return Diagnosis(Status.FAIL, why, f.next_steps, {"request": c.request, "position": worst.position})


def _diverged(f: ServingFindings) -> Diagnosis | None:
    c = f.first_failing
    if c is None or c.status != "diverged" or c.divergence is None:
        return None
    d = c.divergence
    why = (f"{_divergence_text(c, f)}, so the greedy outputs part for more than noise; {_drift_text(c)}")
    where = {"request": c.request, "position": d.position,
             "baseline_token": d.baseline_token, "candidate_token": d.candidate_token}
    return Diagnosis(Status.FAIL, why, f.next_steps, where)


MODULE_DIFF_REQUESTS = "module-diff-requests.jsonl"


def next_steps(config: Any, ctx: ProbeContext, request: ServingRequest, position: int,
               served: Mapping[str, ServedBy], ids: tuple[list[int], list[int]] | None) -> tuple[Step, ...]:
    """What a failing serving diff offers: the module-level diff of the two models in-process on
    the failing request's tokens, a ``diff`` command (the tokens written among the artifacts as
    a requests file for it). The models: ``baseline_model`` / ``candidate_model`` (factories the
    user names), else the local Hugging Face folder each server serves (:mod:`glmfb.diff.served`),
    loaded with transformers in the format that server ran (:mod:`glmfb.diff.hf`). The tokens:
    the prompt's ids and the ones the baseline generated before ``position``, as the baseline
    server gave them (``ids``: vLLM's ``/tokenize`` and token-id answers), or a request's own
    ids. Else what that takes, in words. (Both servers' answers are kept already.)"""
    from glmfb.diff.hf import FACTORY

    baseline, candidate = getattr(config, "baseline_model", None), getattr(config, "candidate_model", None)
    args = {"baseline": dict(config.baseline_args), "candidate": dict(config.candidate_args)}
    formats = ""
    if not baseline or not candidate:
        folders = {side: served[side] for side in SIDES if side in served and served[side].folder}
        if len(folders) < 2:
            return (Step(f"load both models in-process and run the module-level diff (glmfb diff on two torch "
                         f"factories) on request {request.id}, to find the module where the error starts; give "
                         "baseline_model and candidate_model (the factories the servers serve) and the verdict offers "
                         "that diff as a command (a server that serves a local Hugging Face folder, as vLLM's --model "
                         "DIR does, is loaded from it without them)"),)
        baseline = candidate = FACTORY
        args = {side: {"path": folders[side].folder, "dtype": folders[side].dtype or "float32"} for side in SIDES}
        formats = "; ".join(f"the {side} from {m.folder} in {m.dtype or 'float32'} ({m.dtype_source or 'format not seen: float32 assumed'})"
                            for side, m in folders.items())
    if ids is not None:
        tokens, source = [*ids[0], *ids[1]], (f"its {len(ids[0])} prompt tokens and the {len(ids[1])} the baseline "
                                              "generated before it, as the baseline server tokenized them")
    elif not isinstance(request.prompt, str):
        tokens, source = list(request.prompt), f"its {len(request.prompt)} prompt tokens"
    else:
        return (Step(f"request {request.id} gives a text prompt, and the baseline server did not give its token ids "
                     f"(vLLM's /tokenize and return_tokens_as_token_ids): tokenize it as the servers do, write the ids "
                     f"as a request's input_ids, and run glmfb diff {baseline} {candidate} --requests FILE"),)
    from glmfb.core.commandline import rerun_step
    from glmfb.core.io import write_text_atomic
    from glmfb.diff.config import DiffConfig

    path = ctx.artifact(MODULE_DIFF_REQUESTS)
    write_text_atomic(path, json.dumps({"id": request.id, "input_ids": tokens}) + "\n")
    module_diff = DiffConfig(name=f"{config.name}-modules", baseline=baseline, candidate=candidate,
                             baseline_args=args["baseline"], candidate_args=args["candidate"],
                             base_dir=config.base_dir, requests=path)
    why = (f"run the module-level diff of the two models in-process on request {request.id} ({source}, up to token "
           f"{position} where the outputs part), to find the module where the error starts")
    if formats:
        why += f": {formats}"
    return (rerun_step("diff", module_diff, why, name=module_diff.name, intent=Intent.DEEPER),)


SERVING_RULES: tuple[Rule[ServingFindings], ...] = (
    Rule("serving-agree", "diff", _passes, "every request within the tolerances (tie flips allowed)"),
    Rule("serving-divergence", "diff", _diverged, "the greedy outputs part, not at a tie"),
    Rule("serving-drift", "diff", _drifted, "the distributions drift past a tolerance; the outputs do not part, "
         "or part at a tie flip"),
)


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServingOptions:
    """What a serving diff takes from the diff's config."""

    top_logprobs: int = 5
    max_tokens: int = 16
    logprob_tolerance: float = 0.1
    kl_tolerance: float = 0.01
    noise_floor: float = 1e-3
    timeout_s: float = 30.0
    retries: int = 2
    concurrency: int = 4
    baseline_batch: int | None = None
    candidate_batch: int | None = None

    @classmethod
    def of(cls, config: Any) -> ServingOptions:
        names = ("top_logprobs", "max_tokens", "logprob_tolerance", "kl_tolerance", "noise_floor", "retries",
                 "concurrency")
        values = {name: getattr(config, name) for name in names}
        return cls(timeout_s=config.http_timeout_s, baseline_batch=getattr(config, "baseline_batch", None),
                   candidate_batch=getattr(config, "candidate_batch", None), **values)

    def batch(self, side: str) -> int | None:
        """The batch ``side`` is asked in: None without a batch option (``concurrency`` requests
        at once, the two servers at once); with one, that side's (1, alone, where it has none)."""
        if self.baseline_batch is None and self.candidate_batch is None:
            return None
        return int(getattr(self, f"{side}_batch") or 1)


@dataclass
class _Timing:
    wall_s: float = 0.0
    cpu_s: float = 0.0
    calls: dict[str, int] = field(default_factory=dict)


SERVING_CAPTURE = "serving-capture.json"
CAPTURE_SCHEMA = "glmfb.serving-capture/1"


def is_serving_capture(ref: str | Path) -> bool:
    """A folder written by ``glmfb capture openai:...`` (it holds ``serving-capture.json``)."""
    return (Path(ref) / SERVING_CAPTURE).is_file()


@dataclass(frozen=True)
class SavedAnswers:
    """What a server answered, read from a capture folder: its endpoint, the top-k it was asked
    for, every request's answer, and the repeats made at capture time (its noise)."""

    endpoint: str
    top_logprobs: int
    answers: Mapping[str, Answer]
    repeats: Mapping[str, Answer]

    @classmethod
    def read(cls, folder: Path) -> SavedAnswers:
        import json

        from glmfb.contract.errors import InputError

        path = folder / SERVING_CAPTURE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("schema") != CAPTURE_SCHEMA:
                raise InputError(f"{path}: not a {CAPTURE_SCHEMA} document (schema {data.get('schema')!r})")
            answers = {a["request"]: Answer.from_dict(a) for a in data["answers"]}
            repeats = {a["request"]: Answer.from_dict(a) for a in data.get("repeats", [])}
            return cls(str(data["endpoint"]), int(data["top_logprobs"]), answers, repeats)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(f"{path}: cannot read the saved answers: {type(exc).__name__}: {exc}") from None


def capture_endpoint(config: Any, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """``glmfb capture openai:...``: every request asked of the server once, the first asked again
    (its noise), stored in ``config.out/serving-capture.json`` (the folder written aside and
    renamed into place)."""
    import os
    import shutil

    from glmfb.contract.errors import InputError
    from glmfb.core.io import write_json_atomic

    if config.requests is None:
        raise UsageError("glmfb capture needs --requests FILE")
    out = Path(config.out)
    if (out.exists() or out.is_symlink()) and not config.force:
        raise InputError(f"{out} already exists", "give a new --out folder, or --force to replace it whole")
    if out.exists() and not is_serving_capture(out) and any(out.iterdir()):
        raise InputError(f"{out} exists and is not a serving capture; glmfb will not replace it", "give a new --out")
    requests = read_serving_requests(config.requests, config.max_tokens)
    endpoint = parse_endpoint(config.target)
    settings = ClientSettings(timeout_s=config.http_timeout_s, retries=config.retries,
                              concurrency=config.concurrency, top_logprobs=config.top_logprobs)
    with EndpointClient(endpoint, settings) as client:
        answers = ask_all(client, "target", requests, progress)
        repeats = ask_all(client, "target", requests[:1], progress, "repeats")
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    partial.mkdir(parents=True, exist_ok=True)
    try:
        write_json_atomic(partial / SERVING_CAPTURE, {
            "schema": CAPTURE_SCHEMA, "endpoint": endpoint.ref, "top_logprobs": config.top_logprobs,
            "requests": [r.to_dict() for r in requests], "answers": [a.to_dict() for a in answers.values()],
            "repeats": [a.to_dict() for a in repeats.values()]})
        if out.exists():
            shutil.rmtree(out)
        os.replace(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return {"requests": len(answers), "tensors": 0}


def _saved_side(saved: SavedAnswers, side: str, folder: str, requests: Sequence[ServingRequest]) -> None:
    from glmfb.contract.errors import InputError

    missing = [r.id for r in requests if r.id not in saved.answers]
    if missing:
        raise InputError(f"the {side}'s saved answers ({folder}) have no answer to request {missing[0]!r}",
                         "capture the server again with this requests file")


def run_serving_diff(config: Any, ctx: ProbeContext) -> Verdict:
    """The verdict of two serving endpoints over ``config.requests``; a server that cannot be
    reached or answers with an error raises :class:`~glmfb.contract.errors.TargetFailed` naming it (the
    host makes it an error verdict). A side with a server command (``baseline_server``) is
    served by a server started here first (:mod:`glmfb.diff.servers`) and stopped at the end;
    one that does not come up is an error verdict naming the side, the command and its output."""
    if config.requests is None:
        raise UsageError("a serving endpoint side needs --requests FILE")
    refs = {"baseline": config.baseline, "candidate": config.candidate}
    commands = {side: tuple(getattr(config, f"{side}_server", ()) or ()) for side in SIDES}
    commands = {side: command for side, command in commands.items() if command}
    logs = {side: ctx.artifact(f"{side}-server.log") for side in commands}
    log_artifacts = {f"{side}_server_log": str(path) for side, path in logs.items()}
    try:
        with started_servers(commands, refs, logs, config.base_dir, config.server_startup_s, ctx.progress) as servers:
            live = {**refs, **{side: server.endpoint for side, server in servers.items()}}
            try:
                verdict = _serving_verdict(config, ctx, live)
            except TargetFailed as failure:
                return _side_failed(config, failure, servers, log_artifacts)
    except ServerStartFailed as failed:
        return _server_failed(config, failed, log_artifacts)
    return dataclasses.replace(verdict, artifacts={**verdict.artifacts, **log_artifacts})


def _side_failed(config: Any, failure: TargetFailed, servers: Mapping[str, StartedServer],
                 log_artifacts: Mapping[str, str]) -> Verdict:
    """A server that failed mid-run (the host's error verdict for it); where glmfb started that
    server and it has exited, the why says so, with the tail of its log."""
    from glmfb.core.host import target_failed_verdict
    from glmfb.core.process import describe_returncode

    verdict = target_failed_verdict("diff", config.name, failure)
    side = failure.side.removesuffix(" server")
    server = servers.get(side)
    if server is not None:
        try:
            code: int | None = server.process.wait(timeout=1.0)  # a server that is going down: let it end
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            tail = server.tail()
            verdict = dataclasses.replace(verdict, why=f"{verdict.why}; the {side}'s server had {describe_returncode(code)}"
                                                      + (f", its last output: {tail!r}" if tail else ""))
    return dataclasses.replace(verdict, artifacts={**verdict.artifacts, **log_artifacts})


def _server_failed(config: Any, failed: ServerStartFailed, log_artifacts: Mapping[str, str]) -> Verdict:
    """The error verdict of a server glmfb started that did not come up."""
    import shlex

    from glmfb.contract.evidence import ProcessExit, TargetError
    from glmfb.core.process import describe_returncode

    evidence = [TargetError(side=failed.side, stage="while starting its server", error=failed.problem),
                ProcessExit(returncode=failed.returncode,
                            description=describe_returncode(failed.returncode) if failed.returncode is not None else None,
                            stdout_tail=failed.tail or None, stdout=str(failed.log))]
    verdict = Verdict.harness_error(
        "diff", config.name, str(failed), evidence=evidence,
        next=(Step(f"read {failed.log}, and run the {failed.side}'s server command alone to see it start: "
                   f"{shlex.join(failed.command)}"),))
    return dataclasses.replace(verdict, artifacts=dict(log_artifacts))


def _serving_verdict(config: Any, ctx: ProbeContext, refs: Mapping[str, str]) -> Verdict:
    """The serving diff of ``refs`` (each side a server, its port filled in, or a saved capture)."""
    options = ServingOptions.of(config)
    requests = read_serving_requests(config.requests, options.max_tokens)
    saved = {side: SavedAnswers.read(Path(ref)) for side, ref in refs.items() if not is_endpoint(ref)}
    for side, answers_saved in saved.items():
        _saved_side(answers_saved, side, refs[side], requests)
    endpoints = {side: parse_endpoint(saved[side].endpoint if side in saved else ref) for side, ref in refs.items()}
    settings = ClientSettings(timeout_s=options.timeout_s, retries=options.retries, concurrency=options.concurrency,
                              top_logprobs=options.top_logprobs)
    timing = _Timing()
    started, cpu_started = time.perf_counter(), time.process_time()
    answers: dict[str, dict[str, Answer]] = {}
    repeats: dict[str, dict[str, Answer]] = {}
    batches = {side: options.batch(side) for side in SIDES}
    companions = {side: Companions() for side in SIDES}
    with ExitStack() as stack:
        clients = {side: stack.enter_context(EndpointClient(endpoints[side], dataclasses.replace(
                       settings, concurrency=batches[side] or options.concurrency)))
                   for side in SIDES if side not in saved}
        for side in saved:
            answers[side] = {r.id: saved[side].answers[r.id] for r in requests}
            repeats[side] = dict(saved[side].repeats)
        answers.update(_ask(clients, requests, requests, batches, companions, ctx.progress))
        parted = [r for r in requests if answers["baseline"][r.id].tokens != answers["candidate"][r.id].tokens]
        again = [requests[0], *[r for r in parted if r.id != requests[0].id]]
        repeats.update(_ask(clients, again, requests, batches, companions, ctx.progress, "repeats"))
    timing.wall_s = time.perf_counter() - started
    noise, noise_evidence = _noise(answers, repeats, endpoints, options.noise_floor)
    comparisons = tuple(compare_answers(answers["baseline"][r.id], answers["candidate"][r.id], noise,
                                        options.logprob_tolerance, options.kl_tolerance) for r in requests)
    timing.cpu_s = time.process_time() - cpu_started
    timing.wall_s = time.perf_counter() - started
    findings = ServingFindings(len(requests), comparisons, noise, options.noise_floor, options.logprob_tolerance,
                               options.kl_tolerance)
    served = _served(endpoints, settings, saved)
    if findings.first_failing is not None:
        findings = dataclasses.replace(findings, next_steps=_module_steps(config, ctx, findings.first_failing, requests,
                                                                          endpoints, settings, saved, served))
    outcome = diagnose(SERVING_RULES, findings)
    evidence: list[Evidence] = [_requests_evidence(comparisons)]
    failing = findings.first_failing or next((c for c in comparisons if c.divergence is not None), None)
    if failing is not None:
        evidence.append(_drift_evidence(failing))
        if failing.divergence is not None:
            evidence.append(_divergence_evidence(failing))
    evidence += noise_evidence
    evidence.append(dataclasses.replace(_throughput_evidence(requests, answers, repeats, timing),
                                        companion_calls=sum(c.sent for c in companions.values())))
    evidence += [SideRun(side=side, target=refs[side] if side in saved else endpoints[side].ref,
                         batch=None if side in saved else batches[side], companions=companions[side].sent,
                         companions_ended_early=companions[side].ended_early) for side in SIDES]
    evidence += served.values()
    evidence.append(outcome.record)
    artifacts = _write_answers(config, ctx, answers, repeats, findings)
    if any(step.command == "diff" for step in findings.next_steps):
        artifacts["module_diff_requests"] = str(ctx.artifact(MODULE_DIFF_REQUESTS))
    worst_lp = max((c.logprob_diff_max for c in comparisons), default=0.0)
    regime = _regime_text(batches, companions, saved)
    return Verdict(
        probe="diff", name=config.name, status=outcome.diagnosis.status, layer=Layer.NUMERICS,
        why=f"{regime}; {outcome.diagnosis.why}" if regime else outcome.diagnosis.why,
        where=dict(outcome.diagnosis.where or {}),
        metric=Metric("logprob_diff_max", worst_lp, "nats", options.logprob_tolerance),
        evidence=tuple(evidence), next=outcome.diagnosis.next, artifacts=artifacts,
    )


def _served(endpoints: Mapping[str, Any], settings: ClientSettings, saved: Mapping[str, Any]) -> dict[str, ServedBy]:
    """What each live side's server serves (saved sides: none; they were asked before)."""
    served = {}
    for side in SIDES:
        if side not in saved:
            with EndpointClient(endpoints[side], settings) as client:
                served[side] = client.describe(side)
    return served


def _module_steps(config: Any, ctx: ProbeContext, failing: RequestComparison, requests: Sequence[ServingRequest],
                  endpoints: Mapping[str, Any], settings: ClientSettings, saved: Mapping[str, Any],
                  served: Mapping[str, ServedBy]) -> tuple[Step, ...]:
    """The failing request's module-level step, with the baseline server's own token ids of it
    up to where the outputs part (where that server gives them)."""
    request = next(r for r in requests if r.id == failing.request)
    position = failing.divergence.position if failing.divergence is not None else failing.baseline_tokens
    ids = None
    if "baseline" not in saved:
        with EndpointClient(endpoints["baseline"], settings) as client:
            ids = client.token_ids(request, position)
    return next_steps(config, ctx, request, position, served, ids)


def _ask(clients: Mapping[str, EndpointClient], requests: Sequence[ServingRequest], pool: Sequence[ServingRequest],
         batches: Mapping[str, int | None], companions: Mapping[str, Companions],
         progress: Callable[[str], None] | None, what: str = "requests") -> dict[str, dict[str, Answer]]:
    """Every live side's answers to ``requests``. Without a batch option, the two servers at
    once, each ``concurrency`` requests at a time; with one, the sides one after the other (one
    server may serve both, and one side's companions must not be in flight beside the other's
    requests), each request alone or among its side's companions drawn from ``pool``
    (:func:`~glmfb.diff.endpoint.ask_batched`)."""
    if all(batch is None for batch in batches.values()):
        return _both(clients, lambda side: ask_all(clients[side], side, requests, progress, what))
    return {side: ask_batched(clients[side], side, requests, batches[side] or 1, pool, companions[side], progress, what)
            for side in SIDES if side in clients}


def _regime_text(batches: Mapping[str, int | None], companions: Mapping[str, Companions],
                 saved: Mapping[str, Any]) -> str | None:
    """How each side was asked, where a batch option was given (the why names it once): "the
    baseline asked each request alone, the candidate asked each request among 7 others"."""
    if all(batch is None for batch in batches.values()):
        return None

    def regime(side: str) -> str:
        if side in saved:
            return "gave its saved answers"
        batch = batches[side] or 1
        text = "asked each request alone" if batch == 1 else f"asked each request among {batch - 1} others"
        c = companions[side]
        if c.ended_early:
            text += (f" ({c.ended_early} of its {c.sent} companion requests ended before the request they "
                     "accompanied)")
        return text

    said = {side: regime(side) for side in SIDES}
    if said["baseline"] == said["candidate"]:
        return f"both sides {said['baseline']}"
    return f"the baseline {said['baseline']}, the candidate {said['candidate']}"


def _both(clients: Mapping[str, EndpointClient],
          ask: Callable[[str], dict[str, Answer]]) -> dict[str, dict[str, Answer]]:
    """``ask(side)`` for every live side, the two servers at once; a side that fails raises its
    :class:`~glmfb.contract.errors.TargetFailed` (the baseline's first) once both have ended."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {side: pool.submit(ask, side) for side in SIDES if side in clients}
    return {side: future.result() for side, future in futures.items()}


def _noise(answers: Mapping[str, Mapping[str, Answer]], repeats: Mapping[str, Mapping[str, Answer]],
           endpoints: Mapping[str, Any], floor: float) -> tuple[dict[str, float], list[ServingNoise]]:
    noise: dict[str, float] = {}
    evidence: list[ServingNoise] = []
    for side in SIDES:
        largest, parted_at, parted_in = 0.0, None, None
        for rid, again in repeats[side].items():
            value, at = jitter(answers[side][rid], again)
            largest = max(largest, value)
            if at is not None and parted_in is None:
                parted_at, parted_in = at, rid
        noise[side] = max(largest, floor)
        evidence.append(ServingNoise(side=side, server=endpoints[side].ref, repeated=tuple(repeats[side]),
                                     jitter=largest, floor=floor, noise=noise[side],
                                     self_divergent_request=parted_in, self_divergent_position=parted_at))
    return noise, evidence


def _requests_evidence(comparisons: Sequence[RequestComparison]) -> ServingRequests:
    rows = []
    for c in comparisons:
        d = c.divergence
        rows.append(ServingRequestRow(
            request=c.request, status=c.status, baseline_tokens=c.baseline_tokens, candidate_tokens=c.candidate_tokens,
            compared=len(c.drift), first_divergent=d.position if d else None,
            baseline_token=d.baseline_token if d else None, candidate_token=d.candidate_token if d else None,
            logprob_diff_max=c.logprob_diff_max, kl_max=c.kl_max, mass_outside_max=c.mass_outside_max,
            top1_agreement=(sum(p.top1_agree for p in c.drift) / len(c.drift)) if c.drift else 1.0,
        ))
    return ServingRequests(rows=tuple(rows))


def _drift_evidence(c: RequestComparison) -> ServingDrift:
    rows = tuple(ServingDriftRow(position=d.position, token=d.token, logprob_diff=d.logprob_diff,
                                 kl_shared=d.kl_shared, mass_outside=d.mass_outside, top1_agree=d.top1_agree)
                 for d in c.drift[:DRIFT_ROWS])
    return ServingDrift(request=c.request, positions=len(c.drift), rows=rows)


def _divergence_evidence(c: RequestComparison) -> ServingDivergence:
    d = c.divergence
    assert d is not None
    return ServingDivergence(
        request=c.request, position=d.position, baseline_token=d.baseline_token, candidate_token=d.candidate_token,
        baseline_logprob=d.baseline_logprob, candidate_logprob=d.candidate_logprob,
        baseline_token_rank_in_candidate=d.candidate_rank, candidate_token_rank_in_baseline=d.baseline_rank,
        baseline_gap=d.baseline_gap, candidate_gap=d.candidate_gap, tie_flip=d.tie_flip, tied=d.tied,
        preference_moved=d.shift,
    )


def _throughput_evidence(requests: Sequence[ServingRequest], answers: Mapping[str, Mapping[str, Answer]],
                         repeats: Mapping[str, Mapping[str, Answer]], timing: _Timing) -> ServingThroughput:
    calls = sum(len(answers[s]) + len(repeats[s]) for s in SIDES)
    tokens = sum(len(a.steps) for s in SIDES for a in (*answers[s].values(), *repeats[s].values()))
    server_s = {s: sum(a.seconds for a in (*answers[s].values(), *repeats[s].values())) for s in SIDES}
    per_token = {s: tuple(round(a.seconds / len(a.steps), 6) for a in (*answers[s].values(), *repeats[s].values())
                          if a.steps and a.seconds > 0) for s in SIDES}
    return ServingThroughput(
        requests=len(requests), calls=calls, tokens=tokens, wall_s=timing.wall_s,
        requests_per_s=calls / timing.wall_s if timing.wall_s > 0 else 0.0,
        glmfb_cpu_s=timing.cpu_s, glmfb_share=timing.cpu_s / timing.wall_s if timing.wall_s > 0 else 0.0,
        baseline_call_s=server_s["baseline"], candidate_call_s=server_s["candidate"],
        baseline_token_s=per_token["baseline"], candidate_token_s=per_token["candidate"],
    )


def _write_answers(config: Any, ctx: ProbeContext, answers: Mapping[str, Mapping[str, Answer]],
                   repeats: Mapping[str, Mapping[str, Answer]], findings: ServingFindings) -> dict[str, str]:
    """Both servers' answers (``serving-answers.json``): for a failing diff, or with
    ``--keep-captures``."""
    if not (config.keep_captures or findings.first_failing is not None):
        return {}
    from glmfb.core.io import write_json_atomic

    path = ctx.artifact("serving-answers.json")
    write_json_atomic(path, {side: {"answers": [a.to_dict() for a in answers[side].values()],
                                    "repeats": [a.to_dict() for a in repeats[side].values()]} for side in SIDES})
    return {"serving_answers": str(path)}


__all__ = ["SERVING_CAPTURE", "SERVING_RULES", "RequestComparison", "SavedAnswers", "ServingFindings", "capture_endpoint",
           "compare_answers", "is_serving_capture", "jitter", "run_serving_diff", "shared_kl"]
