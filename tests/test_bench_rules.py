"""The rules of glmfb bench as tables: findings in, rule and diagnosis out (no timing)."""

from __future__ import annotations

from typing import Any

import pytest

from glmfb.bench.evidence import OpDiff
from glmfb.bench.opdiff import OpStats, diff_ops
from glmfb.bench.rules import RULES, BenchFindings, ShapeOutcome
from glmfb.rules import diagnose
from glmfb.verdict import Status


def ops(**entries: tuple[float, float]) -> dict[str, OpStats]:
    return {f"aten::{name}": OpStats(f"aten::{name}", calls, self_us) for name, (calls, self_us) in entries.items()}


def op_diff(base: dict[str, OpStats], cand: dict[str, OpStats], slower: bool) -> OpDiff:
    return OpDiff(shape="8x8", profiled_calls=10, ops=tuple(diff_ops(base, cand, slower)))


def findings(*decisions: str, change: float = 0.5, op: OpDiff | None = None, **kwargs: Any) -> BenchFindings:
    shapes = tuple(
        ShapeOutcome(shape=f"{i + 1}x8", decision=d, change=None if d == "too-few-blocks" else change,
                     low=None if d == "too-few-blocks" else change - 0.02, high=None if d == "too-few-blocks" else change + 0.02,
                     blocks=40, needed_blocks=400.0 if d == "undecided" else None, blocks_per_s=20.0)
        for i, d in enumerate(decisions)
    )
    defaults: dict[str, Any] = dict(baseline="fused", candidate="tiled", threshold=0.05, budget_s=10.0, shapes=shapes,
                                    geomean=change, geomean_low=change - 0.02, geomean_high=change + 0.02,
                                    focus=shapes[0].shape, op_diff=op, reproduce="glmfb bench ... --json",
                                    more_evidence="glmfb bench ... --budget 40")
    defaults.update(kwargs)
    return BenchFindings(**defaults)


SLOWER_REDUCTIONS = op_diff(ops(mean=(1, 2.0), pow=(1, 8.0), silu=(1, 10.0), mul=(2, 6.0)),
                            ops(mean=(4, 8.0), pow=(4, 32.0), silu=(4, 40.0), mul=(2, 6.5), slice=(16, 5.0)), True)
FASTER_REDUCTIONS = op_diff(ops(mean=(4, 8.0), silu=(4, 40.0)), ops(mean=(1, 2.0), silu=(1, 10.0)), False)
MORE_CALLS = op_diff(ops(mul=(1, 5.0)), ops(mul=(2, 10.0)), True)
SLOWER_OP = op_diff(ops(mm=(1, 5.0)), ops(mm=(1, 9.0)), True)

TABLE = [
    # (findings, rule, status, phrases in the why)
    (findings("regression", "too-few-blocks"), "too-few-blocks", Status.INCONCLUSIVE, ["did not fit"]),
    (findings("regression", op=SLOWER_REDUCTIONS), "redundant-recomputation", Status.FAIL,
     ["aten::silu called 4x as often (4 vs 1 per call), +46% of the added time", "recomputed 4x per call"]),
    (findings("regression", op=MORE_CALLS), "redundant-work", Status.FAIL, ["redundant work"]),
    (findings("regression", op=SLOWER_OP), "slower-operator", Status.FAIL, ["µs more self time"]),
    (findings("regression", "undecided"), "regression", Status.FAIL, ["slower than fused on 1 of 2 shapes"]),
    (findings("undecided", change=0.09), "undecided", Status.INCONCLUSIVE,
     ["straddles ±5%", "about 400 blocks (~20 s of measuring) would decide it"]),
    (findings("improvement", change=-0.7, op=FASTER_REDUCTIONS), "recomputation-removed", Status.PASS,
     ["4x less often", "of the saved time", "speed-up"]),
    (findings("improvement", "equivalent", change=-0.3), "improvement", Status.PASS, ["faster than fused on 1 of 2"]),
    (findings("equivalent", change=0.01), "equivalent", Status.PASS, ["equivalent within ±5% on 1 shape"]),
    (findings("equivalent", change=0.01, env_differences=("python: 3.11 vs 3.12",)), "environment-differs",
     Status.WARN, ["environments differ (python: 3.11 vs 3.12)"]),
    (findings("equivalent", change=0.01, saved=True, unit="benchmark"), "equivalent", Status.PASS,
     ["on 1 benchmark", "Compared across processes"]),
]


@pytest.mark.parametrize(("case", "rule", "status", "phrases"), TABLE,
                         ids=[f"{row[1]}-{i}" for i, row in enumerate(TABLE)])
def test_rule_table(case: BenchFindings, rule: str, status: Status, phrases: list[str]) -> None:
    outcome = diagnose(RULES, case)
    assert outcome.rule.name == rule, outcome.diagnosis.why
    assert outcome.diagnosis.status is status
    for phrase in phrases:
        assert phrase in outcome.diagnosis.why, outcome.diagnosis.why
    assert outcome.record.rule == rule and outcome.record.saw["shapes"] == len(case.shapes)


def test_no_gpu_advice_for_a_cpu_kernel() -> None:
    cpu = diagnose(RULES, findings("regression", op=SLOWER_REDUCTIONS, device="cpu")).diagnosis
    cuda = diagnose(RULES, findings("regression", op=SLOWER_REDUCTIONS, device="cuda")).diagnosis
    assert not any("warp" in step for step in cpu.next)
    assert any("warp-level reduction" in step for step in cuda.next)


def test_failing_rules_give_the_reproduce_command_and_inconclusive_the_budget() -> None:
    assert "glmfb bench ... --json" in diagnose(RULES, findings("regression")).diagnosis.next
    assert diagnose(RULES, findings("undecided")).diagnosis.next == ("glmfb bench ... --budget 40",)
    assert diagnose(RULES, findings("equivalent", change=0.0)).diagnosis.next == ()
