"""The operator diff, on fixed profiles and on a real torch.profiler pass."""

from __future__ import annotations

import torch

from glmfb.bench.opdiff import OpStats, diff_ops, profile_pair


def ops(**entries: tuple[float, float]) -> dict[str, OpStats]:
    return {f"aten::{name}": OpStats(f"aten::{name}", calls, self_us) for name, (calls, self_us) in entries.items()}


def test_diff_ranks_operators_by_added_time_and_shares_sum_to_one() -> None:
    base = ops(mean=(1, 2.0), pow=(1, 8.0), silu=(1, 10.0), mul=(2, 6.0))
    cand = ops(mean=(4, 8.0), pow=(4, 32.0), silu=(4, 40.0), mul=(2, 6.5), slice=(16, 5.0))
    rows = diff_ops(base, cand, slower=True)
    assert rows[0].op == "aten::silu"
    assert abs(sum(r.share for r in rows if r.added_us > 0) - 1.0) < 1e-9
    mean = next(r for r in rows if r.op == "aten::mean")
    assert (mean.baseline_calls, mean.candidate_calls, mean.reduction) == (1, 4, True)
    assert not next(r for r in rows if r.op == "aten::slice").reduction


def test_measured_direction_wins_over_a_noisy_profile() -> None:
    # The baseline's profile was inflated by a preemption: its net self time is larger, yet the
    # timing said the candidate is slower; the diff still ranks what the candidate added.
    base = ops(mean=(1, 2.0), silu=(1, 200.0))
    cand = ops(mean=(4, 8.0), silu=(4, 40.0))
    rows = diff_ops(base, cand, slower=True)
    assert rows[0].op == "aten::mean" and rows[0].share == 1.0


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
