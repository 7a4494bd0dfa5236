"""The fused chunked metrics against straightforward float64 references."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from glmfb.diff.axes import find_token_axis
from glmfb.diff.metrics import (
    PairComparer,
    Tolerance,
    Tolerances,
    position_errors,
    token_metrics,
)
from glmfb.diff.store import TensorLocation, read_safetensors_header


def reference(baseline: torch.Tensor, candidate: torch.Tensor, rtol: float, atol: float) -> dict[str, float]:
    b = baseline.to(torch.float64).reshape(-1)
    c = candidate.to(torch.float64).reshape(-1)
    d = (c - b).abs()
    return {
        "max_abs": float(d.max()),
        "max_rel": float((d / b.abs().clamp_min(torch.finfo(torch.float32).tiny)).max()),
        "rmse": float(d.pow(2).mean().sqrt()),
        "cosine": float(torch.dot(b, c) / (b.norm() * c.norm())),
        "rel_l2": float(d.norm() / b.norm()),
        "outside": int((d > atol + rtol * b.abs()).sum()),
    }


def stored(tmp_path: Path, name: str, tensor: torch.Tensor) -> TensorLocation:
    path = tmp_path / f"{name}.safetensors"
    save_file({"t0": tensor.contiguous()}, str(path))
    header, start = read_safetensors_header(path)
    begin, end = header["t0"]["data_offsets"]
    dtype = str(tensor.dtype).removeprefix("torch.")
    return TensorLocation(path, start + begin, end - begin, dtype, tuple(tensor.shape))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_file_pass_matches_reference_over_many_chunks(tmp_path: Path, dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    base = torch.randn(37, 1001, generator=generator).to(dtype)
    cand = (base.to(torch.float64) * (1 + 1e-3 * torch.randn(37, 1001, generator=generator, dtype=torch.float64))).to(dtype)
    tolerance = Tolerance(rtol=5e-4, atol=1e-4)
    with PairComparer(chunk_elements=4096) as comparer:  # ~9 chunks, last one partial
        got = comparer.compare_files(stored(tmp_path, "b", base), stored(tmp_path, "c", cand), tolerance)
    want = reference(base, cand, tolerance.rtol, tolerance.atol)
    assert got.numel == base.numel()
    assert got.max_abs == pytest.approx(want["max_abs"], rel=1e-6)
    assert got.rmse == pytest.approx(want["rmse"], rel=1e-4)
    assert got.rel_l2 == pytest.approx(want["rel_l2"], rel=1e-4)
    assert got.cosine == pytest.approx(want["cosine"], abs=1e-6)
    assert got.outside == pytest.approx(want["outside"], abs=max(2, want["outside"] // 1000))
    assert got.max_rel == pytest.approx(want["max_rel"], rel=1e-3)
    difference = (cand.to(torch.float64) - base.to(torch.float64)).abs()
    assert float(difference[got.worst_index]) == pytest.approx(want["max_abs"], rel=1e-6)  # ties may pick another
    assert got.worst_candidate - got.worst_baseline == pytest.approx(
        float((cand.to(torch.float64) - base.to(torch.float64))[got.worst_index]), rel=1e-6)
    assert got.failed == (want["outside"] > 0)


def test_identical_tensors_have_zero_error(tmp_path: Path) -> None:
    base = torch.randn(3000)
    with PairComparer(chunk_elements=1000) as comparer:
        got = comparer.compare_files(stored(tmp_path, "b", base), stored(tmp_path, "c", base.clone()), Tolerance(0.0, 0.0))
    assert (got.max_abs, got.rmse, got.rel_l2, got.outside, got.max_rel) == (0.0, 0.0, 0.0, 0, 0.0)
    assert math.copysign(1.0, got.max_abs) == 1.0  # 0.0, not -0.0 (a JSON "max_abs": -0.0 reads as a bug)
    assert got.cosine == pytest.approx(1.0)
    assert not got.failed


def test_nan_and_inf_are_counted_and_fail(tmp_path: Path) -> None:
    base = torch.arange(1, 5001, dtype=torch.float32)
    cand = base.clone()
    cand[10] = float("nan")
    cand[4000] = float("inf")
    base[20] = float("inf")
    cand[20] = float("inf")  # equal infinities match
    with PairComparer(chunk_elements=1024) as comparer:
        got = comparer.compare_files(stored(tmp_path, "b", base), stored(tmp_path, "c", cand), Tolerance(1e-6, 1e-6))
    assert (got.nan_baseline, got.nan_candidate, got.inf_baseline, got.inf_candidate) == (0, 1, 1, 2)
    assert got.outside == 2
    assert got.nonfinite_mismatch and got.failed
    assert math.isinf(got.max_abs)


def test_in_memory_pass_equals_file_pass(tmp_path: Path) -> None:
    base = torch.randn(8, 513)
    cand = base + 1e-4 * torch.randn(8, 513)
    tolerance = Tolerance(1e-5, 1e-5)
    with PairComparer(chunk_elements=700) as comparer:
        from_files = comparer.compare_files(stored(tmp_path, "b", base), stored(tmp_path, "c", cand), tolerance)
        in_memory = comparer.compare_tensors(base, cand, tolerance)
    assert from_files.outside == in_memory.outside
    assert from_files.max_abs == in_memory.max_abs
    assert from_files.worst_index == in_memory.worst_index
    assert from_files.rel_l2 == pytest.approx(in_memory.rel_l2, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=1, max_size=300),
    noise=st.floats(0, 1e-2),
    chunk=st.integers(1, 64),
)
def test_outside_count_is_exact_for_any_chunking(values: list[float], noise: float, chunk: int) -> None:
    base = torch.tensor(values, dtype=torch.float32)
    cand = base * (1 + noise) + noise
    tolerance = Tolerance(1e-3, 1e-3)
    with PairComparer(chunk_elements=chunk) as comparer:
        got = comparer.compare_tensors(base, cand, tolerance)
    d = (cand - base).abs()
    assert got.outside == int((d - tolerance.rtol * base.abs() > tolerance.atol).sum())
    assert got.max_abs == float(d.max())


def test_tolerances_default_by_dtype_and_override_by_glob() -> None:
    tolerances = Tolerances(per_tap=(("layers.*.mlp*", 1e-2, None),))
    assert tolerances.for_tap("x", "float32") == Tolerance(1.3e-6, 1e-5)
    assert tolerances.for_tap("x", "bfloat16") == Tolerance(1.6e-2, 1e-5)
    assert tolerances.for_tap("x", "float16") == Tolerance(1e-3, 1e-5)
    assert tolerances.for_tap("x", "float64") == Tolerance(1e-7, 1e-7)
    assert tolerances.for_tap("x", "int64") == Tolerance(0.0, 0.0)
    assert tolerances.for_tap("layers.3.mlp.up_proj", "float32") == Tolerance(1e-2, 1e-5)
    assert Tolerances(rtol=0.5, atol=0.25).for_tap("x", "float32") == Tolerance(0.5, 0.25)


def test_position_errors_find_the_first_failing_position() -> None:
    base = torch.randn(1, 50, 16)
    cand = base.clone()
    cand[0, 30:, :] += 1e-2
    assert find_token_axis("t", [(tuple(base.shape), 50)]).axis == 1
    errors = position_errors(base, cand, 1, Tolerance(1e-5, 1e-5))
    assert errors.first_failing == 30
    assert errors.rel_l2[:30].max() == 0.0
    assert errors.rel_l2[30:].min() > 0.0


def test_token_metrics_on_planted_argmax_flip() -> None:
    logits = torch.randn(1, 20, 11, generator=torch.Generator().manual_seed(3))
    changed = logits.clone()
    top = int(logits[0, 7].argmax())
    changed[0, 7, top] -= 10.0  # position 7's argmax moves
    got = token_metrics(logits, changed, dim=1, topk=3)
    assert got.first_argmax_diff == 7
    assert got.kl_max_position == 7
    assert got.kl_max > 0.1
    assert got.logprob_change_position == 7 and got.logprob_change_token == top
    assert got.argmax_agreement == pytest.approx(19 / 20)
    same = token_metrics(logits, logits.clone(), dim=1)
    assert same.first_argmax_diff is None and same.kl_max == 0.0 and same.topk_overlap_min == 1.0


def float32_pass(baseline: torch.Tensor, candidate: torch.Tensor, rtol: float, atol: float) -> tuple[int, float, float]:
    """The fused pass's element-wise quantities, in torch ops alone on whole float32 tensors:
    the outside count, max_abs and max_rel as the pass computed them before it counted with
    numpy (they do not depend on the chunking, so a chunked pass must equal them exactly)."""
    d = (candidate - baseline).abs()
    absb = baseline.abs()
    outside = int(torch.count_nonzero(torch.gt(torch.add(d, absb, alpha=-rtol), atol)))
    max_rel = float(torch.max(d / absb.clamp_min(torch.finfo(torch.float32).tiny)))
    return outside, float(torch.max(d)), max_rel


@pytest.mark.parametrize("atol", [1e-5, 1.0000000204e-05, 0.0])  # 1.0000000204e-05 rounds up in float32
def test_outside_count_at_the_tolerance_boundary_equals_torch(tmp_path: Path, atol: float) -> None:
    """Differences on the float32 value of atol and its neighbours where the baseline is zero
    (so that ``|c - b| - rtol |b|`` is exactly that value), beside subnormal and ordinary
    baselines: the count from files equals torch's count exactly."""
    generator = torch.Generator().manual_seed(3)
    base = torch.randn(20_000, generator=generator)
    base[::11] = 1e-40
    cand = base + 1e-4 * torch.randn(20_000, generator=generator)
    near = torch.tensor(atol, dtype=torch.float32)
    planted = torch.stack([torch.nextafter(near, torch.tensor(-1.0)), near, torch.nextafter(near, torch.tensor(1.0))])
    base[::7] = 0.0
    cand[::7] = planted[torch.arange(0, 20_000, 7) % 3]
    rtol = 1e-3
    with PairComparer(chunk_elements=3001) as comparer:
        got = comparer.compare_files(stored(tmp_path, "b", base), stored(tmp_path, "c", cand), Tolerance(rtol, atol))
    assert (got.outside, got.max_abs, got.max_rel) == float32_pass(base, cand, rtol, atol)


def test_read_ahead_depth_does_not_change_a_metric(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(4)
    base = torch.randn(50_001, generator=generator)
    cand = base * (1 + 1e-3 * torch.randn(50_001, generator=generator))
    cand[12_345] += 0.5
    b, c = stored(tmp_path, "b", base), stored(tmp_path, "c", cand)
    results = []
    for depth in (2, 3, 4, 9):
        with PairComparer(chunk_elements=4096, read_ahead=depth) as comparer:  # 13 chunks
            results.append(comparer.compare_files(b, c, Tolerance(1e-2, 1e-5)))
    assert all(result == results[0] for result in results)
    assert results[0].worst_index == (12_345,) and results[0].outside == 1


def test_a_truncated_file_fails_with_reads_in_flight(tmp_path: Path) -> None:
    """A file cut short under the reader: an InputError, and the comparer still works."""
    from glmfb.contract.errors import InputError

    base = torch.randn(40_000)
    b, c = stored(tmp_path, "b", base), stored(tmp_path, "c", base + 1e-3)
    with open(c.path, "r+b") as handle:
        handle.truncate(c.offset + c.nbytes // 2)
    with PairComparer(chunk_elements=1000, read_ahead=4) as comparer:
        with pytest.raises(InputError, match="truncated"):
            comparer.compare_files(b, c, Tolerance(1e-2, 1e-5))
        again = comparer.compare_files(b, b, Tolerance(1e-2, 1e-5))
    assert again.max_abs == 0.0
