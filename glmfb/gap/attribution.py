"""What ate the time of a failing gap: the GIL, seen by the gil probe run on the candidate side.

The gil probe (:mod:`glmfb.gil`) runs the candidate target in a child process, samples which
thread holds the GIL (py-spy) and which threads wait for it (/proc), and measures a canary
thread's wake-up lateness. Here its verdict is read into a :class:`GilFinding`: the holder
(thread, function, file, line, idle share) and the starved thread. When the gil probe is
missing or breaks, the finding says so and the gap verdict names the missing signal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from glmfb.errors import InputError
from glmfb.gap.config import GapConfig
from glmfb.gil.evidence import GilHolder, GilThreads, HeldSite, Starvation
from glmfb.io import write_json_atomic
from glmfb.probe import ProbeContext, get_probe
from glmfb.verdict import Verdict

IDLE_MAJORITY = 0.5  # a holder blocked in this share of its samples holds the GIL while idle
CANARY_PREFIX = "glmfb-"  # threads the gil probe injects, never the starved thread we name
MAX_PLAUSIBLE_LATENESS_MS = 60_000.0
STARTUP_FUNCTIONS = frozenset({"_call_with_frames_removed", "_find_and_load", "exec_module", "<module>"})


@dataclass(frozen=True)
class GilFinding:
    """The gil probe's answer about the candidate, or why there is none."""

    available: bool
    status: str | None = None  # the gil verdict's status
    reason: str | None = None  # why no answer (probe missing, broke, found nothing)
    holder_thread: str | None = None
    holder_function: str | None = None
    holder_file: str | None = None
    holder_line: int | None = None
    holder_idle_share: float | None = None
    holder_share: float | None = None
    native_frame: str | None = None
    starved_thread: str | None = None
    starved_waiting_share: float | None = None
    canary_p50_ms: float | None = None
    canary_p99_ms: float | None = None
    canary_max_ms: float | None = None
    holder_source: str | None = None  # which gil evidence the holder comes from
    gil_why: str | None = None
    next: tuple[str, ...] = ()
    artifacts: Mapping[str, str] = field(default_factory=dict)

    @property
    def holder_known(self) -> bool:
        return self.holder_function is not None

    @property
    def idle_in_native(self) -> bool:
        return self.holder_idle_share is not None and self.holder_idle_share >= IDLE_MAJORITY

    @property
    def starved(self) -> bool:
        """The gil probe saw starvation (it fails on starvation beside a known holder)."""
        return self.status == "fail" or self.starved_thread is not None

    def sentence(self) -> str:
        """The finding in one sentence, in the terms of its evidence."""
        if not self.available:
            return f"The GIL signal is missing: {self.reason}."
        if not self.holder_known:
            return f"The gil probe ({self.status}) named no GIL holder: {self.reason or self.gil_why}."
        waited = ""
        if self.starved_thread is not None:
            share = (f" in {self.starved_waiting_share:.0%} of samples"
                     if self.starved_waiting_share is not None else "")
            waited = f"the {self.starved_thread} thread waited for the GIL{share}"
            if self.canary_p99_ms is not None:
                waited += f" (a canary thread woke p99 {self.canary_p99_ms:.0f} ms late)"
        elif self.canary_p99_ms is not None:
            waited = f"a canary thread woke p99 {self.canary_p99_ms:.0f} ms late"
        location = f"{self.holder_file}:{self.holder_line}" if self.holder_file else "unknown file"
        held = f"held by {self.holder_function} ({location}) on thread {self.holder_thread}"
        if self.holder_idle_share is not None:
            if self.idle_in_native:
                native = f" ({self.native_frame})" if self.native_frame else ""
                held += f", idle in a native call{native} in {self.holder_idle_share:.0%} of its samples"
            else:
                held += f", computing in {1 - self.holder_idle_share:.0%} of its samples"
        if waited:
            return f"{waited[0].upper()}{waited[1:]}, {held}."
        return f"The GIL was {held}, but no thread was starved beyond the gil probe's threshold."

    def to_evidence(self) -> dict[str, Any]:
        return {
            "kind": "gil_attribution",
            "available": self.available,
            "status": self.status,
            "reason": self.reason,
            "holder_thread": self.holder_thread,
            "holder_function": self.holder_function,
            "holder_file": self.holder_file,
            "holder_line": self.holder_line,
            "holder_share": self.holder_share,
            "holder_idle_share": self.holder_idle_share,
            "native_frame": self.native_frame,
            "holder_source": self.holder_source,
            "starved_thread": self.starved_thread,
            "starved_waiting_share": self.starved_waiting_share,
            "canary_p50_ms": self.canary_p50_ms,
            "canary_p99_ms": self.canary_p99_ms,
            "canary_max_ms": self.canary_max_ms,
            "gil_why": self.gil_why,
        }


def _starved_thread(starvation: Starvation | None, holder_thread: str | None) -> tuple[str | None, float | None]:
    """The thread the gil probe called starved (not the holder, not glmfb's canary) that it saw
    waiting for the GIL most often."""
    if starvation is None:
        return None, None
    starved = set(starvation.threads)
    waiting = [w for w in starvation.waiting_for_gil
               if w.thread in starved and w.thread != holder_thread and not w.thread.startswith(CANARY_PREFIX)]
    if not waiting:
        return None, None
    top = max(waiting, key=lambda w: w.waiting_share)
    return top.thread, top.waiting_share


def _lateness_ms(value: float | None) -> float | None:
    """A canary lateness figure, or None when it cannot be one (longer than any window the gil
    probe samples: a corrupt heartbeat record)."""
    return value if value is not None and 0 <= value <= MAX_PLAUSIBLE_LATENESS_MS else None


def _startup_frame(site: HeldSite) -> bool:
    return site.file.startswith("<frozen importlib") or site.function in STARTUP_FUNCTIONS


def _steady_state_holder(verdict: Verdict) -> tuple[HeldSite | None, str]:
    """The GIL holder of the steady state: the gil probe's top holder, unless that is the
    child's own import machinery (its window starts when the child starts, so imports and the
    target's setup fall inside it); then the most sampled site that is not."""
    top = verdict.find(GilHolder)
    if top is None or not _startup_frame(top):
        return top, "gil_holder"
    threads = verdict.find(GilThreads)
    for index, site in enumerate(threads.sites if threads is not None else ()):
        if not _startup_frame(site):
            return site, f"gil_threads.sites[{index}] (the top holder was import machinery of the child's startup)"
    return None, "only import machinery of the child's startup held the GIL"


def finding_from_verdict(verdict: Verdict) -> GilFinding:
    """Read a gil verdict into a finding, through its typed evidence."""
    holder, holder_source = _steady_state_holder(verdict)
    starvation = verdict.find(Starvation)
    status = verdict.status.value
    if status == "error":
        return GilFinding(available=False, status=status, reason=f"the gil probe could not run: {verdict.why}",
                          artifacts=dict(verdict.artifacts))
    holder_thread = holder.thread if holder else None
    starved_thread, waiting_share = _starved_thread(starvation, holder_thread)
    return GilFinding(
        available=True,
        status=status,
        reason=None if holder else f"no steady-state GIL holder: {holder_source}",
        holder_source=holder_source,
        holder_thread=holder_thread,
        holder_function=holder.function if holder else None,
        holder_file=holder.file if holder else None,
        holder_line=holder.line if holder else None,
        holder_idle_share=holder.idle_share if holder else None,
        holder_share=holder.share_of_time if holder else None,
        native_frame=holder.native_frame if holder else None,
        starved_thread=starved_thread,
        starved_waiting_share=waiting_share,
        canary_p50_ms=_lateness_ms(starvation.p50_ms) if starvation else None,
        canary_p99_ms=_lateness_ms(starvation.p99_ms) if starvation else None,
        canary_max_ms=_lateness_ms(starvation.max_ms) if starvation else None,
        gil_why=verdict.why,
        next=tuple(verdict.next),
        artifacts=dict(verdict.artifacts),
    )


def trace_candidate_gil(config: GapConfig, ctx: ProbeContext) -> GilFinding:
    """Run the gil probe on the candidate target (artifacts in ``ctx``'s folder); never raises
    for a probe failure: the attribution degrades, the gap itself stands."""
    from glmfb.host import run_probe

    try:
        probe = get_probe("gil")
    except InputError as exc:
        return GilFinding(available=False, reason=f"the gil probe is not installed ({exc})")
    try:
        gil_config = probe.config_type(
            name=f"{config.name}/gil",
            target=config.candidate,
            # The gil probe samples once the target is built and has run once (steady state).
            duration_s=config.gil_duration_s,
            setup_timeout_s=max(config.gil_startup_s, 1.0),
            rate_hz=config.gil_rate_hz,
        )
        verdict = run_probe(probe, gil_config, ctx)
    except Exception as exc:
        return GilFinding(available=False, reason=f"the gil probe broke: {type(exc).__name__}: {exc}")
    finding = finding_from_verdict(verdict)
    verdict_file = ctx.artifact("gil-verdict.json")
    try:
        write_json_atomic(verdict_file, verdict.to_dict())
    except OSError:
        return finding
    return replace(finding, artifacts={**finding.artifacts, "verdict": str(verdict_file)})
