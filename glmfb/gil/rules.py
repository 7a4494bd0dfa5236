"""The rules of ``glmfb gil``: what one trace observed in, a diagnosis out.

:func:`decide` turns the :class:`Observations` of a trace into typed evidence and
:class:`GilFindings`, and tries the rules in order (the first that applies wins):

=======================  ======================================================================
gil-hold-native          a thread starved beyond the p99 threshold (or the heartbeat could not
                         run for a long stretch, blocked on the GIL) while another held the GIL
                         blocked in a native call (idle + GIL): a missing GIL release; fail
gil-hold-compute         starved while the holder computed holding the GIL (active + GIL): fail
gil-hold                 starved beside a holder whose active/idle split is unknown: fail
gil-wait-share           not starved by the p99, but a program thread waited for the GIL a large
                         share of the time it was not waiting for a CPU (many short holds that
                         add up), beside a holder: fail
holder-unknown           starved (or waiting), but no holder sampling (py-spy missing or
                         refused): inconclusive
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

import linecache
import re
import sysconfig
from collections import Counter
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
    GilTimeline,
    HeldSite,
    HolderThread,
    OverlapRow,
    Starvation,
    StarvedWindow,
    ThreadTimeRow,
    ThreadTimes,
    TimelineThread,
    TraceOverlap,
    WaitingThread,
)
from glmfb.gil.heartbeat import Heartbeat, lateness_series
from glmfb.gil.pyspy import CallSite, HolderProfile
from glmfb.rules import Diagnosis, Rule, diagnose
from glmfb.step import Step
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
MIN_WAITING_SHARE = 0.05  # a thread waiting for the GIL this share of wall time is starved
# gil-wait-share: the share of a thread's time off the run queue spent waiting for the GIL.
# A thread beside a busy one waits up to one switch interval per hand-over; the planted short
# holds make it wait 40-60%, a clean loop under 3%. Both bounds must hold: the estimate at
# 20% or more and its interval's lower end at 10% or more (a noisy window decides nothing).
WAIT_SHARE_FAIL = 0.2
WAIT_SHARE_LOW = 0.1
MIN_WAIT_WALL_SHARE = 0.05  # and at least this share of wall time
# A heartbeat too thin for a p99 (few wake-ups) still starved when it could not run for this
# many thresholds in one stretch while it waited for the GIL in most of that stretch.
STALL_THRESHOLDS = 10
STALL_GIL_SHARE = 0.5
CANARY_PREFIX = "glmfb-"  # glmfb's own threads in the program: never a starved thread we name
MAX_THREAD_ROWS = 16


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
    reproduce_trace: Step | None = None  # the step that reruns the probe in trace mode
    duration_s: float = 0.0
    observed_s: float | None = None  # the sampled window's length
    window_start_s: float | None = None
    thread_times: dict[int, Any] = field(default_factory=dict)  # tid -> procwatch.ThreadTime
    thread_names: dict[int, str] = field(default_factory=dict)
    cpus: dict[int, str] = field(default_factory=dict)  # tid -> Cpus_allowed_list
    native_votes: dict[int, Counter[tuple[str, str]]] = field(default_factory=dict)  # tid -> (name, symbol) seen
    # tid -> library functions below Python, counted once per snapshot they appear in
    native_foreign: dict[int, Counter[str]] = field(default_factory=dict)
    native_error: str | None = None
    native_snapshots: int = 0
    stall: dict[str, Any] = field(default_factory=dict)  # the heartbeat's longest stretch without a wake-up
    timeline: dict[int, list[list[Any]]] = field(default_factory=dict)
    own_p99_ms: float | None = None  # p99 net of the heartbeat's own CPU waits only
    holder_cpu_wait_s: float = 0.0  # the holder's CPU waits taken out of late wake-ups


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


def _glmfb_file(file: str) -> bool:
    """A file of glmfb itself (its runner, its heartbeat): never the cause."""
    import glmfb

    package = Path(glmfb.__file__).resolve().parent
    try:
        return Path(file).resolve().is_relative_to(package)
    except (OSError, ValueError):
        return False


def _names_callee(file: str, line: int, symbol: str) -> bool:
    """Whether the source line calls the foreign function by (a variable of) its name:
    ``usleep(wait_us)``, ``self._usleep(wait_us)``."""
    text = linecache.getline(file, line) if file and line else ""
    callees = re.findall(r"([A-Za-z_][\w]*)\s*\(", text)
    wanted = symbol.lower().strip("_")
    return bool(wanted) and any(wanted in callee.lower() for callee in callees)


def c_function_of(site: CallSite, votes: Counter[tuple[str, str]] | None,
                  foreign: Counter[str] | None = None) -> tuple[str | None, str | None, str | None]:
    """``(python name, C symbol, source)`` of the C function the site held the GIL in: from
    py-spy --native's frames below it, else from native snapshots of its thread while it ran
    (py-spy leaves the interpreter's own functions out: ``sorted``, ``list.sort``). A foreign
    function (a library's, through ctypes) whose call is written on the site's own line
    (``usleep(...)`` in ``intranode_dispatch``) leaves the site's Python function as the name:
    that function is the binding; through an indirection (``self.work()`` of a partial) the
    foreign function is named.

    A snapshot's frames come from scanning its stack for return addresses, so a stale one (a
    ``clock_gettime`` an earlier call left in a slot the foreign call's frames did not
    overwrite) can sit above the function really called. So a library function that the
    site's own line calls and that is below Python in most snapshots (``foreign``) is taken
    before the outermost library frame the votes name."""
    from glmfb.gil.native import ENTRY_NAMES

    found: tuple[str, str, str] | None = None
    if site.c_calls:
        (name, symbol), count = site.c_calls.most_common(1)[0]
        if count >= 0.5 * max(1, site.split_samples):
            found = (name, symbol, "py-spy --native")
    if found is None and votes:
        total = sum(votes.values())
        (name, symbol), count = votes.most_common(1)[0]
        if name and count >= 0.5 * total:
            found = (name, symbol, "native snapshots")
        if name == symbol and foreign and not _glmfb_file(site.file):  # the votes name a library function
            for called, seen in foreign.most_common():
                if seen >= 0.5 * total and _names_callee(site.file, site.line, called):
                    return None, called, "native snapshots"
    if found is None:
        return None, None, None
    name, symbol, source = found
    library = name == symbol and symbol not in ENTRY_NAMES
    if library and not _glmfb_file(site.file) and _names_callee(site.file, site.line, symbol):
        return None, symbol, source
    return name, symbol, source


def holder_evidence(site: CallSite, total: int, cls: type[HeldSite] = GilHolder,
                    votes: Counter[tuple[str, str]] | None = None, foreign: Counter[str] | None = None) -> HeldSite:
    native = site.native_calls.most_common(1)
    stack = site.stacks.most_common(1)[0][0] if site.stacks else ()
    known = site.split_samples > 0
    idle_share = site.idle / site.samples if site.samples and known else 0.0
    c_function, c_symbol, c_source = c_function_of(site, votes, foreign)
    return cls(
        thread=site.thread_name, tid=site.thread_id, function=_short(site.function), qualname=site.function,
        file=display_path(site.file), line=site.line, samples=site.samples,
        share_of_time=round(site.samples / total, 4) if total else None,
        active_share=round(1.0 - idle_share, 4) if known else None,
        idle_share=round(idle_share, 4) if known else None,
        native_frame=native[0][0] if native else None, native_samples=site.split_samples,
        caller=caller_frame(stack), stack=tuple(stack[-8:]),
        c_function=c_function, c_symbol=c_symbol, c_source=c_source,
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


def holder_site(observations: Observations, exclude: frozenset[int] = frozenset()) -> CallSite | None:
    """The thread that held the GIL most (heartbeat and ``exclude`` left out), and its top call
    site; None when no thread held it in ``min_holder_share`` of the samples. A site in glmfb's
    own code (the target runner's loop) is passed over unless it held the GIL inside a C call
    it made for the target (then that call is the cause)."""
    profile = observations.holders
    if profile is None or not profile.sites or not profile.sample_instants:
        return None
    candidates = [t for t in profile.threads if not t["excluded"] and t["tid"] not in exclude]
    for thread in candidates:  # ranked by samples
        if thread["samples"] / profile.sample_instants < observations.config.min_holder_share:
            return None
        for site in (s for s in profile.sites if s.thread_id == thread["tid"]):
            if not _glmfb_file(site.file):
                return site
            if c_function_of(site, observations.native_votes.get(site.thread_id),
                             observations.native_foreign.get(site.thread_id))[0] is not None:
                return site
    return None


def starved_threads(
    observations: Observations, starved: bool, holder: CallSite | None
) -> list[str]:
    """Threads waiting for the GIL a real share of the time (never the holder itself), and the
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
    reproduce_trace: Step | None = None  # the step that reruns the probe in trace mode
    stall_ms: float | None = None  # the heartbeat's longest stretch without a wake-up
    stall_gil_share: float | None = None  # ... and the share of it blocked on the GIL
    stalled: bool = False  # starved by that stretch (the heartbeat too thin for a p99)
    observed_s: float | None = None
    waiter: WaitingThread | None = None  # the program thread that waited for the GIL most
    wait_holder: GilHolder | None = None  # who held it meanwhile (not the waiter itself)

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

    @property
    def waits_a_lot(self) -> bool:
        """A program thread waited for the GIL a large share of its time off the run queue."""
        waiter = self.waiter
        if waiter is None or waiter.of_runnable_share is None:
            return False
        low = waiter.of_runnable_ci[0] if waiter.of_runnable_ci else waiter.of_runnable_share
        return (waiter.of_runnable_share >= WAIT_SHARE_FAIL and low >= WAIT_SHARE_LOW
                and waiter.waiting_share >= MIN_WAIT_WALL_SHARE)

    def late(self) -> str:
        if self.stalled and self.stall_ms is not None:
            share = f" (blocked on the GIL {100 * (self.stall_gil_share or 0):.0f}% of that time)"
            held = f" while {self.holder.thread} held the GIL" if self.holder is not None else ""
            return (f"{self.starved_text} starved: the heartbeat could not run for {self.stall_ms / 1e3:.2f} s"
                    f"{held}{share}, waking {self.ticks} times in {self.observed_s or 0:.1f} s")
        return (f"{self.starved_text} starved (p99 wake-up {self.p99_ms:.1f} ms late > "
                f"{self.threshold_ms:g} ms)")

    def saw(self) -> dict[str, Any]:
        seen: dict[str, Any] = {
            "starved": self.starved, "heartbeat_usable": self.heartbeat_usable, "p99_ms": self.p99_ms,
            "threshold_ms": self.threshold_ms, "starved_threads": list(self.starved_threads),
            "holder_sampled": self.holder_sampled, "native_known": self.native_known,
        }
        if self.stall_ms is not None:
            seen.update(stall_ms=round(self.stall_ms, 1), stall_gil_share=self.stall_gil_share, stalled=self.stalled)
        if self.holder is not None:
            seen.update(holder_thread=self.holder.thread, holder_function=self.holder.function,
                        holder_c_function=self.holder.c_function,
                        holder_share=round(self.holder_share, 4), holder_idle_share=self.holder.idle_share)
        if self.waiter is not None:
            seen.update(waiter=self.waiter.thread, waiter_share=self.waiter.waiting_share,
                        waiter_of_runnable=self.waiter.of_runnable_share, waiter_ci=list(self.waiter.of_runnable_ci))
        if self.missing:
            seen["missing"] = [m.signal for m in self.missing]
        return seen


def _where_of(holder: GilHolder | None) -> dict[str, Any] | None:
    if holder is None:
        return None
    where: dict[str, Any] = {"thread": holder.thread, "function": holder.c_function or holder.function}
    if not _glmfb_file(holder.file):  # glmfb's runner is never the place to look
        where.update(file=holder.file, line=holder.line)
    return where


def _holder_where(f: GilFindings) -> dict[str, Any] | None:
    return _where_of(f.holder)


def _named(holder: GilHolder) -> str:
    """``sorted (C builtin_sorted), called from Worker.loop`` or the Python function alone."""
    if holder.c_function is None:
        return holder.function
    symbol = f" (C {holder.c_symbol})" if holder.c_symbol and holder.c_symbol != holder.c_function else ""
    caller = "glmfb's target runner" if _glmfb_file(holder.file) else f"{holder.qualname} ({holder.file}:{holder.line})"
    return f"{holder.c_function}{symbol}, called from {caller},"


def _fix_site(holder: GilHolder) -> str:
    if _glmfb_file(holder.file):
        return holder.c_function or holder.function
    name = holder.c_function or holder.function
    return f"{name} ({holder.file}:{holder.line})"


def _trace_step(f: GilFindings) -> tuple[Step, ...]:
    if not f.traced and f.reproduce_trace is not None:
        return (f.reproduce_trace,)
    return ()


def _hold_native(f: GilFindings) -> Diagnosis | None:
    holder = f.holder
    if not (f.starved and holder is not None and f.native_known and f.idle_share >= IDLE_MAJORITY):
        return None
    inside = f" ({holder.native_frame})" if holder.native_frame else ""
    why = (f"{_named(holder)} holds the GIL inside a native call{inside}; release it around the call "
           f"(py::gil_scoped_release, Py_BEGIN_ALLOW_THREADS). {f.late()} while thread "
           f"{holder.thread} held the GIL blocked in {100 * f.idle_share:.0f}% of its samples.")
    steps = (Step(f"wrap the native call under {_fix_site(holder)} in "
                  "py::gil_scoped_release / Py_BEGIN_ALLOW_THREADS, then rerun this probe"), *_trace_step(f))
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
    inside = f", mostly inside native {holder.native_frame}" if holder.native_frame and not holder.c_function else ""
    why = (f"{_named(holder)} on thread {holder.thread} hogs the interpreter: it held the GIL in "
           f"{100 * f.holder_share:.0f}% of sample instants, active (computing) in "
           f"{100 * (1 - f.idle_share):.0f}% of its samples{inside}; {f.late()}. Hot frames: {_hot_frames(holder)}.")
    steps = (Step(f"move the work in {_fix_site(holder)} off the GIL (a native call that "
                  "releases it, a process pool) or cut it into shorter pieces"), *_trace_step(f))
    return Diagnosis(Status.FAIL, why, steps, _holder_where(f))


def _hold_unknown_split(f: GilFindings) -> Diagnosis | None:
    holder = f.holder
    if not (f.starved and holder is not None):
        return None
    why = (f"{_named(holder)} on thread {holder.thread} held the GIL in {100 * f.holder_share:.0f}% of sample "
           f"instants; {f.late()}. Whether it computes or blocks inside a native call while holding it is unknown "
           f"without py-spy --native (active/idle split unknown). Hot frames: {_hot_frames(holder)}.")
    steps = (Step(f"py-spy dump --native --pid <pid>  # is {holder.function} blocked in a native call "
                  "(release the GIL around it) or computing?"), *_trace_step(f))
    return Diagnosis(Status.FAIL, why, steps, _holder_where(f))


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def _wait_share(f: GilFindings) -> Diagnosis | None:
    waiter, holder = f.waiter, f.wait_holder
    if f.starved or holder is None or waiter is None or not f.waits_a_lot:
        return None
    assert waiter.of_runnable_share is not None
    ci = (f" [{_pct(waiter.of_runnable_ci[0])}, {_pct(waiter.of_runnable_ci[1])}]"
          if len(waiter.of_runnable_ci) == 2 else "")
    calm = (f"the heartbeat's p99 stayed at {f.p99_ms:.1f} ms <= {f.threshold_ms:g} ms"
            if f.p99_ms is not None else "the heartbeat was not starved")
    held = f"{100 * holder.share_of_time:.0f}% of sample instants" if holder.share_of_time is not None else "often"
    why = (f"Thread {waiter.thread} waited for the GIL {_pct(waiter.of_runnable_share)}{ci} of the time it was not "
           f"waiting for a CPU ({_pct(waiter.waiting_share)} of wall time), while {_named(holder)} on thread "
           f"{holder.thread} held the GIL in {held}: many short holds that add up ({calm}, so no single hold "
           f"starves a thread).")
    steps = (Step(f"move the work in {_fix_site(holder)} off the GIL (a native call that releases it, "
                  "a process pool), or hold it less often (batch the calls)"), *_trace_step(f))
    return Diagnosis(Status.FAIL, why, steps, _where_of(holder))


def _overlap_note(f: GilFindings) -> str:
    top = f.top_overlap
    return f" The trace ranks {top.function} on thread {top.thread} first by overlap." if top else ""


def _holder_unknown(f: GilFindings) -> Diagnosis | None:
    if not (f.starved or f.waits_a_lot) or f.holder_sampled:
        return None
    cause = f"the GIL holder is unknown ({f.missing_text or 'holder sampling did not run'})"
    what = f.late() if f.starved else (f"thread {f.waiter.thread} waited for the GIL "
                                       f"{_pct(f.waiter.waiting_share)} of wall time" if f.waiter else "")
    return Diagnosis(Status.INCONCLUSIVE, f"{what}, but {cause}.{_overlap_note(f)}",
                     (Step("install py-spy (pip install py-spy) and run as root or with CAP_SYS_PTRACE"),))


def _cpu_not_gil(f: GilFindings) -> Diagnosis | None:
    if not f.starved:
        return None
    cause = (f"no thread held the GIL in {100 * f.min_holder_share:.0f}% or more of {f.sample_instants} sample "
             "instants: the CPU (other processes), not the GIL, may be the cause")
    return Diagnosis(Status.INCONCLUSIVE, f"{f.late()}, but {cause}.{_overlap_note(f)}",
                     (Step("rerun on a quiet machine; check the load with top/pidstat"),))


def _not_measured(f: GilFindings) -> Diagnosis | None:
    if f.heartbeat_usable:
        return None
    reason = f"only {f.ticks} heartbeat ticks" if f.ticks else "no heartbeat data"
    if f.stall_ms is not None and f.stall_gil_share is not None:
        reason += (f"; its longest stretch without a wake-up, {f.stall_ms / 1e3:.2f} s, was blocked on the GIL "
                   f"{100 * f.stall_gil_share:.0f}% of the time")
    held = ""
    if f.holder is not None:
        held = (f" Meanwhile {f.holder.c_function or f.holder.function} on thread {f.holder.thread} held the GIL in "
                f"{100 * f.holder_share:.0f}% of sample instants"
                + (f", blocked in {100 * f.idle_share:.0f}% of them." if f.native_known else "."))
    why = f"Starvation was not measured ({reason}; {f.missing_text or 'the program may not be Python'}).{held}"
    return Diagnosis(Status.INCONCLUSIVE, why,
                     (Step("start the program under glmfb gil (its command line after --, not --pid) so the "
                           "heartbeat is injected"),),
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
    why = (f"No thread was starved ({_calm(f)}), yet {_named(holder)} holds the GIL while blocked in a native "
           f"call in {100 * f.idle_share:.0f}% of its samples: a release is missing there.")
    return Diagnosis(Status.WARN, why, (), _holder_where(f))


def _pass(f: GilFindings) -> Diagnosis | None:
    waited = ""
    if f.waiter is not None and f.waiter.of_runnable_share is not None:
        waited = (f" The thread that waited most for the GIL, {f.waiter.thread}, waited "
                  f"{_pct(f.waiter.of_runnable_share)} of the time it was not waiting for a CPU.")
    return Diagnosis(Status.PASS, f"No thread was starved: heartbeat p99 wake-up lateness {f.p99_ms:.1f} ms <= "
                                  f"{f.threshold_ms:g} ms over {f.ticks} ticks.{waited}", (), {})


RULES: tuple[Rule[GilFindings], ...] = (
    Rule("gil-hold-native", KIND, _hold_native, "starved beside a holder blocked in a native call"),
    Rule("gil-hold-compute", KIND, _hold_compute, "starved beside a holder computing with the GIL"),
    Rule("gil-hold", KIND, _hold_unknown_split, "starved beside a holder, active/idle split unknown"),
    Rule("gil-wait-share", KIND, _wait_share, "not starved, but a thread waits for the GIL a large share of its time"),
    Rule("holder-unknown", KIND, _holder_unknown, "starved, no holder sampling: inconclusive"),
    Rule("cpu-not-gil", KIND, _cpu_not_gil, "starved, but nobody held the GIL for long: inconclusive"),
    Rule("not-measured", KIND, _not_measured, "no usable heartbeat: inconclusive"),
    Rule("signal-missing", KIND, _signal_missing, "not starved, a signal missing: warn"),
    Rule("idle-holder", KIND, _idle_holder, "not starved, a holder idle in a native call: warn"),
    Rule("pass", KIND, _pass, "no thread starved"),
)


def _stall_p99_ms(stall_s: float, share: float, observed_s: float, period_s: float) -> float:
    """The p99 lateness of the wake-ups a heartbeat held back for ``stall_s * share`` would
    have made: each missed deadline counts, the k-th late by the stall less k periods, so 1%
    of the window's deadlines lie beyond the stall less 1% of the window."""
    blocked_s = stall_s * share
    return 1e3 * max(0.0, blocked_s - 0.01 * observed_s)


def _waiting_threads(observations: Observations) -> list[WaitingThread]:
    return [WaitingThread(**w) for w in observations.waiting]


def _top_waiter(waiting: list[WaitingThread]) -> WaitingThread | None:
    program = [w for w in waiting if not w.thread.startswith(CANARY_PREFIX) and w.of_runnable_share is not None]
    if not program:
        return None
    return max(program, key=lambda w: (w.of_runnable_ci[0] if w.of_runnable_ci else 0.0, w.of_runnable_share or 0.0))


def _thread_times(observations: Observations) -> ThreadTimes | None:
    if not observations.thread_times:
        return None
    rows = []
    names = observations.thread_names
    heartbeat_tid = observations.heartbeat.thread_id if observations.heartbeat is not None else None
    for tid, account in sorted(observations.thread_times.items(), key=lambda item: -(item[1].cpu_s + item[1].gil_wait_s)):
        if account.wall_s <= 0:
            continue
        votes = observations.native_votes.get(tid, Counter())
        named = Counter({k[0]: v for k, v in votes.items() if k[0]})
        top = named.most_common(1)[0] if named else None
        runnable = account.wall_s - account.runqueue_s
        name = names.get(tid, f"thread {tid}")
        rows.append(ThreadTimeRow(
            thread=name, tid=tid, cpu_share=round(account.cpu_share, 4),
            runqueue_share=round(account.runqueue_share, 4), gil_wait_share=round(account.gil_wait_share, 4),
            other_wait_share=round(account.other_wait_share, 4),
            gil_wait_ci=tuple(round(x, 4) for x in account.gil_wait_ci),
            gil_wait_of_runnable=round(account.gil_wait_s / runnable, 4) if runnable > 0 else None,
            longest_gil_wait_ms=round(1e3 * account.longest_gil_wait_s, 1),
            cpus=observations.cpus.get(tid), c_function=top[0] if top else None,
            c_function_share=round(top[1] / sum(votes.values()), 4) if top else None,
            native_snapshots=sum(votes.values()), glmfb=tid == heartbeat_tid or name.startswith(CANARY_PREFIX),
        ))
        if len(rows) >= MAX_THREAD_ROWS:
            break
    return ThreadTimes(observed_s=round(observations.observed_s or 0.0, 4), threads=tuple(rows),
                       native_snapshots=observations.native_snapshots, native_error=observations.native_error)


def _timeline(observations: Observations) -> GilTimeline | None:
    if not observations.timeline:
        return None
    names = observations.thread_names
    return GilTimeline(observed_s=round(observations.observed_s or 0.0, 4), threads=tuple(
        TimelineThread(thread=names.get(tid, f"thread {tid}"), tid=tid, spans=tuple(spans))
        for tid, spans in observations.timeline.items()))


def decide(observations: Observations, rules: Sequence[Rule[Any]] | None = None) -> Verdict:
    """The verdict of one trace: typed evidence, findings, the first rule that applies."""
    config = observations.config
    heartbeat = observations.heartbeat
    threshold_ms = config.starvation_p99_ms
    beat_ok = heartbeat is not None and heartbeat_is_usable(heartbeat)
    p99_ms = heartbeat.percentile_ms(99) if beat_ok and heartbeat is not None else None
    recorded_p99 = (observations.own_p99_ms if observations.own_p99_ms is not None
                    else heartbeat.percentile_ms(99) if heartbeat is not None and heartbeat.ticks else None)
    starved = p99_ms is not None and p99_ms > threshold_ms
    stall = observations.stall
    stall_s, stall_share = stall.get("stall_s"), stall.get("gil_share")
    stalled = bool(
        heartbeat is not None and heartbeat.ticks < MIN_HEARTBEAT_TICKS and stall_s is not None
        and stall_share is not None and 1e3 * stall_s >= STALL_THRESHOLDS * threshold_ms
        and stall_share >= STALL_GIL_SHARE
    )
    if stalled and heartbeat is not None and stall_s is not None and stall_share is not None:
        beat_ok, starved = True, True
        p99_ms = max(p99_ms or 0.0, _stall_p99_ms(stall_s, stall_share, observations.observed_s or stall_s,
                                                  heartbeat.period_s))
    site = holder_site(observations)
    profile = observations.holders
    total = profile.sample_instants if profile else 0
    starved_names = starved_threads(observations, starved, site)
    holder = (holder_evidence(site, total, votes=observations.native_votes.get(site.thread_id),
                              foreign=observations.native_foreign.get(site.thread_id))
              if site is not None else None)
    assert holder is None or isinstance(holder, GilHolder)
    waiting = _waiting_threads(observations)
    waiter = _top_waiter([w for w in waiting if site is None or w.tid != site.thread_id] or waiting)
    wait_holder: GilHolder | None = None
    if waiter is not None:
        other = holder_site(observations, exclude=frozenset({waiter.tid}))
        if other is not None:
            found = holder_evidence(other, total, votes=observations.native_votes.get(other.thread_id),
                                    foreign=observations.native_foreign.get(other.thread_id))
            assert isinstance(found, GilHolder)
            wait_holder = found
    missing = tuple(MissingSignal(signal=m["signal"], reason=m["reason"]) for m in observations.missing)

    evidence: list[Evidence] = []
    if heartbeat is not None:
        summary = heartbeat.summary()
        summary["p99_ms"] = round(p99_ms, 3) if p99_ms is not None else summary["p99_ms"]
        start = observations.window_start_s
        observed = observations.observed_s
        evidence.append(Starvation(
            threads=tuple(starved_names), canary=HEARTBEAT_THREAD, **summary, threshold_ms=threshold_ms,
            starved=starved, waiting_for_gil=tuple(waiting),
            **observations.window_summary, windows=tuple(StarvedWindow(**w) for w in observations.windows),
            observed_s=round(observed, 4) if observed is not None else None,
            expected_ticks=int(observed / heartbeat.period_s) if observed else None,
            stall_ms=round(1e3 * stall_s, 1) if stall_s is not None else None,
            stall_start_s=round(stall["start_s"], 4) if "start_s" in stall else None,
            stall_gil_share=round(stall_share, 4) if stall_share is not None else None,
            stall_holder=stall.get("holder"),
            recorded_p99_ms=round(recorded_p99, 3) if recorded_p99 is not None else None,
            holder_cpu_wait_ms=round(1e3 * observations.holder_cpu_wait_s, 1),
            lateness_series=tuple(lateness_series(heartbeat, start, start + observed))
            if start is not None and observed else (),
        ))
    if holder is not None:
        evidence.append(holder)
    if profile is not None:
        evidence.append(GilThreads(
            samples=profile.total_samples, sample_instants=profile.sample_instants, native=profile.native,
            threads=tuple(HolderThread(**t) for t in profile.threads[:8]),
            sites=tuple(holder_evidence(s, total, GilSite) for s in profile.sites[1:4]),  # type: ignore[misc]
        ))
    times = _thread_times(observations)
    if times is not None:
        evidence.append(times)
    timeline = _timeline(observations)
    if timeline is not None:
        evidence.append(timeline)
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
        stall_ms=1e3 * stall_s if stall_s is not None else None, stall_gil_share=stall_share, stalled=stalled,
        observed_s=observations.observed_s, waiter=waiter, wait_holder=wait_holder,
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
