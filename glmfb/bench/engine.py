"""The bench engine: measure, decide, explain, and answer with a Verdict.

:func:`run_bench` compares two kernel factories in one process (or measures one target for
``--save``); :func:`compare_saved` compares two saved result files. A factory or kernel that
raises, returns a non-callable or NaN raises :class:`~glmfb.contract.errors.TargetFailed`, which the
host turns into an error verdict. The statistics decide per shape; the rules in
:mod:`glmfb.bench.rules` turn that and the operator diff into the verdict's status and why.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from glmfb.bench.allocations import (
    Blocks,
    Side,
    call_checked,
    load_side,
    measure_single,
    prepare_pairs,
    warm_up,
)
from glmfb.bench.config import BenchConfig, kernel_name
from glmfb.bench.decision import (
    LOOK_CONFIDENCE,
    STATISTIC,
    Change,
    aa_biased,
    change_from_interval,
    combine,
    decide_with_floor,
    pairs_needed,
    samples_needed,
)
from glmfb.bench.evidence import (
    BenchHarness,
    BenchSummary,
    CacheRegime,
    Measurement,
    OpDiff,
    Placement,
    ProcessFloorEvidence,
    Roofline,
    SavedComparison,
    ShapeChange,
    quantiles_of,
)
from glmfb.bench.footprint import Footprint, input_footprint, larger
from glmfb.bench.heap import pin_heap
from glmfb.bench.rules import RULES, BenchFindings, HotFigure, ShapeOutcome, hot_differs
from glmfb.contract.errors import InputError, UsageError
from glmfb.contract.evidence import EnvDifferences, Evidence
from glmfb.contract.step import Intent, Step
from glmfb.contract.units import format_shape
from glmfb.contract.verdict import Layer, Metric, Status, Verdict
from glmfb.core.commandline import rerun_step
from glmfb.core.env import differences, fingerprint
from glmfb.core.measure.cache import CacheSize, Regime, last_level_cache, regime_of
from glmfb.core.measure.hostload import HostLoadMeter, busy_note
from glmfb.core.measure.intervals import processes_interval, time_interval
from glmfb.core.measure.stats import Decision, Estimate
from glmfb.core.probe import ProbeContext
from glmfb.core.rules import diagnose
from glmfb.core.targets import side_labels, target_labels

MIN_BLOCKS = 4  # blocks a comparison needs at least (2 allocation pairs, 2 blocks each)
# The hot check of a pair's focus shape (one input set reused, inputs hot in cache), on top of
# the budget: a fifth of it and at most HOT_MAX_S (a budget is a ceiling: a large one given to
# decide a small change does not make the check longer), over HOT_PAIRS allocation pairs, at
# least HOT_MIN_ROUNDS rounds whatever the budget (8 ABBA blocks: 16 samples a side). Each sample lasts HOT_SAMPLE_FACTOR
# times --sample-ms and comes after HOT_WARM_CALLS untimed calls on its input set: one pass
# over a 16 MiB set does not leave it in a 32 MiB cache (a kernel reading it took 1.24 ms after
# one pass, 0.93 ms after two or more, as a loop that only reuses it reads).
HOT_SHARE = 0.2
HOT_MAX_S = 2.0
HOT_PAIRS = 4
HOT_MIN_ROUNDS = 2
HOT_SAMPLE_FACTOR = 4
HOT_WARM_CALLS = 2


@dataclass
class ShapeResult:
    """Everything measured for one shape."""

    shape: str
    calls_per_sample: int
    blocks: Blocks
    change: Change | None
    decision: Decision
    aa: Change | None
    floor: float
    looks: int
    baseline_median_s: float
    candidate_median_s: float
    declared: dict[str, dict[str, float | None]] = field(default_factory=dict)
    measuring_s: float = 0.0  # allocating the pairs and measuring them, what the budget counts
    extra: dict[str, Any] = field(default_factory=dict)  # how the shape was measured (ShapeChange fields)
    regime: Regime | None = None  # the cache regime its inputs were in

    @property
    def ratio_of_medians(self) -> float:
        return self.candidate_median_s / self.baseline_median_s - 1.0


def _pct(value: float) -> str:
    return f"{value * 100:+.1f}%"


def _ci(low: float, high: float) -> str:
    return f"[{low * 100:+.1f}, {high * 100:+.1f}]"


# --------------------------------------------------------------------------------------------
# In-process comparison
# --------------------------------------------------------------------------------------------


def run_bench(config: BenchConfig, ctx: ProbeContext) -> Verdict:
    """Measure per :class:`BenchConfig` and return the verdict (see the module docstring)."""
    import torch

    started = ctx.clock.monotonic()
    threads_before = torch.get_num_threads()
    try:
        if config.torch_threads is not None:
            torch.set_num_threads(config.torch_threads)
        env = fingerprint()
        timer = _pick_timer(config)
        env["device"] = timer.device if timer.device == "cpu" else env.get("device", "cuda")
        if config.candidate is None:
            verdict = _measure_only(config, ctx, timer, env)
        else:
            verdict = _compare(config, ctx, timer, env)
    finally:
        torch.set_num_threads(threads_before)
    from dataclasses import replace

    return replace(verdict, duration_s=ctx.clock.monotonic() - started)


def _pick_timer(config: BenchConfig) -> Any:
    """The CPU timer, or the CUDA one: ``--device auto`` picks CUDA when torch sees a device
    and the baseline kernel returns a CUDA tensor (or returns nothing, so it may write into a
    CUDA output); a kernel returning CPU tensors is timed on the CPU."""
    import torch

    from glmfb.bench.timers import CpuTimer, make_timer, result_device

    if config.device == "auto":
        if not torch.cuda.is_available():
            return CpuTimer()
        probe = load_side("baseline", config.baseline, config.shapes[0], 1)
        result = call_checked(probe, probe.kernels[0], "a device probe call")
        if result_device(result) == "cpu":
            return CpuTimer()
    try:
        return make_timer("cuda" if config.device == "auto" else config.device,
                          cuda_graph=config.cuda_graph)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(str(exc)) from exc


def _load_pair(config: BenchConfig, shape: tuple[int, ...]) -> tuple[Side, Side]:
    assert config.candidate is not None
    baseline = load_side("baseline", config.baseline, shape, config.input_sets)
    candidate = load_side("candidate", config.candidate, shape, config.input_sets)
    return baseline, candidate


def _cache_of(timer: Any) -> CacheSize | None:
    """The last-level cache the inputs' regime is read against: the host's, or on CUDA the
    device's L2."""
    if timer.device == "cuda":
        l2 = getattr(timer, "l2_bytes", None)
        return CacheSize(int(l2), "L2", "torch.cuda.get_device_properties") if l2 else None
    return last_level_cache()


def _regime(input_sets: int, footprint: Footprint | None, cache: CacheSize | None) -> Regime:
    if footprint is None:
        return regime_of(input_sets, None, None, cache)
    return regime_of(input_sets, footprint.set_bytes, footprint.total_bytes, cache, footprint.source)


def _measure_shape(
    config: BenchConfig, ctx: ProbeContext, timer: Any, shape: tuple[int, ...], budget_s: float,
    seed: int, cache: CacheSize | None = None,
) -> ShapeResult:
    from glmfb.core.measure import Settings, compare

    assert config.candidate is not None
    label = format_shape(shape)
    ctx.progress(f"bench {label}: loading, warming up and allocating")

    def report(message: str) -> None:
        ctx.progress(f"bench {label}: {message}")

    began = ctx.clock.monotonic()
    setup = prepare_pairs(
        timer, config.baseline, config.candidate, shape, input_sets=config.input_sets,
        sample_s=config.sample_s, budget_s=budget_s, clock=ctx.clock.monotonic, progress=report,
    )
    settings = Settings(threshold=config.threshold, budget_s=max(budget_s - setup.setup_s, budget_s / 2),
                        seed=seed)
    comparison = compare(setup.pairs, settings, ctx.clock.monotonic, report)
    look = comparison.final
    change = change_from_interval(look.interval, seed=seed) if look is not None else None
    aa = change_from_interval(look.aa, seed=seed + 1) if look is not None and look.aa is not None else None
    blocks = Blocks.of(comparison, setup.setup_s)
    base_samples = blocks.samples_of("baseline") or [math.nan]
    cand_samples = blocks.samples_of("candidate") or [math.nan]
    declared = {
        side.label: {"flops_per_call": side.flops_per_call, "bytes_per_call": side.bytes_per_call}
        for side in (setup.baseline, setup.candidate)
    }
    extra: dict[str, Any] = {
        "allocations_per_side": setup.plan.ab_pairs,
        "aa_pairs": setup.plan.aa_pairs,
        "pairs_limited_by": setup.plan.limited_by,
        "input_sets_per_allocation": setup.input_sets,
        "candidate_calls_per_sample": setup.candidate_calls_per_sample,
        "bytes_per_allocation": setup.bytes_per_allocation,
        "rounds": comparison.rounds,
        "stopped_by": comparison.stopped_by,
        "look_levels": tuple(round(lk.confidence, 5) for lk in comparison.looks),
        "setup_s": setup.setup_s,
    }
    if look is not None:
        extra.update(
            df=look.interval.df,
            between_allocation_sd=look.interval.between_sd,
            within_allocation_sd=look.interval.within_sd,
        )
        needed = pairs_needed(change, config.threshold) if change is not None else math.inf
        if look.decision is Decision.UNDECIDED and math.isfinite(needed):
            extra["allocation_pairs_needed"] = math.ceil(needed)
        if look.aa is not None:
            extra["aa_between_allocation_sd"] = look.aa.between_sd
    return ShapeResult(
        shape=label, calls_per_sample=setup.calls_per_sample, blocks=blocks, change=change,
        decision=look.decision if look is not None else Decision.UNDECIDED,
        aa=aa, floor=look.floor if look is not None else 0.0, looks=len(comparison.looks),
        baseline_median_s=statistics.median(base_samples),
        candidate_median_s=statistics.median(cand_samples), declared=declared,
        measuring_s=ctx.clock.monotonic() - began, extra=extra,
        regime=_regime(setup.input_sets, larger(*(input_footprint(side.kernels, setup.bytes_per_allocation)
                                                  for side in (setup.baseline, setup.candidate))), cache),
    )


@dataclass(frozen=True)
class HotCheck:
    """The hot check of a pair's focus shape: both sides on one input set reused."""

    status: str  # "measured", "off (hot_check = false)", or why it was not needed or not run
    change: Estimate | None = None  # at 95%
    blocks: int = 0
    pairs: int = 0
    calls_per_sample: int = 0
    measuring_s: float = 0.0


def _hot_check(config: BenchConfig, ctx: ProbeContext, timer: Any, shape: tuple[int, ...],
               focus: ShapeResult, seed: int) -> HotCheck:
    """Both sides of the focus shape timed again on one input set reused (inputs hot in cache),
    interleaved as the main measurement is (no A/A pairs), briefly (:data:`HOT_SHARE` of the
    budget, at most :data:`HOT_MAX_S`, on top of it), each sample after :data:`HOT_WARM_CALLS` untimed calls on its set,
    with one look at 95%: a figure to set beside the main one, which decides nothing. Not run
    when it could not differ (one set already, or one set alone beyond the cache), when the
    main measurement estimated no change, or with ``hot_check = false``."""
    from glmfb.core.measure import Settings, compare
    from glmfb.core.measure.sequential import LookPlan

    assert config.candidate is not None
    if not config.hot_check:
        return HotCheck("off (hot_check = false)")
    if focus.change is None:
        return HotCheck("not run: the main measurement estimated no change")
    regime = focus.regime
    if regime is not None and not regime.hot_differs_by_construction:
        return HotCheck("not needed: the main measurement reused one input set" if regime.input_sets <= 1 else
                        "not needed: one input set alone exceeds the cache, so it comes from memory either way")
    label = format_shape(shape)

    def report(message: str) -> None:
        ctx.progress(f"bench {label}, hot check (one input set reused): {message}")

    report("loading")
    budget_s = min(config.budget_s * HOT_SHARE, HOT_MAX_S)
    began = ctx.clock.monotonic()
    setup = prepare_pairs(
        timer, config.baseline, config.candidate, shape, input_sets=1, sample_s=config.sample_s * HOT_SAMPLE_FACTOR,
        budget_s=budget_s, clock=ctx.clock.monotonic, progress=report, min_pairs=HOT_PAIRS, max_pairs=HOT_PAIRS,
        with_aa=False, warm_calls=HOT_WARM_CALLS, limit_setup=False,
    )
    settings = Settings(threshold=config.threshold, budget_s=max(budget_s - setup.setup_s, budget_s / 2),
                        plan=LookPlan(fractions=(1.0,)), min_rounds=HOT_MIN_ROUNDS, seed=seed)
    comparison = compare(setup.pairs, settings, ctx.clock.monotonic, report)
    look = comparison.final
    return HotCheck("measured", look.interval.estimate if look is not None else None, comparison.blocks,
                    setup.plan.ab_pairs, setup.calls_per_sample, ctx.clock.monotonic() - began)


def _regime_evidence(shape: str, regime: Regime, hot: HotCheck | None = None,
                     differs: bool | None = None, main: Estimate | None = None) -> CacheRegime:
    cache = regime.cache
    checked: dict[str, Any] = {}
    if hot is not None:
        estimate = hot.change
        checked = {
            "hot_check": hot.status,
            "hot_change": estimate.value if estimate is not None else None,
            "hot_ci": estimate.ci if estimate is not None else None,
            "hot_confidence": estimate.confidence if estimate is not None else None,
            "hot_blocks": hot.blocks or None, "hot_pairs": hot.pairs or None,
            "hot_calls_per_sample": hot.calls_per_sample or None,
            "hot_measuring_s": hot.measuring_s if hot.status == "measured" else None,
            "hot_differs": differs,
            "main_ci": main.ci if main is not None else None,
        }
    return CacheRegime(
        shape=shape, regime=regime.name, summary=regime.clause(), input_sets=regime.input_sets,
        set_bytes=regime.set_bytes, total_bytes=regime.total_bytes, bytes_source=regime.bytes_source,
        cache_bytes=cache.bytes if cache is not None else None, cache_level=cache.level if cache is not None else None,
        cache_source=cache.source if cache is not None else None, **checked,
    )


def _outcome(result: ShapeResult, decision: Decision | None, threshold: float) -> ShapeOutcome:
    if result.change is None:
        return ShapeOutcome(shape=result.shape, decision="too-few-blocks", blocks=len(result.blocks))
    estimate = result.change.estimate
    final = decision or result.decision
    needed = samples_needed(result.change, threshold) if final is Decision.UNDECIDED else None
    return ShapeOutcome(
        shape=result.shape, decision=final.value, change=estimate.value, low=estimate.low, high=estimate.high,
        blocks=len(result.blocks), needed_blocks=needed, blocks_per_s=result.blocks.blocks_per_s,
        aa_change=result.aa.estimate.value if result.aa is not None else None,
        aa_biased=result.aa is not None and aa_biased(result.aa), floor=result.floor,
    )


def _compare(config: BenchConfig, ctx: ProbeContext, timer: Any, env: dict[str, Any]) -> Verdict:
    assert config.candidate is not None
    results: list[ShapeResult] = []
    spent_s = 0.0
    cache = _cache_of(timer)
    # Kernels' temporaries must not fault pages in on some calls of some allocations only
    # (glmfb.bench.heap): on the CPU the C heap is pinned before the first allocation.
    heap = pin_heap() if timer.device == "cpu" else None
    meter = HostLoadMeter()
    for index, shape in enumerate(config.shapes):
        # A shape decided early leaves its budget to the shapes after it.
        share_s = (config.budget_s - spent_s) / (len(config.shapes) - index)
        results.append(_measure_shape(config, ctx, timer, shape, share_s, config.seed + 7 * index, cache))
        spent_s += min(share_s, results[-1].measuring_s)
    host_load = meter.stop()
    baseline_name = kernel_name(config.baseline.ref)
    candidate_name = kernel_name(config.candidate.ref)
    artifacts = _save(config, ctx, timer, env, results)

    decided = [r for r in results if r.change is not None]
    decisions: dict[str, Decision] = {r.shape: r.decision for r in decided}
    significant: dict[str, bool] = {}
    geomean = None
    if len(decided) == len(results):
        changes = [r.change for r in decided if r.change is not None]
        combined = combine(changes, [r.decision for r in decided], confidence=LOOK_CONFIDENCE)
        for result, final, flag in zip(decided, combined.decisions, combined.significant, strict=True):
            result.decision = final
            decisions[result.shape] = final
            significant[result.shape] = flag
        geomean = combined.geomean
    outcomes = tuple(_outcome(r, decisions.get(r.shape), config.threshold) for r in results)
    focus = _focus(results)
    focus_shape = (config.shapes[[format_shape(s) for s in config.shapes].index(focus.shape)]
                   if focus is not None else None)

    # The same comparison with one input set reused (inputs hot in cache): a figure beside the
    # main one, never a decision (the verdict's status and metric stay the main measurement's).
    hot: HotCheck | None = None
    hot_figure: HotFigure | None = None
    main_95: Estimate | None = None  # the main change at the hot check's level, which it is compared with
    if focus is not None and focus_shape is not None:
        hot = _hot_check(config, ctx, timer, focus_shape, focus, config.seed + 5)
        if hot.change is not None and focus.change is not None:
            interval = focus.change.interval
            main_95 = interval.at(hot.change.confidence).estimate if interval is not None else focus.change.estimate
            figure = (hot.change.value, hot.change.low, hot.change.high)
            hot_figure = HotFigure(*figure, differs=hot_differs((main_95.value, main_95.low, main_95.high), figure,
                                                                 config.threshold))

    op_diff: OpDiff | None = None
    slower = any(o.decision == "regression" for o in outcomes)
    faster_only = (not slower and all(o.decision in ("improvement", "equivalent") for o in outcomes)
                   and any(o.decision == "improvement" for o in outcomes))
    if config.profile and focus is not None and focus_shape is not None and (slower or faster_only):
        ctx.progress(f"bench {focus.shape}: profiling both sides")
        op_diff = _profile(config, timer, focus_shape, focus, slower)

    steps = next_steps(config, focus.shape if focus is not None else None, _suggest_budget(config, results))
    findings = BenchFindings(
        baseline=baseline_name, candidate=candidate_name, threshold=config.threshold, budget_s=config.budget_s,
        labels=target_labels(config.baseline, config.candidate),
        shapes=outcomes,
        geomean=geomean.value if geomean is not None else None,
        geomean_low=geomean.low if geomean is not None else None,
        geomean_high=geomean.high if geomean is not None else None,
        focus=focus.shape if focus is not None else None, op_diff=op_diff, device=timer.device,
        reproduce=steps["reproduce"], more_evidence=steps["more_evidence"], host_load=host_load,
        regime=focus.regime.clause() if focus is not None and focus.regime is not None else "", hot=hot_figure,
    )
    outcome = diagnose(ctx.rules("bench", RULES), findings)
    diagnosis = outcome.diagnosis

    evidence: list[Evidence] = []
    if geomean is not None:
        evidence.append(BenchSummary(
            shapes=len(outcomes), slower=sum(o.decision == "regression" for o in outcomes),
            faster=sum(o.decision == "improvement" for o in outcomes),
            undecided=sum(o.decision == "undecided" for o in outcomes),
            geomean_change=geomean.value, geomean_ci=geomean.ci, confidence=LOOK_CONFIDENCE,
            threshold=config.threshold,
            statistic=STATISTIC,
            fdr="Benjamini-Hochberg at 0.05 across shapes",
        ))
    evidence.extend(_shape_evidence(r, significant.get(r.shape), decisions.get(r.shape)) for r in results)
    for result in results:
        if result.regime is not None:
            at_focus = focus is not None and result.shape == focus.shape  # the hot check's shape
            evidence.append(_regime_evidence(
                result.shape, result.regime, hot if at_focus else None,
                hot_figure.differs if at_focus and hot_figure is not None else None,
                main_95 if at_focus else None))
    if op_diff is not None:
        evidence.append(dataclasses.replace(op_diff, rule=outcome.rule.name))
    roofline = _roofline(timer.device, decided)
    if roofline is not None:
        evidence.append(roofline)
    evidence.append(BenchHarness(
        **timer.describe(), threads=env.get("threads"), input_sets=config.input_sets, sample_s=config.sample_s,
        order="independent allocation pairs, each in randomized balanced ABBA/BAAB blocks, rounds in random pair order", budget_s=config.budget_s,
        heap=heap,
    ))
    if host_load is not None:
        evidence.append(host_load.evidence())
    evidence.append(outcome.record)

    metric = None
    if focus is not None and focus.change is not None:
        estimate = focus.change.estimate if len(results) == 1 or geomean is None else geomean
        metric = Metric("time_change" if len(results) == 1 else "geomean_time_change", estimate.value, "fraction",
                        config.threshold, estimate.ci)
    where: dict[str, Any] = dict(diagnosis.where) if diagnosis.where is not None else {
        "kernel": candidate_name, **({"shape": focus.shape} if focus is not None else {})}
    why = diagnosis.why
    lead = op_diff.lead_sites() if op_diff is not None and diagnosis.status is Status.FAIL else None
    if lead is not None:  # the line in the user's code that calls the operator carrying most of the change
        op, sites, share = lead
        where.update(file=sites[0].file, line=sites[0].line, function=sites[0].function)
        why += f" The candidate calls {op}, the operator with the largest share of the change ({share:.0%}), " + " and ".join(
            f"from {s.function} at {s.file}:{s.line}" + (f" (as {s.via})" if s.via else "")
            + f", {s.calls:.3g} a call" for s in sites[:2]) + "."
    return Verdict(
        probe="bench", name=config.name, status=diagnosis.status, layer=Layer.KERNEL, where=where,
        why=why, metric=metric, evidence=tuple(evidence), next=diagnosis.next, artifacts=artifacts,
        env=env,
    )


def next_steps(config: BenchConfig, focus: str | None, budget_s: float) -> dict[str, Step | None]:
    """The steps the rules may suggest (:class:`~glmfb.bench.rules.BenchFindings` fields): the
    comparison rerun on the ``focus`` shape, and on every shape with ``budget_s``; neither
    writes ``--save`` again."""
    return {
        "reproduce": (rerun_step("bench", config, "reproduce on the worst shape", shapes=[focus], save=None,
                                  intent=Intent.REPRODUCE)
                      if focus is not None else None),
        "more_evidence": rerun_step("bench", config, "more evidence: a budget that would decide it", intent=Intent.CONFIRM,
                                    budget=budget_s, save=None),
    }


def _focus(results: Sequence[ShapeResult]) -> ShapeResult | None:
    """The shape the verdict speaks about: the largest regression, else the first undecided,
    else the largest improvement, else the largest change."""
    decided = [r for r in results if r.change is not None]
    if not decided:
        return results[0] if results else None

    def size(r: ShapeResult) -> float:
        return r.change.estimate.value if r.change is not None else 0.0

    by = {d: [r for r in decided if r.decision is d] for d in Decision}
    if by[Decision.REGRESSION]:
        return max(by[Decision.REGRESSION], key=size)
    if by[Decision.UNDECIDED]:
        return by[Decision.UNDECIDED][0]
    if by[Decision.IMPROVEMENT]:
        return min(by[Decision.IMPROVEMENT], key=size)
    return max(decided, key=lambda r: abs(size(r)))


def _suggest_budget(config: BenchConfig, results: Sequence[ShapeResult]) -> float:
    per_shape = config.budget_s / len(config.shapes)
    worst = 0.0
    for result in results:
        if result.change is None or result.decision is not Decision.UNDECIDED:
            continue
        needed = samples_needed(result.change, config.threshold)
        rate = result.blocks.blocks_per_s
        if math.isfinite(needed) and rate > 0:
            worst = max(worst, needed / rate)
    if worst == 0.0:
        return round(max(config.budget_s * 4, 30), 1)
    return round(max(config.budget_s, worst * len(config.shapes) + per_shape), 1)


def _shape_evidence(result: ShapeResult, significant: bool | None, decision: Decision | None) -> ShapeChange:
    change = result.change
    aa = result.aa
    return ShapeChange(
        shape=result.shape, decision=(decision or result.decision).value,
        change=change.estimate.value if change is not None else None,
        ci=change.estimate.ci if change is not None else None,
        confidence=change.estimate.confidence if change is not None else None,
        pvalue=change.pvalue if change is not None else None,
        fdr_significant=significant, blocks=len(result.blocks), looks=result.looks,
        calls_per_sample=result.calls_per_sample, baseline_median_s=result.baseline_median_s,
        candidate_median_s=result.candidate_median_s, ratio_of_medians_change=result.ratio_of_medians,
        noise_floor=result.floor, measuring_s=result.measuring_s,
        aa_change=aa.estimate.value if aa is not None else None, aa_ci=aa.estimate.ci if aa is not None else None,
        aa_blocks=aa.samples if aa is not None else None,
        quantiles_s={side: quantiles_of(result.blocks.samples_of(side)) for side in ("baseline", "candidate")},
        side_time_s={side: interval for side in ("baseline", "candidate")
                     if (interval := time_interval(result.blocks.samples_of(side))) is not None} or None,
        **result.extra,
    )


def _profile(config: BenchConfig, timer: Any, shape: tuple[int, ...], focus: ShapeResult, slower: bool) -> OpDiff:
    """The operator diff of the focus shape: both sides under torch.profiler with their input
    shapes recorded, in alternating rounds (see :mod:`glmfb.bench.opdiff`)."""
    from glmfb.bench.opdiff import build_op_diff, op_sites, profile_pair

    baseline, candidate = _load_pair(config, shape)
    slower_side_s = max(focus.baseline_median_s, focus.candidate_median_s)
    calls = max(10, min(100, int(0.3 / slower_side_s) if slower_side_s > 0 else 10))
    for side in (baseline, candidate):
        warm_up(side, min_calls=1, min_s=0.0)
    base_ops, cand_ops = profile_pair(baseline.kernels, candidate.kernels, calls, timer.device)
    op_diff = build_op_diff(base_ops, cand_ops, shape=focus.shape, profiled_calls=calls, slower=slower,
                            device=timer.device)
    # the lines that call the operators carrying most of the change, on each side that runs them
    ops = list(dict.fromkeys([row.op for row in op_diff.ops[:3]] + list(op_diff.only_in_candidate[:2])
                             + list(op_diff.repeated_reductions[:2])))
    sites = [*op_sites(candidate.kernels, cand_ops, [op for op in ops if op in cand_ops], "candidate"),
             *op_sites(baseline.kernels, base_ops, [op for op in ops if op in base_ops], "baseline")]
    return dataclasses.replace(op_diff, sites=tuple(sites))


def _roofline(device: str, results: Sequence[ShapeResult]) -> Roofline | None:
    if not any(v["flops_per_call"] or v["bytes_per_call"] for r in results for v in r.declared.values()):
        return None
    from glmfb.bench.roofline import measure_ceilings, place

    ceilings = measure_ceilings(device)
    rows = []
    for result in results:
        for label, median in (("baseline", result.baseline_median_s), ("candidate", result.candidate_median_s)):
            declared = result.declared[label]
            if not (declared["flops_per_call"] or declared["bytes_per_call"]) or not median > 0:
                continue
            placement = place(median, declared["flops_per_call"], declared["bytes_per_call"], ceilings)
            rows.append(Placement(shape=result.shape, side=label, **placement.to_dict(), summary=placement.describe()))
    return Roofline(ceilings=ceilings.to_dict(), placements=tuple(rows))


def _save(config: BenchConfig, ctx: ProbeContext, timer: Any, env: dict[str, Any],
          results: Sequence[ShapeResult]) -> dict[str, str]:
    """The raw samples, always into the artifact folder, and to ``--save`` when given."""
    from glmfb.bench.saved import write_saved

    sides = {"baseline": {"ref": config.baseline.ref, "kernel": kernel_name(config.baseline.ref),
                          "args": dict(config.baseline.args)}}
    if config.candidate is not None:
        sides["candidate"] = {"ref": config.candidate.ref, "kernel": kernel_name(config.candidate.ref),
                              "args": dict(config.candidate.args)}
    shapes = {
        r.shape: {"calls_per_sample": r.calls_per_sample,
                  **{label: r.blocks.samples_of(label) for label in sides},
                  **{f"{label}_allocations": r.blocks.allocations_of(label) for label in sides
                     if r.blocks.allocations_of(label)}}
        for r in results
    }
    artifact = ctx.artifact("bench-samples.json")
    write_saved(artifact, env=env, created=ctx.clock.utc_now(), device=timer.device,
                threads=int(env.get("threads") or 0), timer=timer.describe(), sides=sides, shapes=shapes)
    artifacts = {"samples": str(artifact)}
    if config.save is not None:
        from glmfb.core.io import atomic_writer

        with atomic_writer(config.save, "wb") as handle, open(artifact, "rb") as source:
            shutil.copyfileobj(source, handle)
        artifacts["saved"] = str(config.save)
    return artifacts


# --------------------------------------------------------------------------------------------
# One target, measured to be saved
# --------------------------------------------------------------------------------------------


def _measure_only(config: BenchConfig, ctx: ProbeContext, timer: Any, env: dict[str, Any]) -> Verdict:
    """One target alone: its own time per call on each shape, with an interval; nothing is
    compared, so the verdict passes and says so. Its history series is that time, per commit."""
    per_shape_s = config.budget_s / len(config.shapes)
    results: list[ShapeResult] = []
    name = kernel_name(config.baseline.ref)
    cache = _cache_of(timer)
    meter = HostLoadMeter()
    times: list[tuple[float, float, float] | None] = []
    normalized: list[Normalized | None] = []
    for shape in config.shapes:
        label = format_shape(shape)
        ctx.progress(f"bench {label}: measuring {name}")
        if config.processes > 1:
            blocks, calls, runs, footprint = _measure_in_processes(config, ctx, shape, per_shape_s)
            times.append(processes_interval([r.time_s for r in runs]))
            normalized.append(_normalized(runs))
        else:
            single = measure_single(timer, config.baseline, shape, input_sets=config.input_sets,
                                    sample_s=config.sample_s, budget_s=per_shape_s, clock=ctx.clock.monotonic)
            blocks = Blocks(raw=[("baseline", v) for v in single.values], elapsed_s=single.elapsed_s,
                            allocations=single.allocations)
            calls = single.calls_per_sample
            footprint = input_footprint(single.side.kernels, single.bytes_per_allocation)
            times.append(time_interval(single.values))
            normalized.append(None)
        samples = blocks.samples_of("baseline")
        results.append(ShapeResult(label, calls, blocks, None, Decision.UNDECIDED, None, 0.0, 0,
                                   statistics.median(samples), math.nan,
                                   regime=_regime(config.input_sets, footprint, cache)))
    host_load = meter.stop()
    artifacts = _save(config, ctx, timer, env, results)
    first = times[0]
    shown = ", ".join(f"{r.shape} {_us(t[0]) if t else _us(r.baseline_median_s)}"
                      + (f" [{_us(t[1])}, {_us(t[2])}]" if t else "") for r, t in zip(results, times, strict=True))
    saved = f"; samples saved to {artifacts['saved']}" if "saved" in artifacts else ""
    next_steps: tuple[Step, ...] = ()
    if "saved" in artifacts:
        next_steps = (Step("compare with another saved run", command="bench",
                           arguments={"baseline": "OLD.json", "candidate": artifacts["saved"]}),)
    evidence: list[Any] = [
        Measurement(shape=r.shape, samples=len(r.blocks.raw), calls_per_sample=r.calls_per_sample,
                    median_s=r.baseline_median_s, time_s=t[0] if t else None, ci_s=(t[1], t[2]) if t else None,
                    processes=config.processes, **(n.fields() if n else {}))
        for r, t, n in zip(results, times, normalized, strict=True)]
    evidence.extend(_regime_evidence(r.shape, r.regime) for r in results if r.regime is not None)
    if host_load is not None:
        evidence.append(host_load.evidence())
    spread = (f"over {config.processes} fresh processes, the interval their spread" if config.processes > 1 else
              "in one process, batch means of each shape's samples in time order")
    regime = results[0].regime
    measured = (f" with {regime.clause()}{f' on {results[0].shape}' if len(results) > 1 else ''}"
                if regime is not None else "")
    why = (f"measured {name} alone (nothing compared){measured}: time per call {shown} (95% intervals, {spread})"
           f"{_normalized_clause(results, normalized)}{saved}")
    metric: Metric | None = Metric("median_time", first[0] if first else results[0].baseline_median_s, "s",
                                   ci=(first[1], first[2]) if first else None)
    status = Status.PASS
    if host_load is not None and host_load.busy:
        # Alone, nothing cancels the load of other processes out (a pair's interleaving does):
        # the time is theirs as much as the kernel's, so it is no point of the kernel's series.
        status, metric = Status.INCONCLUSIVE, None
        why += (f".{busy_note(host_load)} Alone, a kernel's time takes that load in, so this run is not its time: "
                "no metric, and no point in its history")
        next_steps = (rerun_step("bench", config, "measure it again on a quiet host", intent=Intent.CONFIRM), *next_steps)
    return Verdict(
        probe="bench", name=config.name, status=status, layer=Layer.KERNEL,
        where={"kernel": name}, why=why, metric=metric,
        evidence=tuple(evidence), next=next_steps, artifacts=artifacts, env=env,
    )


@dataclass(frozen=True)
class Normalized:
    """A kernel's time per call in units of the reference's (:mod:`glmfb.bench.reference`),
    a sample of which followed each of the kernel's in each of the same fresh processes:
    ``value`` with its 95% interval over the processes, and each process's own time, reference
    time and ratio (the batch-means statistic of its samples' ratios, as a pair's change is
    read from its alternating samples)."""

    value: float
    low: float
    high: float
    process_times_s: tuple[float, ...]
    process_reference_s: tuple[float, ...]
    process_ratios: tuple[float, ...]

    def fields(self) -> dict[str, Any]:
        """The :class:`~glmfb.bench.evidence.Measurement` fields that carry it."""
        from glmfb.bench.reference import VERSION

        return {"normalized_time": self.value, "normalized_ci": (self.low, self.high),
                "reference_version": VERSION, "process_times_s": self.process_times_s,
                "process_reference_s": self.process_reference_s, "process_ratios": self.process_ratios}


@dataclass(frozen=True)
class ProcessRun:
    """One fresh process's own time per call and, with the reference, its reference time per
    call and the statistic of its paired ratios (None without)."""

    time_s: float
    reference_s: float | None = None
    ratio: float | None = None


def _normalized(runs: Sequence[ProcessRun]) -> Normalized | None:
    """The processes' paired ratios, as :func:`processes_interval` reads a run over processes;
    None unless every process timed its reference."""
    if not runs or any(r.ratio is None or r.reference_s is None for r in runs):
        return None
    interval = processes_interval([r.ratio for r in runs if r.ratio is not None])
    if interval is None:
        return None
    return Normalized(*interval, tuple(r.time_s for r in runs), tuple(r.reference_s or 0.0 for r in runs),
                      tuple(r.ratio or 0.0 for r in runs))


def _cv(values: Sequence[float]) -> float:
    """Coefficient of variation (sample standard deviation over the mean)."""
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else math.nan


def _normalized_clause(results: list[ShapeResult], normalized: list[Normalized | None]) -> str:
    """The why's words for the time in the reference's units, when it was measured, with the
    scatter over the processes of each time and of their ratio (the figures that say whether the
    reference took in what moved the kernel)."""
    measured = [(r.shape, n) for r, n in zip(results, normalized, strict=True) if n is not None]
    if not measured:
        return ""
    shown = ", ".join(f"{shape} {n.value:.4g} [{n.low:.4g}, {n.high:.4g}]" for shape, n in measured)
    shape, first = measured[0]
    where = f" on {shape}" if len(results) > 1 else ""
    return (f"; in units of a fixed reference workload whose samples alternated with its own in the same "
            f"processes (normalized_time): {shown}; over the processes{where} the kernel's own time "
            f"scattered {_cv(first.process_times_s):.1%} (cv), the reference's {_cv(first.process_reference_s):.1%}, "
            f"their ratio {_cv(first.process_ratios):.1%}")


def _measure_in_processes(
    config: BenchConfig, ctx: ProbeContext, shape: tuple[int, ...], budget_s: float,
) -> tuple[Blocks, int, list[ProcessRun], Footprint | None]:
    """The target alone in ``config.processes`` fresh processes one after another
    (:mod:`glmfb.bench.worker`), the budget shared: their samples (allocation = process), the
    calls per sample of the first, each process's own times (batch means of its samples; with
    ``config.reference``, of its reference's and of their paired ratios too) and the footprint
    of the first process's first allocation (None: not measured)."""
    import json
    import subprocess
    import sys

    from glmfb.contract.errors import HarnessError

    target = config.baseline
    blocks, calls, runs = Blocks(), 0, []
    footprint: Footprint | None = None
    for index in range(config.processes):
        ctx.progress(f"bench {format_shape(shape)}: fresh process {index + 1} of {config.processes}")
        job = {"target": target.ref, "args": dict(target.args), "shape": list(shape),
               "base_dir": str(target.base_dir) if target.base_dir is not None else None,
               "input_sets": config.input_sets, "sample_s": config.sample_s, "budget_s": budget_s / config.processes,
               "threads": config.threads, "sys_path": [p for p in sys.path if p], "reference": config.reference}
        began = ctx.clock.monotonic()
        done = subprocess.run([sys.executable, "-m", "glmfb.bench.worker"], input=json.dumps(job), text=True,
                              capture_output=True, timeout=budget_s + 600, check=False)
        lines = done.stdout.strip().splitlines()
        try:
            answer = json.loads(lines[-1])
        except (IndexError, ValueError):
            tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise HarnessError(f"bench: fresh process {index + 1} of {config.processes} ended without an answer: "
                               f"{tail}") from None
        if "error" in answer:
            raise HarnessError(f"bench: in fresh process {index + 1} of {config.processes}: {answer['error']}")
        values = [float(v) for v in answer["values"]]
        calls = calls or int(answer["calls_per_sample"])
        if footprint is None and answer.get("footprint"):
            total, largest, source = answer["footprint"]
            footprint = Footprint(int(total), int(largest), str(source))
        blocks.raw.extend(("baseline", v) for v in values)
        blocks.allocations.extend(index for _ in values)
        blocks.elapsed_s += ctx.clock.monotonic() - began
        runs.append(_process_run(values, [float(v) for v in answer.get("reference") or ()]
                                 if config.reference else []))
    return blocks, calls, runs, footprint


def _process_run(values: list[float], reference: list[float]) -> ProcessRun:
    """One process's own times: each series' batch-means statistic (its median below 4
    samples); the ratio is read from the pairs, each of the kernel's samples with the
    reference's right after it, so what moved both within the process cancels."""

    def own(samples: list[float]) -> float:
        interval = time_interval(samples)
        return interval[0] if interval is not None else statistics.median(samples)

    if len(reference) != len(values) or not reference:
        return ProcessRun(own(values))
    return ProcessRun(own(values), own(reference), own([v / r for v, r in zip(values, reference, strict=True)]))


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.4g} µs"


# --------------------------------------------------------------------------------------------
# Saved files
# --------------------------------------------------------------------------------------------


def compare_saved(config: BenchConfig, ctx: ProbeContext) -> Verdict:
    """Compare two saved sides (glmfb ``--save`` files or pytest-benchmark JSON), unpaired."""
    from glmfb.bench.decision import SavedChange, SavedRun, saved_change
    from glmfb.bench.saved import SavedSide, load_runs
    from glmfb.core.measure.floor import ProcessFloor, get_floor

    assert config.candidate is not None
    baseline_runs = load_runs(config.baseline.ref)
    candidate_runs = load_runs(config.candidate.ref)
    baseline, candidate = baseline_runs[0], candidate_runs[0]
    others = [set(run.keys) for run in [*baseline_runs[1:], *candidate_runs]]
    keys = [k for k in baseline.keys if all(k in keys for keys in others)]
    if not keys:
        raise InputError(
            f"{config.baseline.ref} and {config.candidate.ref} have no shape or benchmark in common",
            f"baseline has {', '.join(baseline.keys[:5])}; candidate has {', '.join(candidate.keys[:5])}",
        )
    approximate: list[str] = []
    same_process = len(baseline_runs) == len(candidate_runs) == 1 and baseline.path == candidate.path
    floor_used: list[tuple[ProcessFloor, str]] = []

    def run_of(side: SavedSide, key: str) -> SavedRun:
        if key in side.samples:
            values = side.samples[key]
            return SavedRun(values, side.allocations.get(key), statistics.median(values), 0.0, len(values))
        summary = side.summaries[key]
        if key not in approximate:
            approximate.append(key)
        return SavedRun(None, None, summary.median_s, summary.relative_se, summary.rounds)

    def change_for(key: str, index: int) -> SavedChange:
        a = [run_of(side, key) for side in baseline_runs]
        b = [run_of(side, key) for side in candidate_runs]
        sd = df = None
        if not same_process and len(a) + len(b) < 3:
            if not floor_used:
                ctx.progress("measuring this machine's between-process floor (once; cached)")
                floor_used.append(get_floor(ctx.progress))
            sd, df = floor_used[0][0].sd, floor_used[0][0].df
        return saved_change(a, b, same_process=same_process, process_sd=sd, process_df=df, seed=index)

    saved = [change_for(key, i) for i, key in enumerate(keys)]
    changes = [c.change for c in saved]
    decisions = [decide_with_floor(c, config.threshold, 0.0) for c in changes]
    combined = combine(changes, decisions)
    geomean = combined.geomean
    outcomes = tuple(
        ShapeOutcome(shape=key, decision=combined.decisions[i].value, change=changes[i].estimate.value,
                     low=changes[i].estimate.low, high=changes[i].estimate.high, blocks=changes[i].samples)
        for i, key in enumerate(keys)
    )

    def of(decision: Decision) -> list[int]:
        return [i for i, d in enumerate(combined.decisions) if d is decision]

    def size(i: int) -> float:
        return changes[i].estimate.value

    if of(Decision.REGRESSION):
        focus = max(of(Decision.REGRESSION), key=size)
    elif of(Decision.UNDECIDED):
        focus = of(Decision.UNDECIDED)[0]
    elif of(Decision.IMPROVEMENT):
        focus = min(of(Decision.IMPROVEMENT), key=size)
    else:
        focus = 0
    env_diff = differences(baseline.env, candidate.env)
    pytest_format = baseline.format == "pytest-benchmark"
    findings = BenchFindings(
        baseline=baseline.source, candidate=candidate.source, threshold=config.threshold, budget_s=0.0,
        labels=side_labels(baseline.source, candidate.source),
        shapes=outcomes, geomean=geomean.value, geomean_low=geomean.low, geomean_high=geomean.high,
        focus=keys[focus], saved=True, saved_in_process=same_process,
        saved_runs_note=_runs_note(len(baseline_runs), len(candidate_runs), saved, floor_used),
        unit="benchmark" if pytest_format else "shape",
        env_differences=tuple(f"{k}: {a} vs {b}" for k, (a, b) in env_diff.items()),
        approximate=len(approximate),
        more_evidence=_PAIRED,
        reproduce=_PAIRED,
    )
    outcome = diagnose(ctx.rules("bench", RULES), findings)
    evidence: list[Evidence] = [SavedComparison(
        baseline=baseline.source, candidate=candidate.source, formats=(baseline.format, candidate.format),
        in_process=same_process, statistic=_saved_statistic(saved),
        runs=(len(baseline_runs), len(candidate_runs)),
        geomean_change=geomean.value, geomean_ci=geomean.ci, approximate=tuple(approximate),
    )]
    if floor_used:
        fields = floor_used[0][0].evidence(floor_used[0][1])
        evidence.append(ProcessFloorEvidence(**{k: v for k, v in fields.items() if k != "kind"}))
    for i, key in enumerate(keys):
        interval = changes[i].interval
        evidence.append(ShapeChange(
            shape=key, change=changes[i].estimate.value, ci=changes[i].estimate.ci, pvalue=changes[i].pvalue,
            decision=combined.decisions[i].value, fdr_significant=combined.significant[i], method=saved[i].method,
            df=interval.df if interval is not None else None, units=interval.units if interval is not None else None,
        ))
    if env_diff:
        evidence.append(EnvDifferences(differences={k: [a, b] for k, (a, b) in env_diff.items()},
                                       note="the two saved runs were measured in different environments"))
    evidence.append(outcome.record)
    where: dict[str, Any] = {"kernel": candidate.kernel}
    where["function" if pytest_format else "shape"] = keys[focus]
    if outcome.diagnosis.where is not None:
        where = {**where, **{k: v for k, v in outcome.diagnosis.where.items() if k != "kernel"}}
    total = len(keys)
    estimate = changes[focus].estimate if total == 1 else geomean
    return Verdict(
        probe="bench", name=config.name, status=outcome.diagnosis.status, layer=Layer.KERNEL, where=where,
        why=outcome.diagnosis.why,
        metric=Metric("time_change" if total == 1 else "geomean_time_change", estimate.value, "fraction",
                      config.threshold, estimate.ci),
        evidence=tuple(evidence), next=outcome.diagnosis.next, env=fingerprint(),
    )


# What a saved comparison suggests: its files name no targets to rerun, so a plain step.
_PAIRED = Step("rerun both kernels in one process for a paired measurement: bench the two kernel targets "
               "(BASELINE CANDIDATE) on the saved shapes")


def _saved_statistic(saved: Sequence[Any]) -> str:
    methods = {c.method for c in saved}
    texts = {
        "runs": "difference of mean log medians (batch means) of independent runs, pooled two-sample t over runs",
        "allocations": "difference of mean log medians of independent allocations (one process), pooled two-sample t",
        "one process": "difference of batch-means log medians, one process",
        "one run a side + process floor": "difference of batch-means log medians; each run's batch-means "
        "error plus twice the between-process variance of this machine, Welch-Satterthwaite t",
    }
    return "; ".join(texts[m] for m in sorted(methods))


def _runs_note(a_runs: int, b_runs: int, saved: Sequence[Any], floor_used: Sequence[Any]) -> str:
    """What the saved comparison's interval carries between processes, in words."""
    if floor_used:
        floor, source = floor_used[0]
        note = (f"one run a side, so the interval carries this machine's between-process floor "
                f"(sd {floor.sd:.1%} of a run's median over {floor.processes} fresh processes, "
                f"measured {floor.created}{'' if source == 'cache' else ' just now'}"
                f"{f' at load {floor.load_1m:.1f}' if floor.load_1m is not None else ''})")
        now, then = floor.evidence(source)["load_1m_now"], floor.load_1m
        if now is not None and then is not None and now > 2 * then + 1:
            note += (f"; the host is busier now (load {now:.1f}), so that floor may understate the "
                     "noise: remeasure it with python -m glmfb.core.measure.floor")
        return note
    if any(c.method == "runs" for c in saved):
        return f"{a_runs} run(s) against {b_runs}: the spread between runs is in the interval"
    return ""


__all__ = ["compare_saved", "next_steps", "run_bench"]
