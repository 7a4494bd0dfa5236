"""The evidence kinds of ``glmfb gil``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from glmfb.contract.evidence import Evidence, Record, evidence_kind


@dataclass(frozen=True, kw_only=True)
class WaitingThread(Record):
    """A thread of the program that waited for the GIL: the share of wall time it was blocked
    on the GIL's futex (kernel counters, see glmfb.gil.procwatch), with its 95% interval, and
    the share of the time it was not waiting for a CPU."""

    thread: str
    tid: int
    waiting_share: float
    waiting_ci: tuple[float, ...] = ()
    of_runnable_share: float | None = None  # gil wait / (wall - run-queue wait)
    of_runnable_ci: tuple[float, ...] = ()
    seen_share: float | None = None  # the share of /proc ticks that saw it waiting (biased low)
    of_ready_share: float | None = None  # gil wait / (CPU + run-queue wait + gil wait): of the time it had work
    of_ready_ci: tuple[float, ...] = ()


@dataclass(frozen=True, kw_only=True)
class StarvedWindow(Record):
    """A window where the heartbeat woke more than the threshold late, and who did what in it."""

    start_s: float
    duration_ms: float
    max_lateness_ms: float
    waiting_threads: tuple[str, ...] = ()
    heartbeat_states: dict[str, int] | None = None
    holder: str | None = None
    holder_states: dict[str, int] | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Starvation(Evidence):
    """The heartbeat (a canary thread that wants the GIL every period) and the threads seen
    waiting for the GIL: lateness percentiles net of CPU waits, starved windows."""

    kind: ClassVar[str] = "starvation"
    threads: tuple[str, ...]
    canary: str
    threshold_ms: float
    starved: bool
    ticks: int
    period_ms: float
    p50_ms: float
    p99_ms: float
    wall_p99_ms: float
    cpu_wait_total_ms: float
    dropped_records: int = 0
    max_ms: float | None = None
    waiting_for_gil: tuple[WaitingThread, ...] = ()
    windows_total: int | None = None
    starved_ms_total: float | None = None
    windows: tuple[StarvedWindow, ...] = ()
    observed_s: float | None = None  # the sampled window's length
    expected_ticks: int | None = None  # wake-ups a heartbeat never held back would have made
    stall_ms: float | None = None  # its longest stretch without a wake-up in the window
    stall_start_s: float | None = None  # from the window's start
    stall_gil_share: float | None = None  # of that stretch, the share it waited for the GIL
    stall_holder: str | None = None
    p99_interval_ms: tuple[float, ...] | None = None  # the p99's 95% interval (block bootstrap over the run)
    recorded_p99_ms: float | None = None  # p99 net of the heartbeat's own CPU waits only
    holder_cpu_wait_ms: float | None = None  # the GIL holder's CPU waits, also taken out
    startup_excluded_s: float | None = None  # left out at the start: the imports until they settled
    startup_settled: bool | None = None  # the start-up imports settled inside the window (None: unknown)
    lateness_series: tuple[Any, ...] = ()  # [t_s, lateness_ms] (<= 2000, the max per bin)
    hold_median_ms: float | None = None  # the median lateness of the windows (max_ms: the longest)
    held_long: bool = False  # starved by long holds (docs/gil.md) though the p99 stayed under the threshold

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"gil_waiting": [w.to_dict() for w in self.waiting_for_gil],
                "gil_windows": [w.to_dict() for w in self.windows]}


@dataclass(frozen=True, kw_only=True)
class HeldSite(Evidence):
    """A call site where a thread held the GIL: function, file, line, shares of the samples."""

    thread: str
    tid: int
    function: str
    qualname: str
    file: str
    line: int
    samples: int
    share_of_time: float | None = None
    active_share: float | None = None
    idle_share: float | None = None
    native_frame: str | None = None
    native_samples: int = 0
    caller: str | None = None
    stack: tuple[str, ...] = ()
    c_function: str | None = None  # the Python name of the C function it was in (sorted)
    c_symbol: str | None = None  # its C symbol (builtin_sorted)
    c_source: str | None = None  # py-spy --native, or native snapshots
    thread_count: int = 1  # short-lived threads of one name taken as this thread (2+: a group)
    # the wait the site is (queue.SimpleQueue.get, threading.Condition.wait, the GIL's hand-over): a
    # thread sampled holding the GIL there was waking from it; never a holder (glmfb.gil.holders.waited_in)
    wait: str | None = None
    # The thread's native snapshots: those that named the C function (c_votes) of those counted
    # (native_votes), and those set aside because they found it blocked with the GIL released
    # (released_snapshots), most of them in released_in (queue.SimpleQueue.get).
    c_votes: int = 0
    native_votes: int = 0
    released_snapshots: int = 0
    released_in: str | None = None

    @classmethod
    def _legacy_keys(cls) -> frozenset[str]:
        return frozenset({"share_of_samples"})  # a copy of share_of_time written before typed evidence


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GilHolder(HeldSite):
    """The thread that held the GIL most (the heartbeat excluded) and its top call site."""

    kind: ClassVar[str] = "gil_holder"
    title: ClassVar[str] = "GIL holder"


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GilStartup(HeldSite):
    """Where the GIL was held inside imports (the program's start-up: ``import torch`` loading
    its libraries), reported apart: the holder of the verdict is the steady state's.
    ``samples_total`` counts every start-up sample, ``share_of_time`` is the top site's."""

    kind: ClassVar[str] = "gil_startup"
    title: ClassVar[str] = "GIL held at start-up (imports)"
    samples_total: int = 0


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GilSite(HeldSite):
    """A further call site that held the GIL (the runners-up of the holder)."""

    kind: ClassVar[str] = "site"


@dataclass(frozen=True, kw_only=True)
class HolderThread(Record):
    """Per thread: samples in which it held the GIL, their share, active and idle split."""

    thread: str
    tid: int
    samples: int
    share: float
    excluded: bool
    active: int | None = None
    idle: int | None = None
    thread_count: int = 1  # short-lived threads of one name taken as this thread (2+: a group)


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GilThreads(Evidence):
    """Every thread seen holding the GIL, and the next call sites after the top one."""

    kind: ClassVar[str] = "gil_threads"
    samples: int
    sample_instants: int
    native: bool
    threads: tuple[HolderThread, ...]
    sites: tuple[GilSite, ...] = ()

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"gil_threads": [t.to_dict() for t in self.threads]}


@dataclass(frozen=True, kw_only=True)
class OverlapRow(Record):
    thread: str
    function: str
    overlap_ms: float
    slices: int
    share_of_starved_time: float | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class TraceOverlap(Evidence):
    """From a viztracer trace: functions on other threads ranked by their overlap with the
    starved thread's waits."""

    kind: ClassVar[str] = "trace_overlap"
    functions: tuple[OverlapRow, ...]


@dataclass(frozen=True, kw_only=True)
class ThreadTimeRow(Record):
    """Where one thread's time went over the sampled window, as shares of wall time (they sum
    to 1): on a CPU, waiting for one (run queue), blocked on the GIL, blocked on anything
    else; with what it ran in C when seen running (native snapshots)."""

    thread: str
    tid: int
    cpu_share: float
    runqueue_share: float
    gil_wait_share: float
    other_wait_share: float
    gil_wait_ci: tuple[float, ...] = ()
    gil_wait_of_runnable: float | None = None
    gil_wait_of_ready: float | None = None  # of the time on a CPU, waiting for one or for the GIL
    longest_gil_wait_ms: float | None = None
    cpus: str | None = None  # the CPUs it may run on (Cpus_allowed_list)
    c_function: str | None = None  # what it ran in C in most of its native snapshots that did not find it waiting
    c_function_share: float | None = None  # of those snapshots
    native_snapshots: int = 0  # all of its snapshots
    released_snapshots: int = 0  # those that found it blocked with the GIL released (a queue's get, take_gil)
    released_in: str | None = None  # what most of those found it in (queue.SimpleQueue.get)
    glmfb: bool = False  # glmfb's own thread (the heartbeat), never a cause
    thread_count: int = 1  # short-lived threads of one name taken as this thread (2+: a group)


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ThreadTimes(Evidence):
    """Per thread: CPU, run-queue, GIL-wait and other-wait shares of the sampled window, from
    the kernel's per-thread counters (/proc/PID/task/TID/schedstat) and the states seen."""

    kind: ClassVar[str] = "thread_times"
    observed_s: float
    threads: tuple[ThreadTimeRow, ...]
    native_snapshots: int = 0
    native_error: str | None = None

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"gil_thread_times": [t.to_dict() for t in self.threads]}


@dataclass(frozen=True, kw_only=True)
class TimelineThread(Record):
    thread: str
    tid: int
    spans: tuple[Any, ...]  # [start_s, end_s, state]: holding | waiting | running


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GilTimeline(Evidence):
    """Per thread, when it held the GIL, waited for it or ran, over the sampled window (from
    the /proc ticks; the holder is py-spy's top holder at ticks where another thread waited,
    since py-spy's samples carry no time). Bounded: at most 600 spans per thread."""

    kind: ClassVar[str] = "gil_timeline"
    observed_s: float
    threads: tuple[TimelineThread, ...]


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GilSignals(Evidence):
    """Which signals the verdict was decided from, and which were missing (each missing one is
    also a ``missing_signal`` item, with its reason)."""

    kind: ClassVar[str] = "gil_signals"
    title: ClassVar[str] = "signals used"
    attached: bool  # attached by --pid: no heartbeat
    used: tuple[str, ...]
    missing: tuple[str, ...] = ()
    gil_futex: str | None = None  # how the GIL's futex words were found (None: not found)


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GilWaits(Evidence):
    """Without a heartbeat (attached by --pid): the program's threads that waited for the GIL
    (per-thread /proc accounting), the one that waited the largest share of its runnable time,
    and what the GIL holder py-spy saw was doing at the /proc ticks where that thread waited."""

    kind: ClassVar[str] = "gil_waits"
    title: ClassVar[str] = "GIL waits (no heartbeat)"
    observed_s: float
    threshold_share: float  # of runnable time: a wait share at or above this (interval's low end 10%) fails
    threads: tuple[WaitingThread, ...] = ()
    waiter: str | None = None
    holder: str | None = None
    wait_ticks: int | None = None  # /proc ticks at which the waiter was seen waiting for the GIL
    holder_states: dict[str, int] | None = None  # what the holder's thread did at those ticks

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"gil_waiting": [w.to_dict() for w in self.threads]}


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Readiness(Evidence):
    """When the launched program was ready (--ready URL answered 200, --ready-log matched a
    line) and when the sampling window opened, in seconds from its start."""

    kind: ClassVar[str] = "readiness"
    ready_s: float  # from the program's start to ready
    window_start_s: float | None = None  # from the program's start to the window's opening
    url: str | None = None
    status: int | None = None  # what the URL answered last
    polls: int = 0
    log_regex: str | None = None
    log_line: str | None = None  # the output line that matched


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class LoadRun(Evidence):
    """The load command run during the window (--load): when it ran, how it ended, its output's
    tail. ``failed``: it could not start, or it ended by itself with a non-zero status or a
    signal; one still running when the window closed was stopped (``stopped``), which is no
    failure."""

    kind: ClassVar[str] = "load"
    title: ClassVar[str] = "load command"
    command: tuple[str, ...]
    window_s: float  # the sampling window's length
    failed: bool
    started_s: float | None = None  # from the window's opening
    ended_s: float | None = None  # from the window's opening, when it ended by itself
    stopped: bool = False  # still running when the window closed: stopped with its process tree
    returncode: int | None = None
    description: str | None = None
    error: str | None = None  # why it could not start
    stdout_tail: str | None = None
    stderr_tail: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    # the fields of the last JSON object the load printed on a line of its stdout (its own
    # figures: a p99, a request count, errors), scalars only, at most REPORTED_FIELDS of them
    reported: Mapping[str, Any] | None = None

    def figures(self) -> str:
        """The load's own figures as the why quotes them: ``p99_ms 1352, requests 126``."""
        return ", ".join(f"{key} {_figure(value)}" for key, value in (self.reported or {}).items())

    def phrase(self) -> str:
        """``the load command (python load.py) exited with status 1: <last line>``."""
        import shlex

        text = f"the load command ({shlex.join(self.command)[:120]})"
        if self.error is not None:
            return f"{text} could not start: {self.error}"
        how = self.description or f"exited with status {self.returncode}"
        last = (self.stderr_tail or self.stdout_tail or "").strip().splitlines()
        tail = f": {last[-1][:200]}" if last and self.failed else ""
        when = f" {self.ended_s:.1f} s into the {self.window_s:.1f} s window" if self.ended_s is not None else ""
        return f"{text} {how}{when}{tail}"


REPORTED_FIELDS = 12  # of the load's JSON object, the fields kept (in its order)


def reported_fields(stdout_end: str) -> dict[str, Any] | None:
    """The scalar fields (numbers, booleans, strings up to 80 characters) of the last line of
    ``stdout_end`` that is a JSON object, at most :data:`REPORTED_FIELDS`; None when no line is."""
    import json

    for line in reversed(stdout_end.splitlines()):
        text = line.strip()
        if not (text.startswith("{") and text.endswith("}")):
            continue
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if not isinstance(data, dict):
            continue
        fields = {str(key)[:40]: value[:80] if isinstance(value, str) else value for key, value in data.items()
                  if isinstance(value, (bool, int, float, str)) and not (isinstance(value, float) and value != value)}
        return dict(list(fields.items())[:REPORTED_FIELDS]) or None
    return None


def _figure(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


EVIDENCE_TYPES: tuple[type[Evidence], ...] = (Starvation, GilHolder, GilStartup, GilSite, GilThreads, TraceOverlap,
                                              ThreadTimes, GilTimeline, GilSignals, GilWaits, Readiness, LoadRun)
