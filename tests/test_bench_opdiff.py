"""The operator diff and its diagnosis rules, on fixed profiles and on a real torch.profiler pass."""

from __future__ import annotations

import torch

from glmfb.bench.opdiff import OpStats, diff_ops, explain, profile_pair


def ops(**entries: tuple[float, float]) -> dict[str, OpStats]:
    return {f"aten::{name}": OpStats(f"aten::{name}", calls, self_us) for name, (calls, self_us) in entries.items()}


def test_repeated_reductions_are_redundant_recomputation() -> None:
    base = ops(mean=(1, 2.0), pow=(1, 8.0), silu=(1, 10.0), mul=(2, 6.0))
    cand = ops(mean=(4, 8.0), pow=(4, 32.0), silu=(4, 40.0), mul=(2, 6.5), slice=(16, 5.0))
    deltas = diff_ops(base, cand, slower=True)
    assert deltas[0].name == "aten::silu"
    assert abs(sum(d.share for d in deltas if d.added_us > 0) - 1.0) < 1e-9
    explanation = explain(deltas, slower=True)
    assert explanation.rule == "redundant-recomputation"
    assert explanation.repeated_reductions == ("aten::mean",)
    assert "aten::silu called 4x as often (4 vs 1 per call), +46% of the added time" in explanation.clause
    assert "recomputed 4x per call" in explanation.clause
    assert explanation.next


def test_improvement_reads_in_reverse() -> None:
    base = ops(mean=(4, 8.0), silu=(4, 40.0))
    cand = ops(mean=(1, 2.0), silu=(1, 10.0))
    explanation = explain(diff_ops(base, cand, slower=False), slower=False)
    assert explanation.rule == "recomputation-removed"
    assert "4x less often" in explanation.clause and "of the saved time" in explanation.clause


def test_more_calls_without_reductions_is_redundant_work() -> None:
    explanation = explain(diff_ops(ops(mul=(1, 5.0)), ops(mul=(2, 10.0)), slower=True), slower=True)
    assert explanation.rule == "redundant-work"


def test_same_calls_but_slower_is_a_slower_operator() -> None:
    explanation = explain(diff_ops(ops(mm=(1, 5.0)), ops(mm=(1, 9.0)), slower=True), slower=True)
    assert explanation.rule == "slower-operator"
    assert "µs more self time" in explanation.clause


def test_measured_direction_wins_over_a_noisy_profile() -> None:
    # The baseline's profile was inflated by a preemption: its net self time is larger, yet the
    # timing said the candidate is slower; the diff still ranks what the candidate added.
    base = ops(mean=(1, 2.0), silu=(1, 200.0))
    cand = ops(mean=(4, 8.0), silu=(4, 40.0))
    deltas = diff_ops(base, cand, slower=True)
    assert deltas[0].name == "aten::mean" and deltas[0].share == 1.0


def test_profile_pair_counts_operators_per_call() -> None:
    x = torch.randn(16, 64)

    def one() -> torch.Tensor:
        return x.mean(-1)

    def four() -> torch.Tensor:
        for _ in range(3):
            x.mean(-1)
        return x.mean(-1)

    base, cand = profile_pair([one], [four], calls=10, device="cpu", rounds=2)
    assert base["aten::mean"].calls_per_call == 1.0
    assert cand["aten::mean"].calls_per_call == 4.0
