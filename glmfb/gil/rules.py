"""The rules of ``glmfb gil``: what one trace observed in, a diagnosis out.

:func:`decide` turns the :class:`Observations` of a trace into typed evidence and
:class:`GilFindings`, and tries the rules in order (the first that applies wins):

=======================  ======================================================================
gil-hold-native          a thread starved beyond the p99 threshold while another held the GIL
                         blocked in a native call (idle + GIL): a missing GIL release; fail
gil-hold-compute         starved while the holder computed holding the GIL (active + GIL): fail
gil-hold                 starved beside a holder whose active/idle split is unknown: fail
holder-unknown           starved, but no holder sampling (py-spy missing or refused):
                         inconclusive
cpu-not-gil              starved, but nobody held the GIL for long: the CPU, not the GIL;
                         inconclusive
not-measured             no usable heartbeat (attached by pid, not Python): inconclusive
signal-missing           not starved, but a signal is missing: warn
idle-holder              not starved, yet a thread holds the GIL blocked in a native call for a
                         large share of the time: warn
pass                     no thread starved
=======================  ======================================================================
"""

from __future__ import annotations

import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmfb.evidence import Evidence, MissingSignal
from glmfb.gil.config import HEARTBEAT_THREAD, GilConfig
from glmfb.gil.evidence import (
    GilHolder,
    GilSite,
    GilThreads,
    HeldSite,
    HolderThread,
    OverlapRow,
    Starvation,
    StarvedWindow,
    TraceOverlap,
    WaitingThread,
)
from glmfb.gil.heartbeat import Heartbeat
from glmfb.gil.pyspy import CallSite, HolderProfile
from glmfb.rules import Diagnosis, Rule, diagnose
from glmfb.verdict import Layer, Metric, Status, Verdict

KIND = "gil"

MIN_HEARTBEAT_TICKS = 50
MIN_COVERED_S = 0.5
_LIBRARY_PREFIXES = tuple(
    {
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["platstdlib"],
        sysconfig.get_paths()["purelib"],
    }
)
IDLE_MAJORITY = 0.5  # a holder blocked in this share of its samples holds the GIL while idle
WARN_IDLE_SHARE = 0.2  # without starvation, still worth a warning
MIN_WAITING_SHARE = 0.05  # a thread seen waiting for the GIL in this share of ticks is starved


@dataclass
class Observations:
    """Everything one trace produced, for the rules."""

    config: GilConfig
    heartbeat: Heartbeat | None = None
    holders: HolderProfile | None = None
    waiting: list[dict[str, Any]] = field(default_factory=list)  # target threads seen waiting
    windows: list[dict[str, Any]] = field(default_factory=list)  # the longest, longest first
    window_summary: dict[str, Any] = field(default_factory=dict)  # windows_total, starved_ms_total
    blame: list[dict[str, Any]] | None = None  # trace mode: functions overlapping starved slices
    missing: list[dict[str, str]] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    reproduce_trace: str = ""
    duration_s: float = 0.0


def heartbeat_is_usable(heartbeat: Heartbeat) -> bool:
    """Enough ticks, or few ticks that cover a long time: a heavily starved heartbeat wakes
    rarely, and that is the signal, not a lack of data."""
    if not heartbeat.ticks:
        return False
    # The time the heartbeat saw: from its first wake-up (and the wait before it) to its
    # last. Summing lateness alone misses the waits for the GIL after its own file writes,
    # and under heavy starvation that undercounts a 2 s window as 0.5 s (found flaky in CI).
    span_s = max(heartbeat.wake_s) - min(heartbeat.wake_s) if heartbeat.wake_s else 0.0
    covered_s = max(
        span_s + max(0.0, heartbeat.lateness_s[0]) + heartbeat.period_s,
        heartbeat.ticks * heartbeat.period_s + sum(max(0.0, x) for x in heartbeat.lateness_s),
    )
    return heartbeat.ticks >= MIN_HEARTBEAT_TICKS or (
        heartbeat.ticks >= 3 and covered_s >= MIN_COVERED_S
    )


def _is_library(file: str) -> bool:
    return file.startswith(_LIBRARY_PREFIXES) or "site-packages" in file or file.startswith("<")


def caller_frame(stack: tuple[str, ...]) -> str | None:
    """The innermost frame outside the standard library and installed packages."""
    for label in reversed(stack):
        location = label.rpartition(" (")[2].rstrip(")")
        if not _is_library(location.rpartition(":")[0]):
            return label
    return None


def holder_evidence(site: CallSite, total: int, cls: type[HeldSite] = GilHolder) -> HeldSite:
    native = site.native_calls.most_common(1)
    stack = site.stacks.most_common(1)[0][0] if site.stacks else ()
    known = site.split_samples > 0
    idle_share = site.idle / site.samples if site.samples and known else 0.0
    return cls(
        thread=site.thread_name, tid=site.thread_id, function=_short(site.function), qualname=site.function,
        file=display_path(site.file), line=site.line, samples=site.samples,
        share_of_time=round(site.samples / total, 4) if total else None,
        active_share=round(1.0 - idle_share, 4) if known else None,
        idle_share=round(idle_share, 4) if known else None,
        native_frame=native[0][0] if native else None, native_samples=site.split_samples,
        caller=caller_frame(stack), stack=tuple(stack[-8:]),
    )


def display_path(file: str) -> str:
    """A file as users read it: relative to the working directory when under it."""
    path = Path(file)
    if path.is_absolute():
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return file
    return file


def _short(function: str) -> str:
    return function if function.startswith("<") else function.rsplit(".", 1)[-1]


def holder_site(observations: Observations) -> CallSite | None:
    """The thread that held the GIL most (heartbeat excluded), and its top call site; None when
    no thread held it in ``min_holder_share`` of the samples."""
    profile = observations.holders
    if profile is None or not profile.sites or not profile.sample_instants:
        return None
    candidates = [t for t in profile.threads if not t["excluded"]]
    sites_by_thread = {s.thread_id for s in profile.sites}
    candidates = [t for t in candidates if t["tid"] in sites_by_thread]
    if not candidates:
        return None
    top_thread = candidates[0]  # threads come ranked by samples
    if top_thread["samples"] / profile.sample_instants < observations.config.min_holder_share:
        return None
    return next(s for s in profile.sites if s.thread_id == top_thread["tid"])


def starved_threads(
    observations: Observations, starved: bool, holder: CallSite | None
) -> list[str]:
    """Threads seen waiting for the GIL often enough (never the holder itself), and the
    heartbeat when it was late beyond the threshold."""
    names = [
        w["thread"]
        for w in observations.waiting
        if w["waiting_share"] >= MIN_WAITING_SHARE
        and (holder is None or w["tid"] != holder.thread_id)
    ]
    if starved:
        names.append(HEARTBEAT_THREAD)
    return names


@dataclass(frozen=True)
class GilFindings:
    """What the rules look at: the typed evidence of the trace and the figures derived from it."""

    threshold_ms: float
    min_holder_share: float
    starved: bool
    heartbeat_usable: bool
    p99_ms: float | None
    ticks: int
    holder: GilHolder | None  # the steady-state top holder, when one held the GIL often enough
    holder_sampled: bool  # py-spy ran (whatever it saw)
    sample_instants: int
    native_known: bool  # the holder's active/idle split was measured (py-spy --native)
    starved_threads: tuple[str, ...]
    missing: tuple[MissingSignal, ...] = ()
    top_overlap: OverlapRow | None = None  # trace mode: what overlapped the starved slices most
    traced: bool = False
    reproduce_trace: str = ""

    @property
    def idle_share(self) -> float:
        return self.holder.idle_share or 0.0 if self.holder is not None else 0.0

    @property
    def holder_share(self) -> float:
        if self.holder is None or not self.sample_instants:
            return 0.0
        return self.holder.samples / self.sample_instants

    @property
    def missing_text(self) -> str:
        return "; ".join(f"{m.signal}: {m.reason}" for m in self.missing)

    @property
    def starved_text(self) -> str:
        return ", ".join(self.starved_threads) or HEARTBEAT_THREAD

    def late(self) -> str:
        return (f"{self.starved_text} starved (p99 wake-up {self.p99_ms:.1f} ms late > "
                f"{self.threshold_ms:g} ms)")

    def saw(self) -> dict[str, Any]:
        seen: dict[str, Any] = {
            "starved": self.starved, "heartbeat_usable": self.heartbeat_usable, "p99_ms": self.p99_ms,
            "threshold_ms": self.threshold_ms, "starved_threads": list(self.starved_threads),
            "holder_sampled": self.holder_sampled, "native_known": self.native_known,
        }
        if self.holder is not None:
            seen.update(holder_thread=self.holder.thread, holder_function=self.holder.function,
                        holder_share=round(self.holder_share, 4), holder_idle_share=self.holder.idle_share)
        if self.missing:
            seen["missing"] = [m.signal for m in self.missing]
        return seen


def _holder_where(f: GilFindings) -> dict[str, Any] | None:
    if f.holder is None:
        return None
    return {"thread": f.holder.thread, "function": f.holder.function, "file": f.holder.file, "line": f.holder.line}


def _trace_step(f: GilFindings) -> tuple[str, ...]:
    if not f.traced and f.reproduce_trace:
        return (f"{f.reproduce_trace}  # ranks what overlaps the starved slices",)
    return ()


def _hold_native(f: GilFindings) -> Diagnosis | None:
    holder = f.holder
    if not (f.starved and holder is not None and f.native_known and f.idle_share >= IDLE_MAJORITY):
        return None
    inside = f" ({holder.native_frame})" if holder.native_frame else ""
    why = (f"{holder.function} holds the GIL inside a native call{inside}; release it around the call "
           f"(py::gil_scoped_release, Py_BEGIN_ALLOW_THREADS). {f.late()} while thread "
           f"{holder.thread} held the GIL blocked in {100 * f.idle_share:.0f}% of its samples.")
    steps = (f"wrap the native call under {holder.function} ({holder.file}:{holder.line}) in "
             "py::gil_scoped_release / Py_BEGIN_ALLOW_THREADS, then rerun this probe", *_trace_step(f))
    return Diagnosis(Status.FAIL, why, steps, _holder_where(f))


def _hot_frames(holder: GilHolder) -> str:
    stack = holder.stack
    hot = " <- ".join(reversed(stack[-3:]))
    if holder.caller is not None and holder.caller not in stack[-3:]:
        hot += f", called from {holder.caller}"
    return hot


def _hold_compute(f: GilFindings) -> Diagnosis | None:
    holder = f.holder
    if not (f.starved and holder is not None and f.native_known):
        return None
    inside = f", mostly inside native {holder.native_frame}" if holder.native_frame else ""
    why = (f"{holder.function} on thread {holder.thread} hogs the interpreter: it held the GIL in "
           f"{100 * f.holder_share:.0f}% of sample instants, active (computing) in "
           f"{100 * (1 - f.idle_share):.0f}% of its samples{inside}; {f.late()}. Hot frames: {_hot_frames(holder)}.")
    steps = (f"move the work in {holder.function} ({holder.file}:{holder.line}) off the GIL (a native call that "
             "releases it, a process pool) or cut it into shorter pieces", *_trace_step(f))
    return Diagnosis(Status.FAIL, why, steps, _holder_where(f))


def _hold_unknown_split(f: GilFindings) -> Diagnosis | None:
    holder = f.holder
    if not (f.starved and holder is not None):
        return None
    why = (f"{holder.function} on thread {holder.thread} held the GIL in {100 * f.holder_share:.0f}% of sample "
           f"instants; {f.late()}. Whether it computes or blocks inside a native call while holding it is unknown "
           f"without py-spy --native (active/idle split unknown). Hot frames: {_hot_frames(holder)}.")
    steps = (f"py-spy dump --native --pid <pid>  # is {holder.function} blocked in a native call "
             "(release the GIL around it) or computing?", *_trace_step(f))
    return Diagnosis(Status.FAIL, why, steps, _holder_where(f))


def _overlap_note(f: GilFindings) -> str:
    top = f.top_overlap
    return f" The trace ranks {top.function} on thread {top.thread} first by overlap." if top else ""


def _holder_unknown(f: GilFindings) -> Diagnosis | None:
    if not f.starved or f.holder_sampled:
        return None
    cause = f"the GIL holder is unknown ({f.missing_text or 'holder sampling did not run'})"
    return Diagnosis(Status.INCONCLUSIVE, f"{f.late()}, but {cause}.{_overlap_note(f)}",
                     ("install py-spy (pip install py-spy) and run as root or with CAP_SYS_PTRACE",))


def _cpu_not_gil(f: GilFindings) -> Diagnosis | None:
    if not f.starved:
        return None
    cause = (f"no thread held the GIL in {100 * f.min_holder_share:.0f}% or more of {f.sample_instants} sample "
             "instants: the CPU (other processes), not the GIL, may be the cause")
    return Diagnosis(Status.INCONCLUSIVE, f"{f.late()}, but {cause}.{_overlap_note(f)}",
                     ("rerun on a quiet machine; check the load with top/pidstat",))


def _not_measured(f: GilFindings) -> Diagnosis | None:
    if f.heartbeat_usable:
        return None
    reason = f"only {f.ticks} heartbeat ticks" if f.ticks else "no heartbeat data"
    held = ""
    if f.holder is not None:
        held = (f" Meanwhile {f.holder.function} on thread {f.holder.thread} held the GIL in "
                f"{100 * f.holder_share:.0f}% of sample instants"
                + (f", blocked in {100 * f.idle_share:.0f}% of them." if f.native_known else "."))
    why = f"Starvation was not measured ({reason}; {f.missing_text or 'the program may not be Python'}).{held}"
    return Diagnosis(Status.INCONCLUSIVE, why,
                     ("start the program under glmfb (glmfb gil -- python prog.py) so the heartbeat is injected",),
                     _holder_where(f))


def _calm(f: GilFindings) -> str:
    return f"heartbeat p99 {f.p99_ms:.1f} ms <= {f.threshold_ms:g} ms"


def _signal_missing(f: GilFindings) -> Diagnosis | None:
    if not f.missing:
        return None
    return Diagnosis(Status.WARN, f"No thread was starved ({_calm(f)}), but a signal is missing: {f.missing_text}.",
                     (), _holder_where(f))


def _idle_holder(f: GilFindings) -> Diagnosis | None:
    holder = f.holder
    if not (holder is not None and f.native_known and f.idle_share >= WARN_IDLE_SHARE and f.holder_share >= 0.2):
        return None
    why = (f"No thread was starved ({_calm(f)}), yet {holder.function} holds the GIL while blocked in a native "
           f"call in {100 * f.idle_share:.0f}% of its samples: a release is missing there.")
    return Diagnosis(Status.WARN, why, (), _holder_where(f))


def _pass(f: GilFindings) -> Diagnosis | None:
    return Diagnosis(Status.PASS, f"No thread was starved: heartbeat p99 wake-up lateness {f.p99_ms:.1f} ms <= "
                                  f"{f.threshold_ms:g} ms over {f.ticks} ticks.", (), {})


RULES: tuple[Rule[GilFindings], ...] = (
    Rule("gil-hold-native", KIND, _hold_native, "starved beside a holder blocked in a native call"),
    Rule("gil-hold-compute", KIND, _hold_compute, "starved beside a holder computing with the GIL"),
    Rule("gil-hold", KIND, _hold_unknown_split, "starved beside a holder, active/idle split unknown"),
    Rule("holder-unknown", KIND, _holder_unknown, "starved, no holder sampling: inconclusive"),
    Rule("cpu-not-gil", KIND, _cpu_not_gil, "starved, but nobody held the GIL for long: inconclusive"),
    Rule("not-measured", KIND, _not_measured, "no usable heartbeat: inconclusive"),
    Rule("signal-missing", KIND, _signal_missing, "not starved, a signal missing: warn"),
    Rule("idle-holder", KIND, _idle_holder, "not starved, a holder idle in a native call: warn"),
    Rule("pass", KIND, _pass, "no thread starved"),
)


def decide(observations: Observations, rules: Sequence[Rule[Any]] | None = None) -> Verdict:
    """The verdict of one trace: typed evidence, findings, the first rule that applies."""
    config = observations.config
    heartbeat = observations.heartbeat
    threshold_ms = config.starvation_p99_ms
    beat_ok = heartbeat is not None and heartbeat_is_usable(heartbeat)
    p99_ms = heartbeat.percentile_ms(99) if beat_ok and heartbeat is not None else None
    starved = p99_ms is not None and p99_ms > threshold_ms
    site = holder_site(observations)
    profile = observations.holders
    total = profile.sample_instants if profile else 0
    starved_names = starved_threads(observations, starved, site)
    holder = holder_evidence(site, total) if site is not None else None
    assert holder is None or isinstance(holder, GilHolder)
    missing = tuple(MissingSignal(signal=m["signal"], reason=m["reason"]) for m in observations.missing)

    evidence: list[Evidence] = []
    if heartbeat is not None:
        evidence.append(Starvation(
            threads=tuple(starved_names), canary=HEARTBEAT_THREAD, **heartbeat.summary(), threshold_ms=threshold_ms,
            starved=starved, waiting_for_gil=tuple(WaitingThread(**w) for w in observations.waiting),
            **observations.window_summary, windows=tuple(StarvedWindow(**w) for w in observations.windows),
        ))
    if holder is not None:
        evidence.append(holder)
    if profile is not None:
        evidence.append(GilThreads(
            samples=profile.total_samples, sample_instants=profile.sample_instants, native=profile.native,
            threads=tuple(HolderThread(**t) for t in profile.threads[:8]),
            sites=tuple(holder_evidence(s, total, GilSite) for s in profile.sites[1:4]),  # type: ignore[misc]
        ))
    overlaps = tuple(OverlapRow(**row) for row in observations.blame[:10]) if observations.blame is not None else None
    if overlaps is not None:
        evidence.append(TraceOverlap(functions=overlaps))
    evidence.extend(missing)

    findings = GilFindings(
        threshold_ms=threshold_ms, min_holder_share=config.min_holder_share, starved=starved,
        heartbeat_usable=beat_ok, p99_ms=p99_ms, ticks=heartbeat.ticks if heartbeat is not None else 0,
        holder=holder, holder_sampled=profile is not None, sample_instants=total,
        native_known=bool(profile is not None and profile.native and site is not None and site.split_samples > 0),
        starved_threads=tuple(starved_names), missing=missing,
        top_overlap=overlaps[0] if overlaps else None, traced=observations.blame is not None,
        reproduce_trace=observations.reproduce_trace,
    )
    outcome = diagnose(list(rules) if rules is not None else list(RULES), findings)
    evidence.append(outcome.record)
    diagnosis = outcome.diagnosis
    return Verdict(
        probe="gil", name=config.name, status=diagnosis.status, layer=Layer.RUNTIME, why=diagnosis.why,
        where=dict(diagnosis.where or {}), metric=Metric("starvation_p99", p99_ms, "ms", threshold_ms),
        evidence=tuple(evidence), next=diagnosis.next, artifacts=observations.artifacts, env=observations.env,
        duration_s=observations.duration_s,
    )
