"""A why that checks itself (issue 53): every kind of sentence a diff's why can say has a
precondition on the evidence, written once in :mod:`glmfb.diff.claims`: a position only where a
token axis was read, "not float16's range" only where the operations that made the NaN or Inf
were traced and none shows float16. Over generated findings, no rule says what its own
evidence contradicts; the check itself finds a why that does; and the acceptance scorer fails
a verdict that does."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from glmfb.core.rules import diagnose
from glmfb.diff.axes import FOLLOWS, SIZE, Segment
from glmfb.diff.claims import NOT_FLOAT16_RANGE, POSITION, contradicted
from glmfb.diff.optrace import TracedOp
from glmfb.diff.rounding import BiasTest, Float16Range
from glmfb.diff.rules import RULES, DiffFindings
from glmfb.diff.shape import ErrorShape, ZeroRegion, growth_fit, position_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import accuracy

STEP = position_profile([0.0] * 32 + [0.05] * 32, [0] * 32 + [64] * 32)  # a step at 32
GROWTH = position_profile([0.0] + [1e-3 * i for i in range(1, 64)], [0] + [64] * 63)
FLAT = position_profile([1e-3] * 64, [64] * 64)
ZEROS_AT = position_profile([0.0] * 128 + [8e-8] * 384, [0] * 128 + [0, 1, 0, 0] * 96)
assert STEP is not None and STEP.step and GROWTH is not None and ZEROS_AT is not None and ZEROS_AT.zeros is not None
GROWING = growth_fit([32, 64, 128, 256, 512], [1e-4, 1.6e-4, 2.6e-4, 4.2e-4, 6.8e-4], "requests")
BIASED = BiasTest("own error of m", explained=0.97, mean_scale=0.99, mean_shift=0.0, rows=64, row_width=64)

DTYPES = st.sampled_from(["float16", "float32", "bfloat16"])
OPS = st.builds(TracedOp, operation=st.sampled_from(["aten.bmm", "aten.exp", "aten.addmm"]),
                inputs=st.lists(DTYPES, max_size=3).map(tuple), output=DTYPES, site=st.none())
RANGES = st.builds(
    Float16Range, tap=st.just("m.o_proj"), module=st.sampled_from([None, "m"]),
    baseline_max_abs=st.floats(0, 1e6), beyond=st.integers(0, 100), elements=st.just(100),
    seen=st.lists(st.sampled_from(["its output is float16 in the candidate's capture",
                                   "aten.bmm takes float16 operands"]), max_size=2).map(tuple),
    looked_at=st.sampled_from(["its operations", "the dtype of its output in the candidate's capture"]),
    first_nonfinite=st.one_of(st.none(), OPS), traced=st.booleans(),
)
FINDINGS = st.builds(
    lambda **kw: DiffFindings(failed=True, requests=3, failing_requests=3, request="r64", first_divergent="m",
                              tap="m", dtype="float32", **kw),
    module=st.sampled_from([None, "m"]), local=st.sampled_from([None, True, False]),
    shape=st.sampled_from(list(ErrorShape)), position=st.one_of(st.none(), st.integers(0, 200)),
    profile=st.sampled_from([None, STEP, GROWTH, FLAT, ZEROS_AT]),
    onsets=st.lists(st.tuples(st.integers(16, 512), st.integers(0, 64)), max_size=3).map(tuple),
    zeros=st.sampled_from([None, ZeroRegion(ZEROS_AT.zeros)]),
    length_fit=st.sampled_from([None, GROWING]), bias=st.sampled_from([None, BIASED]),
    range=st.one_of(st.none(), RANGES),
    token_axis=st.one_of(st.none(), st.integers(0, 3)), token_axis_basis=st.sampled_from([None, FOLLOWS, SIZE]),
    sequence=st.one_of(st.none(), st.builds(Segment, st.integers(0, 3), st.just(20), st.just(150))),
)


def _said(findings: DiffFindings) -> tuple[str, list[str], dict[str, Any]]:
    outcome = diagnose(RULES, findings)
    return outcome.diagnosis.why, [step.why for step in outcome.diagnosis.next], dict(outcome.record.saw)


@settings(max_examples=300, deadline=None)
@given(FINDINGS)
def test_no_rule_says_what_its_own_evidence_contradicts(findings: DiffFindings) -> None:
    why, steps, saw = _said(findings)
    assert contradicted(why, steps, {}, saw) == [], why


def test_the_check_finds_a_why_its_evidence_contradicts() -> None:
    why = "Zero error up to position 31, large from position 32 on"
    assert contradicted(why, [], {}, {"token_axis": 2}) == []
    assert contradicted(why, [], {}, {}) == [POSITION]
    assert contradicted("", [], {"position": 32}, {"token_axis": None}) == [POSITION]
    denial = "glmfb saw no float16 in attn.o_proj (...), so it is not float16's range"
    made_by_float16 = {"float16_traced": True, "float16_seen": [],
                       "first_nonfinite": {"operation": "aten.bmm", "inputs": ["float16", "float16"], "output": "float16"}}
    assert contradicted(denial, [], {}, made_by_float16) == [NOT_FLOAT16_RANGE]
    assert contradicted(denial, [], {}, {**made_by_float16, "float16_traced": False,
                                         "first_nonfinite": {"inputs": ["float32"], "output": "float32"}}) == [NOT_FLOAT16_RANGE]
    assert contradicted(denial, [], {}, {**made_by_float16, "first_nonfinite": {"inputs": ["float32"],
                                                                                  "output": "float32"}}) == []


def test_the_rules_consult_the_preconditions() -> None:
    # the same step, with and without a token axis: a position is named only with one
    with_axis = DiffFindings(failed=True, requests=3, failing_requests=3, request="r64", module="m", local=True,
                             first_divergent="m", tap="m", position=32, profile=STEP, token_axis=2,
                             shape=ErrorShape.CONSTANT)
    why, _, _ = _said(with_axis)
    assert "a step at position 32" in why
    why, steps, _ = _said(replace(with_axis, token_axis=None))
    assert not POSITION.says.search("\n".join([why, *steps])), why
    # an operation that made the Inf in float16: float16 is never denied
    made = Float16Range("m.o_proj", "m", 1.5e5, 300, 4608, (), "its operations",
                        TracedOp("aten.bmm", ("float16", "float16"), "float16", None), traced=True)
    nonfinite = replace(with_axis, shape=ErrorShape.NON_FINITE, nonfinite_tap="m.o_proj", range=made)
    assert "not float16's range" not in _said(nonfinite)[0]
    no_float16 = replace(made, first_nonfinite=TracedOp("aten.exp", ("float32",), "float32", None))
    assert "so it is not float16's range" in _said(replace(nonfinite, range=no_float16))[0]


def test_the_acceptance_scorer_fails_a_verdict_its_evidence_contradicts() -> None:
    verdict = {"probe": "diff", "why": "a step at position 32", "next": [], "where": {"position": 32},
               "evidence": [{"kind": "diagnosis", "rule": "position-onset", "saw": {"position": 32}}]}
    assert accuracy.contradicted_claims(verdict) == [f"position said without {POSITION.requires}"]
    verdict["evidence"] = [{"kind": "diagnosis", "rule": "position-onset", "saw": {"position": 32, "token_axis": 2}}]
    assert accuracy.contradicted_claims(verdict) == []
    assert accuracy.contradicted_claims({**verdict, "probe": "gil"}) == []
