"""The rules of ``glmfb gil``: the findings of one trace in, a diagnosis out.

:mod:`glmfb.gil.verdict` turns the observations of a trace into typed evidence and
:class:`GilFindings`; the rules here are tried in order (the first that applies wins):

=======================  ======================================================================
gil-hold-native          a thread starved beyond the p99 threshold (or the heartbeat could not
                         run for a long stretch, blocked on the GIL) while another held the GIL
                         blocked in a native call (idle + GIL): a missing GIL release; fail
gil-hold-compute         starved while the holder computed holding the GIL (active + GIL): fail
gil-hold                 starved beside a holder whose active/idle split is unknown: fail
gil-wait-attached        attached by --pid (no heartbeat): a program thread waited for the GIL a
                         large share of the time it was runnable (/proc), beside a holder py-spy
                         saw: fail (no holder seen: inconclusive)
gil-wait-share           not starved by the p99 (or over it by less than the p99's own spread:
                         its interval reaches down to the threshold), but a program thread
                         waited for the GIL a large share of the time it was not waiting for a
                         CPU (many short holds that add up), beside a holder: fail
load-failed              the load command (--load) could not start, or failed: inconclusive
undecided-wait-share     not starved on a busy host (other processes kept 0.25 CPUs busy), and a
                         thread's GIL-wait share is not decisive either way: its interval
                         reaches 20% (a pass there needs all of it under): inconclusive
holder-unknown           starved (or waiting), but no holder sampling (py-spy missing or
                         refused): inconclusive
cpu-not-gil              starved, but nobody held the GIL for long: the CPU, not the GIL;
                         inconclusive
not-measured             no usable heartbeat (not Python), or attached by pid without the /proc
                         waits or py-spy's holder samples: inconclusive
signal-missing           not starved, but a signal is missing: warn
idle-holder              not starved, yet a thread holds the GIL blocked in a native call for a
                         large share of the time: warn
pass                     no thread starved
=======================  ======================================================================
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from glmfb.contract.evidence import MissingSignal
from glmfb.contract.step import Step
from glmfb.contract.verdict import Status
from glmfb.core.measure.hostload import HostLoad, busy_note
from glmfb.core.rules import Claim, Diagnosis, Rule
from glmfb.gil.config import HEARTBEAT_THREAD
from glmfb.gil.evidence import GilHolder, GilStartup, LoadRun, OverlapRow, WaitingThread
from glmfb.gil.groups import describe
from glmfb.gil.holders import SOURCE_LINE, SOURCE_SNAPSHOTS, display_path, glmfb_file, library_file

KIND = "gil"

IDLE_MAJORITY = 0.5  # a holder blocked in this share of its samples holds the GIL while idle
WARN_IDLE_SHARE = 0.2  # without starvation, still worth a warning
# gil-wait-share: the share of a thread's time off the run queue spent waiting for the GIL.
# A thread beside a busy one waits up to one switch interval per hand-over; the planted short
# holds make it wait 40-60%, a clean loop under 3%. Both bounds must hold: the estimate at
# 20% or more and its interval's lower end at 10% or more (a noisy window decides nothing).
WAIT_SHARE_FAIL = 0.2
WAIT_SHARE_LOW = 0.1
MIN_WAIT_WALL_SHARE = 0.05  # and at least this share of wall time
# Attached by --pid (no heartbeat), the share is of the time a thread was ready to run: a
# server's threads idle in recv most of the time, so a starved one waits a small share of wall
# time (a planted pickling thread beside four request handlers: 10-11% of wall time, 55% of the
# time ready to run); the wall share then only keeps a few stray ticks from deciding.
MIN_WAIT_WALL_SHARE_ATTACHED = 0.02
# A hold the heartbeat saw (a window in which it woke more than the threshold late, net of its
# CPU waits: it waited for the GIL) is long at this many thresholds; LONG_HOLDS of them starve
# the heartbeat whatever its p99, which counts wake-ups, not holds: an exporter that json-dumps
# a large structure once a second held the GIL 555-641 ms at a time, and the p99 of the
# wake-ups between stayed under 1 ms (issue 53). "Short holds" are said only where none was long.
LONG_HOLD_THRESHOLDS = 10
LONG_HOLDS = 2


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
    own_p99_ms: float | None = None  # the p99 net of the heartbeat's own CPU waits only (p99_ms: of the holder's too)
    p99_interval_ms: tuple[float, float] | None = None  # the p99's 95% interval over stretches of the run
    host_load: HostLoad | None = None  # the rest of the host while sampling ran
    startup_settled: bool | None = None  # the program's start-up imports settled inside the window
    startup: GilStartup | None = None  # the top site that held the GIL inside imports
    rerun_longer: Step | None = None  # the rerun with a window long enough to get past start-up
    attached: bool = False  # attached by --pid: no heartbeat could be injected
    waits_measured: bool = False  # /proc ran and the GIL's futex is known: who waited for it is known
    signals_used: tuple[str, ...] = ()  # what was measured, in the words the why uses
    wait_ticks: int | None = None  # /proc ticks at which the waiter was seen waiting for the GIL
    wait_holder_states: Counter[str] | None = None  # what the wait holder's thread did at those ticks
    load: LoadRun | None = None  # --load: how the load command ran
    thread_shares: dict[int, float] | None = None  # tid -> share of sample instants it held the GIL (py-spy)
    also_waiting: tuple[WaitingThread, ...] = ()  # other program threads that waited as much as the waiter's rule asks
    hold_ms: tuple[float, ...] = ()  # each hold the heartbeat saw (its windows' lateness, ms), longest first
    held_long: bool = False  # starved by LONG_HOLDS or more long holds (its p99 may be low)

    @property
    def long_hold_ms(self) -> float:
        return LONG_HOLD_THRESHOLDS * self.threshold_ms

    @property
    def long_holds(self) -> tuple[float, ...]:
        return tuple(hold for hold in self.hold_ms if hold >= self.long_hold_ms)

    @property
    def holds_short(self) -> bool:
        """No hold the heartbeat saw was long: what "many short holds" needs."""
        return not self.long_holds

    def holds_text(self) -> str:
        """``555 to 641 ms at a time (median 600 ms), 5 times in 5.0 s``: the long holds."""
        holds = sorted(self.long_holds)
        if not holds:
            return ""
        span = f"{holds[0]:.0f} to {holds[-1]:.0f} ms" if len(holds) > 1 else f"{holds[0]:.0f} ms"
        median = holds[len(holds) // 2] if len(holds) % 2 else (holds[len(holds) // 2 - 1] + holds[len(holds) // 2]) / 2
        window = f" in {self.observed_s:.1f} s" if self.observed_s else ""
        return (f"{span} at a time (longest {holds[-1]:.0f} ms, median {median:.0f} ms), "
                f"{len(holds)} time{'s' if len(holds) > 1 else ''}{window}")

    @property
    def without_heartbeat(self) -> bool:
        """Attached by --pid, and decided without a heartbeat: the /proc waits were measured and
        py-spy sampled the holder (either missing: not measured, never a pass)."""
        return self.attached and not self.heartbeat_usable and self.waits_measured and self.holder_sampled

    @property
    def basis(self) -> str:
        """`` Decided from py-spy's GIL holder samples and /proc per-thread states; no heartbeat:
        attached by --pid.`` for a verdict decided without a heartbeat, else ""."""
        if not self.without_heartbeat:
            return ""
        used = [s for s in self.signals_used if s != "the injected heartbeat"]
        listed = ", ".join(used[:-1]) + f" and {used[-1]}" if len(used) > 1 else "".join(used)
        return f" Decided from {listed}; no heartbeat: attached by --pid."

    @property
    def holder_running_share(self) -> float | None:
        """The share of the waiter's GIL waits (the /proc ticks it was seen waiting) at which the
        holder's thread was running."""
        if not self.wait_ticks or self.wait_holder_states is None:
            return None
        return self.wait_holder_states.get("running", 0) / self.wait_ticks

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
    def missing_beyond_heartbeat(self) -> tuple[MissingSignal, ...]:
        """The missing signals, less the heartbeat when the verdict was decided without it."""
        if not self.without_heartbeat:
            return self.missing
        return tuple(m for m in self.missing if m.signal != "heartbeat")

    @property
    def starved_text(self) -> str:
        return ", ".join(self.starved_threads) or HEARTBEAT_THREAD

    @property
    def starved_at_margin(self) -> bool:
        """Starved by the p99, but its interval reaches down to the threshold: the p99 is over
        the threshold by less than its own spread over stretches of the run."""
        interval = self.p99_interval_ms
        return (self.starved and not self.stalled and not self.held_long and interval is not None
                and interval[0] <= self.threshold_ms)

    @property
    def waiter_share(self) -> tuple[float | None, tuple[float, ...]]:
        """The top waiter's GIL wait as a share, with its interval: of the time it was ready to run
        (on a CPU, waiting for one or for the GIL) when decided without a heartbeat (a server's
        threads idle in ``recv`` most of the time), else of its time off the run queue."""
        waiter = self.waiter
        if waiter is None:
            return None, ()
        if self.without_heartbeat:
            return waiter.of_ready_share, waiter.of_ready_ci
        return waiter.of_runnable_share, waiter.of_runnable_ci

    @property
    def share_of(self) -> str:
        """What :attr:`waiter_share` is a share of, in words."""
        if self.without_heartbeat:
            return "the time it was ready to run (on a CPU, waiting for one, or for the GIL)"
        return "the time it was not waiting for a CPU"

    @property
    def min_wait_wall_share(self) -> float:
        return MIN_WAIT_WALL_SHARE_ATTACHED if self.without_heartbeat else MIN_WAIT_WALL_SHARE

    @property
    def waits_a_lot(self) -> bool:
        """A program thread waited for the GIL a large share of its time off the run queue (of
        its time ready to run, without a heartbeat), the interval's low end too, and a real
        share of wall time."""
        waiter = self.waiter
        share, ci = self.waiter_share
        if waiter is None or share is None:
            return False
        low = ci[0] if ci else share
        return share >= WAIT_SHARE_FAIL and low >= WAIT_SHARE_LOW and waiter.waiting_share >= self.min_wait_wall_share

    def late(self) -> str:
        if self.held_long and (self.p99_ms is None or self.p99_ms <= self.threshold_ms):
            p99 = f"its p99 wake-up lateness, {self.p99_ms:.1f} ms, " if self.p99_ms is not None else "its p99 "
            return (f"{self.starved_text} starved: the heartbeat could not run for {self.holds_text()}, blocked on "
                    f"the GIL ({p99}counts wake-ups, not holds, and stayed under the {self.threshold_ms:g} ms "
                    "threshold)")
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
        if self.hold_ms:
            seen.update(holds=len(self.hold_ms), longest_hold_ms=round(self.hold_ms[0], 1),
                        long_holds=len(self.long_holds), held_long=self.held_long)
        if self.holder is not None:
            seen.update(holder_thread=self.holder.thread, holder_function=self.holder.function,
                        holder_c_function=self.holder.c_function,
                        holder_share=round(self.holder_share, 4), holder_idle_share=self.holder.idle_share)
        if self.waiter is not None:
            seen.update(waiter=self.waiter.thread, waiter_share=self.waiter.waiting_share,
                        waiter_of_runnable=self.waiter.of_runnable_share, waiter_ci=list(self.waiter.of_runnable_ci))
        if self.missing:
            seen["missing"] = [m.signal for m in self.missing]
        if self.attached:
            seen.update(attached=True, without_heartbeat=self.without_heartbeat, waits_measured=self.waits_measured,
                        signals_used=list(self.signals_used))
            if self.holder_running_share is not None:
                seen["holder_running_while_waiting"] = round(self.holder_running_share, 4)
        if self.load is not None:
            seen.update(load_failed=self.load.failed, load_returncode=self.load.returncode)
        return seen


def user_frame(holder: GilHolder) -> tuple[str, str, int | None] | None:
    """The first frame in the user's own code (function, file, line) when the holder's site is
    in a library (the standard library's json encoder) and its stack has one outside the
    libraries and glmfb; None when the site is the user's own (or only libraries and glmfb's
    runner called it)."""
    if not library_file(holder.file) or holder.caller is None:
        return None
    function, _, location = holder.caller.rpartition(" (")
    file, _, line = location.rstrip(")").rpartition(":")
    if not function or not file or glmfb_file(file):
        return None
    return function, display_path(file), int(line) if line.isdigit() else None


def library_function(holder: GilHolder) -> str:
    """What the GIL was held in, in the library: its C function, else its Python function."""
    return holder.c_function or holder.qualname


def _where_of(holder: GilHolder | None) -> dict[str, Any] | None:
    if holder is None:
        return None
    user = user_frame(holder)
    if user is not None:  # the user's frame, the library function beside it
        function, file, line = user
        where: dict[str, Any] = {"thread": holder.thread, "function": function, "file": file}
        if line is not None:
            where["line"] = line
        where["library_function"] = library_function(holder)
        return where
    where = {"thread": holder.thread, "function": holder.c_function or holder.function}
    if not glmfb_file(holder.file):  # glmfb's runner is never the place to look
        where.update(file=holder.file, line=holder.line)
    return where


def _holder_where(f: GilFindings) -> dict[str, Any] | None:
    return _where_of(f.holder)


def _named(holder: GilHolder) -> str:
    """``sorted (C builtin_sorted), called from Worker.loop`` or the Python function alone; for
    a site in a library, with the user's frame that called it."""
    user = user_frame(holder)
    if user is not None:
        function, file, line = user
        at = f"{file}:{line}" if line is not None else file
        inside = f" (C {holder.c_symbol})" if holder.c_symbol and holder.c_symbol != holder.c_function else ""
        return (f"{library_function(holder)}{inside} (in {holder.qualname}, {holder.file}:{holder.line}), called from "
                f"{function} ({at}){_snapshots(holder)},")
    if holder.c_function is None:
        return holder.function
    symbol = f" (C {holder.c_symbol})" if holder.c_symbol and holder.c_symbol != holder.c_function else ""
    caller = "glmfb's target runner" if glmfb_file(holder.file) else f"{holder.qualname} ({holder.file}:{holder.line})"
    if holder.c_source == SOURCE_LINE:
        return (f"{holder.c_function}, called from {caller} (named from that line's only call, a C function: "
                "py-spy --native sampled no frame below it),")
    return f"{holder.c_function}{symbol}, called from {caller}{_snapshots(holder)},"


def _snapshots(holder: GilHolder) -> str:
    """How many of the thread's native snapshots named the C function, and how many were set
    aside because they found the thread blocked with the GIL released: those say where it
    waited, not what it held the GIL in. The wait itself (``released_in``) stays in the
    evidence: named in the why, a queue's get beside the holder reads as a lead to follow."""
    if holder.c_source != SOURCE_SNAPSHOTS or not holder.native_votes:
        return ""
    aside = (f"; {holder.released_snapshots} more found it waiting with the GIL released, not counted"
             if holder.released_snapshots else "")
    return f" (in {holder.c_votes} of {holder.native_votes} native snapshots of the thread while it ran{aside})"


def _thread(holder: GilHolder) -> str:
    """``thread X``, or ``41 short-lived threads X (taken as one)`` for a group of them."""
    return describe(holder.thread, holder.thread_count)


def _fix_site(holder: GilHolder) -> str:
    user = user_frame(holder)
    if user is not None:
        function, file, line = user
        return f"{library_function(holder)}, called from {function} ({file}:{line})"
    if glmfb_file(holder.file):
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
           f"(py::gil_scoped_release, Py_BEGIN_ALLOW_THREADS). {f.late()} while "
           f"{_thread(holder)} held the GIL blocked in {100 * f.idle_share:.0f}% of its samples.")
    steps = (Step(f"wrap the native call under {_fix_site(holder)} in "
                  "py::gil_scoped_release / Py_BEGIN_ALLOW_THREADS, then rerun this probe"), *_trace_step(f))
    return Diagnosis(Status.FAIL, why, steps, _holder_where(f))


def _hot_frames(holder: GilHolder) -> str:
    stack = holder.stack
    hot = " <- ".join(reversed(stack[-3:]))
    if holder.caller is not None and holder.caller not in stack[-3:]:
        hot += f", called from {holder.caller}"
    return hot


def _short_holds(f: GilFindings) -> bool:
    """The p99 crossed the threshold only within its own spread, while a thread's wait for the
    GIL is decisive: the evidence is of many short holds that add up (gil-wait-share), not of a
    hold long enough to starve on its own."""
    return f.starved_at_margin and f.waits_a_lot and f.wait_holder is not None


def _hold_compute(f: GilFindings) -> Diagnosis | None:
    holder = f.holder
    if not (f.starved and holder is not None and f.native_known) or _short_holds(f):
        return None
    inside = f", mostly inside native {holder.native_frame}" if holder.native_frame and not holder.c_function else ""
    why = (f"{_named(holder)} on {_thread(holder)} hogs the interpreter: it held the GIL in "
           f"{100 * f.holder_share:.0f}% of sample instants, active (computing) in "
           f"{100 * (1 - f.idle_share):.0f}% of its samples{inside}; {f.late()}. Hot frames: {_hot_frames(holder)}.")
    steps = (Step(f"move the work in {_fix_site(holder)} off the GIL (a native call that "
                  "releases it, a process pool) or cut it into shorter pieces"), *_trace_step(f))
    return Diagnosis(Status.FAIL, why, steps, _holder_where(f))


def _hold_unknown_split(f: GilFindings) -> Diagnosis | None:
    holder = f.holder
    if not (f.starved and holder is not None) or _short_holds(f):
        return None
    why = (f"{_named(holder)} on {_thread(holder)} held the GIL in {100 * f.holder_share:.0f}% of sample "
           f"instants; {f.late()}. Whether it computes or blocks inside a native call while holding it is unknown "
           f"without py-spy --native (active/idle split unknown). Hot frames: {_hot_frames(holder)}.")
    steps = (Step(f"py-spy dump --native --pid <pid>  # is {holder.function} blocked in a native call "
                  "(release the GIL around it) or computing?"), *_trace_step(f))
    return Diagnosis(Status.FAIL, why, steps, _holder_where(f))


def _sentence(text: str) -> str:
    """``text`` to open a sentence (a thread's own name keeps its case)."""
    return text[:1].upper() + text[1:]


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def _wait_share(f: GilFindings) -> Diagnosis | None:
    waiter, holder = f.waiter, f.wait_holder
    if f.without_heartbeat:  # gil-wait-attached speaks of that case
        return None
    if (f.starved and not _short_holds(f)) or holder is None or waiter is None or not f.waits_a_lot:
        return None
    assert waiter.of_runnable_share is not None
    ci = (f" [{_pct(waiter.of_runnable_ci[0])}, {_pct(waiter.of_runnable_ci[1])}]"
          if len(waiter.of_runnable_ci) == 2 else "")
    if f.starved and f.p99_interval_ms is not None:
        low, high = f.p99_interval_ms
        calm = (f"the heartbeat's p99, {f.p99_ms:.1f} ms, is over the {f.threshold_ms:g} ms threshold by less "
                f"than its own spread ({low:.1f} to {high:.1f} ms over stretches of the run)")
    elif f.p99_ms is not None:
        calm = f"the heartbeat's p99 stayed at {f.p99_ms:.1f} ms <= {f.threshold_ms:g} ms"
    else:
        calm = "the heartbeat was not starved"
    held = f"{100 * holder.share_of_time:.0f}% of sample instants" if holder.share_of_time is not None else "often"
    if f.holds_short:
        how = f"many short holds that add up ({calm}, so no single hold is shown to starve a thread)"
    else:  # one long hold: fewer than the LONG_HOLDS that starve, never called short
        how = (f"holds that add up, one of them long: the heartbeat could not run for {f.holds_text()} ({calm}, "
               "which counts wake-ups, not holds)")
    why = (f"{_sentence(describe(waiter.thread, 1))} waited for the GIL {_pct(waiter.of_runnable_share)}{ci} of the time it was not "
           f"waiting for a CPU ({_pct(waiter.waiting_share)} of wall time), while {_named(holder)} on "
           f"{_thread(holder)} held the GIL in {held}: {how}.")
    steps = (Step(f"move the work in {_fix_site(holder)} off the GIL (a native call that releases it, "
                  "a process pool), or hold it less often (batch the calls)"), *_trace_step(f))
    return Diagnosis(Status.FAIL, why, steps, _where_of(holder))


def _wait_attached(f: GilFindings) -> Diagnosis | None:
    """Attached by --pid (no heartbeat): a program thread waited for the GIL a large share of
    the time it was runnable (not waiting for a CPU), per its /proc accounts, while py-spy saw
    another thread hold the GIL: fail, naming both. With no such holder: inconclusive."""
    waiter, holder = f.waiter, f.wait_holder
    share, interval = f.waiter_share
    if not f.without_heartbeat or waiter is None or share is None or not f.waits_a_lot:
        return None
    ci = f" [{_pct(interval[0])}, {_pct(interval[1])}]" if len(interval) == 2 else ""
    waited = (f"{_sentence(describe(waiter.thread, 1))} waited for the GIL {_pct(share)}{ci} of the time it was ready "
              f"to run (on a CPU, waiting for one, or for the GIL; {_pct(waiter.waiting_share)} of wall time)")
    if holder is None:
        why = (f"{waited}, but py-spy saw no other thread hold the GIL in {_pct(f.min_holder_share)} or more of "
               f"{f.sample_instants} sample instants: the holder is unknown.{f.basis}")
        return Diagnosis(Status.INCONCLUSIVE, why, (Step("rerun with a longer --duration"),), {})
    held = f"{100 * holder.share_of_time:.0f}% of sample instants" if holder.share_of_time is not None else "often"
    meanwhile = ""
    if f.wait_ticks and f.wait_holder_states:
        doing = ", ".join(f"{state} in {_pct(count / f.wait_ticks)}"
                          for state, count in f.wait_holder_states.most_common(2))
        meanwhile = f"; at the {f.wait_ticks} /proc ticks where {waiter.thread} waited, {holder.thread} was {doing}"
    if holder.idle_share is not None and holder.idle_share >= IDLE_MAJORITY:
        inside = f" ({holder.native_frame})" if holder.native_frame else ""
        how = (f" It holds the GIL blocked inside a native call{inside} in {_pct(holder.idle_share)} of its samples: "
               "release it around the call (py::gil_scoped_release, Py_BEGIN_ALLOW_THREADS).")
        step = Step(f"wrap the native call under {_fix_site(holder)} in py::gil_scoped_release / "
                    "Py_BEGIN_ALLOW_THREADS, then rerun this probe")
    else:
        active = (f", active (computing) in {_pct(1 - (holder.idle_share or 0.0))} of its samples"
                  if holder.idle_share is not None else "")
        how = f" Hot frames: {_hot_frames(holder)}."
        held += active
        step = Step(f"move the work in {_fix_site(holder)} off the GIL (a native call that releases it, a process "
                    "pool) or cut it into shorter pieces")
    others = [w for w in f.also_waiting if w.tid != waiter.tid and w.tid != holder.tid]
    if others:
        listed = ", ".join(f"{w.thread} {_pct(w.of_ready_share or 0.0)}" for w in others[:4])
        more = f" and {len(others) - 4} more" if len(others) > 4 else ""
        plural = "s" if len(others) > 1 else ""
        how = f" {len(others)} other thread{plural} waited 20%+ of {'their' if plural else 'its'} ready time too: {listed}{more}.{how}"
    why = (f"{waited}, while {_named(holder)} on {_thread(holder)} held the GIL in {held}{meanwhile}.{how}{f.basis}")
    return Diagnosis(Status.FAIL, why, (step,), _where_of(holder))


def _load_failed(f: GilFindings) -> Diagnosis | None:
    """The load command (--load) could not start, or ended by itself with a failure: the window
    did not see the load a pass would speak of. Inconclusive (a fail stands: what starved is
    starved, loaded or not, and its why says the load failed)."""
    load = f.load
    if load is None or not load.failed:
        return None
    why = (f"Not decided: {load.phrase()}, so the window did not see the load it was meant to measure "
           f"(no thread was found starved meanwhile).{f.basis}")
    return Diagnosis(Status.INCONCLUSIVE, why, (Step(f"run the load command alone to see why it failed: "
                                                      f"{load.stderr or load.command[0]}"),), {})


def _busy_waiter(f: GilFindings) -> Diagnosis | None:
    """A thread waited for the GIL a large share of the time it was not waiting for a CPU, but
    that was under :data:`MIN_WAIT_WALL_SHARE` of wall time: on a host where a thread spends
    most of its time waiting for a CPU, its few moments off the run queue cannot say whether the
    GIL starves it. Not a pass: inconclusive."""
    waiter = f.waiter
    if (f.starved or waiter is None or waiter.of_runnable_share is None or f.waits_a_lot
            or waiter.waiting_share >= MIN_WAIT_WALL_SHARE or f.without_heartbeat):
        return None
    low = waiter.of_runnable_ci[0] if waiter.of_runnable_ci else waiter.of_runnable_share
    if waiter.of_runnable_share < WAIT_SHARE_FAIL or low < WAIT_SHARE_LOW:
        return None
    off_cpu = waiter.waiting_share / waiter.of_runnable_share  # the share of wall time it was not waiting for a CPU
    calm = f" (the heartbeat's p99: {f.p99_ms:.1f} ms)" if f.p99_ms is not None else ""
    why = (f"Not decided: {describe(waiter.thread, 1)} waited for the GIL {_pct(waiter.of_runnable_share)} of the time it "
           f"was not waiting for a CPU, but it was off the run queue only {_pct(off_cpu)} of wall time "
           f"({_pct(waiter.waiting_share)} of wall time waiting for the GIL): on a host this busy, so little time "
           f"does not show whether the GIL starves it{calm}.") + busy_note(f.host_load) + f.basis
    return Diagnosis(Status.INCONCLUSIVE, why,
                     (QUIETER_HOST,),
                     _holder_where(f))


def _undecided_wait(f: GilFindings) -> Diagnosis | None:
    """Not starved, on a busy host (evidence ``host_load``), and a program thread's GIL wait is
    neither decisive (:attr:`GilFindings.waits_a_lot`) nor decisively under
    :data:`WAIT_SHARE_FAIL`: its interval reaches the share that fails. On a busy host the wait
    share reads low: planted short holds that a quiet host reads at 54% [50%, 58%] read 19%
    [13%, 27%] beside two busy loops (every thread waits for a CPU, the holder too, so there are
    fewer hand-overs), and a pass turned them green. Inconclusive there. On a quiet host the
    rule does not apply: a clean twin's interval there reached 15% and, in 1 run of 6, 20%."""
    waiter = f.waiter
    share, interval = f.waiter_share
    if (f.starved or f.host_load is None or not f.host_load.busy or waiter is None
            or share is None or f.waits_a_lot
            or len(interval) != 2 or interval[1] < WAIT_SHARE_FAIL):
        return None
    if f.without_heartbeat and waiter.waiting_share < f.min_wait_wall_share:
        return None  # a few ticks of a server's thread: under the wall share that could fail, busy host or not
    low, high = interval
    held = f", while {_named(f.wait_holder)} on {_thread(f.wait_holder)} held it" if f.wait_holder is not None else ""
    calm = f" (the heartbeat's p99: {f.p99_ms:.1f} ms)" if f.p99_ms is not None else ""
    why = (f"Not decided: {describe(waiter.thread, 1)} waited for the GIL {_pct(share)} "
           f"[{_pct(low)}, {_pct(high)}] of {f.share_of}{held}: not a pass, since that "
           f"interval reaches {_pct(WAIT_SHARE_FAIL)} (the share that fails), and not a fail, which needs "
           f"{_pct(WAIT_SHARE_FAIL)} or more with the interval's low end at {_pct(WAIT_SHARE_LOW)} or more"
           f"{calm}.") + busy_note(f.host_load) + f.basis
    return Diagnosis(Status.INCONCLUSIVE, why, (QUIETER_HOST,), _holder_where(f))


def _overlap_note(f: GilFindings) -> str:
    top = f.top_overlap
    return f" The trace ranks {top.function} on {describe(top.thread, 1)} first by overlap." if top else ""


def _holder_unknown(f: GilFindings) -> Diagnosis | None:
    if not (f.starved or f.waits_a_lot) or f.holder_sampled:
        return None
    cause = f"the GIL holder is unknown ({f.missing_text or 'holder sampling did not run'})"
    what = f.late() if f.starved else (f"{describe(f.waiter.thread, 1)} waited for the GIL "
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
    if f.heartbeat_usable or f.without_heartbeat:
        return None
    reason = f"only {f.ticks} heartbeat ticks" if f.ticks else "no heartbeat data"
    if f.stall_ms is not None and f.stall_gil_share is not None:
        reason += (f"; its longest stretch without a wake-up, {f.stall_ms / 1e3:.2f} s, was blocked on the GIL "
                   f"{100 * f.stall_gil_share:.0f}% of the time")
    held = ""
    if f.holder is not None:
        held = (f" Meanwhile {f.holder.c_function or f.holder.function} on {_thread(f.holder)} held the GIL in "
                f"{100 * f.holder_share:.0f}% of sample instants"
                + (f", blocked in {100 * f.idle_share:.0f}% of them." if f.native_known else "."))
    why = f"Starvation was not measured ({reason}; {f.missing_text or 'the program may not be Python'}).{held}"
    return Diagnosis(Status.INCONCLUSIVE, why,
                     (Step("start the program under glmfb gil (its command line after --, not --pid) so the "
                           "heartbeat is injected"),),
                     _holder_where(f))


def _calm(f: GilFindings) -> str:
    if f.p99_ms is None:  # decided without a heartbeat
        waiter = f.waiter
        share, interval = f.waiter_share
        if waiter is None or share is None:
            return "no program thread was seen waiting for the GIL"
        ci = f" [{_pct(interval[0])}, {_pct(interval[1])}]" if len(interval) == 2 else ""
        return (f"the thread that waited most for the GIL, {waiter.thread}, waited {_pct(share)}{ci} of {f.share_of}, "
                f"{100 * waiter.waiting_share:.1f}% of wall time (a thread fails at {_pct(WAIT_SHARE_FAIL)} of the one, "
                f"the interval's low end at {_pct(WAIT_SHARE_LOW)}, and {_pct(f.min_wait_wall_share)} of the other)")
    return f"heartbeat p99 {f.p99_ms:.1f} ms <= {f.threshold_ms:g} ms"


# What a run undecided on a busy host offers (rules busy-host and busy-waiter).
QUIETER_HOST = Step("rerun with the machine to itself (nothing else running), or with a longer --duration")


def _busy_host(f: GilFindings) -> Diagnosis | None:
    """Not starved only once the GIL holder's own waits for a CPU are taken out of the late
    wake-ups. A holder descheduled with the GIL held keeps every other thread waiting all the
    same; on a host this busy, the lateness the GIL causes cannot be told from the machine's, and
    a pass would turn a GIL hold green. Inconclusive."""
    if f.starved or f.p99_ms is None or f.own_p99_ms is None or f.own_p99_ms <= f.threshold_ms:
        return None
    holder = f" ({_named(f.holder)})" if f.holder is not None else ""
    why = (f"Not decided: the heartbeat woke p99 {f.own_p99_ms:.1f} ms late, over the {f.threshold_ms:g} ms "
           f"threshold, and {f.p99_ms:.1f} ms once the times the GIL holder{holder} itself waited for a CPU are "
           "taken out: on a host this busy, a thread that holds the GIL while it waits for a CPU cannot be told "
           "from CPU contention.") + busy_note(f.host_load)
    return Diagnosis(Status.INCONCLUSIVE, why,
                     (QUIETER_HOST,),
                     _holder_where(f))


def _still_starting(f: GilFindings) -> Diagnosis | None:
    """Nobody starved, but the program was still inside its start-up imports when the window
    ended (the import system held a module lock at the last look), and imports held the GIL
    in the window: what was sampled is start-up, not the steady state a pass would speak of."""
    if (f.starved and f.holder is not None) or f.startup_settled is not False or f.startup is None:
        return None
    if not f.sample_instants or f.p99_ms is None:
        return None
    startup = f.startup
    # sample_instants is rate x time sampled, an estimate: samples of two importing threads that
    # py-spy both read as holding the GIL can outnumber it
    share = min(1.0, startup.samples_total / f.sample_instants)
    window = f"the {f.observed_s:.0f} s window" if f.observed_s else "the window"
    caller = f", under {startup.caller}" if startup.caller else ""
    why = (f"No steady state was sampled: the program was still importing when {window} ended (imports held "
           f"the GIL in {_pct(share)} of sample instants, most in {startup.function}{caller} on {startup.thread}). ")
    if f.starved:  # by the imports' holds: no thread held it outside them often enough to be named
        why += (f"The heartbeat's p99 wake-up lateness, {f.p99_ms:.1f} ms, is the start-up's, not the "
                "program's once started.")
    else:
        why += f"No thread was starved meanwhile ({_calm(f)}), which says nothing of the program once started."
    steps = (f.rerun_longer,) if f.rerun_longer is not None else ()
    return Diagnosis(Status.INCONCLUSIVE, why, steps, {})


def _signal_missing(f: GilFindings) -> Diagnosis | None:
    missing = f.missing_beyond_heartbeat
    if not missing:
        return None
    text = "; ".join(f"{m.signal}: {m.reason}" for m in missing)
    return Diagnosis(Status.WARN, f"No thread was starved ({_calm(f)}), but a signal is missing: {text}.{f.basis}",
                     (), _holder_where(f))


def _idle_holder(f: GilFindings) -> Diagnosis | None:
    holder = f.holder
    if not (holder is not None and f.native_known and f.idle_share >= WARN_IDLE_SHARE and f.holder_share >= 0.2):
        return None
    why = (f"No thread was starved ({_calm(f)}), yet {_named(holder)} holds the GIL while blocked in a native "
           f"call in {100 * f.idle_share:.0f}% of its samples: a release is missing there.{f.basis}")
    return Diagnosis(Status.WARN, why, (), _holder_where(f))


def _pass(f: GilFindings) -> Diagnosis | None:
    if f.without_heartbeat:
        held = ""
        if f.holder is not None:
            thread_share = (f.thread_shares or {}).get(f.holder.tid, f.holder_share)
            held = (f" The thread that held the GIL most, {f.holder.thread}, held it in {_pct(thread_share)} of sample "
                    f"instants (its top call site: {_named(f.holder).rstrip(',')}, {_pct(f.holder_share)}).")
        return Diagnosis(Status.PASS, f"No thread was starved for the GIL: {_calm(f)}.{held}{f.basis}", (), {})
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
    Rule("gil-wait-attached", KIND, _wait_attached, "attached by --pid (no heartbeat): a thread waits for the GIL "
         "a large share of its runnable time beside a holder"),
    Rule("gil-wait-share", KIND, _wait_share, "not starved, but a thread waits for the GIL a large share of its time"),
    Rule("load-failed", KIND, _load_failed, "the load command could not start or failed: inconclusive"),
    Rule("busy-waiter", KIND, _busy_waiter, "not starved, but a thread waited for the GIL much of its little "
         "time off the run queue: inconclusive"),
    Rule("undecided-wait-share", KIND, _undecided_wait, "not starved on a busy host, but a thread's GIL wait share "
         "reaches the share that fails: inconclusive"),
    Rule("still-starting", KIND, _still_starting, "not starved (or starved with no steady-state holder), but "
         "the window ended inside the program's start-up imports: inconclusive"),
    Rule("holder-unknown", KIND, _holder_unknown, "starved, no holder sampling: inconclusive"),
    Rule("cpu-not-gil", KIND, _cpu_not_gil, "starved, but nobody held the GIL for long: inconclusive"),
    Rule("not-measured", KIND, _not_measured, "no usable heartbeat: inconclusive"),
    Rule("busy-host", KIND, _busy_host, "starved only counting the holder's own waits for a CPU: inconclusive"),
    Rule("signal-missing", KIND, _signal_missing, "not starved, a signal missing: warn"),
    Rule("idle-holder", KIND, _idle_holder, "not starved, a holder idle in a native call: warn"),
    Rule("pass", KIND, _pass, "no thread starved"),
)


# What each kind of sentence of a gil why needs of the findings (tests/test_gil_rules.py runs the
# rules over generated findings against these).
CLAIMS: tuple[Claim[GilFindings], ...] = (
    Claim("short-holds", r"many short holds", lambda f: f.holds_short),
    Claim("hold-lengths", r"could not run for [\d.]+ (to [\d.]+ )?ms at a time", lambda f: bool(f.long_holds)),
    Claim("long-holds-starve", r"counts wake-ups, not holds, and stayed under",
          lambda f: f.held_long and f.starved),
    Claim("not-starved", r"^No thread was starved", lambda f: not f.starved),
    Claim("hogs", r"hogs the interpreter", lambda f: f.starved and f.holder is not None),
    Claim("p99-calm", r"p99 stayed at [\d.]+ ms <=", lambda f: f.p99_ms is not None and f.p99_ms <= f.threshold_ms),
)
