"""The operator diff, on fixed profiles and on real torch.profiler passes (shapes recorded)."""

from __future__ import annotations

import pytest
import torch

from glmfb.bench.opdiff import (
    InputStats,
    OpStats,
    TensorMeta,
    build_op_diff,
    copy_facts,
    diff_inputs,
    diff_ops,
    profile_pair,
    tensors_of,
)


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
    slice_row = next(r for r in rows if r.op == "aten::slice")
    assert not slice_row.reduction and slice_row.only_in == "candidate" and slice_row.view and slice_row.movement


def test_measured_direction_wins_over_a_noisy_profile() -> None:
    # The baseline's profile was inflated by a preemption: its net self time is larger, yet the
    # timing said the candidate is slower; the diff still ranks what the candidate added.
    base = ops(mean=(1, 2.0), silu=(1, 200.0))
    cand = ops(mean=(4, 8.0), silu=(4, 40.0))
    rows = diff_ops(base, cand, slower=True)
    assert rows[0].op == "aten::mean" and rows[0].share == 1.0


def test_tensor_inputs_are_read_from_the_profilers_records() -> None:
    # aten::sum(x, [-1], False, None) and aten::cat([a, b], 0), as record_shapes gives them.
    found = tensors_of([[64, 64], [], [], []], [[1, 64], [], [], []], ["float", "ScalarList", "Scalar", ""])
    assert found == (TensorMeta((64, 64), (1, 64), "float32", 4),)
    assert not found[0].contiguous and found[0].describe() == "float32[64, 64] strides (1, 64)"
    listed = tensors_of([[[2, 3], [4, 3]], []], [[[3, 1], [3, 1]], []], ["TensorList", "Scalar"])
    assert [t.shape for t in listed] == [(2, 3), (4, 3)] and listed[0].itemsize is None
    half = tensors_of([[8, 8]], [[8, 1]], ["c10::BFloat16"])[0]
    assert (half.dtype, half.logical_bytes, half.describe()) == ("bfloat16", 128.0, "bfloat16[8, 8]")


def test_a_broadcast_input_spans_its_own_bytes_and_its_copy_writes_the_full_size() -> None:
    full = TensorMeta((256, 4096), (4096, 1), "float32", 4)
    expanded = TensorMeta((256, 4096), (0, 1), "float32", 4)
    assert expanded.broadcast and not expanded.contiguous
    assert expanded.unique_bytes == 4096 * 4 and expanded.logical_bytes == 256 * 4096 * 4
    assert copy_facts("aten::copy_", (full, expanded)) == (256 * 4096 * 4, "broadcast")
    transposed = TensorMeta((1024, 1024), (1, 1024), "float32", 4)
    square = TensorMeta((1024, 1024), (1024, 1), "float32", 4)
    assert copy_facts("aten::copy_", (square, transposed)) == (4 * 2**20, "strided")
    assert copy_facts("aten::copy_", (TensorMeta((8,), (1,), "bfloat16", 2), TensorMeta((8,), (1,), "float32", 4))) \
        == (16.0, "dtype")
    assert copy_facts("aten::mul", (full, full)) == (0.0, None)


def _stats(name: str, *entries: InputStats) -> OpStats:
    return OpStats(name, sum(e.calls_per_call for e in entries), sum(e.self_us_per_call for e in entries), entries)


def test_the_diff_by_inputs_separates_a_repeat_from_a_call_on_other_inputs() -> None:
    whole = TensorMeta((8, 4096), (4096, 1), "float32", 4)
    tile = TensorMeta((8, 1024), (4096, 1), "float32", 4)
    base = {"aten::silu": _stats("aten::silu", InputStats("float32[8, 4096]", "", 1, 10.0, (whole,))),
            "aten::mul": _stats("aten::mul", InputStats("float32[8, 4096]", "", 1, 8.0, (whole,)))}
    cand = {"aten::silu": _stats("aten::silu", InputStats("float32[8, 4096]", "", 4, 40.0, (whole,))),
            "aten::mul": _stats("aten::mul", InputStats("float32[8, 1024] strides (4096, 1)", "", 4, 12.0, (tile,)))}
    rows = {(r.op, r.inputs): r for r in diff_inputs(base, cand, slower=True)}
    assert rows[("aten::silu", "float32[8, 4096]")].candidate_calls == 4
    assert rows[("aten::mul", "float32[8, 4096]")].candidate_calls == 0
    diff = build_op_diff(base, cand, shape="8x4096", profiled_calls=10, slower=True)
    assert diff.repeated_inputs == ("aten::silu",)
    # of the operators' added time: silu +30 µs, mul +4 µs net (-8 on the whole rows, +12 on the tiles)
    assert diff.repeated_inputs_share == pytest.approx(30 / 34)
    mul = next(r for r in diff.ops if r.op == "aten::mul")
    assert mul.inputs_change == "shapes" and mul.candidate_read_bytes == mul.baseline_read_bytes == 8 * 4096 * 4


def test_profile_pair_counts_operators_per_call_and_per_input_shape() -> None:
    x = torch.randn(16, 64)
    y = torch.randn(4, 64)

    def one() -> torch.Tensor:
        return x.mean(-1) + y.mean(-1).sum()

    def four() -> torch.Tensor:
        for _ in range(3):
            x.mean(-1)
        return x.mean(-1) + y.mean(-1).sum()

    base, cand = profile_pair([one], [four], calls=10, device="cpu", rounds=2)
    assert base["aten::mean"].calls_per_call == 2.0
    assert cand["aten::mean"].calls_per_call == 5.0
    by_inputs = {e.inputs: e.calls_per_call for e in cand["aten::mean"].by_inputs}
    assert by_inputs == {"float32[16, 64]": 4.0, "float32[4, 64]": 1.0}
    rows = {(r.op, r.inputs): r for r in diff_inputs(base, cand, slower=True)}
    assert (rows[("aten::mean", "float32[16, 64] with arguments [-1], False")].baseline_calls,
            rows[("aten::mean", "float32[16, 64] with arguments [-1], False")].candidate_calls) == (1.0, 4.0)


def test_a_real_profile_records_strides_and_a_materialized_copy() -> None:
    x = torch.randn(256, 512)
    w = torch.randn(512)
    strided = torch.randn(512, 256).t()

    def broadcast() -> torch.Tensor:
        return x * w + strided.sum(-1, keepdim=True)

    def materialized() -> torch.Tensor:
        return x * w.expand(256, 512).contiguous() + strided.sum(-1, keepdim=True)

    base, cand = profile_pair([broadcast], [materialized], calls=6, device="cpu", rounds=2)
    total = sum(e.written_bytes * e.calls_per_call for e in cand["aten::copy_"].by_inputs)
    assert total == 256 * 512 * 4
    assert {e.copied_from for e in cand["aten::copy_"].by_inputs if e.written_bytes} == {"broadcast"}
    assert cand["aten::copy_"].called_from == "aten::clone"
    assert "strides (1, 256)" in base["aten::sum"].by_inputs[0].inputs
    diff = build_op_diff(base, cand, shape="256x512", profiled_calls=6, slower=True)
    assert {"aten::copy_", "aten::contiguous", "aten::expand"} <= set(diff.only_in_candidate)
    assert diff.only_in_baseline == ()
    mul = next(r for r in diff.ops if r.op == "aten::mul")
    assert mul.inputs_change == "shapes"
    assert mul.candidate_read_bytes == 2 * 256 * 512 * 4 and mul.baseline_read_bytes == (256 * 512 + 512) * 4
    copy = next(r for r in diff.ops if r.op == "aten::copy_")
    assert copy.candidate_written_bytes == 256 * 512 * 4 and copy.copied_from == "broadcast" and copy.movement


def test_a_real_profile_splits_an_operators_calls_by_caller() -> None:
    # copy_ on a scalar inside aten::_to_copy twice a call on both sides; once more, of the whole
    # input, inside aten::clone in the candidate: the diff names the caller whose calls changed.
    x = torch.randn(64, 256)

    def clamp(copy: bool) -> torch.Tensor:
        hidden = x.clone() if copy else x
        low = torch.tensor(-6.0e4, dtype=torch.float64).to(hidden.dtype)
        high = torch.tensor(6.0e4, dtype=torch.float64).to(hidden.dtype)
        return hidden.clamp(low.item(), high.item())

    base, cand = profile_pair([lambda: clamp(False)], [lambda: clamp(True)], calls=6, device="cpu", rounds=2)
    callers = {c.parent: c.calls_per_call for c in cand["aten::copy_"].callers}
    assert callers == {"aten::_to_copy": 2.0, "aten::clone": 1.0}
    assert {c.parent: c.calls_per_call for c in base["aten::copy_"].callers} == {"aten::_to_copy": 2.0}
    assert cand["aten::copy_"].called_from == "aten::_to_copy"  # the side's most frequent caller
    copy = next(r for r in build_op_diff(base, cand, shape="64x256", profiled_calls=6, slower=True).ops
                if r.op == "aten::copy_")
    assert copy.called_from == "aten::clone"  # the caller whose calls changed
    assert [(c.called_from, c.baseline_calls, c.candidate_calls) for c in copy.callers] == [
        ("aten::_to_copy", 2.0, 2.0), ("aten::clone", 0.0, 1.0)]


def test_quantiles_of_samples_for_the_report() -> None:
    from glmfb.bench.evidence import QUANTILES, quantiles_of

    values = [float(v) for v in range(101)] + [float("nan")]
    assert quantiles_of(values) == tuple(float(q) for q in QUANTILES)
    assert quantiles_of([2.0]) == (2.0,) * len(QUANTILES) and quantiles_of([]) == ()


def _same_events_both_ways(function, calls: int = 20) -> int:
    """Profile ``function`` once and read the profile both ways: the profiler's own records
    (what a CPU bench reads) and torch's ``FunctionEvent`` tree; the same operator calls, with
    the same inputs, parents and own times."""
    from collections import Counter, defaultdict

    from glmfb.bench.opdiff import _cpu_events, _function_events, profiler_session

    for _ in range(3):
        function()
    with profiler_session("cpu") as prof:
        for _ in range(calls):
            function()
    records = _cpu_events(prof.kineto_results)
    tree = _function_events(prof, "cpu")

    def key(event):
        return (event.name, repr(event.shapes), repr(event.strides), repr(event.dtypes), repr(event.concrete),
                event.parent)

    assert Counter(map(key, records)) == Counter(map(key, tree))
    own: tuple[dict, dict] = (defaultdict(float), defaultdict(float))
    for side, events in zip(own, (records, tree), strict=True):
        for event in events:
            side[key(event)] += event.self_us
    assert all(own[0][k] == pytest.approx(own[1][k], abs=1e-6) for k in own[1])
    return len(records)


def test_a_cpu_profile_read_from_its_records_equals_torchs_reading() -> None:
    """Nested calls (a redispatch of the same operator, which torch folds into its parent),
    a backward pass, a second thread: the records' reading equals torch's. Without folding the
    redispatch, ``aten::div_`` inside ``aten::div_`` would count twice."""
    import threading

    from scenarios.decode_norm.kernels import gated_norm_tiled

    tiled = gated_norm_tiled((8, 512))
    assert _same_events_both_ways(tiled) > 20 * 10
    x = torch.randn(32, 32, requires_grad=True)

    def backward() -> None:
        (x @ x).relu().sum().backward()

    assert _same_events_both_ways(backward) > 0

    def two_threads() -> None:
        other = threading.Thread(target=lambda: torch.randn(64).sum())
        other.start()
        torch.randn(64).mean()
        other.join()

    assert _same_events_both_ways(two_threads) > 0


def test_a_cpu_profile_imports_no_compiler() -> None:
    """``torch.profiler.profile``'s start asks ``hasattr(torch, "_inductor")``, which imports
    ``torch._inductor`` and ``torch._dynamo`` (1.3 s here): bench's CPU profile, run in the process
    of every bench that explains itself, must not pay that (a fresh interpreter, as a bench's)."""
    import subprocess
    import sys

    code = ("import sys, torch\n"
            "from glmfb.bench.opdiff import profile_pair\n"
            "a = torch.randn(64, 64)\n"
            "profile_pair([lambda: a @ a], [lambda: a + a], 10, 'cpu')\n"
            "print('torch._dynamo' in sys.modules, 'torch._inductor' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["False", "False"]
