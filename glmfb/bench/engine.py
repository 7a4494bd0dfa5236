"""The bench engine: measure, decide, explain, and answer with a Verdict.

:func:`run_bench` compares two kernel factories in one process (or measures one target for
``--save``); :func:`compare_saved` compares two saved result files. Both return a Verdict and
never raise for a broken kernel: a factory that raises, a non-callable, a NaN result become an
error verdict (layer harness). Bad user input (a target that does not resolve) raises
:class:`~glmfb.errors.UsageError` subclasses, which the CLI turns into exit code 2.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from glmfb.bench.config import BenchConfig, SavedCompareConfig
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
from glmfb.bench.runner import (
    Blocks,
    KernelError,
    Side,
    call_checked,
    kernel_name,
    load_side,
    measure_single,
    prepare_pairs,
    warm_up,
)
from glmfb.env import differences, fingerprint
from glmfb.errors import GlmfbError, InputError, UsageError
from glmfb.stats import Decision
from glmfb.units import format_shape
from glmfb.verdict import Layer, Metric, ProbeKind, Status, Verdict, traceback_evidence

MIN_BLOCKS = 4  # blocks a comparison needs at least (2 allocation pairs, 2 blocks each)


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
    measuring_s: float = 0.0  # A/A and A/B together, what the budget counts
    extra: dict[str, Any] = field(default_factory=dict)  # measurement evidence for the shape

    @property
    def ratio_of_medians(self) -> float:
        return self.candidate_median_s / self.baseline_median_s - 1.0


def _pct(value: float) -> str:
    return f"{value * 100:+.1f}%"


def _ci(low: float, high: float) -> str:
    return f"[{low * 100:+.1f}, {high * 100:+.1f}]"


def _harness_verdict(name: str, exc: BaseException, started: float, env: dict[str, Any]) -> Verdict:
    if isinstance(exc, GlmfbError):
        why = str(exc)
        evidence: list[dict[str, Any]] = []
    else:
        why = f"the bench harness raised {type(exc).__name__}: {exc}"
        evidence = [traceback_evidence(exc)]
    return Verdict.harness_error(
        ProbeKind.BENCH, name, why, evidence=evidence, env=env,
        duration_s=time.perf_counter() - started,
        next=("call the factory and its kernel by hand: k = factory(shape); k()",),
    )


# --------------------------------------------------------------------------------------------
# In-process comparison
# --------------------------------------------------------------------------------------------


def run_bench(config: BenchConfig) -> Verdict:
    """Measure per :class:`BenchConfig` and return the verdict (see the module docstring)."""
    started = time.perf_counter()
    import torch

    threads_before = torch.get_num_threads()
    env: dict[str, Any] = {}
    try:
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        env = fingerprint()
        timer = _pick_timer(config)
        env["device"] = timer.device if timer.device == "cpu" else env.get("device", "cuda")
        if config.candidate is None:
            return _measure_only(config, timer, env, started)
        return _compare(config, timer, env, started)
    except UsageError:
        raise
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # KernelError and anything unexpected: an error verdict
        return _harness_verdict(config.name, exc, started, env)
    finally:
        torch.set_num_threads(threads_before)


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


def _measure_shape(
    config: BenchConfig, timer: Any, shape: tuple[int, ...], budget_s: float, seed: int
) -> ShapeResult:
    from glmfb.measure import Settings, compare

    assert config.candidate is not None
    label = format_shape(shape)
    config.progress(f"bench {label}: loading, warming up and allocating")

    def report(message: str) -> None:
        config.progress(f"bench {label}: {message}")

    setup = prepare_pairs(
        timer, config.baseline, config.candidate, shape, input_sets=config.input_sets,
        sample_s=config.sample_s, budget_s=budget_s, progress=report,
    )
    settings = Settings(threshold=config.threshold, budget_s=max(budget_s - setup.setup_s, budget_s / 2),
                        seed=seed)
    comparison = compare(setup.pairs, settings, time.perf_counter, report)
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
        "bytes_per_allocation": setup.bytes_per_allocation,
        "rounds": comparison.rounds,
        "stopped_by": comparison.stopped_by,
        "look_levels": [round(lk.confidence, 5) for lk in comparison.looks],
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
        measuring_s=comparison.elapsed_s + setup.setup_s, extra=extra,
    )


def _compare(config: BenchConfig, timer: Any, env: dict[str, Any], started: float) -> Verdict:
    assert config.candidate is not None
    results: list[ShapeResult] = []
    spent_s = 0.0
    for index, shape in enumerate(config.shapes):
        # A shape decided early leaves its budget to the shapes after it.
        share_s = (config.budget_s - spent_s) / (len(config.shapes) - index)
        results.append(_measure_shape(config, timer, shape, share_s, config.seed + 7 * index))
        spent_s += min(share_s, results[-1].measuring_s)
    baseline_name = kernel_name(config.baseline.ref)
    candidate_name = kernel_name(config.candidate.ref)
    artifacts: dict[str, str] = {}
    if config.save is not None:
        _save(config, timer, env, results)
        artifacts["samples"] = str(config.save)

    decided = [r for r in results if r.change is not None]
    if len(decided) < len(results):
        short = ", ".join(r.shape for r in results if r.change is None)
        return Verdict(
            probe=ProbeKind.BENCH, name=config.name, status=Status.INCONCLUSIVE, layer=Layer.KERNEL,
            where={"kernel": candidate_name, "shape": short.split(", ")[0]},
            why=f"the budget of {config.budget_s:g} s did not fit {MIN_BLOCKS} ABBA blocks on {short}",
            evidence=tuple(_shape_evidence(r, None, None) for r in results),
            next=(f"rerun with --budget {max(config.budget_s * 4, 30):g}",),
            artifacts=artifacts, env=env, duration_s=time.perf_counter() - started,
        )
    changes = [r.change for r in decided if r.change is not None]
    combined = combine(changes, [r.decision for r in decided], confidence=LOOK_CONFIDENCE)
    for result, final in zip(decided, combined.decisions, strict=True):
        result.decision = final

    regressions = [r for r in decided if r.decision is Decision.REGRESSION]
    improvements = [r for r in decided if r.decision is Decision.IMPROVEMENT]
    undecided = [r for r in decided if r.decision is Decision.UNDECIDED]

    def size(r: ShapeResult) -> float:
        return r.change.estimate.value if r.change is not None else 0.0

    if regressions:
        status, focus = Status.FAIL, max(regressions, key=size)
    elif undecided:
        status, focus = Status.INCONCLUSIVE, undecided[0]
    elif improvements:
        status, focus = Status.PASS, min(improvements, key=size)
    else:
        status, focus = Status.PASS, max(decided, key=lambda r: abs(size(r)))
    assert focus.change is not None

    evidence: list[dict[str, Any]] = []
    explanation_clause = ""
    rule_next: tuple[str, ...] = ()
    focus_shape = config.shapes[[format_shape(s) for s in config.shapes].index(focus.shape)]
    shows_effect = status is Status.FAIL or (bool(improvements) and status is Status.PASS)
    if config.profile and shows_effect:
        config.progress(f"bench {focus.shape}: profiling both sides")
        op_evidence, explanation_clause, rule_next = _profile(config, timer, focus_shape, focus, status)
        evidence.append(op_evidence)
    roofline = _roofline(timer.device, decided)
    if roofline is not None:
        evidence.append(roofline)

    total = len(decided)
    geomean = combined.geomean
    summary = f"geomean {_pct(geomean.value)} {_ci(*geomean.ci)}"
    per_shape = f"on {focus.shape} {_pct(focus.change.estimate.value)} {_ci(*focus.change.estimate.ci)}"
    if status is Status.FAIL:
        headline = (
            f"{candidate_name} is slower than {baseline_name} on {len(regressions)} of {total} "
            f"shape{'s' if total > 1 else ''} ({summary}); {per_shape}"
        )
    elif status is Status.INCONCLUSIVE:
        headline = _inconclusive_why(config, candidate_name, baseline_name, undecided, total)
    elif improvements:
        speedup = 1.0 / (1.0 + focus.change.estimate.value)
        headline = (
            f"{candidate_name} is faster than {baseline_name} on {len(improvements)} of {total} "
            f"shape{'s' if total > 1 else ''} ({summary}); {per_shape}, a {speedup:.2f}x speed-up"
        )
    else:
        headline = (
            f"{candidate_name} and {baseline_name} are equivalent within ±{config.threshold:.0%} "
            f"on {total} shape{'s' if total > 1 else ''} ({summary})"
        )
    floor_note = ""
    if focus.aa is not None and aa_biased(focus.aa):
        floor_note = (f" The A/A calibration read {_pct(focus.aa.estimate.value)} between the "
                      "baseline and itself; effects smaller than that are not called.")
    if focus.floor > config.threshold:
        floor_note = (f" The A/A noise floor here, ±{focus.floor:.1%}, exceeds the threshold; "
                      "effects were judged against it.")
    why = headline + (f": {explanation_clause}." if explanation_clause else ".") + floor_note

    evidence[:0] = [
        _shape_evidence(r, combined.significant[i], combined.decisions[i]) for i, r in enumerate(decided)
    ]
    evidence.insert(0, {
        "kind": "summary", "shapes": total, "slower": len(regressions), "faster": len(improvements),
        "undecided": len(undecided), "geomean_change": geomean.value, "geomean_ci": list(geomean.ci),
        "confidence": LOOK_CONFIDENCE, "threshold": config.threshold,
        "statistic": STATISTIC,
        "fdr": "Benjamini-Hochberg at 0.05 across shapes",
    })
    evidence.append({
        "kind": "harness", **timer.describe(), "threads": env.get("threads"),
        "input_sets": config.input_sets, "sample_s": config.sample_s,
        "order": "randomized balanced ABBA/BAAB blocks", "budget_s": config.budget_s,
    })
    metric_name = "time_change" if total == 1 else "geomean_time_change"
    metric_estimate = focus.change.estimate if total == 1 else geomean
    next_steps = list(rule_next)
    shapes_args = " ".join(f"--shape {format_shape(s)}" for s in config.shapes)
    refs = f"{config.baseline.describe()} {config.candidate.describe()}"
    if status is Status.INCONCLUSIVE:
        next_steps.append(f"glmfb bench {refs} {shapes_args} --budget {_suggest_budget(config, undecided):g}")
    elif status is Status.FAIL:
        next_steps.append(f"glmfb bench {refs} --shape {focus.shape} --json  # reproduce on the worst shape")
    return Verdict(
        probe=ProbeKind.BENCH,
        name=config.name,
        status=status,
        layer=Layer.KERNEL,
        where={"kernel": candidate_name, "shape": focus.shape},
        why=why,
        metric=Metric(metric_name, metric_estimate.value, "fraction", config.threshold, metric_estimate.ci),
        evidence=tuple(evidence),
        next=tuple(next_steps),
        artifacts=artifacts,
        env=env,
        duration_s=time.perf_counter() - started,
    )


def _needed(result: ShapeResult, threshold: float) -> float:
    return samples_needed(result.change, threshold) if result.change is not None else math.inf


def _suggest_budget(config: BenchConfig, undecided: Sequence[ShapeResult]) -> float:
    per_shape = config.budget_s / len(config.shapes)
    worst = 0.0
    for result in undecided:
        needed = _needed(result, config.threshold)
        rate = result.blocks.blocks_per_s
        if math.isfinite(needed) and rate > 0:
            worst = max(worst, needed / rate)
    if worst == 0.0:
        return round(config.budget_s * 4, 1)
    return round(max(config.budget_s, worst * len(config.shapes) + per_shape), 1)


def _inconclusive_why(
    config: BenchConfig, candidate: str, baseline: str, undecided: Sequence[ShapeResult], total: int
) -> str:
    result = undecided[0]
    assert result.change is not None
    needed = _needed(result, config.threshold)
    estimate = result.change.estimate
    head = (
        f"the budget of {config.budget_s:g} s ran out before {candidate} vs {baseline} was decided "
        f"on {len(undecided)} of {total} shape{'s' if total > 1 else ''}: on {result.shape} "
        f"{_pct(estimate.value)} {_ci(*estimate.ci)} straddles ±{config.threshold:.0%} after "
        f"{len(result.blocks)} blocks"
    )
    if math.isfinite(needed) and result.blocks.blocks_per_s > 0:
        seconds = needed / result.blocks.blocks_per_s
        return f"{head}; about {needed:,.0f} blocks (~{seconds:,.0f} s of measuring) would decide it"
    return f"{head}; the change sits on the threshold, so no sample size decides it (move the threshold)"


def _shape_evidence(
    result: ShapeResult, significant: bool | None, decision: Decision | None
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": "shape",
        "shape": result.shape,
        "decision": (decision or result.decision).value,
        "blocks": len(result.blocks),
        "looks": result.looks,
        "calls_per_sample": result.calls_per_sample,
        "baseline_median_s": result.baseline_median_s,
        "candidate_median_s": result.candidate_median_s,
        "ratio_of_medians_change": result.ratio_of_medians,
        "noise_floor": result.floor,
        "measuring_s": result.measuring_s,
    }
    if result.change is not None:
        data.update(
            change=result.change.estimate.value,
            ci=list(result.change.estimate.ci),
            confidence=result.change.estimate.confidence,
            pvalue=result.change.pvalue,
        )
    data.update(result.extra)
    if significant is not None:
        data["fdr_significant"] = significant
    if result.aa is not None:
        data["aa_change"] = result.aa.estimate.value
        data["aa_ci"] = list(result.aa.estimate.ci)
        data["aa_blocks"] = result.aa.samples
    return data


def _profile(
    config: BenchConfig, timer: Any, shape: tuple[int, ...], focus: ShapeResult, status: Status
) -> tuple[dict[str, Any], str, tuple[str, ...]]:
    from glmfb.bench.opdiff import diff_ops, explain, profile_pair

    baseline, candidate = _load_pair(config, shape)
    slower_side_s = max(focus.baseline_median_s, focus.candidate_median_s)
    calls = max(10, min(100, int(0.3 / slower_side_s) if slower_side_s > 0 else 10))
    for side in (baseline, candidate):
        warm_up(side, min_calls=1, min_s=0.0)
    base_ops, cand_ops = profile_pair(baseline.kernels, candidate.kernels, calls, timer.device)
    slower = status is Status.FAIL
    deltas = diff_ops(base_ops, cand_ops, slower)
    explanation = explain(deltas, slower)
    evidence = {
        "kind": "op_diff",
        "shape": focus.shape,
        "profiled_calls": calls,
        "rule": explanation.rule,
        "repeated_reductions": list(explanation.repeated_reductions),
        "ops": [d.to_dict() for d in deltas[:10]],
    }
    return evidence, explanation.clause, explanation.next


def _roofline(device: str, results: Sequence[ShapeResult]) -> dict[str, Any] | None:
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
            rows.append({"shape": result.shape, "side": label, **placement.to_dict(),
                         "summary": placement.describe()})
    return {"kind": "roofline", "ceilings": ceilings.to_dict(), "placements": rows}


def _save(config: BenchConfig, timer: Any, env: dict[str, Any], results: Sequence[ShapeResult]) -> None:
    from glmfb.bench.saved import write_saved
    from glmfb.suite import utc_now

    assert config.save is not None
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
    write_saved(config.save, env=env, created=utc_now(), device=timer.device,
                threads=int(env.get("threads") or 0), timer=timer.describe(), sides=sides, shapes=shapes)


# --------------------------------------------------------------------------------------------
# One target, measured to be saved
# --------------------------------------------------------------------------------------------


def _measure_only(config: BenchConfig, timer: Any, env: dict[str, Any], started: float) -> Verdict:
    if config.save is None:
        raise UsageError("one target given and no --save", "give BASELINE and CANDIDATE, or --save FILE")
    per_shape_s = config.budget_s / len(config.shapes)
    results: list[ShapeResult] = []
    name = kernel_name(config.baseline.ref)
    for shape in config.shapes:
        label = format_shape(shape)
        config.progress(f"bench {label}: measuring {name}")
        single = measure_single(timer, config.baseline, shape, input_sets=config.input_sets,
                                sample_s=config.sample_s, budget_s=per_shape_s)
        blocks = Blocks(raw=[("baseline", v) for v in single.values], elapsed_s=single.elapsed_s,
                        allocations=single.allocations)
        results.append(ShapeResult(label, single.calls_per_sample, blocks, None, Decision.UNDECIDED,
                                   None, 0.0, 0, statistics.median(single.values), math.nan))
    _save(config, timer, env, results)
    medians = ", ".join(f"{r.shape} {r.baseline_median_s * 1e6:.4g} µs" for r in results)
    return Verdict(
        probe=ProbeKind.BENCH, name=config.name, status=Status.PASS, layer=Layer.KERNEL,
        where={"kernel": name},
        why=f"measured {name} only (nothing compared): median per call {medians}; samples saved to "
            f"{config.save}",
        metric=Metric("median_time", results[0].baseline_median_s, "s"),
        evidence=tuple({"kind": "measurement", "shape": r.shape, "samples": len(r.blocks.raw),
                        "calls_per_sample": r.calls_per_sample, "median_s": r.baseline_median_s}
                       for r in results),
        next=(f"glmfb bench OLD.json {config.save}  # compare with another saved run",),
        artifacts={"samples": str(config.save)}, env=env, duration_s=time.perf_counter() - started,
    )


# --------------------------------------------------------------------------------------------
# Saved files
# --------------------------------------------------------------------------------------------


def compare_saved(config: SavedCompareConfig) -> Verdict:
    """Compare two saved sides (glmfb ``--save`` files or pytest-benchmark JSON), unpaired."""
    started = time.perf_counter()
    from glmfb.bench.decision import SavedChange, SavedRun, saved_change
    from glmfb.bench.saved import SavedSide, load_runs
    from glmfb.measure.floor import ProcessFloor, get_floor

    baseline_runs = load_runs(config.baseline)
    candidate_runs = load_runs(config.candidate)
    baseline, candidate = baseline_runs[0], candidate_runs[0]
    others = [set(run.keys) for run in [*baseline_runs[1:], *candidate_runs]]
    keys = [k for k in baseline.keys if all(k in keys for keys in others)]
    if not keys:
        raise InputError(
            f"{config.baseline} and {config.candidate} have no shape or benchmark in common",
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
                floor_used.append(get_floor(config.on_progress))
            sd, df = floor_used[0][0].sd, floor_used[0][0].df
        return saved_change(a, b, same_process=same_process, process_sd=sd, process_df=df, seed=index)

    saved = [change_for(key, i) for i, key in enumerate(keys)]
    changes = [c.change for c in saved]
    decisions = [decide_with_floor(c, config.threshold, 0.0) for c in changes]
    combined = combine(changes, decisions)
    regress = [i for i, d in enumerate(combined.decisions) if d is Decision.REGRESSION]
    improve = [i for i, d in enumerate(combined.decisions) if d is Decision.IMPROVEMENT]
    undecided = [i for i, d in enumerate(combined.decisions) if d is Decision.UNDECIDED]
    if regress:
        status, focus = Status.FAIL, max(regress, key=lambda i: changes[i].estimate.value)
    elif undecided:
        status, focus = Status.INCONCLUSIVE, undecided[0]
    elif improve:
        status, focus = Status.PASS, min(improve, key=lambda i: changes[i].estimate.value)
    else:
        status, focus = Status.PASS, 0
    geomean = combined.geomean
    total = len(keys)
    verb = {Status.FAIL: f"slower on {len(regress)} of {total}",
            Status.INCONCLUSIVE: f"undecided on {len(undecided)} of {total}",
            Status.PASS: f"faster on {len(improve)} of {total}" if improve else
            f"equivalent within ±{config.threshold:.0%} on all {total}"}[status]
    estimate = changes[focus].estimate
    why = (
        f"{candidate.source} vs {baseline.source}: {verb} ({'shapes' if baseline.format != 'pytest-benchmark' else 'benchmarks'}), "
        f"geomean {_pct(geomean.value)} {_ci(*geomean.ci)}; {keys[focus]} {_pct(estimate.value)} "
        f"{_ci(*estimate.ci)}. "
        + ("Both sides come from one saved in-process run" if same_process else
           "Compared across processes: noisier than an in-process A/B run")
    )
    runs_note = _runs_note(len(baseline_runs), len(candidate_runs), saved, floor_used)
    if runs_note:
        why += f"; {runs_note}"
    env_diff = differences(baseline.env, candidate.env)
    if env_diff:
        listed = "; ".join(f"{k}: {a} vs {b}" for k, a, b in ((k, *v) for k, v in env_diff.items()))
        why += f"; the environments differ ({listed}), so part of the change may be the environment"
        if status is Status.PASS:
            status = Status.WARN
    if approximate:
        why += f"; {len(approximate)} comparison(s) from medians and IQR only (no raw samples)"
    evidence: list[dict[str, Any]] = [{
        "kind": "saved_comparison", "baseline": baseline.source, "candidate": candidate.source,
        "formats": [baseline.format, candidate.format], "in_process": same_process,
        "statistic": _saved_statistic(saved),
        "runs": [len(baseline_runs), len(candidate_runs)], "same_process": same_process,
        "geomean_change": geomean.value, "geomean_ci": list(geomean.ci),
        "approximate": approximate,
    }]
    if floor_used:
        evidence.append(floor_used[0][0].evidence(floor_used[0][1]))
    for i, key in enumerate(keys):
        interval = changes[i].interval
        evidence.append({
            "kind": "shape", "shape": key, "change": changes[i].estimate.value,
            "ci": list(changes[i].estimate.ci), "pvalue": changes[i].pvalue, "method": saved[i].method,
            "df": interval.df if interval is not None else None,
            "units": interval.units if interval is not None else None,
            "decision": combined.decisions[i].value, "fdr_significant": combined.significant[i],
        })
    if env_diff:
        evidence.append({"kind": "env_mismatch",
                         "differences": {k: [a, b] for k, (a, b) in env_diff.items()}})
    where: dict[str, Any] = {"kernel": candidate.kernel}
    if baseline.format != "pytest-benchmark":
        where["shape"] = keys[focus]
    else:
        where["function"] = keys[focus]
    return Verdict(
        probe=ProbeKind.BENCH, name=config.name, status=status, layer=Layer.KERNEL, where=where,
        why=why + ".",
        metric=Metric("time_change" if total == 1 else "geomean_time_change",
                      estimate.value if total == 1 else geomean.value, "fraction", config.threshold,
                      estimate.ci if total == 1 else geomean.ci),
        evidence=tuple(evidence),
        next=("rerun both kernels in one process for a paired measurement: glmfb bench BASELINE "
              "CANDIDATE --shape ...",),
        env=fingerprint(), duration_s=time.perf_counter() - started,
    )


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
    if floor_used:
        floor, source = floor_used[0]
        note = (f"one run a side, so the interval carries this machine's between-process floor "
                f"(sd {floor.sd:.1%} of a run's median over {floor.processes} fresh processes, "
                f"measured {floor.created}{'' if source == 'cache' else ' just now'}"
                f"{f' at load {floor.load_1m:.1f}' if floor.load_1m is not None else ''})")
        evidence = floor.evidence(source)
        now, then = evidence["load_1m_now"], floor.load_1m
        if now is not None and then is not None and now > 2 * then + 1:
            note += (f"; the host is busier now (load {now:.1f}), so that floor may understate the "
                     "noise: remeasure it with python -m glmfb.measure.floor")
        return note
    if any(c.method == "runs" for c in saved):
        return f"{a_runs} run(s) against {b_runs}: the spread between runs is in the interval"
    return ""


__all__ = ["KernelError", "compare_saved", "run_bench"]
