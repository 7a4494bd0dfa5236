"""``run_gap``: build both sides, measure the gap interleaved, compare phases, attribute, decide.

The verdict rules, in one place:

- **fail** (layer transfer) when the gap's interval lies above the threshold. The why names
  the phases that grew, the transfer bandwidth against the path's own ceiling, and the gil
  probe's holder and starved thread; ``where`` is the starved thread with the holder's
  function, file and line. A transfer at the ceiling is called bandwidth-bound; a transfer
  far below its own page rate alone beside a GIL holder idle in a native call is a missing
  GIL release.
- **pass** when the interval lies below the threshold.
- **inconclusive** when ``repeats`` or the budget ran out first.
- **error** (layer harness) when a side cannot be built or raises (a receiver that died).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from glmfb.errors import GlmfbError
from glmfb.gap.attribution import GilFinding, trace_candidate_gil
from glmfb.gap.bandwidth import BandwidthCheck, check_bandwidth
from glmfb.gap.config import GapConfig
from glmfb.gap.phases import PhaseChange, compare_phases, grown_phases
from glmfb.gap.runner import Measurement, TargetFailed, gap_passes, measure
from glmfb.targets import Target
from glmfb.verdict import Layer, Metric, ProbeKind, Status, Verdict, traceback_evidence

Progress = Callable[[str], None]


def run_gap(
    config: GapConfig, artifact_dir: Path | None = None, progress: Progress | None = None
) -> Verdict:
    """Compare baseline and candidate iterations and return the gap verdict.

    Bad targets raise :class:`~glmfb.errors.TargetError` (a usage error); anything a target
    raises while it is built or run becomes an error verdict, never a pass.
    """
    from glmfb.env import fingerprint

    started = time.perf_counter()
    report = progress or (lambda message: None)
    baseline_factory = config.baseline.load()
    candidate_factory = config.candidate.load()
    sides: list[Any] = []
    try:
        sides.append(_build("baseline", baseline_factory, config.baseline, report))
        sides.append(_build("candidate", candidate_factory, config.candidate, report))
        measurement = measure(config, sides[0], sides[1], report, build=(
            lambda: _build("baseline", baseline_factory, config.baseline, report),
            lambda: _build("candidate", candidate_factory, config.candidate, report),
        ))
        verdict = _judge(config, measurement, sides[1], artifact_dir, report)
    except TargetFailed as failure:
        verdict = _target_failed(config, failure, sides)
    except GlmfbError:
        raise
    except Exception as exc:  # a broken probe is an error verdict, never a pass
        verdict = Verdict.harness_error(
            ProbeKind.GAP, config.name, f"glmfb gap broke: {type(exc).__name__}: {exc}",
            evidence=[traceback_evidence(exc)],
        )
    finally:
        for side in sides:
            _close(side)
    env = {**fingerprint(), **_transfer_env(sides)}
    return replace(verdict, env=env, duration_s=time.perf_counter() - started)


def _build(label: str, factory: Callable[..., Any], target: Target, report: Progress) -> Callable[[], Any]:
    report(f"building the {label}: {target.describe()}")
    try:
        built = factory(**dict(target.args))
    except Exception as exc:
        raise TargetFailed(label, f"while building ({target.describe()})", exc) from exc
    if not callable(built):
        raise TargetFailed(label, "while building", TypeError(
            f"{target.ref} returned a {type(built).__name__}, not a zero-argument callable"))
    return built


def _close(side: Any) -> None:
    close = getattr(side, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):  # closing must not hide the verdict
            close()


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


def _target_failed(config: GapConfig, failure: TargetFailed, sides: list[Any]) -> Verdict:
    evidence: list[dict[str, Any]] = [
        {"kind": "target_error", "side": failure.side, "stage": failure.stage,
         "error": f"{type(failure.error).__name__}: {failure.error}"},
        traceback_evidence(failure.error),
    ]
    evidence.extend({"kind": "transfer", "side": label, **_describe(side)}
                    for label, side in zip(("baseline", "candidate"), sides, strict=False))
    target = config.baseline if failure.side == "baseline" else config.candidate
    return Verdict.harness_error(
        ProbeKind.GAP, config.name, f"{failure}",
        evidence=evidence,
        next=(f"run the {failure.side} alone: python -c \"from glmfb.targets import Target; "
              f"f = Target({target.portable_ref!r}).load()(**{dict(target.args)!r}); f(); f()\"",),
    )


# --------------------------------------------------------------------------------------------
# The verdict
# --------------------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.0f} ms" if abs(seconds) >= 0.0095 else f"{1e3 * seconds:.1f} ms"


def _phase_phrase(change: PhaseChange) -> str:
    if change.baseline_s is None:
        return f"{change.name} {_ms(change.delta_s)} (only in the candidate)"
    relative = f", {change.change:+.0%}" if change.change is not None else ""
    return f"{change.name} +{_ms(change.delta_s)}{relative}"


def _judge(
    config: GapConfig, measurement: Measurement, candidate: Any, artifact_dir: Path | None, report: Progress
) -> Verdict:
    estimate = measurement.estimate
    threshold = config.threshold
    phases = compare_phases(measurement.baseline.phases, measurement.candidate.phases, config.confidence)
    grown = grown_phases(phases, threshold)
    n = len(measurement.baseline.times_s)
    gap_text = (f"the candidate takes {estimate.value:+.1%} [{estimate.low:+.1%}, {estimate.high:+.1%}] "
                f"against the baseline ({n} interleaved iterations a side, threshold {threshold:.0%})")
    if estimate.low > threshold:
        status = Status.FAIL
    elif gap_passes(estimate, threshold):
        status = Status.PASS
    else:
        status = Status.INCONCLUSIVE

    bandwidth: BandwidthCheck | None = None
    gil: GilFinding | None = None
    if config.attribute:
        report("measuring the transfer ceiling")
        bandwidth = check_bandwidth(candidate, measurement.candidate.phases)
        if status is Status.FAIL:
            report("running the gil probe on the candidate")
            gil_dir = (artifact_dir or Path("reports") / "gap") / "gil"
            gil = trace_candidate_gil(config, gil_dir, report)

    evidence: list[dict[str, Any]] = [
        {
            "kind": "gap",
            "gap": estimate.value,
            "ci": list(estimate.ci),
            "confidence": estimate.confidence,
            "threshold": threshold,
            "baseline_median_s": statistics.median(measurement.baseline.times_s),
            "candidate_median_s": statistics.median(measurement.candidate.times_s),
            "iterations_per_side": n,
            "stopped_by": measurement.stopped_by,
            "elapsed_s": measurement.elapsed_s,
            **measurement.evidence(),
            "baseline_samples_s": [round(t, 6) for t in measurement.baseline.times_s],
            "candidate_samples_s": [round(t, 6) for t in measurement.candidate.times_s],
        },
        *(change.to_dict() for change in phases),
    ]
    info = _describe(candidate)
    if info:
        evidence.append({"kind": "transfer", "side": "candidate", **info})
    if bandwidth is not None:
        evidence.append(bandwidth.to_evidence())
    if gil is not None:
        evidence.append(gil.to_evidence())

    where: dict[str, Any] = {}
    next_steps: list[str] = []
    artifacts: dict[str, str] = {}
    if status is Status.FAIL:
        why, where, next_steps = _explain_failure(config, gap_text, grown, bandwidth, gil)
        if gil is not None:
            artifacts.update({f"gil_{k}": v for k, v in gil.artifacts.items()})
    elif status is Status.PASS:
        why = f"Within the threshold: {gap_text}."
        if bandwidth is not None and bandwidth.achieved_bytes_per_s is not None:
            why += f" {bandwidth.summary()[0].upper()}{bandwidth.summary()[1:]}."
    else:
        ran_out = {"budget": f"the {config.budget_s:g} s budget", "repeats": f"{config.repeats} repeats"}
        why = (f"Not decided: {gap_text}; the interval straddles the threshold and "
               f"{ran_out.get(measurement.stopped_by, 'the limits')} ran out.")
        next_steps.append(f"glmfb gap {config.baseline.portable_ref} {config.candidate.portable_ref} "
                          f"--threshold {config.threshold:.0%} --repeats {config.repeats * 2} "
                          f"--budget {config.budget_s * 2:g}  # more evidence, on a quieter machine")
    path = bandwidth.transfer_path if bandwidth is not None else info.get("transfer_path")
    if path:
        why += f" Transfer path: {path}."
    fallback = info.get("fallback_reason")
    if fallback:
        why += f" (fallback: {fallback})"
    return Verdict(
        probe=ProbeKind.GAP,
        name=config.name,
        status=status,
        layer=Layer.TRANSFER,
        why=why,
        where=where,
        metric=Metric("gap", estimate.value, "ratio", threshold, estimate.ci),
        evidence=tuple(evidence),
        next=tuple(next_steps),
        artifacts=artifacts,
    )


def _explain_failure(
    config: GapConfig,
    gap_text: str,
    grown: list[PhaseChange],
    bandwidth: BandwidthCheck | None,
    gil: GilFinding | None,
) -> tuple[str, dict[str, Any], list[str]]:
    sentences = [f"Over the threshold: {gap_text}."]
    if grown:
        sentences.append("The time went to " + " and ".join(_phase_phrase(c) for c in grown[:3]) + ".")
    else:
        sentences.append("No single reported phase grew beyond noise.")
    if bandwidth is not None and bandwidth.achieved_bytes_per_s is not None:
        verdict_on_link = (
            "the link is saturated: bandwidth, not the interpreter, limits the transfer"
            if bandwidth.bandwidth_bound else
            "the sender was held back, not the link" if bandwidth.starved else
            "the link was not the limit"
        )
        sentences.append(f"{bandwidth.summary()[0].upper()}{bandwidth.summary()[1:]}: {verdict_on_link}.")
    elif bandwidth is not None and bandwidth.error:
        sentences.append(f"Bandwidth unknown ({bandwidth.error}).")
    where: dict[str, Any] = {}
    next_steps: list[str] = []
    if gil is not None:
        sentences.append(gil.sentence())
        if gil.holder_known and gil.starved:
            where = {"thread": gil.starved_thread or gil.holder_thread,
                     "function": gil.holder_function}
            if gil.holder_file:
                where["file"] = gil.holder_file
            if gil.holder_line is not None:
                where["line"] = gil.holder_line
            if gil.idle_in_native:
                sentences.append(f"A missing GIL release in {gil.holder_function}: release the GIL "
                                 "around its native call and rerun this gap.")
        next_steps.extend(gil.next)
        if not gil.available or not gil.holder_known:
            next_steps.append(f"glmfb gil --target {config.candidate.portable_ref} --duration 15")
    elif not config.attribute:
        sentences.append("Attribution was switched off.")
    if bandwidth is not None and bandwidth.bandwidth_bound:
        next_steps.append("cut the bytes moved (KV precision, fewer layers sent) or add bandwidth")
    next_steps.append(f"glmfb gap {config.baseline.portable_ref} {config.candidate.portable_ref} "
                      f"--threshold {config.threshold:.0%}  # after the fix")
    return " ".join(sentences), where, next_steps
