"""Loading and timing kernels: factories, input sets, NaN checks, ABBA blocks, timers."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from glmfb.bench.allocations import (
    Blocks,
    calibrate_each,
    calls_per_sample,
    kernel_name,
    load_side,
    measure_single,
    plan_pairs,
    prepare_pairs,
    warm_up,
)
from glmfb.bench.timers import CpuTimer, Kernel, Loop, first_nonfinite, make_timer
from glmfb.contract.errors import TargetFailed
from glmfb.core.measure import Settings, compare
from glmfb.core.measure.simulate import FakeClock
from glmfb.core.measure.stats import Decision
from glmfb.core.targets import Target, resolve

HERE = __file__
SEEDS: list[int] = []


def seeded_factory(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> Any:
    SEEDS.append(seed)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale

    def kernel() -> torch.Tensor:
        return x * 2

    kernel.flops_per_call = x.numel()  # type: ignore[attr-defined]
    return kernel


def rows_factory(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> Any:
    """The same ops on ``scale`` times the rows (issue 53's size of a slowdown)."""
    x = torch.randn((round(shape[0] * scale), *shape[1:]), generator=torch.Generator().manual_seed(seed))
    return lambda: (x * 2 + 1).sum()


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


def test_pairs_run_in_abba_blocks_far_above_timer_resolution() -> None:
    timer = CpuTimer()
    setup = prepare_pairs(timer, Target(f"{HERE}:seeded_factory"), Target(f"{HERE}:seeded_factory"),
                          (64, 256), input_sets=2, sample_s=5e-4, budget_s=0.4)
    assert setup.plan.ab_pairs >= 6 and setup.plan.aa_pairs >= 2
    comparison = compare(setup.pairs, Settings(threshold=0.5, budget_s=0.4, seed=3), time.perf_counter)
    by_pair: dict[int, list[str]] = {}
    for sample in comparison.samples:
        by_pair.setdefault(sample.pair, []).append("A" if (sample.label == "baseline" and sample.kind == "ab")
                                                   or (sample.allocation % 2 == 0 and sample.kind == "aa") else "B")
    for letters in by_pair.values():
        assert {"".join(letters[i:i + 4]) for i in range(0, len(letters) - 3, 4)} <= {"ABBA", "BAAB"}
    resolution = CpuTimer().describe()["resolution_s"]
    assert all(s.value_s * setup.calls_per_sample > 100 * resolution for s in comparison.samples)
    blocks = Blocks.of(comparison)
    assert len(blocks) == comparison.blocks
    assert set(blocks.allocations_of("candidate")) == set(range(setup.plan.ab_pairs))


def test_each_side_gets_its_own_calls_per_sample_in_whole_rotations() -> None:
    """A candidate doing 4x the work gets about a quarter of the baseline's calls per sample, so
    both sides' samples last about as long: with equal calls its samples lasted 4x as long, and
    host load covering both samples of its BB in an ABBA block inflated the change. Each sample
    is whole rotations over the input sets."""
    from glmfb.bench.heap import pin_heap

    pin_heap()  # as the engine does: unpinned, the temporaries' page faults decide the calls
    timer = CpuTimer()
    base = load_side("baseline", Target(f"{HERE}:rows_factory"), (256, 1024), 2)
    cand = load_side("candidate", Target(f"{HERE}:rows_factory", {"scale": 4.0}), (256, 1024), 2)
    for side in (base, cand):
        warm_up(side)
    calls = calibrate_each(timer, [base, cand], 2e-3)
    assert 2.0 <= calls["baseline"] / calls["candidate"] <= 8.0, calls
    # whole rotations: the faster of two samples must not pick the luckier input set
    assert calls["baseline"] % 2 == 0 and calls["candidate"] % 2 == 0, calls
    setup = prepare_pairs(timer, Target(f"{HERE}:rows_factory"), Target(f"{HERE}:rows_factory", {"scale": 4.0}),
                          (256, 1024), input_sets=2, sample_s=2e-3, budget_s=0.4, max_pairs=6)
    assert setup.calls_per_sample > setup.candidate_calls_per_sample >= 1
    assert setup.calls_per_sample % 2 == 0 and setup.candidate_calls_per_sample % 2 == 0
    hot = prepare_pairs(timer, Target(f"{HERE}:rows_factory"), Target(f"{HERE}:rows_factory", {"scale": 4.0}),
                        (256, 1024), input_sets=1, sample_s=2e-3, budget_s=0.4, max_pairs=2, min_pairs=2,
                        with_aa=False)
    assert hot.calls_per_sample > hot.candidate_calls_per_sample >= 1


def test_pinned_heap_lets_temporaries_reuse_memory() -> None:
    """glibc's malloc mmaps (or trims back) blocks of a kernel's temporaries, so some calls fault
    their pages in again, depending on the heap's state; pinned, a warm kernel faults none."""
    import resource

    from glmfb.bench.heap import pin_heap

    done = pin_heap()
    if not done.startswith("glibc"):
        pytest.skip(f"the heap is {done}")
    assert pin_heap() == done  # once per process
    x = torch.randn(512, 1024)  # 2 MiB; each call makes three temporaries of its size
    for _ in range(5):
        ((x * 2) + x).sum()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        ((x * 2) + x).sum()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 50  # not 3 x 512 pages a call


def test_plan_pairs_by_budget_memory_and_setup() -> None:
    assert plan_pairs(10.0, 0.004).ab_pairs == 24  # small kernel: the maximum
    slow = plan_pairs(10.0, 0.2)  # 50 ms calls: the minimum, 6 pairs
    assert (slow.ab_pairs, slow.aa_pairs, slow.limited_by) == (6, 2, "budget")
    tight = plan_pairs(10.0, 0.004, bytes_per_pair=2**30, available_bytes=16 * 2**30)
    assert tight.ab_pairs == 3 and tight.limited_by == "memory"
    costly = plan_pairs(10.0, 0.004, setup_s_per_pair=0.5)
    assert costly.ab_pairs == 4 and costly.limited_by == "setup"


class ScriptedTimer:
    """Times nothing: a loop "takes" the sum of its kernels' ``cost_s`` (with 1% jitter), and
    the fake clock moves by that much."""

    device = "cpu"

    def __init__(self, clock: FakeClock, seed: int = 0) -> None:
        self.clock = clock
        self.rng = random.Random(seed)

    def prepare(self, kernels: Sequence[Kernel], calls: int) -> Loop:
        order = [kernels[i % len(kernels)] for i in range(calls)]

        def run() -> Any:
            return order[-1]()

        run.cost_s = sum(k.cost_s for k in order)  # type: ignore[attr-defined]
        return Loop(calls, run)

    def measure(self, loop: Loop) -> tuple[float, Any]:
        elapsed = loop.run.cost_s * math.exp(self.rng.gauss(0.0, 0.01))  # type: ignore[attr-defined]
        self.clock.advance(elapsed)
        return elapsed, loop.run()

    def describe(self) -> dict[str, Any]:
        return {"timer": "scripted"}


LUCK = random.Random(11)


def scripted_factory(shape: tuple[int, ...], slowdown: float = 0.0, luck: float = 0.0, seed: int = 0) -> Any:
    """A kernel that does nothing and *costs* 100 µs, times an allocation's luck."""
    SEEDS.append(seed)

    def kernel() -> None:
        return None

    kernel.cost_s = 100e-6 * (1 + slowdown) * math.exp(LUCK.gauss(0.0, luck))  # type: ignore[attr-defined]
    return kernel


def scripted(candidate_args: dict[str, Any], baseline_args: dict[str, Any] | None = None,
             threshold: float = 0.05) -> Any:
    clock = FakeClock()
    timer = ScriptedTimer(clock)
    setup = prepare_pairs(timer, Target(f"{HERE}:scripted_factory", baseline_args or {}),
                          Target(f"{HERE}:scripted_factory", candidate_args), (8,), input_sets=2,
                          sample_s=1e-3, budget_s=5.0, clock=clock)
    return setup, compare(setup.pairs, Settings(threshold=threshold, budget_s=5.0), clock)


def test_scripted_bench_decisions_and_seeds() -> None:
    target_seeds().clear()
    setup, slower = scripted({"slowdown": 0.10})
    assert slower.decision is Decision.REGRESSION
    seeds = target_seeds()
    # pair j: both sides get seeds 2j, 2j+1; each A/A pair two allocations with the same seeds
    assert seeds[:4] == [0, 1, 0, 1]
    assert seeds.count(2) == 2 and seeds.count(2 * setup.plan.ab_pairs) == 2
    _, same = scripted({})
    assert same.decision is Decision.EQUIVALENT


def test_scripted_allocation_luck_is_not_called_a_regression() -> None:
    """Allocations that differ by ~3% (sd): the old one-allocation-a-side design read such
    luck as tight effects; over independent pairs it widens the interval instead."""
    outcomes = [scripted({"luck": 0.03}, {"luck": 0.03}, threshold=0.02)[1].decision for _ in range(5)]
    assert Decision.REGRESSION not in outcomes and Decision.IMPROVEMENT not in outcomes


def test_measure_single_rotates_allocations() -> None:
    clock = FakeClock()
    single = measure_single(ScriptedTimer(clock), Target(f"{HERE}:scripted_factory"), (8,), input_sets=1,
                            sample_s=1e-3, budget_s=0.1, allocations=3, clock=clock)
    assert set(single.allocations) == {0, 1, 2} and len(single.values) == len(single.allocations)
    assert single.allocations[:3] == [0, 1, 2]


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
    from glmfb.contract.verdict import Status

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
