"""Loading and timing kernels: factories, input sets, NaN checks, ABBA blocks, timers."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import torch

from glmfb.bench.runner import (
    Blocks,
    InterleavedRunner,
    calibrate,
    calls_per_sample,
    kernel_name,
    load_side,
    warm_up,
)
from glmfb.bench.timers import CpuTimer, first_nonfinite, make_timer
from glmfb.errors import TargetFailed
from glmfb.targets import Target, resolve

HERE = __file__
SEEDS: list[int] = []


def seeded_factory(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> Any:
    SEEDS.append(seed)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale

    def kernel() -> torch.Tensor:
        return x * 2

    kernel.flops_per_call = x.numel()  # type: ignore[attr-defined]
    return kernel


def raising_factory(shape: tuple[int, ...]) -> Any:
    raise ValueError("no such head size")


def non_callable_factory(shape: tuple[int, ...]) -> Any:
    return 42


def nan_on_third_call(shape: tuple[int, ...]) -> Any:
    calls = {"n": 0}
    x = torch.ones(shape)

    def kernel() -> torch.Tensor:
        calls["n"] += 1
        return x * math.nan if calls["n"] == 3 else x * 1

    return kernel


def target_seeds() -> list[int]:
    """SEEDS as seen by the module glmfb imported the target from (a separate import)."""
    seeds: list[int] = resolve(f"{HERE}:seeded_factory").__globals__["SEEDS"]
    return seeds


def test_input_sets_get_distinct_seeds_and_declared_work() -> None:
    target_seeds().clear()
    side = load_side("baseline", Target(f"{HERE}:seeded_factory"), (4, 8), 3)
    assert target_seeds() == [0, 1, 2]
    assert len(side.kernels) == 3
    assert side.flops_per_call == 32.0
    assert side.bytes_per_call is None
    assert side.kernel_name == "seeded_factory"


def test_user_seed_is_not_overridden() -> None:
    target_seeds().clear()
    load_side("baseline", Target(f"{HERE}:seeded_factory", {"seed": 7}), (2,), 2)
    assert target_seeds() == [7, 7]


def test_factory_that_raises_is_a_target_failure() -> None:
    with pytest.raises(TargetFailed, match=r"raised ValueError: no such head size in its factory .* for shape 4x8"):
        load_side("baseline", Target(f"{HERE}:raising_factory"), (4, 8), 1)


def test_non_callable_is_a_target_failure() -> None:
    with pytest.raises(TargetFailed, match="returned a int, not a zero-argument callable"):
        load_side("candidate", Target(f"{HERE}:non_callable_factory"), (4,), 1)


def test_nan_on_one_call_is_caught_in_warm_up() -> None:
    side = load_side("candidate", Target(f"{HERE}:nan_on_third_call"), (4,), 1)
    with pytest.raises(TargetFailed, match=r"NaN or Inf in result; .* on warm-up call 3"):
        warm_up(side)


def test_first_nonfinite_walks_containers() -> None:
    assert first_nonfinite(torch.ones(3)) is None
    assert first_nonfinite((torch.ones(2), {"a": torch.tensor([1.0, math.inf])})) == "result[1]['a']"
    assert first_nonfinite(math.nan) == "result"
    assert first_nonfinite(torch.ones(2, dtype=torch.int64)) is None
    assert first_nonfinite(None) is None


def test_calls_per_sample() -> None:
    assert calls_per_sample(1e-4, 1e-3) == 10
    assert calls_per_sample(5e-3, 1e-3) == 1
    assert calls_per_sample(0.0, 1e-3) == 1_000_000


def test_abba_blocks_are_balanced_and_sample_far_above_resolution() -> None:
    side_a = load_side("baseline", Target(f"{HERE}:seeded_factory"), (64, 256), 2)
    side_b = load_side("candidate", Target(f"{HERE}:seeded_factory"), (64, 256), 2)
    timer = CpuTimer()
    calls = calibrate(timer, [side_a, side_b], 5e-4)
    assert calls >= 1
    loops = {"baseline": timer.prepare(side_a.kernels, calls), "candidate": timer.prepare(side_b.kernels, calls)}
    blocks = Blocks()
    InterleavedRunner(timer, loops, {"baseline": side_a, "candidate": side_b}, seed=3).run(
        blocks, 10, time.perf_counter() + 30
    )
    assert len(blocks) == 10
    patterns = ["".join("A" if label == "baseline" else "B" for label, _ in blocks.raw[i:i + 4])
                for i in range(0, 40, 4)]
    assert set(patterns) <= {"ABBA", "BAAB"}
    assert patterns.count("ABBA") == patterns.count("BAAB") == 5
    assert all(value * calls > 100 * CpuTimer().describe()["resolution_s"] for _, value in blocks.raw)


def test_make_timer_on_cpu() -> None:
    assert make_timer("cpu").device == "cpu"
    if not torch.cuda.is_available():
        assert make_timer("auto").device == "cpu"
        with pytest.raises(RuntimeError, match="no CUDA device"):
            make_timer("cuda")


def test_kernel_name() -> None:
    assert kernel_name("scenarios/x/k.py:gated_norm_tiled") == "gated_norm_tiled"
    assert kernel_name("pkg.mod:Class.make") == "Class.make"


@pytest.mark.gpu
def test_cuda_timer_events_flush_and_graph() -> None:
    from glmfb.bench.timers import CudaTimer

    x = torch.randn(1024, 1024, device="cuda")

    def kernel() -> torch.Tensor:
        return x * 2

    for use_graph in (False, True):
        timer = CudaTimer(use_graph=use_graph)
        loop = timer.prepare([kernel], 10)
        elapsed, result = timer.measure(loop)
        assert elapsed > 0 and result.shape == x.shape
        assert timer.describe()["l2_flush_bytes"] >= 32 * 2**20


def test_result_device() -> None:
    from glmfb.bench.timers import result_device

    assert result_device(torch.ones(2)) == "cpu"
    assert result_device(None) is None
    assert result_device((1, {"a": torch.ones(1)})) == "cpu"


@pytest.mark.gpu
def test_gpu_end_to_end_tiled_vs_fused_on_cuda() -> None:
    from pathlib import Path

    from helpers import run

    from glmfb.bench.config import BenchConfig
    from glmfb.bench.evidence import BenchHarness
    from glmfb.verdict import Status

    kernels = str(Path(__file__).resolve().parents[1] / "scenarios" / "decode_norm" / "kernels.py")
    for cuda_graph in (False, True):
        verdict = run("bench", BenchConfig(
            name="gpu", baseline=Target(f"{kernels}:gated_norm_fused", {"device": "cuda"}),
            candidate=Target(f"{kernels}:gated_norm_tiled", {"device": "cuda"}),
            shapes=((64, 4096),), budget_s=3.0, cuda_graph=cuda_graph,
        ), Path(f"/tmp/glmfb-gpu-{cuda_graph}"))
        assert verdict.status is Status.FAIL, verdict.why
        harness = verdict.find(BenchHarness)
        assert harness is not None and harness.timer == "cuda-events" and harness.cuda_graph is cuda_graph
