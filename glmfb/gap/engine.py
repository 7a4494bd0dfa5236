"""``run_gap``: build both sides, measure the gap interleaved, compare phases, attribute, decide.

The statistics say whether the gap's interval lies above the threshold (then the candidate
is attributed: bandwidth against the path's ceiling, the gil probe on the candidate), below
it, or straddles it; the rules in :mod:`glmfb.gap.rules` turn that into the verdict. A side
that cannot be built or raises raises :class:`~glmfb.contract.errors.TargetFailed` (the host makes it
an error verdict, with what each side said about its transfer).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

from glmfb.contract.errors import TargetFailed
from glmfb.contract.evidence import Evidence
from glmfb.contract.step import Intent, Step
from glmfb.contract.verdict import Layer, Metric, Verdict
from glmfb.core.commandline import rerun_step
from glmfb.core.probe import ProbeContext
from glmfb.core.rules import diagnose
from glmfb.core.targets import Target
from glmfb.gap.attribution import GilFinding, gil_rerun_step, trace_candidate_gil
from glmfb.gap.bandwidth import BandwidthCheck, check_bandwidth
from glmfb.gap.config import GapConfig
from glmfb.gap.evidence import GapMeasurement, Phase, TransferInfo
from glmfb.gap.interleave import Measurement, close_all, measure
from glmfb.gap.phases import compare_phases, grown_phases
from glmfb.gap.rules import RULES, GapFindings

Progress = Callable[[str], None]


def run_gap(config: GapConfig, ctx: ProbeContext) -> Verdict:
    """Compare baseline and candidate iterations and return the gap verdict."""
    from dataclasses import replace

    from glmfb.core.env import fingerprint

    started = ctx.clock.monotonic()
    baseline_factory = config.baseline.load()
    candidate_factory = config.candidate.load()
    sides: list[Any] = []
    try:
        sides.append(_build("baseline", baseline_factory, config.baseline, ctx.progress))
        sides.append(_build("candidate", candidate_factory, config.candidate, ctx.progress))
        measurement = measure(config, sides[0], sides[1], ctx.progress, build=(
            lambda: _build("baseline", baseline_factory, config.baseline, ctx.progress),
            lambda: _build("candidate", candidate_factory, config.candidate, ctx.progress),
        ))
        verdict = _judge(config, measurement, sides[1], ctx)
    except TargetFailed as failure:
        from glmfb.core.host import target_failed_verdict

        verdict = target_failed_verdict("gap", config.name, failure, next=(_alone(config, failure.side),))
        verdict = replace(verdict, evidence=(*verdict.evidence, *_transfers(sides)))
    finally:
        close_all(sides)
    env = {**fingerprint(), **_transfer_env(sides)}
    return replace(verdict, env=env, duration_s=ctx.clock.monotonic() - started)


def _alone(config: GapConfig, side: str) -> str:
    target = config.baseline if side == "baseline" else config.candidate
    return (f"run the {side} alone: python -c \"from glmfb.core.targets import Target; "
            f"f = Target({target.portable_ref!r}).load()(**{dict(target.args)!r}); f(); f()\"")


def next_steps(config: GapConfig, attributed: bool) -> dict[str, Step | None]:
    """The steps the rules may suggest (:class:`~glmfb.gap.rules.GapFindings` fields): the
    same gap after a fix, the gap with twice the repeats and budget, and (when the gil probe
    ran) the gil probe on the candidate, sampled longer."""
    return {
        "rerun": rerun_step("gap", config, "after the fix", intent=Intent.AFTER_FIX),
        "more_evidence": rerun_step("gap", config, "more evidence, on a quieter machine", intent=Intent.CONFIRM,
                                    repeats=config.repeats * 2, budget=config.budget_s * 2),
        "gil_rerun": gil_rerun_step(config) if attributed else None,
    }


def _transfers(sides: list[Any]) -> list[TransferInfo]:
    return [_transfer_info(label, side) for label, side in zip(("baseline", "candidate"), sides, strict=False)]


def _transfer_info(label: str, side: Any) -> TransferInfo:
    info = _describe(side)
    known = {k: info.pop(k) for k in ("transfer_path", "fallback_reason") if k in info}
    return TransferInfo(side=label, **known, extra=info)


def _build(label: str, factory: Callable[..., Any], target: Target, report: Progress) -> Callable[[], Any]:
    report(f"building the {label}: {target.describe()}")
    try:
        built = factory(**dict(target.args))
    except (Exception, SystemExit) as exc:
        raise TargetFailed(label, f"while building ({target.describe()})", exc) from exc
    if not callable(built):
        raise TargetFailed(label, "while building", TypeError(
            f"{target.ref} returned a {type(built).__name__}, not a zero-argument callable"))
    return built


def _describe(side: Any) -> dict[str, Any]:
    describe = getattr(side, "describe", None)
    if not callable(describe):
        return {}
    try:
        info = describe()
    except Exception:
        return {}
    return dict(info) if isinstance(info, Mapping) else {}


def _transfer_env(sides: list[Any]) -> dict[str, Any]:
    paths = [getattr(side, "transfer_path", None) for side in sides]
    path = next((p for p in reversed(paths) if p), None)
    return {"transfer_path": path} if path else {}


def _phase_order(measurement: Measurement) -> dict[str, int]:
    """Each phase's place in an iteration: the order the target reported them in (the
    candidate's first, then any the baseline alone reported)."""
    order: dict[str, int] = {}
    for sample in [*measurement.candidate.phases[:1], *measurement.baseline.phases[:1]]:
        for key in sample:
            if not key.endswith("_bytes"):
                order.setdefault(key, len(order))
    return order


def _judge(config: GapConfig, measurement: Measurement, candidate: Any, ctx: ProbeContext) -> Verdict:
    estimate = measurement.estimate
    threshold = config.threshold
    phases = compare_phases(measurement.baseline.phases, measurement.candidate.phases, config.confidence)
    over = estimate.low > threshold

    bandwidth: BandwidthCheck | None = None
    gil: GilFinding | None = None
    if config.attribute:
        ctx.progress("measuring the transfer ceiling")
        bandwidth = check_bandwidth(candidate, measurement.candidate.phases)
        if over:
            ctx.progress("running the gil probe on the candidate")
            gil = trace_candidate_gil(config, ctx.child("gil"))

    n = len(measurement.baseline.times_s)
    evidence: list[Evidence] = [
        GapMeasurement(
            gap=estimate.value, ci=estimate.ci, confidence=estimate.confidence, threshold=threshold,
            baseline_median_s=statistics.median(measurement.baseline.times_s),
            candidate_median_s=statistics.median(measurement.candidate.times_s),
            iterations_per_side=n, stopped_by=measurement.stopped_by, elapsed_s=measurement.elapsed_s,
            **measurement.evidence(),
            baseline_samples_s=tuple(round(t, 6) for t in measurement.baseline.times_s),
            candidate_samples_s=tuple(round(t, 6) for t in measurement.candidate.times_s),
        ),
        *(Phase(phase=c.name, baseline_s=c.baseline_s, candidate_s=c.candidate_s, delta_s=c.delta_s, change=c.change,
                ci=c.ci, concurrent=c.concurrent, order=_phase_order(measurement).get(c.name),
                within="iteration" if c.concurrent else None) for c in phases),
    ]
    if measurement.host_load is not None:
        evidence.append(measurement.host_load.evidence())
    info = _describe(candidate)
    if info:
        evidence.append(_transfer_info("candidate", candidate))
    if bandwidth is not None:
        evidence.append(bandwidth.evidence())

    findings = GapFindings(
        gap=estimate.value, low=estimate.low, high=estimate.high, threshold=threshold, iterations=n,
        stopped_by=measurement.stopped_by, budget_s=config.budget_s, repeats=config.repeats,
        grown=tuple(grown_phases(phases, threshold)), bandwidth=bandwidth, gil=gil, attribute=config.attribute,
        host_load=measurement.host_load, baseline_median_s=statistics.median(measurement.baseline.times_s),
        added_activities=tuple(c.name for c in phases if c.concurrent and c.baseline_s is None and c.candidate_s),
        **next_steps(config, attributed=gil is not None),
    )
    if findings.gil_seen is not None:  # the reading the rules take: the holder and waiter the why names
        evidence.append(findings.gil_seen.evidence())
    outcome = diagnose(ctx.rules("gap", RULES), findings)
    evidence.append(outcome.record)
    diagnosis = outcome.diagnosis
    why = diagnosis.why
    path = bandwidth.transfer_path if bandwidth is not None else info.get("transfer_path")
    if path:
        why += f" Transfer path: {path}."
    fallback = info.get("fallback_reason")
    if fallback:
        why += f" (fallback: {fallback})"
    artifacts: dict[str, str] = {}
    if gil is not None and diagnosis.status.value == "fail":
        artifacts.update({f"gil_{k}": v for k, v in gil.artifacts.items()})
    return Verdict(
        probe="gap", name=config.name, status=diagnosis.status, layer=Layer.TRANSFER, why=why,
        where=dict(diagnosis.where or {}), metric=Metric("gap", estimate.value, "ratio", threshold, estimate.ci),
        evidence=tuple(evidence), next=diagnosis.next, artifacts=artifacts,
    )
