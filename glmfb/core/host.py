"""The host boundary: the one place a probe's run turns into a verdict, whatever happens.

:func:`run_probe` calls ``probe.run(config, ctx)`` and guarantees a verdict back:

- :class:`~glmfb.contract.errors.TargetFailed` (the target raised) becomes an error verdict, layer
  harness, that names the side and the stage, with the traceback in evidence;
- a :class:`~glmfb.contract.errors.GlmfbError` becomes an error verdict with its message;
- anything else is glmfb's own failure: an error verdict "glmfb <kind> broke", traceback in
  evidence. Never a pass.

Usage errors (:class:`~glmfb.contract.errors.UsageError`) are raised on (bad input is exit code 2,
not a verdict), except in a suite (``usage_errors=False``), where a problem found only once
the probe ran (a target attribute that does not exist) is that probe's error verdict and the
run goes on. Ctrl-C propagates.

The probe does not know whether it runs here or in a supervised child process: the host
decides (``isolate``: :mod:`glmfb.core.supervise`, with a timeout and a cancellation event), and
either way the caller gets a :class:`~glmfb.contract.verdict.Verdict`.
"""

from __future__ import annotations

import dataclasses
import threading
import traceback
from typing import Any

from glmfb.contract.errors import TRACEBACK_FRAMES, GlmfbError, TargetFailed, UsageError
from glmfb.contract.evidence import TargetError, Traceback
from glmfb.contract.verdict import Verdict
from glmfb.core.probe import Probe, ProbeContext


def run_probe(probe: Probe, config: Any, ctx: ProbeContext, *, usage_errors: bool = True, isolate: bool = False,
              timeout_s: float | None = None, cancel: threading.Event | None = None) -> Verdict:
    """Run one probe and return its verdict (see the module docstring). With ``isolate`` the
    probe runs in a supervised child process, stopped after ``timeout_s`` (default
    :data:`glmfb.core.supervise.DEFAULT_TIMEOUT_S`) or when ``cancel`` is set."""
    started = ctx.clock.monotonic()
    name = str(getattr(config, "name", probe.kind))
    if isolate:
        from glmfb.core.supervise import run_isolated

        verdict = run_isolated(
            probe.kind, name, config, run_id=ctx.run_id, artifact_dir=ctx.artifact_dir, progress=ctx.progress,
            rules_files=ctx.rules_files, usage_errors=usage_errors, timeout_s=timeout_s, cancel=cancel,
            workdir=ctx.workdir, fence=ctx.fence,
        )
        return finish(verdict, ctx.clock.monotonic() - started)
    try:
        verdict = probe.run(config, ctx)
    except TargetFailed as failure:
        verdict = target_failed_verdict(probe.kind, name, failure)
    except UsageError as exc:
        if usage_errors:
            raise
        verdict = Verdict.harness_error(probe.kind, name, str(exc))
    except GlmfbError as exc:
        verdict = Verdict.harness_error(probe.kind, name, str(exc))
    except Exception as exc:  # glmfb's own failure: an error verdict, never a pass
        verdict = Verdict.harness_error(
            probe.kind, name, f"glmfb {probe.kind} broke: {type(exc).__name__}: {exc}",
            evidence=[traceback_evidence(exc)],
            next=["rerun with GLMFB_DEBUG=1 and report the traceback"],
        )
    breach = ctx.fence.breach() if ctx.fence is not None else None
    if breach is not None:  # whatever the probe answered, it did not run the code it was asked to
        verdict = Verdict.harness_error(probe.kind, name, f"glmfb {probe.kind}: {breach}")
    return finish(verdict, ctx.clock.monotonic() - started)


def finish(verdict: Verdict, elapsed_s: float) -> Verdict:
    """Fill what every verdict carries when the engine left it out: duration, environment."""
    changes: dict[str, Any] = {}
    if verdict.duration_s == 0.0:
        changes["duration_s"] = elapsed_s
    if not verdict.env:
        from glmfb.core.env import fingerprint

        changes["env"] = fingerprint()
    return dataclasses.replace(verdict, **changes) if changes else verdict


def target_failed_verdict(kind: str, name: str, failure: TargetFailed, *, next: tuple[str, ...] = ()) -> Verdict:
    """The error verdict for a target that raised: names the side and stage, keeps the trace."""
    return Verdict.harness_error(
        kind, name, str(failure),
        evidence=[
            TargetError(side=failure.side, stage=failure.stage, error=failure.error_line),
            Traceback(text=failure.traceback_text),
        ],
        next=next or (f"run the {failure.side} alone to see the error; fix it and rerun",),
    )


def traceback_evidence(exc: BaseException) -> Traceback:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return Traceback(text="".join(lines[-TRACEBACK_FRAMES:]))
