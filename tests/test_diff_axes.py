"""The token axis of a tap, found from the requests' lengths (issue 53): ``[B, T, ...]``,
``[B, H, T, D]``, ``[T, ...]`` and packed ``[total_tokens, H, D]`` alike; two axes that both
follow the length, or requests that all have one length, are said, never guessed silently. Then
a diff of a chunked retention whose kernel returns ``[B, H, T, D]`` names its position, as the
same kernel in ``[B, T, H, D]`` does, and a packed request's positions are read within its
sequence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import run

from glmfb.contract.errors import InputError
from glmfb.diff.axes import (
    AMBIGUOUS,
    FOLLOWS,
    NONE,
    SIZE,
    TokenAxes,
    check_offsets,
    find_token_axis,
    segment_of,
)
from glmfb.diff.config import DiffConfig
from glmfb.diff.metrics import PositionErrors
from glmfb.diff.requests import parse_request

ACCEPTANCE = Path(__file__).resolve().parent / "acceptance"


# ---- the finder --------------------------------------------------------------------------------


@pytest.mark.parametrize(("shapes", "axis"), [
    ([(1, 64, 32), (1, 96, 32), (1, 128, 32)], 1),  # [B, T, hidden]
    ([(2, 4, 64, 8), (2, 4, 96, 8), (2, 4, 128, 8)], 2),  # [B, H, T, D]: heads before the tokens
    ([(64, 32), (96, 32), (128, 32)], 0),  # [T, hidden]
    ([(64, 4, 8), (96, 4, 8), (128, 4, 8)], 0),  # packed [total_tokens, H, D]
    ([(2, 64, 4, 8), (2, 96, 4, 8), (2, 128, 4, 8)], 1),  # [B, T, H, D], batch 2
])
def test_the_axis_that_follows_the_length_is_the_token_axis(shapes: list[tuple[int, ...]], axis: int) -> None:
    found = find_token_axis("t", [(shape, shape[axis]) for shape in shapes])
    assert (found.axis, found.basis, found.candidates) == (axis, FOLLOWS, (axis,))
    assert found.lengths == (64, 96, 128) and found.requests == 3
    assert f"axis {axis} of t" in found.describe() and "follows the length of 3 requests (64, 96, 128)" in found.describe()


def test_a_dimension_the_size_of_one_request_does_not_follow_the_length() -> None:
    # head_dim 64 is the first request's length too: only the axis that follows every length is tokens
    found = find_token_axis("attn", [((1, 4, 64, 64), 64), ((1, 4, 96, 64), 96)])
    assert (found.axis, found.basis) == (2, FOLLOWS)
    # with the first request alone, axes 2 and 3 both have its length: not guessed
    alone = find_token_axis("attn", [((1, 4, 64, 64), 64)])
    assert (alone.axis, alone.basis, alone.candidates) == (None, AMBIGUOUS, (2, 3))
    assert "axes 2 and 3 both have size 64, the length of every one of 1 request, so neither is taken" in alone.describe()


def test_two_axes_that_both_follow_the_length_are_ambiguous() -> None:
    # attention scores [B, H, T, T]: query and key positions both follow the length
    found = find_token_axis("scores", [((1, 2, 64, 64), 64), ((1, 2, 96, 96), 96)])
    assert (found.axis, found.basis, found.candidates) == (None, AMBIGUOUS, (2, 3))
    assert found.describe() == ("no token axis read in scores [1, 2, 64, 64]: axes 2 and 3 both follow the length of "
                                "2 requests (64, 96), so neither is taken")


def test_requests_all_of_one_length_match_by_size_alone_and_say_so() -> None:
    found = find_token_axis("h", [((1, 4, 32, 8), 32), ((1, 4, 32, 8), 32)])
    assert (found.axis, found.basis, found.lengths) == (2, SIZE, (32,))
    assert "by its size alone: every one of 2 requests has length 32, so no axis could be seen to follow" in found.describe()
    tied = find_token_axis("h", [((1, 32, 32), 32), ((1, 32, 32), 32)])
    assert (tied.axis, tied.basis, tied.candidates) == (None, AMBIGUOUS, (1, 2))
    # the inputs' own sequence axis (token ids [1, L]) breaks a tie of sizes, and the evidence says so
    hinted = find_token_axis("h", [((1, 32, 32), 32)], hint=1)
    assert (hinted.axis, hinted.basis, hinted.hint) == (1, SIZE, 1)
    assert "axes 1 and 2 have that size, and axis 1 is taken as the axis along which the requests' inputs" in (
        hinted.describe())
    # but never a tie of two axes that both follow the length, nor a hint that is not a candidate
    scores = [((1, 64, 64), 64), ((1, 96, 96), 96)]
    assert find_token_axis("s", scores, hint=1).axis is None
    assert find_token_axis("h", [((1, 4, 32, 32), 32)], hint=1).axis is None


def test_no_axis_of_the_length_and_no_length_find_nothing() -> None:
    pooled = find_token_axis("pool", [((1, 32), 64), ((1, 32), 96)])
    assert (pooled.axis, pooled.basis) == (None, NONE)
    assert "no axis has the request's length in every one of 2 requests" in pooled.describe()
    unknown = find_token_axis("x", [((1, 64, 32), None)])
    assert (unknown.axis, unknown.basis) == (None, NONE) and "no length" in unknown.describe()
    # a tap whose rank changes between requests has no one axis
    assert find_token_axis("x", [((64, 32), 64), ((1, 96, 32), 96)]).axis is None


def test_token_axes_read_every_request_and_judge_an_unseen_tap_alone() -> None:
    axes = TokenAxes({"o": [((1, 4, 64, 8), 64), ((1, 4, 96, 8), 96)]})
    assert axes.of("o", (1, 4, 96, 8), 96).axis == 2
    assert axes.of("o", (1, 4, 96, 8), 96).shape == (1, 4, 96, 8)  # the shape in the request it is read in
    assert axes.of("unseen", (1, 64, 32), 64).basis == SIZE


# ---- packed requests ---------------------------------------------------------------------------


def test_a_packed_request_is_read_within_the_sequence_that_fails_first() -> None:
    outside = np.zeros(150, dtype=np.int64)
    outside[52:] = 1  # sequence 1 (tokens 20-149) fails from its own position 32
    errors = PositionErrors(0, outside * 0.1, outside * 0.1, outside)
    within = errors.in_sequence((0, 20, 150))
    assert within.segment is not None and (within.segment.index, within.segment.start) == (1, 20)
    assert len(within.rel_l2) == 130 and within.first_failing == 32
    assert errors.in_sequence(None) is errors  # not packed: the whole axis
    assert errors.in_sequence((0, 20, 100)) is errors  # offsets that do not split this axis
    assert segment_of((0, 20, 150), []).index == 1  # nothing fails: the longest


def test_offsets_must_split_the_request() -> None:
    assert check_offsets([0, 20, 150], 150) is None
    assert "start at 0" in (check_offsets([5, 150], 150) or "")
    assert "increase strictly" in (check_offsets([0, 20, 20, 150], 150) or "")
    assert "end at the request's length, 150" in (check_offsets([0, 20, 140], 150) or "")
    spec = {"q": {"shape": [150, 4, 8]}}
    request = parse_request({"id": "p", "tensors": spec, "sequence_axis": 0, "cu_seqlens": [0, 20, 150]}, "f:1")
    assert request.offsets == (0, 20, 150) and request.length == 150
    with pytest.raises(InputError, match="cu_seqlens must end at the request's length, 150"):
        parse_request({"id": "p", "tensors": spec, "sequence_axis": 0, "cu_seqlens": [0, 20, 140]}, "f:1")
    # the minimizer's shorter request keeps offsets that split it
    assert request.shrink(60).offsets == (0, 20, 60)
    assert request.shrink(10).offsets == (0, 10)


# ---- a diff names the position whatever the layout ---------------------------------------------


def _requests(folder: Path, lines: list[dict[str, object]]) -> Path:
    path = folder / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize(("layout", "shape"), [("bhtd", "1x4x96x8"), ("bthd", "1x96x4x8")])
def test_a_chunk_boundary_bug_is_placed_in_either_layout(tmp_path: Path, layout: str, shape: str) -> None:
    requests = _requests(tmp_path, [{"id": f"t{n}", "tensors": {"x": {"shape": [1, n, 32], "seed": n}},
                                     "sequence_axis": 1} for n in (64, 96)])
    target = f"{ACCEPTANCE / 'retention.py'}:retnet"
    config = DiffConfig("ret", target, target, requests=requests, baseline_args={"layout": layout},
                        candidate_args={"layout": layout, "query_decay": "i"}, minimize=False)
    verdict = run("diff", config, tmp_path)
    assert verdict.where == {"request": "t96", "module": "layers.0.retention.retention", "position": 32, "shape": shape}
    assert "a step at position 32" in verdict.why
    axis = next(e for e in verdict.evidence if e.kind == "token_axis")
    assert (axis.axis, axis.basis) == (2 if layout == "bhtd" else 1, FOLLOWS)  # type: ignore[attr-defined]


def test_a_packed_request_names_the_position_within_its_sequence(tmp_path: Path) -> None:
    lines = []
    for name, offsets in (("p72", [0, 24, 72]), ("p150", [0, 20, 150])):
        total = offsets[-1]
        lines.append({"id": name, "tensors": {t: {"shape": [total, 4, 8], "seed": s} for s, t in enumerate("qkv")},
                      "sequence_axis": 0, "cu_seqlens": offsets})
    target = f"{ACCEPTANCE / 'retention.py'}:packed_retention"
    config = DiffConfig("packed", target, target, requests=_requests(tmp_path, lines),
                        candidate_args={"query_decay": "i"}, minimize=False)
    verdict = run("diff", config, tmp_path)
    assert verdict.where["position"] == 32 and verdict.where["sequence"] == 1, verdict.why
    assert "its sequence 1 (its tokens 20 to 149" in verdict.why and "a step at position 32 of sequence 1" in verdict.why
