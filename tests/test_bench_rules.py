"""The rules of glmfb bench as tables: findings in, rule and diagnosis out (no timing).

The operator diffs are built from profiles written out by hand in the form torch.profiler
gives them (operator, calls and self time per kernel call, input shapes, strides and dtypes,
the operator it runs inside), through the same :func:`build_op_diff` the engine uses.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from glmfb.bench.config import BenchConfig
from glmfb.bench.evidence import OpDiff
from glmfb.bench.opdiff import (
    CallerStats,
    InputStats,
    OpStats,
    TensorMeta,
    build_op_diff,
    copy_facts,
)
from glmfb.bench.rules import RULES, BenchFindings, ShapeOutcome
from glmfb.contract.verdict import Status
from glmfb.core.commandline import rerun_step, shell_line
from glmfb.core.rules import diagnose
from glmfb.core.targets import Target

SIZES = {"float32": 4, "bfloat16": 2, "float64": 8, "bool": 1}


def t(dtype: str, *shape: int, strides: tuple[int, ...] | None = None) -> TensorMeta:
    """A tensor input; contiguous strides unless given."""
    if strides is None:
        strides, step = [], 1
        for size in reversed(shape):
            strides.insert(0, step)
            step *= size
    return TensorMeta(tuple(shape), tuple(strides), dtype, SIZES[dtype])


Call = tuple[str, InputStats, str | None]


def call(op: str, calls: float, self_us: float, *tensors: TensorMeta, args: str = "", inside: str | None = None) -> Call:
    """One operator on one set of inputs, per kernel call, as the profile records it."""
    written, source = copy_facts(f"aten::{op}", tensors)
    inputs = ", ".join(x.describe() for x in tensors) or "no tensor inputs"
    return (f"aten::{op}", InputStats(inputs, args, calls, self_us, tensors, written, source),
            f"aten::{inside}" if inside else None)


def side(*calls: Call) -> dict[str, OpStats]:
    """A profile: the calls grouped by operator, each operator's calls split by the operator
    they run inside, and the one it runs inside most named (as the profile reading does)."""
    grouped: dict[str, list[InputStats]] = {}
    callers: dict[str, dict[str | None, CallerStats]] = {}
    for name, stats, parent in calls:
        grouped.setdefault(name, []).append(stats)
        seen = callers.setdefault(name, {}).get(parent, CallerStats(parent, 0.0, 0.0))
        callers[name][parent] = CallerStats(parent, seen.calls_per_call + stats.calls_per_call,
                                            seen.self_us_per_call + stats.self_us_per_call)

    def most(name: str) -> str | None:
        return max(callers[name].values(), key=lambda c: c.calls_per_call).parent

    return {name: OpStats(name, sum(s.calls_per_call for s in entries), sum(s.self_us_per_call for s in entries),
                          tuple(entries), most(name), tuple(callers[name].values()))
            for name, entries in grouped.items()}


def diff(base: dict[str, OpStats], cand: dict[str, OpStats], slower: bool = True) -> OpDiff:
    return build_op_diff(base, cand, shape="8x8", profiled_calls=10, slower=slower)


CONFIG = BenchConfig("b", Target("kernels.py:fused"), Target("kernels.py:tiled"), shapes=((1, 8), (2, 8)))
REPRODUCE = rerun_step("bench", CONFIG, "reproduce on the worst shape", shapes=["1x8"])
MORE = rerun_step("bench", CONFIG, "more evidence", budget="40s")


def findings(*decisions: str, change: float = 0.5, op: OpDiff | None = None, **kwargs: Any) -> BenchFindings:
    shapes = tuple(
        ShapeOutcome(shape=f"{i + 1}x8", decision=d, change=None if d == "too-few-blocks" else change,
                     low=None if d == "too-few-blocks" else change - 0.02, high=None if d == "too-few-blocks" else change + 0.02,
                     blocks=40, needed_blocks=400.0 if d == "undecided" else None, blocks_per_s=20.0)
        for i, d in enumerate(decisions)
    )
    defaults: dict[str, Any] = dict(baseline="fused", candidate="tiled", threshold=0.05, budget_s=10.0, shapes=shapes,
                                    geomean=change, geomean_low=change - 0.02, geomean_high=change + 0.02,
                                    focus=shapes[0].shape, op_diff=op, reproduce=REPRODUCE, more_evidence=MORE)
    defaults.update(kwargs)
    return BenchFindings(**defaults)


X = t("float32", 64, 4096)
ROW = t("float32", 64, 1)
W = t("float32", 4096)

# Row max and row sum once, then the output; against both recomputed for each of 4 tiles.
STATS_ONCE = side(call("amax", 1, 30, X, args="[-1], True"), call("sub", 1, 100, X, ROW, args="1"),
                  call("exp", 1, 1000, X), call("sum", 1, 30, X, args="[-1], True"),
                  call("exp", 4, 250, t("float32", 64, 1024)), call("cat", 1, 60, *[t("float32", 64, 1024)] * 4))
STATS_PER_TILE = side(call("amax", 4, 120, X, args="[-1], True"), call("sub", 4, 400, X, ROW, args="1"),
                      call("exp", 4, 4000, X), call("sum", 4, 120, X, args="[-1], True"),
                      call("exp", 4, 250, t("float32", 64, 1024)), call("cat", 1, 60, *[t("float32", 64, 1024)] * 4))
# The same recomputation, tiled with slices whose time is overhead (views move no data).
SLICED = side(*[c for c in (call("amax", 4, 120, X, args="[-1], True"), call("exp", 4, 1500, X),
                            call("sum", 4, 120, X, args="[-1], True"))],
              call("slice", 4, 1600, X, args="1, 0, 1024, 1"), call("as_strided", 4, 400, X, inside="slice"),
              call("exp", 4, 250, t("float32", 64, 1024)))
SLICED_BASE = side(call("amax", 1, 30, X, args="[-1], True"), call("exp", 1, 375, X),
                   call("sum", 1, 30, X, args="[-1], True"), call("exp", 4, 250, t("float32", 64, 1024)))

# F.layer_norm against mean, sub, pow, add, sqrt, div, mul written out.
LAYER_NORM = side(call("layer_norm", 1, 3, X, W, W, args="[4096], 1e-05"),
                  call("native_layer_norm", 1, 400, X, W, W, args="[4096], 1e-05", inside="layer_norm"),
                  call("empty", 1, 2, inside="native_layer_norm"))
WRITTEN_OUT = side(call("mean", 2, 20, X, args="[-1], True"), call("sum", 2, 60, X, inside="mean"),
                   call("sub", 2, 800, X, ROW, args="1"), call("pow", 1, 450, X, args="2"),
                   call("add", 1, 8, ROW, args="1e-05"), call("sqrt", 1, 10, ROW), call("div", 1, 450, X, ROW),
                   call("mul", 1, 400, X, W), call("add", 1, 400, X, W, args="1"))

STRIDED = t("float32", 1024, 1024, strides=(1, 1024))
SQUARE = t("float32", 1024, 1024)

# x * w broadcast, against w expanded and copied to the full size first.
FULL = t("float32", 256, 4096)
EXPANDED = t("float32", 256, 4096, strides=(0, 1))
BROADCAST = side(call("mul", 1, 600, FULL, t("float32", 4096)))
MATERIALIZED = side(call("expand", 1, 5, t("float32", 4096), args="[256, 4096], False"),
                    call("contiguous", 1, 2, EXPANDED), call("clone", 1, 4, EXPANDED, inside="contiguous"),
                    call("empty_like", 1, 2, EXPANDED, inside="clone"),
                    call("copy_", 1, 250, FULL, EXPANDED, inside="clone"), call("mul", 1, 900, FULL, FULL))
# A transposed tensor made contiguous before a row sum.
TRANSPOSED_COPY = side(call("contiguous", 1, 2, STRIDED), call("clone", 1, 4, STRIDED, inside="contiguous"),
                       call("copy_", 1, 900, SQUARE, STRIDED, inside="clone"), call("sum", 1, 60, SQUARE, args="[-1]"))
ROW_SUM = side(call("sum", 1, 60, SQUARE, args="[-1]"))

TILE = t("float32", 8, 1024, strides=(4096, 1))
WHOLE = t("float32", 8, 4096)

TABLE = [
    # (findings, rule, status, phrases the why must contain, a pattern neither why nor next may match)
    (findings("regression", "too-few-blocks"), "too-few-blocks", Status.INCONCLUSIVE, ["did not fit"], None),
    (findings("regression", op=diff(STATS_ONCE, STATS_PER_TILE)), "redundant-recomputation", Status.FAIL,
     ["aten::exp called 4x as often on the same inputs, float32[64, 4096] (4 vs 1 per call)",
      "recomputed 4x per call", "the reductions aten::amax, aten::sum among them", "redundant recomputation"],
     r"warp|only in the candidate"),
    (findings("regression", op=diff(SLICED_BASE, SLICED)), "redundant-recomputation", Status.FAIL,
     ["of the time added outside views such as aten::slice", "recomputed 4x per call"], r"warp"),
    (findings("regression", op=diff(LAYER_NORM, WRITTEN_OUT)), "lost-fusion", Status.FAIL,
     ["aten::layer_norm (aten::native_layer_norm inside it)", "does not run in the candidate",
      "the candidate runs 8 operators the baseline does not", "+100% of the added time",
      "the 7 of them the kernel calls directly read 8.03 MiB per kernel call, against 1.03 MiB for aten::layer_norm", "lost fusion"],
     r"warp|recomput"),
    (findings("regression", op=diff(side(call("sum", 1, 60, SQUARE, args="[-1], False")),
                                     side(call("sum", 1, 400, STRIDED, args="[-1], False")))),
     "slower-op", Status.FAIL,
     ["aten::sum called as often (1 per call), 340 µs more self time",
      "on a non-contiguous input (float32[1024, 1024] strides (1, 1024), against float32[1024, 1024]"], r"warp"),
    (findings("regression", op=diff(side(call("gelu", 1, 160, X)), side(call("gelu", 1, 500, X)))),
     "slower-op", Status.FAIL,
     ["on the same inputs (float32[64, 4096]) with the same recorded arguments",
      "the profile records nothing that tells why"], r"warp|strided|dtype"),
    (findings("regression", op=diff(side(call("mm", 1, 100, t("float32", 64, 64), t("float32", 64, 64))),
                                     side(call("mm", 1, 300, t("bfloat16", 64, 64), t("bfloat16", 64, 64))))),
     "slower-op", Status.FAIL, ["in another dtype (bfloat16[64, 64], bfloat16[64, 64], against float32[64, 64]"], None),
    (findings("regression", op=diff(side(call("leaky_relu", 1, 100, X, args="0.01")),
                                     side(call("leaky_relu", 1, 300, X, args="0.2")))),
     "slower-op", Status.FAIL, ["other scalar arguments (float32[64, 4096] with arguments 0.2, against "
                                "float32[64, 4096] with arguments 0.01"], None),
    (findings("regression", op=diff(side(call("bmm", 1, 100, t("float32", 4, 64, 64), t("float32", 4, 64, 64))),
                                     side(call("baddbmm", 1, 400, t("float32", 4, 64, 64), t("float32", 4, 64, 64))))),
     "slower-op", Status.FAIL, ["aten::bmm runs only in the baseline", "replaced by another"], r"fusion"),
    (findings("regression", op=diff(BROADCAST, MATERIALIZED)), "memory-traffic", Status.FAIL,
     ["aten::contiguous > aten::clone > aten::copy_ (1 vs 0 per call) runs only in the candidate and writes 4 MiB "
      "per kernel call",
      "a broadcast (stride-0) view copied into a full tensor",
      "aten::mul, called as often, reads 8 MiB per kernel call against 4.02 MiB in the baseline",
      "written and read again (more memory traffic)"], r"warp|recomput|fusion"),
    (findings("regression", op=diff(ROW_SUM, TRANSPOSED_COPY)), "memory-traffic", Status.FAIL,
     ["writes 4 MiB per kernel call, a non-contiguous view copied into a contiguous tensor",
      "a materialized intermediate (more memory traffic)"], r"warp"),
    (findings("regression", op=diff(side(call("mul", 1, 100, X, W)),
                                     side(call("mul", 1, 100, X, W), call("tanh", 1, 600, X)))),
     "extra-ops", Status.FAIL, ["operators only the candidate runs carry +100% of the added time",
                                "aten::tanh called only in the candidate"], r"recomput|fusion"),
    (findings("regression", op=diff(side(call("mul", 1, 40, WHOLE, WHOLE)), side(call("mul", 4, 120, TILE, TILE)))),
     "more-calls", Status.FAIL, ["aten::mul called 4x as often (4 vs 1 per call) on other inputs",
                                 "about the same data in more, smaller calls"], r"recomput"),
    # Repeats +100 µs, an added operator +90 µs, the same calls slower +40 µs: none carries most.
    (findings("regression", op=diff(side(call("mul", 1, 100, X, W), call("exp", 1, 100, X)),
                                     side(call("mul", 1, 140, X, W), call("exp", 2, 200, X), call("tanh", 1, 90, X)))),
     "regression", Status.FAIL, ["no one pattern carries most of the added time"], None),
    (findings("regression", "undecided"), "regression", Status.FAIL, ["slower than fused on 1 of 2 shapes",
                                                                     "no operator diff was taken"], None),
    (findings("undecided", change=0.09), "undecided", Status.INCONCLUSIVE,
     ["straddles ±5%", "about 400 blocks (~20 s of measuring) would decide it"], None),
    (findings("improvement", change=-0.7, op=diff(STATS_PER_TILE, STATS_ONCE, slower=False)), "recomputation-removed",
     Status.PASS, ["4x less often on the same inputs", "of the saved time", "speed-up", "repeated work removed"], None),
    (findings("improvement", "equivalent", change=-0.3), "improvement", Status.PASS, ["faster than fused on 1 of 2"],
     None),
    (findings("equivalent", change=0.01), "equivalent", Status.PASS, ["equivalent within ±5% on 1 shape"], None),
    (findings("equivalent", change=0.01, env_differences=("python: 3.11 vs 3.12",)), "environment-differs",
     Status.WARN, ["environments differ (python: 3.11 vs 3.12)"], None),
    (findings("equivalent", change=0.01, saved=True, unit="benchmark"), "equivalent", Status.PASS,
     ["on 1 benchmark", "Compared across processes"], None),
]


@pytest.mark.parametrize(("case", "rule", "status", "phrases", "never"), TABLE,
                         ids=[f"{row[1]}-{i}" for i, row in enumerate(TABLE)])
def test_rule_table(case: BenchFindings, rule: str, status: Status, phrases: list[str], never: str | None) -> None:
    outcome = diagnose(RULES, case)
    assert outcome.rule.name == rule, outcome.diagnosis.why
    assert outcome.diagnosis.status is status
    for phrase in phrases:
        assert phrase in outcome.diagnosis.why, outcome.diagnosis.why
    if never is not None:
        for text in (outcome.diagnosis.why, *map(shell_line, outcome.diagnosis.next)):
            assert not re.search(never, text, re.IGNORECASE), text
    assert outcome.record.rule == rule and outcome.record.saw["shapes"] == len(case.shapes)


# Bounds cast from float64 scalars twice a call (aten::to > aten::_to_copy > aten::copy_ on a
# scalar, both sides), against the same with a defensive clone of the input first: copy_ runs on
# both sides, and the copy that changed is the one inside aten::clone (issue 53).
SCALAR, SCALAR64 = t("float32"), t("float64")


def _scalar_casts() -> list[Call]:
    return [call("to", 2, 4, SCALAR64, args="6, False, False"), call("_to_copy", 2, 6, SCALAR64, inside="to"),
            call("empty_strided", 2, 2, inside="_to_copy"), call("copy_", 2, 3, SCALAR, SCALAR64, inside="_to_copy"),
            call("item", 2, 1, SCALAR), call("_local_scalar_dense", 2, 1, SCALAR, inside="item")]


CLAMP = side(*_scalar_casts(), call("clamp", 1, 300, FULL, args="-60000.0, 60000.0"))
CLAMP_OF_A_COPY = side(call("clone", 1, 8, FULL), call("empty_like", 1, 3, FULL, inside="clone"),
                       call("copy_", 1, 330, FULL, FULL, inside="clone"), *_scalar_casts(),
                       call("clamp", 1, 420, FULL, args="-60000.0, 60000.0"))


def test_a_copy_called_from_two_operators_is_named_by_the_caller_whose_calls_changed() -> None:
    op_diff = diff(CLAMP, CLAMP_OF_A_COPY)
    copy = next(op for op in op_diff.ops if op.op == "aten::copy_")
    assert copy.called_from == "aten::clone"
    assert {(c.called_from, c.baseline_calls, c.candidate_calls) for c in copy.callers} == {
        ("aten::clone", 0.0, 1.0), ("aten::_to_copy", 2.0, 2.0)}
    outcome = diagnose(RULES, findings("regression", op=op_diff))
    assert outcome.rule.name == "memory-traffic", outcome.diagnosis.why
    why = outcome.diagnosis.why
    assert ("aten::clone > aten::copy_ (1 vs 0 per call inside aten::clone; 2 per call on both sides inside "
            "aten::_to_copy) in the candidate writes 4 MiB per kernel call") in why, why
    assert "(float32[256, 4096], float32[256, 4096])" in why, why  # what the changed copy copies, not a scalar
    assert "_to_copy > aten::copy_" not in why and "float32[], float64[]" not in why, why


def test_a_caller_called_as_often_is_named_when_its_time_changed() -> None:
    # copy_ inside two callers, called as often on both sides: the one whose self time grew.
    base = side(call("copy_", 2, 10, SCALAR, SCALAR64, inside="_to_copy"), call("copy_", 1, 100, FULL, FULL, inside="clone"))
    cand = side(call("copy_", 2, 10, SCALAR, SCALAR64, inside="_to_copy"), call("copy_", 1, 400, FULL, FULL, inside="clone"))
    copy = next(op for op in diff(base, cand).ops if op.op == "aten::copy_")
    assert copy.called_from == "aten::clone"


def test_the_evidence_names_the_operators_only_one_side_runs_and_their_share() -> None:
    op = diff(LAYER_NORM, WRITTEN_OUT)
    assert set(op.only_in_baseline) == {"aten::layer_norm", "aten::native_layer_norm", "aten::empty"}
    assert op.only_in_candidate[0] == "aten::sub" and "aten::layer_norm" not in op.only_in_candidate
    assert op.only_in_candidate_share == pytest.approx(1.0)
    assert op.only_in_baseline_share < 0  # time the baseline's own operators took, given back
    assert op.repeated_inputs == () and op.repeated_inputs_share == 0.0
    saw = diagnose(RULES, findings("regression", op=op)).record.saw
    assert saw["only_in_candidate_share"] == 1.0 and "aten::native_layer_norm" in saw["only_in_baseline"]


def test_ops_only_in_the_candidate_are_never_recomputation() -> None:
    # Two subtractions of the mean in the candidate and none in the baseline: not a repeat.
    op = diff(LAYER_NORM, WRITTEN_OUT)
    assert not any(row.op == "aten::sub" for row in op.inputs if row.baseline_calls > 0)
    assert diagnose(RULES, findings("regression", op=op)).rule.name != "redundant-recomputation"


def test_a_view_removed_from_the_baseline_is_not_a_lost_fusion() -> None:
    base = side(call("mul", 1, 100, X, W), call("view", 1, 3, X, args="[64, 4096]"))
    cand = side(call("mul", 1, 100, X, W), call("tanh", 1, 400, X), call("exp", 1, 400, X))
    assert diagnose(RULES, findings("regression", op=diff(base, cand))).rule.name == "extra-ops"


def test_gpu_advice_only_for_a_cuda_kernel() -> None:
    op = diff(STATS_ONCE, STATS_PER_TILE)
    cpu = diagnose(RULES, findings("regression", op=op, device="cpu")).diagnosis
    cuda = diagnose(RULES, findings("regression", op=op, device="cuda")).diagnosis
    assert not any("warp" in shell_line(step) for step in cpu.next)
    assert any("warp-level reduction" in step.why for step in cuda.next)
    for case in (diff(LAYER_NORM, WRITTEN_OUT), diff(BROADCAST, MATERIALIZED)):
        cpu = diagnose(RULES, findings("regression", op=case, device="cpu")).diagnosis
        assert not any(re.search("warp|shared memory|registers", text)
                       for text in (cpu.why, *map(shell_line, cpu.next)))


def test_failing_rules_give_the_reproduce_command_and_inconclusive_the_budget() -> None:
    assert REPRODUCE in diagnose(RULES, findings("regression")).diagnosis.next
    assert diagnose(RULES, findings("regression", op=diff(BROADCAST, MATERIALIZED))).diagnosis.next[-1] == REPRODUCE
    assert diagnose(RULES, findings("undecided")).diagnosis.next == (MORE,)
    assert diagnose(RULES, findings("equivalent", change=0.0)).diagnosis.next == ()
    assert REPRODUCE.arguments == {"baseline": "kernels.py:fused", "candidate": "kernels.py:tiled", "shapes": ["1x8"]}
    assert shell_line(MORE) == ("glmfb bench kernels.py:fused kernels.py:tiled --shape 1x8 --shape 2x8 --budget 40s"
                                "  # more evidence")


def test_rule_names_are_the_corpus_classes() -> None:
    names = [rule.name for rule in RULES]
    assert {"redundant-recomputation", "lost-fusion", "slower-op", "memory-traffic", "equivalent"} <= set(names)
    assert "slower-operator" not in names


def test_a_repeat_that_adds_more_than_the_net_added_time_says_so() -> None:
    small = t("float32", 64, 1024)
    base = side(call("exp", 1, 100, X), call("exp", 4, 100, small))
    cand = side(call("exp", 3, 300, X), call("exp", 4, 50, small))  # +200 µs repeated, -50 µs elsewhere
    why = diagnose(RULES, findings("regression", op=diff(base, cand))).diagnosis.why
    assert "carry +133% of the added time (more than all of it: other calls of the same operators took less)" in why


def test_a_layout_change_is_named_without_advice_the_profile_does_not_back() -> None:
    # The candidate reads the contiguous layout and is slower: no "make it contiguous" advice.
    op = diff(side(call("sum", 1, 60, STRIDED, args="[-1], False")), side(call("sum", 1, 400, SQUARE, args="[-1], False")))
    diagnosis = diagnose(RULES, findings("regression", op=op)).diagnosis
    assert "on inputs with other strides (float32[1024, 1024], against float32[1024, 1024] strides (1, 1024)" \
        in diagnosis.why
    assert "only the strides differ" in diagnosis.next[0].why and "contiguous input" not in diagnosis.next[0].why


def test_undecided_on_a_busy_host_says_how_busy_it_was() -> None:
    from glmfb.core.measure.hostload import HostLoad

    busy = HostLoad(window_s=3.0, cpus=2, host_busy_s=6.0, own_busy_s=1.2)
    why = diagnose(RULES, findings("undecided", change=0.09, host_load=busy)).diagnosis.why
    assert "would decide it. The host was busy: other processes kept 1.6 of the host's 2 CPUs busy while it measured." \
        in why, why
    quiet = HostLoad(window_s=3.0, cpus=2, host_busy_s=1.3, own_busy_s=1.2)
    assert "busy" not in diagnose(RULES, findings("undecided", change=0.09, host_load=quiet)).diagnosis.why


# ---- no why states what its evidence contradicts (glmfb.bench.rules.CLAIMS) ------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from glmfb.bench.rules import CLAIMS  # noqa: E402
from glmfb.core.rules import contradicted  # noqa: E402

_calls = st.lists(st.tuples(st.sampled_from(["copy_", "clone", "mul", "sum", "exp", "_to_copy"]),
                            st.sampled_from([0.5, 1.0, 2.0, 4.0]), st.floats(1.0, 2000.0),
                            st.sampled_from([FULL, SCALAR, X]),
                            st.sampled_from([None, "clone", "_to_copy"])), max_size=6)


def _profile(calls: list[tuple[str, float, float, TensorMeta, str | None]]) -> dict[str, OpStats]:
    return side(*(call(op, n, us, tensor, tensor, inside=inside if inside != op else None)
                  for op, n, us, tensor, inside in calls))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["regression", "improvement", "equivalent", "undecided"]), min_size=1, max_size=3),
       st.one_of(st.none(), st.tuples(_calls, _calls)))
def test_no_bench_why_states_what_its_evidence_contradicts(decisions: list[str], profiles: Any) -> None:
    case = findings(*decisions, op=None if profiles is None else diff(
        _profile(profiles[0]), _profile(profiles[1]), slower="regression" in decisions))
    why = diagnose(RULES, case).diagnosis.why
    assert contradicted(CLAIMS, case, why) == [], why
