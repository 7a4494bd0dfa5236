"""Which cache regime a bench figure is for (issue 37, item 5).

A candidate doing twice the work of its baseline reads +60% to +79% on the 2-core development
VM with 4 rotated input sets of 16 MiB (64 MiB, beyond its 32 MiB last-level cache) and +87% to
+98% with one set reused, hot in cache (torch.utils.benchmark's regime): both are right for
their regime. So every verdict states its regime, and a pair's hot check gives the hot figure where
it differs. The rules' wording, the cache and footprint readers and the rotation are tested
here without timing; the end-to-end tests (``slow``) time real kernels and assert only what
stands far above noise.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from glmfb.bench.config import BenchConfig
from glmfb.bench.evidence import CacheRegime, Measurement
from glmfb.bench.footprint import Footprint, input_footprint
from glmfb.bench.rules import RULES, BenchFindings, HotFigure, ShapeOutcome, hot_differs, pct
from glmfb.bench.timers import CpuTimer
from glmfb.contract.options import options_of
from glmfb.contract.verdict import Status, Verdict
from glmfb.core.measure.cache import (
    COLD,
    HOT,
    UNKNOWN,
    WARM,
    CacheSize,
    _from_lscpu,
    _from_sysfs,
    last_level_cache,
    regime_of,
)
from glmfb.core.rules import diagnose
from glmfb.core.targets import Target

HERE = __file__
MiB = 1 << 20
L3 = CacheSize(32 * MiB, "L3", "/sys/devices/system/cpu/cpu0/cache/index3/size")


# --------------------------------------------------------------------------------------------
# The kernels: one reduction, and the same reduction twice (twice the work, same inputs)
# --------------------------------------------------------------------------------------------


def sum_rows(shape: tuple[int, ...], times: int = 1, seed: int = 0) -> Any:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))

    def kernel() -> torch.Tensor:
        result = x.sum(0)
        for _ in range(times - 1):
            result = x.sum(0)
        return result

    return kernel


# --------------------------------------------------------------------------------------------
# The cache size and the regime, in words
# --------------------------------------------------------------------------------------------


def test_the_last_level_cache_is_read_from_sysfs_or_lscpu(tmp_path: Path) -> None:
    for index, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                                                 (3, "Unified", "32768K")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")
    assert _from_sysfs(tmp_path) == CacheSize(32 * MiB, "L3", str(tmp_path / "index3" / "size"))
    assert _from_sysfs(tmp_path / "missing") is None
    lscpu = ("L1d cache:                               64 KiB (2 instances)\n"
             "L1i cache:                               64 KiB (2 instances)\n"
             "L2 cache:                                2 MiB (2 instances)\n"
             "L3 cache:                                64 MiB (2 instances)\n")
    assert _from_lscpu(lscpu) == CacheSize(32 * MiB, "L3", "lscpu")  # one instance's size
    assert _from_lscpu("Model name: AMD EPYC\n") is None
    found = last_level_cache()
    assert found is None or found.bytes > 0


def test_the_regime_is_named_from_the_input_sets_their_bytes_and_the_cache() -> None:
    cold = regime_of(4, 16 * MiB, 64 * MiB, L3)
    assert cold.name == COLD
    assert cold.clause() == "inputs cold in cache (4 rotated input sets, 64 MiB in all, beyond the 32 MiB last-level cache)"
    assert cold.hot_differs_by_construction
    warm = regime_of(4, 256 << 10, 1 * MiB, L3)
    assert warm.name == WARM
    assert warm.clause() == "inputs warm in cache (the 4 rotated input sets, 1 MiB in all, fit in the 32 MiB last-level cache)"
    hot = regime_of(1, 4 * MiB, 4 * MiB, L3)
    assert hot.name == HOT and not hot.hot_differs_by_construction  # it already reused one set
    assert hot.clause() == "inputs hot in cache (one input set of 4 MiB, reused, fits in the 32 MiB last-level cache)"
    huge = regime_of(4, 64 * MiB, 256 * MiB, L3)
    assert huge.name == COLD and not huge.hot_differs_by_construction  # one set alone comes from memory
    unknown = regime_of(4, None, None, L3)
    assert unknown.name == UNKNOWN and unknown.hot_differs_by_construction
    assert unknown.clause() == "4 rotated input sets of a size not measured (the cache regime is unknown)"
    no_cache = regime_of(4, MiB, 4 * MiB, None)
    assert no_cache.name == UNKNOWN and "could not be read" in no_cache.clause()


def test_the_footprint_counts_each_storage_the_kernel_holds_once() -> None:
    weight = torch.ones(1024)  # 4 KiB, shared by every input set

    def factory() -> Any:
        x = torch.zeros(256, 1024)  # 1 MiB each
        view = x[:, :512]  # a view: no bytes of its own

        def kernel() -> Any:
            return (view * weight[:512]).sum() + x.sum()

        return kernel

    footprint = input_footprint([factory() for _ in range(4)])
    assert footprint is not None and footprint.source == "tensors the kernel holds"
    assert footprint.total_bytes == 4 * MiB + 4096
    assert footprint.set_bytes == MiB + 4096
    assert input_footprint([lambda: None], grown_bytes=8 * MiB) == Footprint(8 * MiB, 8 * MiB, "resident-memory growth")
    assert input_footprint([lambda: None]) is None


def test_a_timed_loop_goes_on_with_the_set_after_the_one_the_last_loop_ended_on() -> None:
    """With one call a sample, restarting at set 0 would time set 0 only: no rotation at all
    (the cache regime of the samples then depended on what ran before each)."""
    called: list[int] = []
    kernels = [lambda i=i: called.append(i) for i in range(4)]
    timer = CpuTimer()
    one = timer.prepare(kernels, 1)
    for _ in range(8):
        timer.measure(one)
    assert called == [0, 1, 2, 3, 0, 1, 2, 3]
    called.clear()
    three = timer.prepare(kernels, 3)
    for _ in range(4):
        timer.measure(three)
    assert sorted(called) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    called.clear()
    warm = timer.prepare(kernels[:1], 2, warm=2)  # the hot check: 2 untimed calls, then 2 timed
    timer.measure(warm)
    assert called == [0, 0, 0, 0]


def test_the_hot_checks_pairs_are_not_cut_by_loading_time_and_have_no_aa_pairs() -> None:
    from glmfb.bench.allocations import plan_pairs

    cut = plan_pairs(0.6, 0.01, setup_s_per_pair=0.2, min_pairs=4, max_pairs=4)
    assert cut.ab_pairs == 2 and cut.limited_by == "setup" and cut.aa_pairs == 2
    hot = plan_pairs(0.6, 0.01, setup_s_per_pair=0.2, min_pairs=4, max_pairs=4, with_aa=False, limit_setup=False)
    assert (hot.ab_pairs, hot.aa_pairs) == (4, 0)


# --------------------------------------------------------------------------------------------
# The why: the regime once, and the hot figure only where it differs
# --------------------------------------------------------------------------------------------

REGIME = "inputs cold in cache (4 rotated input sets, 64 MiB in all, beyond the 32 MiB last-level cache)"


def findings(decision: str, change: float, low: float, high: float, hot: HotFigure | None = None,
             **kwargs: Any) -> BenchFindings:
    shape = ShapeOutcome(shape="1024x4096", decision=decision, change=change, low=low, high=high, blocks=40,
                         needed_blocks=400.0 if decision == "undecided" else None, blocks_per_s=20.0)
    fields: dict[str, Any] = dict(baseline="sum_once", candidate="sum_twice", threshold=0.05, budget_s=10.0,
                                  shapes=(shape,), geomean=change, geomean_low=low, geomean_high=high,
                                  focus=shape.shape, regime=REGIME, hot=hot)
    fields.update(kwargs)
    return BenchFindings(**fields)


def why(f: BenchFindings) -> tuple[str, Status]:
    outcome = diagnose(RULES, f)
    return outcome.diagnosis.why, outcome.diagnosis.status


def test_hot_differs_needs_apart_intervals_and_more_than_the_threshold_between_the_changes() -> None:
    assert hot_differs((0.494, 0.486, 0.502), (0.98, 0.95, 1.01), 0.05)  # the figures
    assert not hot_differs((0.0, -0.02, 0.02), (0.01, -0.05, 0.07), 0.05)  # a twin
    assert not hot_differs((0.49, 0.48, 0.50), (0.52, 0.515, 0.525), 0.05)  # apart, but by less than 5%
    assert not hot_differs((0.70, 0.43, 0.93), (0.875, 0.755, 1.003), 0.05)  # 17 points, but overlapping


def test_the_why_states_the_regime_once_and_the_hot_figure_beside_the_main_one_where_it_differs() -> None:
    text, status = why(findings("regression", 0.494, 0.486, 0.502, HotFigure(0.98, 0.95, 1.01, differs=True)))
    assert status is Status.FAIL  # the main measurement decides
    assert text.count(REGIME) == 1 and text.count("hot in cache") == 1
    assert f"Measured with {REGIME}, it reads +49.4%; with one input set reused, hot in cache, +98.0% [+95.0, +101.0]: " \
           "the candidate's extra work is compute" in text

    text, _ = why(findings("regression", 0.494, 0.486, 0.502, HotFigure(0.50, 0.47, 0.53, differs=False)))
    assert f"Measured with {REGIME}." in text and "hot in cache," not in text and text.count("in cache") == 1

    # The other way round: the candidate's extra time is memory traffic that a hot cache avoids.
    text, _ = why(findings("regression", 0.60, 0.55, 0.65, HotFigure(0.10, 0.08, 0.12, differs=True)))
    assert "hot in cache, +10.0% [+8.0, +12.0]: the candidate's extra time is memory traffic" in text
    text, status = why(findings("improvement", -0.40, -0.45, -0.35, HotFigure(-0.10, -0.12, -0.08, differs=True)))
    assert status is Status.PASS and "the time the candidate saves is memory traffic" in text
    text, _ = why(findings("regression", 0.20, 0.15, 0.25, HotFigure(-0.20, -0.25, -0.15, differs=True)))
    assert "which kernel is faster depends on whether its inputs come from memory or stay in cache" in text


@pytest.mark.parametrize("decision", ["equivalent", "undecided", "too-few-blocks"])
def test_every_pair_verdict_states_its_regime(decision: str) -> None:
    change = {"equivalent": 0.001, "undecided": 0.05}.get(decision)
    f = findings(decision, change, change - 0.01, change + 0.01) if change is not None else BenchFindings(
        baseline="a", candidate="b", threshold=0.05, budget_s=0.1, shapes=(ShapeOutcome("8x8", decision),),
        focus="8x8", regime=REGIME)
    text, _ = why(f)
    assert text.count(f"Measured with {REGIME}.") == 1, text


def test_hot_check_is_an_option_of_toml_cli_and_agents() -> None:
    spec = next(o for o in options_of(BenchConfig) if o.attr == "hot_check")
    assert spec.key == "hot_check" and spec.flag == "--hot-check" and spec.default is True
    config = BenchConfig("b", Target("a.py:f"), Target("a.py:g"), shapes=((8,),), hot_check=False)
    assert config.hot_check is False


# --------------------------------------------------------------------------------------------
# End to end, on real kernels (timing: slow)
# --------------------------------------------------------------------------------------------


def cold_shape() -> tuple[int, int]:
    """float32 rows of 4096 columns, one input set half the last-level cache: the 4 rotated
    sets exceed it twice over, one set fits (16 MiB sets here, 1024x4096)."""
    cache = last_level_cache()
    if cache is None:
        pytest.skip("the last-level cache size cannot be read here")
    if cache.bytes > 128 * MiB:
        pytest.skip(f"a {cache.bytes // MiB} MiB last-level cache needs input sets too large for a quick test")
    return (max(64, cache.bytes // 2 // (4096 * 4)), 4096)


def run_bench(config: BenchConfig) -> Verdict:
    from helpers import run

    return run("bench", config, Path(tempfile.mkdtemp(prefix="glmfb-regime-")))


def pair(times: int, shape: tuple[int, ...], **options: Any) -> BenchConfig:
    options.setdefault("budget_s", 3.0)
    return BenchConfig(name="regime", baseline=Target(f"{HERE}:sum_rows"),
                       candidate=Target(f"{HERE}:sum_rows", {"times": times}), shapes=(shape,), profile=False,
                       **options)


def regime_of_verdict(verdict: Verdict) -> CacheRegime:
    found = verdict.find(CacheRegime)
    assert found is not None, verdict.evidence
    return found


@pytest.mark.slow
def test_twice_the_work_states_the_cold_regime_and_the_hot_figure_where_it_differs() -> None:
    """Measured on the development VM (32 MiB L3, 1024x4096, this test's budget of 3 s, 9 runs):
    cold +60% to +75%, hot +88% to +98%, the hot change 1.2 to 1.6 times the cold one, the hot
    figure in the why in 3 of the last 4 (docs/bench.md). The ratio is not far enough above the
    noise of a 3 s run to assert; asserted: the regime, both changes far from the threshold, and
    that the why gives the hot figure exactly when the evidence says it differs."""
    verdict = run_bench(pair(2, cold_shape()))
    assert verdict.status is Status.FAIL, verdict.why
    regime = regime_of_verdict(verdict)
    assert regime.regime == COLD and regime.input_sets == 4
    assert regime.total_bytes is not None and regime.cache_bytes is not None and regime.total_bytes > regime.cache_bytes
    assert verdict.why.count("Measured with inputs cold in cache (4 rotated input sets,") == 1
    assert regime.hot_check == "measured" and regime.hot_change is not None and regime.hot_ci is not None
    assert regime.hot_change > 0.5  # twice the work on inputs hot in cache: far from the threshold
    assert verdict.metric is not None and verdict.metric.value is not None and verdict.metric.value > 0.3
    assert regime.main_ci is not None and regime.hot_differs is not None
    if regime.hot_differs:
        assert f"it reads {pct(verdict.metric.value)}; with one input set reused, hot in cache, " \
               f"{pct(regime.hot_change)}" in verdict.why
    else:
        assert "hot in cache," not in verdict.why


@pytest.mark.slow
def test_a_twin_states_its_regime_and_claims_no_hot_difference() -> None:
    verdict = run_bench(pair(1, cold_shape()))
    assert verdict.status is not Status.FAIL, verdict.why
    regime = regime_of_verdict(verdict)
    assert regime.regime == COLD and regime.hot_check == "measured"
    assert regime.hot_change is not None and abs(regime.hot_change) < 0.25
    assert regime.hot_differs is False
    assert verdict.why.count("Measured with inputs cold in cache") == 1 and "hot in cache," not in verdict.why


@pytest.mark.slow
def test_no_hot_check_and_one_target_alone_state_the_regime_without_a_hot_check() -> None:
    if last_level_cache() is None:
        pytest.skip("the last-level cache size cannot be read here")
    verdict = run_bench(pair(1, (64, 1024), budget_s=1.0, hot_check=False))
    regime = regime_of_verdict(verdict)
    assert regime.regime == WARM and regime.hot_check == "off (hot_check = false)" and regime.hot_change is None
    assert "Measured with inputs warm in cache (the 4 rotated input sets, 1 MiB in all, fit in the" in verdict.why

    alone = run_bench(BenchConfig(name="alone", baseline=Target(f"{HERE}:sum_rows"), shapes=((64, 1024),),
                                  budget_s=0.5))
    assert alone.find(Measurement) is not None
    regime = regime_of_verdict(alone)
    assert regime.regime == WARM and regime.hot_check is None
    assert "alone (nothing compared) with inputs warm in cache (the 4 rotated input sets, 1 MiB in all" in alone.why
