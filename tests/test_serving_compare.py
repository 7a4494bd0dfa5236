"""The serving diff's comparison on answers written here (no server): the KL on the shared top-k,
the tie-flip rule, a server's jitter, and what a request file for servers may hold."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from glmfb.contract.errors import InputError, UsageError
from glmfb.contract.verdict import Status
from glmfb.core.rules import diagnose
from glmfb.diff.endpoint import Answer, TokenStep, parse_endpoint, read_serving_requests
from glmfb.diff.serving import (
    SERVING_RULES,
    RequestComparison,
    ServingFindings,
    compare_answers,
    jitter,
    shared_kl,
)


def _answer(*steps: tuple[str, float, dict[str, float]]) -> Answer:
    return Answer("r", tuple(TokenStep(t, lp, top) for t, lp, top in steps))


def test_shared_kl_is_zero_on_equal_distributions_and_bounds_the_mass_outside() -> None:
    top = {"a": -0.5, "b": -1.5, "c": -3.0}
    kl, outside = shared_kl(top, top)
    assert kl == pytest.approx(0.0, abs=1e-12) and outside == pytest.approx(1 - sum(math.exp(v) for v in top.values()))
    kl, outside = shared_kl(top, {"a": -0.4, "b": -1.7, "d": -2.0})
    shared = min(math.exp(-0.5) + math.exp(-1.5), math.exp(-0.4) + math.exp(-1.7))
    assert kl > 0 and outside == pytest.approx(1 - shared)


def test_a_flip_within_noise_is_a_tie_and_beyond_it_a_divergence() -> None:
    base = _answer(("x", -0.1, {"x": -0.1, "y": -3.0}), ("a", -0.6930, {"a": -0.6930, "b": -0.6935}))
    cand = _answer(("x", -0.1, {"x": -0.1, "y": -3.0}), ("b", -0.6930, {"b": -0.6930, "a": -0.6934}))
    tie = compare_answers(base, cand, {"baseline": 1e-3, "candidate": 1e-3}, 0.1, 0.01)
    assert tie.status == "tie" and tie.divergence is not None and tie.divergence.position == 1
    regression = compare_answers(base, cand, {"baseline": 1e-4, "candidate": 1e-4}, 0.1, 0.01)
    assert regression.status == "diverged" and regression.failed
    assert regression.divergence is not None and regression.divergence.candidate_rank == 2
    untied = _answer(("x", -0.1, {"x": -0.1, "y": -3.0}), ("a", -0.6, {"a": -0.6, "b": -0.9}))
    far = _answer(("x", -0.1, {"x": -0.1, "y": -3.0}), ("b", -0.6, {"b": -0.6, "a": -0.9}))
    assert compare_answers(untied, far, {"baseline": 1e-3, "candidate": 1e-3}, 1.0, 1.0).status == "diverged"


def _findings(*comparisons: RequestComparison, noise: float = 1e-3, tolerance: float = 0.1) -> ServingFindings:
    return ServingFindings(len(comparisons), comparisons, {"baseline": noise, "candidate": noise}, noise, tolerance,
                           0.01)


def test_a_tie_on_one_side_is_a_tie_flip_and_the_others_preference_is_how_far_it_moved() -> None:
    """A bfloat16 candidate's two leading tokens tied exactly, a float32 baseline preferring its
    own by 0.0063 nats: the candidate chose by tie-break. Within the logprob tolerance that is a
    tie flip (pass), the why saying which side tied; the same tie with the baseline preferring
    its own by 0.3 nats has moved the distribution past the tolerance at that token: drift."""
    base = _answer(("x", -0.1, {"x": -0.1, "y": -3.0}), ("a", -2.3, {"a": -2.3, "b": -2.3063}))
    cand = _answer(("x", -0.1, {"x": -0.1, "y": -3.0}), ("b", -2.3, {"b": -2.3, "a": -2.3}))
    near = compare_answers(base, cand, {"baseline": 1e-3, "candidate": 1e-3}, 0.1, 0.01)
    assert near.status == "tie" and not near.failed and near.divergence is not None
    assert near.divergence.tied == ("candidate",) and near.divergence.moved == pytest.approx(0.0063)
    verdict = diagnose(SERVING_RULES, _findings(near)).diagnosis
    assert verdict.status is Status.PASS, verdict.why
    assert "r at token 1 (the candidate tied, the baseline preferring its own by 0.0063 nats)" in verdict.why
    assert "its token there is its tie-break" in verdict.why

    far_base = _answer(("x", -0.1, {"x": -0.1, "y": -3.0}), ("a", -2.3, {"a": -2.3, "b": -2.6}))
    far = compare_answers(far_base, cand, {"baseline": 1e-3, "candidate": 1e-3}, 0.1, 0.01)
    assert far.status == "drift" and far.failed
    verdict = diagnose(SERVING_RULES, _findings(far)).diagnosis
    assert verdict.status is Status.FAIL and verdict.where == {
        "request": "r", "position": 1, "baseline_token": "a", "candidate_token": "b"}, verdict.where
    assert "the candidate's two tokens are tied exactly" in verdict.why
    assert "only the candidate was tied" in verdict.why and "moved by 0.3 nats" in verdict.why
    assert "beyond the logprob tolerance 0.1" in verdict.why


def test_a_tie_at_the_first_token_fails_on_how_far_it_moved() -> None:
    """Nothing before it to compare: the drift rule still answers, at the divergence."""
    base = _answer(("a", -2.3, {"a": -2.3, "b": -2.9}))
    cand = _answer(("b", -2.3, {"b": -2.3, "a": -2.3}))
    comparison = compare_answers(base, cand, {"baseline": 1e-3, "candidate": 1e-3}, 0.1, 0.01)
    verdict = diagnose(SERVING_RULES, _findings(comparison)).diagnosis
    assert verdict.status is Status.FAIL and verdict.where["position"] == 0, verdict.why
    assert "they part at the first token" in verdict.why


def test_a_tie_on_both_sides_is_noise_whatever_the_tolerance() -> None:
    base = _answer(("a", -0.69, {"a": -0.69, "b": -0.6905}))
    cand = _answer(("b", -0.69, {"b": -0.69, "a": -0.6908}))
    comparison = compare_answers(base, cand, {"baseline": 1e-3, "candidate": 1e-3}, 1e-4, 0.01)
    assert comparison.status == "tie" and comparison.divergence is not None
    assert comparison.divergence.tied == ("baseline", "candidate") and comparison.divergence.moved == 0.0


def test_jitter_is_the_largest_difference_and_a_self_flip_counts_its_gap() -> None:
    first = _answer(("x", -0.1, {"x": -0.1, "y": -3.0}), ("a", -0.69, {"a": -0.69, "b": -0.70}))
    second = _answer(("x", -0.1002, {"x": -0.1002, "y": -3.0}), ("b", -0.69, {"b": -0.69, "a": -0.71}))
    value, position = jitter(first, second)
    assert position == 1 and value == pytest.approx(0.02)


def test_a_drift_past_the_tolerance_fails_before_any_divergence() -> None:
    base = _answer(("x", -0.1, {"x": -0.1, "y": -3.0}), ("a", -0.2, {"a": -0.2, "b": -2.0}))
    cand = _answer(("x", -0.1, {"x": -0.1, "y": -3.0}), ("a", -0.5, {"a": -0.5, "b": -1.1}))
    drift = compare_answers(base, cand, {"baseline": 1e-3, "candidate": 1e-3}, 0.1, 0.01)
    assert drift.status == "drift" and drift.divergence is None and drift.failed
    assert drift.logprob_diff_max == pytest.approx(0.3)


def test_a_side_that_stops_early_parts_there() -> None:
    base = _answer(("x", -0.1, {"x": -0.1}), ("a", -0.2, {"a": -0.2}))
    cand = _answer(("x", -0.1, {"x": -0.1}))
    comparison = compare_answers(base, cand, {"baseline": 1e-3, "candidate": 1e-3}, 0.1, 0.01)
    assert comparison.status == "diverged" and comparison.divergence is not None
    assert comparison.divergence.position == 1 and comparison.divergence.candidate_token is None


def test_endpoints_and_requests_for_servers(tmp_path: Path) -> None:
    assert parse_endpoint("openai:http://127.0.0.1:8000/v1/#tiny").base_url == "http://127.0.0.1:8000/v1"
    assert parse_endpoint("openai:http://127.0.0.1:8000/v1#tiny").model == "tiny"
    with pytest.raises(UsageError):
        parse_endpoint("openai:127.0.0.1:8000")
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "input_ids": [1, 2], "max_tokens": 3}\n')
    requests = read_serving_requests(path, 7)
    assert [(r.id, r.prompt, r.max_tokens) for r in requests] == [("a", "hi", 7), ("b", (1, 2), 3)]
    path.write_text('{"id": "a", "length": 4}\n')
    with pytest.raises(InputError, match="needs exactly one of prompt, input_ids"):
        read_serving_requests(path)
