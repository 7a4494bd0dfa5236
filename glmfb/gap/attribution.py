"""What ate the time of a failing gap: the GIL, seen by the gil probe run on the candidate side.

The gil probe (:mod:`glmfb.gil`) runs the candidate target in a child process, samples which
thread holds the GIL (py-spy) and which threads wait for it (/proc), and measures a canary
thread's wake-up lateness. Here its verdict is read into a :class:`GilFinding`: the holder
(thread, function, file, line, idle share) and the starved thread. When the gil probe is
missing or breaks, the finding says so and the gap verdict names the missing signal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from glmfb.contract.errors import InputError
from glmfb.contract.evidence import MissingSignal
from glmfb.contract.step import Intent, Step
from glmfb.contract.verdict import Verdict
from glmfb.core.commandline import rerun_step
from glmfb.core.io import write_json_atomic
from glmfb.core.probe import ProbeContext, get_probe
from glmfb.gap.config import GapConfig
from glmfb.gap.evidence import GilAttribution
from glmfb.gil import SOURCE_LINE
from glmfb.gil import describe_threads as describe
from glmfb.gil.evidence import (
    GilHolder,
    GilThreads,
    HeldSite,
    Starvation,
    ThreadTimeRow,
    ThreadTimes,
    WaitingThread,
)

IDLE_MAJORITY = 0.5  # a holder blocked in this share of its samples holds the GIL while idle
CANARY_PREFIX = "glmfb-"  # threads the gil probe injects, never the starved thread we name
MAX_PLAUSIBLE_LATENESS_MS = 60_000.0
STARTUP_FUNCTIONS = frozenset({"_call_with_frames_removed", "_find_and_load", "exec_module", "<module>"})
# A thread that wants a CPU this share of its time and waits for one in this share is slowed
# by CPU contention; a competitor on its CPUs must have run this share of the time.
CPU_WAIT_SHARE = 0.25
COMPETITOR_CPU_FRACTION = 0.25  # of the CPU time the candidate's threads got on those CPUs
MIN_COMPETITOR_CPU_SHARE = 0.03  # of wall time: a competitor that ran at all
# Of the time off the run queue, as the gil probe's gil-wait-share: the estimate at 20% or
# more and its interval's lower end at 10% or more.
GIL_WAIT_SHARE = 0.2
GIL_WAIT_LOW = 0.1


@dataclass(frozen=True)
class GilFinding:
    """The gil probe's answer about the candidate, or why there is none."""

    available: bool
    status: str | None = None  # the gil verdict's status
    reason: str | None = None  # why no answer (probe missing, broke, found nothing)
    holder_thread: str | None = None
    holder_thread_count: int = 1  # short-lived threads of one name the holder stands for (2+)
    holder_function: str | None = None
    holder_file: str | None = None
    holder_line: int | None = None
    holder_idle_share: float | None = None
    holder_share: float | None = None
    native_frame: str | None = None
    starved_thread: str | None = None
    starved_waiting_share: float | None = None
    starved_waiting_ci: tuple[float, ...] = ()  # the interval of that share of wall time
    starved_of_runnable: float | None = None  # GIL wait / (wall - run-queue wait) of that thread
    starved_of_runnable_ci: tuple[float, ...] = ()
    holder_c_function: str | None = None  # the C function the holder held the GIL in (pickle.dumps)
    holder_python_function: str | None = None  # its Python caller
    holder_c_source: str | None = None  # what named the C function (py-spy --native, the line's only call)
    cpu_victim: str | None = None  # the thread that waited most for a CPU
    cpu_victim_runqueue_share: float | None = None
    cpu_victim_cpu_share: float | None = None
    cpu_victim_gil_of_runnable: float | None = None
    cpu_victim_gil_share: float | None = None  # of wall time
    cpu_victim_gil_of_runnable_ci: tuple[float, ...] = ()  # the interval of its GIL wait off the run queue
    competitor_thread: str | None = None  # the thread that ran most on the victim's CPUs
    competitor_thread_count: int = 1  # short-lived threads of one name it stands for (2+)
    competitor_function: str | None = None  # what it ran in C (zlib.compress)
    competitor_cpu_share: float | None = None
    competitor_cpu_fraction: float | None = None  # of the CPU the candidate's threads got there
    shared_cpus: str | None = None
    # The same threads in a gil run of the baseline, when the candidate's threads waited for a
    # CPU: which thread the gap slowed and which one the candidate added or runs more.
    baseline_compared: bool = False
    baseline_reason: str | None = None  # why there is no comparison, when one was wanted
    cpu_victim_baseline_runqueue_share: float | None = None
    competitor_baseline_cpu_share: float | None = None  # None: the baseline has no such thread
    # Whether the baseline's gil run saw the slowed thread and the competitor (None: no such run).
    cpu_victim_in_baseline: bool | None = None
    competitor_in_baseline: bool | None = None
    canary_p50_ms: float | None = None
    canary_p99_ms: float | None = None
    canary_max_ms: float | None = None
    holder_source: str | None = None  # which gil evidence the holder comes from
    gil_why: str | None = None
    gil_missing: tuple[str, ...] = ()  # "signal: reason" of what the gil probe could not collect
    next: tuple[Step, ...] = ()  # the gil verdict's next steps
    artifacts: Mapping[str, str] = field(default_factory=dict)
    # The same gil run read from the top holder's own wait for the GIL, held by the site of another
    # thread that held it most: the iteration's thread can hold the GIL most (its Python between
    # torch ops) and still wait for it behind a helper's long C calls. The gap's rules read it
    # when the thread named starved does not explain the gap (glmfb.gap.rules).
    holder_own_wait: GilFinding | None = None

    def amended(self, **changes: Any) -> GilFinding:
        """This finding with ``changes``, and its reading from the top holder's own wait too."""
        own = self.holder_own_wait
        amended = replace(self, **changes)
        return amended if own is None else replace(amended, holder_own_wait=replace(own, **changes))

    @property
    def holder_known(self) -> bool:
        return self.holder_function is not None

    @property
    def idle_in_native(self) -> bool:
        return self.holder_idle_share is not None and self.holder_idle_share >= IDLE_MAJORITY

    @property
    def starved(self) -> bool:
        """The gil probe saw starvation: it failed (on starvation beside a known holder), or the
        thread that waited most for the GIL waited a share of its time that matters
        (:data:`GIL_WAIT_LOW` of its time off the run queue). The thread that waited most is
        always named; one that waited 0.3% of the time was not starved, and no holder is
        blamed for it."""
        if self.status == "fail":
            return True
        if self.starved_thread is None:
            return False
        share = self.starved_of_runnable if self.starved_of_runnable is not None else self.starved_waiting_share
        return share is not None and share >= GIL_WAIT_LOW

    @property
    def holder_apart(self) -> bool:
        """A thread of the candidate waited for the GIL beside a known holder on another thread."""
        return self.holder_known and self.starved_thread is not None and self.starved_thread != self.holder_thread

    @property
    def starved_wait(self) -> tuple[float, float] | None:
        """The starved thread's GIL wait as a share of the time it was not waiting for a CPU,
        and the low end of its interval: what it would lose to the GIL over an iteration run on
        CPUs of its own (the gil probe's own samplers take CPU time the gap's iterations did
        not share). From the share of wall time for an older gil verdict without it."""
        if self.starved_of_runnable is not None:
            ci = self.starved_of_runnable_ci
            return self.starved_of_runnable, ci[0] if ci else self.starved_of_runnable
        if self.starved_waiting_share is not None:
            ci = self.starved_waiting_ci
            return self.starved_waiting_share, ci[0] if ci else self.starved_waiting_share
        return None

    @property
    def gil_bound(self) -> bool:
        """A thread of the candidate waited for the GIL a large share of its time off the run
        queue (:data:`GIL_WAIT_SHARE`, the interval's low end at :data:`GIL_WAIT_LOW`), beside
        a known holder on another thread. The gap's rule also weighs that wait against the
        time the gap added (:mod:`glmfb.gap.rules`): a smaller share can explain a smaller gap."""
        if not self.holder_apart:
            return False
        share = self.starved_of_runnable
        if share is None:  # an older gil verdict: its own failure stands for it
            return self.status == "fail"
        low = self.starved_of_runnable_ci[0] if self.starved_of_runnable_ci else share
        return share >= GIL_WAIT_SHARE and low >= GIL_WAIT_LOW

    @property
    def gil_wait_follows_cpu_wait(self) -> bool:
        """The thread that waited for the GIL waited for a thread that was itself the one slowed
        by CPU contention, and is (or stands among) the threads that took its CPU: the holder
        keeps the GIL while it waits for a CPU, so the waiter's GIL wait follows from the
        contention, and the gap is the CPU's (measured under load here: short-lived zlib
        senders waited 20%+ of their time for the GIL the CPU-starved prefill held, and the gap
        read gil-starved-sender, blaming the prefill's own attention code)."""
        return self.gil_bound and self.waiter_took_holders_cpu

    @property
    def waiter_took_holders_cpu(self) -> bool:
        """The GIL holder is the thread CPU contention slowed, and the thread that waited for the
        GIL is (or stands among) the threads that took its CPU: whatever that wait weighs, it
        follows from the contention (:attr:`gil_wait_follows_cpu_wait`)."""
        return (self.cpu_bound and self.holder_thread is not None and self.cpu_victim == self.holder_thread
                and self.starved_thread is not None and self.starved_thread == self.competitor_thread)

    @property
    def cpu_bound(self) -> bool:
        """A thread waited for a CPU a large share of its time while another thread of the
        candidate ran on the same CPUs, and the GIL does not explain the wait."""
        runqueue = self.cpu_victim_runqueue_share or 0.0
        return (self.cpu_victim is not None and self.competitor_thread is not None
                and runqueue >= CPU_WAIT_SHARE
                and (self.competitor_cpu_fraction or 0.0) >= COMPETITOR_CPU_FRACTION
                and (self.competitor_cpu_share or 0.0) >= MIN_COMPETITOR_CPU_SHARE
                and self._cpu_wait_dominates)

    @property
    def _cpu_wait_dominates(self) -> bool:
        """The victim's wait for a CPU outweighs its wait for the GIL: by 2x, or by any margin
        when that GIL wait is itself unsettled (the victim is the thread that waited most for the
        GIL and the interval of its share reaches below :data:`GIL_WAIT_LOW`). Measured on a
        loaded CI host: a prefill sharing its one core with a zlib sender waited 33% of the time
        for a CPU (1% in the baseline's run) and 18% for the GIL, [0.4%, 56%] of its time off
        the run queue; the 2x test alone left the gap unexplained."""
        gil = self.cpu_victim_gil_share or 0.0
        return self._gil_wait_under_half or (gil < (self.cpu_victim_runqueue_share or 0.0)
                                             and self.victim_gil_wait_unsettled)

    @property
    def _gil_wait_under_half(self) -> bool:
        """The victim waited for the GIL under half as long as for a CPU."""
        return (self.cpu_victim_gil_share or 0.0) < (self.cpu_victim_runqueue_share or 0.0) / 2

    @property
    def _victim_gil_ci(self) -> tuple[float, ...]:
        """The interval of the CPU victim's own GIL wait (of its time off the run queue)."""
        if self.cpu_victim_gil_of_runnable_ci:
            return self.cpu_victim_gil_of_runnable_ci
        return self.starved_of_runnable_ci if self.cpu_victim is not None and self.cpu_victim == self.starved_thread else ()

    @property
    def victim_gil_wait_unsettled(self) -> bool:
        """The interval of the CPU victim's own GIL wait reaches below :data:`GIL_WAIT_LOW`: the
        GIL's part is not settled. The victim need not be the thread the gil probe names as the
        most starved: measured on a loaded CI host, a prefill sharing its one CPU with a zlib
        sender started per layer waited 33% of the time for a CPU (2% in the baseline's run) and
        22% for the GIL ([8%, 55%] of its time off the run queue), while the gil probe named the
        prefill the holder and the senders the starved threads; the gap read over-threshold."""
        ci = self._victim_gil_ci
        return self.cpu_victim is not None and bool(ci) and ci[0] < GIL_WAIT_LOW

    def cpu_sentence(self) -> str:
        runs = f" in {self.competitor_function}" if self.competitor_function else ""
        cpus = f" (CPUs {self.shared_cpus})" if self.shared_cpus else ""
        victim_before = competitor_before = ""
        if self.baseline_compared:
            if self.cpu_victim_baseline_runqueue_share is not None:
                victim_before = f" against {self.cpu_victim_baseline_runqueue_share:.0%} in the baseline's run"
            competitor_before = (" (a thread the baseline does not run)" if self.competitor_baseline_cpu_share is None
                                 else f" (it ran {self.competitor_baseline_cpu_share:.0%} in the baseline's run)")
        return (f"The {self.cpu_victim} thread waited for a CPU {self.cpu_victim_runqueue_share:.0%} of the time"
                f"{victim_before} (and ran {self.cpu_victim_cpu_share:.0%}) while "
                f"{describe(self.competitor_thread or '', self.competitor_thread_count)}"
                f"{competitor_before} ran{runs} on the "
                f"same CPUs{cpus}, taking {self.competitor_cpu_fraction or 0.0:.0%} of the CPU time the candidate's "
                f"threads got there; {self._gil_part_phrase()}{self._follows_phrase()}: CPU contention, "
            "not the GIL.")

    def _gil_part_phrase(self) -> str:
        gil = self.cpu_victim_gil_share or 0.0
        if self._gil_wait_under_half or not self.victim_gil_wait_unsettled:
            return f"the GIL does not explain it ({self.cpu_victim} waited for the GIL {gil:.0%} of the time)"
        low, high = self._victim_gil_ci[0], self._victim_gil_ci[-1]
        return (f"the GIL explains less of it: {self.cpu_victim} waited for the GIL {gil:.0%} of the time, less "
                f"than for a CPU, and that share is not settled ({low:.0%} to {high:.0%} of its time off the run "
                "queue)")

    def _follows_phrase(self) -> str:
        if not self.gil_wait_follows_cpu_wait or self.starved_of_runnable is None:
            return ""
        return (f"; {describe(self.competitor_thread or '', self.competitor_thread_count)} waited for the GIL "
                f"{self.starved_of_runnable:.0%} of the time it was not waiting for a CPU, held by "
                f"{self.cpu_victim}, the thread the contention slowed")

    def sentence(self, name_holder: bool = True) -> str:
        """The finding in one sentence, in the terms of its evidence. ``name_holder=False``: the
        verdict does not lay the gap on the GIL (its ``where`` names no holder), so the sentence
        says what waited for the GIL and how long, never who held it."""
        if not self.available:
            return f"The GIL signal is missing: {self.reason}."
        if not self.holder_known:
            return f"The gil probe ({self.status}) named no GIL holder: {self.reason or self.gil_why}."
        if not self.starved:
            lateness = (f" (a canary thread woke p99 {self.canary_p99_ms:.1f} ms late)"
                        if self.canary_p99_ms is not None else "")
            if self.cpu_bound:
                return f"The gil probe saw no thread starved of the GIL{lateness}: the GIL does not explain the gap."
            return (f"The gil probe saw no thread starved of the GIL{lateness}, and no thread waiting for a CPU "
                    "another thread of the candidate took: neither the GIL nor CPU contention explains the gap.")
        waited = ""
        if self.starved_thread is not None:
            share = (f" {self.starved_waiting_share:.0%} of the time" if self.starved_waiting_share is not None else "")
            if self.starved_of_runnable is not None:
                share += f" ({self.starved_of_runnable:.0%} of the time it was not waiting for a CPU)"
            waited = f"the {self.starved_thread} thread waited for the GIL{share}"
            if self.canary_p99_ms is not None:
                waited += f" (a canary thread woke p99 {self.canary_p99_ms:.0f} ms late)"
        elif self.canary_p99_ms is not None:  # the gil probe failed on the canary's lateness
            waited = f"a canary thread woke p99 {self.canary_p99_ms:.0f} ms late"
        if not name_holder:
            return self._unnamed_sentence(waited)
        location = f"{self.holder_file}:{self.holder_line}" if self.holder_file else "glmfb's target runner"
        if self.holder_c_function and self.holder_python_function:
            named = (" (named from that line's only call, a C function; py-spy --native sampled no frame below it)"
                     if self.holder_c_source == SOURCE_LINE else "")
            held = (f"held by {self.holder_c_function}, called from {self.holder_python_function} ({location}){named}, "
                    f"on {describe(self.holder_thread or '', self.holder_thread_count)}")
        else:
            held = (f"held by {self.holder_function} ({location}) on "
                    f"{describe(self.holder_thread or '', self.holder_thread_count)}")
        if self.holder_idle_share is not None:
            if self.idle_in_native:
                native = f" ({self.native_frame})" if self.native_frame else ""
                held += f", idle in a native call{native} in {self.holder_idle_share:.0%} of its samples"
            else:
                held += f", computing in {1 - self.holder_idle_share:.0%} of its samples"
        if waited:
            return f"{waited[0].upper()}{waited[1:]}, {held}."
        return f"The gil probe failed: {self.gil_why} The GIL was {held}."

    def _unnamed_sentence(self, waited: str) -> str:
        """What waited for the GIL and how long, without the holder."""
        if self.starved_thread is not None:
            return f"{waited[0].upper()}{waited[1:]}."
        seen = f"{waited[0].upper()}{waited[1:]}, but the gil probe" if waited else "The gil probe failed, but it"
        return f"{seen} named no thread of the candidate that waited for the GIL: the GIL is not shown to explain the gap."

    def evidence(self) -> GilAttribution:
        """This finding as typed evidence: the evidence kind's fields are this finding's own."""
        return GilAttribution.of(self)


@dataclass(frozen=True)
class _Waiter:
    """A thread of the program that waited for the GIL, as the gil verdict gives its wait."""

    thread: str | None = None
    waiting_share: float | None = None  # of wall time
    waiting_ci: tuple[float, ...] = ()
    of_runnable: float | None = None  # of the time off the run queue
    of_runnable_ci: tuple[float, ...] = ()

    @classmethod
    def of(cls, wait: WaitingThread) -> _Waiter:
        """From an entry of the gil verdict's ``starvation.waiting_for_gil``."""
        return cls(wait.thread, wait.waiting_share, tuple(wait.waiting_ci), wait.of_runnable_share,
                   tuple(wait.of_runnable_ci))


def _starved_thread(starvation: Starvation | None, holder_thread: str | None) -> _Waiter:
    """The program thread (not the holder, not glmfb's canary) that waited for the GIL most,
    by its share of the time off the run queue (else by the share of wall time an older gil
    verdict gives)."""
    if starvation is None:
        return _Waiter()
    starved = set(starvation.threads)
    waiting = [w for w in starvation.waiting_for_gil
               if w.thread != holder_thread and not w.thread.startswith(CANARY_PREFIX)
               and (w.thread in starved or w.of_runnable_share is not None)]
    if not waiting:
        return _Waiter()
    top = max(waiting, key=lambda w: (w.of_runnable_share if w.of_runnable_share is not None else -1.0,
                                      w.waiting_share))
    if top.of_runnable_share is None and top.thread not in starved:
        return _Waiter()
    return _Waiter.of(top)


def cpu_set(text: str | None) -> set[int]:
    """``0-2,5`` -> {0, 1, 2, 5} (a Cpus_allowed_list); empty when unknown."""
    cpus: set[int] = set()
    for part in (text or "").split(","):
        first, _, last = part.strip().partition("-")
        if first.isdigit():
            cpus.update(range(int(first), int(last) + 1 if last.isdigit() else int(first) + 1))
    return cpus


def waits_for_cpu(times: ThreadTimes | None) -> bool:
    """Whether a thread of the program waited for a CPU a large share of its time (then which
    thread the contention slowed is worth a baseline run to tell)."""
    return times is not None and any(not t.glmfb and t.runqueue_share >= CPU_WAIT_SHARE for t in times.threads)


def _cpu_contention(times: ThreadTimes | None, driver: str | None,
                    baseline: ThreadTimes | None = None) -> dict[str, Any]:
    """The thread slowed by CPU contention and the thread that ran most on its CPUs meanwhile
    (glmfb's own threads are never either).

    With the baseline's thread times (a gil run of the baseline target), the slowed thread is
    the one the baseline also runs whose wait for a CPU grew most, and the competitor the one
    whose CPU time grew most (a thread the baseline does not run grew from nothing): on shared
    CPUs every busy thread waits for the others, and only the baseline tells the work the
    candidate added from the work it slowed. Without it, the slowed thread is the one that
    drives the iteration, the thread that held the GIL most (it runs the iteration's Python),
    when it waited for a CPU a real share of its time; else the thread that waited most."""
    if times is None:
        return {}
    program = [t for t in times.threads if not t.glmfb]
    wanting = [t for t in program if t.cpu_share + t.runqueue_share >= CPU_WAIT_SHARE]
    if not wanting:
        return {}
    before = {t.thread: t for t in baseline.threads if not t.glmfb} if baseline is not None else {}

    def wait_grown(row: ThreadTimeRow) -> float:
        return row.runqueue_share - before[row.thread].runqueue_share

    slowed = [t for t in wanting if t.thread in before and wait_grown(t) > 0]
    drivers = [t for t in wanting if t.thread == driver and t.runqueue_share >= CPU_WAIT_SHARE]
    if slowed:
        victim = max(slowed, key=wait_grown)
    else:
        victim = drivers[0] if drivers else max(wanting, key=lambda t: t.runqueue_share)
    mine = cpu_set(victim.cpus)

    def overlaps(row: ThreadTimeRow) -> bool:
        return not mine or not cpu_set(row.cpus) or bool(mine & cpu_set(row.cpus))

    def cpu_grown(row: ThreadTimeRow) -> float:
        return row.cpu_share - (before[row.thread].cpu_share if row.thread in before else 0.0)

    others = [t for t in program if t.tid != victim.tid and overlaps(t)]
    found: dict[str, Any] = {"cpu_victim": victim.thread, "cpu_victim_runqueue_share": victim.runqueue_share,
                             "cpu_victim_cpu_share": victim.cpu_share,
                             "cpu_victim_gil_of_runnable": victim.gil_wait_of_runnable,
                             "cpu_victim_gil_share": victim.gil_wait_share}
    if slowed:
        found.update(baseline_compared=True, cpu_victim_baseline_runqueue_share=before[victim.thread].runqueue_share)
    if baseline is not None:
        found["cpu_victim_in_baseline"] = victim.thread in before
    if others:
        competitor = max(others, key=cpu_grown if slowed else (lambda t: t.cpu_share))
        if slowed and competitor.thread in before:
            found["competitor_baseline_cpu_share"] = before[competitor.thread].cpu_share
        if baseline is not None:
            found["competitor_in_baseline"] = competitor.thread in before
        shared = sorted(mine & cpu_set(competitor.cpus)) if mine and competitor.cpus else []
        used = victim.cpu_share + sum(t.cpu_share for t in others)
        found.update(competitor_thread=competitor.thread, competitor_thread_count=competitor.thread_count,
                     competitor_function=competitor.c_function,
                     competitor_cpu_share=competitor.cpu_share,
                     competitor_cpu_fraction=round(competitor.cpu_share / used, 4) if used > 0 else None,
                     shared_cpus=",".join(str(c) for c in shared) or None)
    return found


def _lateness_ms(value: float | None) -> float | None:
    """A canary lateness figure, or None when it cannot be one (longer than any window the gil
    probe samples: a corrupt heartbeat record)."""
    return value if value is not None and 0 <= value <= MAX_PLAUSIBLE_LATENESS_MS else None


def _startup_frame(site: HeldSite) -> bool:
    return site.file.startswith("<frozen importlib") or site.function in STARTUP_FUNCTIONS


def _glmfb_frame(site: HeldSite) -> bool:
    """A site in glmfb's own code (its target runner), unless it held the GIL in a C call it
    made for the target (then the call is the cause)."""
    import glmfb

    if site.c_function:
        return False
    package = Path(glmfb.__file__).resolve().parent
    try:
        return Path(site.file).resolve().is_relative_to(package)
    except (OSError, ValueError):
        return False


def _steady_state_holder(verdict: Verdict) -> tuple[HeldSite | None, str]:
    """The GIL holder of the steady state: the gil probe's top holder, unless that is the
    child's own import machinery (its window starts when the child starts, so imports and the
    target's setup fall inside it); then the most sampled site that is not."""
    top = verdict.find(GilHolder)
    if top is None:
        return None, "it sampled no thread holding the GIL"
    if not (_startup_frame(top) or _glmfb_frame(top)):
        return top, "gil_holder"
    threads = verdict.find(GilThreads)
    why = "import machinery of the child's startup" if _startup_frame(top) else "glmfb's own runner"
    for index, site in enumerate(threads.sites if threads is not None else ()):
        if not (_startup_frame(site) or _glmfb_frame(site) or site.wait):
            return site, f"gil_threads.sites[{index}] (the top holder was {why})"
    return None, f"only {why} held the GIL"


def _glmfb_file(file: str) -> bool:
    import glmfb

    try:
        return Path(file).resolve().is_relative_to(Path(glmfb.__file__).resolve().parent)
    except (OSError, ValueError):
        return False


def _holder_fields(site: HeldSite | None) -> dict[str, Any]:
    """A finding's holder fields from the site that held the GIL."""
    if site is None:
        return {"holder_thread": None}
    c_function = site.c_function
    own = not _glmfb_file(site.file)
    return {
        "holder_thread": site.thread, "holder_thread_count": site.thread_count,
        "holder_function": c_function or site.function, "holder_c_function": c_function,
        "holder_python_function": site.qualname if c_function else None,
        "holder_c_source": site.c_source if c_function else None,
        "holder_file": site.file if own else None, "holder_line": site.line if own else None,
        "holder_idle_share": site.idle_share, "holder_share": site.share_of_time, "native_frame": site.native_frame,
    }


def _waiter_fields(waiter: _Waiter) -> dict[str, Any]:
    return {"starved_thread": waiter.thread, "starved_waiting_share": waiter.waiting_share,
            "starved_waiting_ci": waiter.waiting_ci, "starved_of_runnable": waiter.of_runnable,
            "starved_of_runnable_ci": waiter.of_runnable_ci}


def _holders_own_wait(verdict: Verdict, starvation: Starvation | None, holder: HeldSite | None
                      ) -> tuple[_Waiter, HeldSite, str] | None:
    """The top holder's own wait for the GIL (its share of the time off the run queue known),
    and the site of another program thread that held the GIL most: ``(waiter, site, where the
    site comes from)``; None when either is missing."""
    if holder is None or starvation is None:
        return None
    own = [w for w in starvation.waiting_for_gil if w.thread == holder.thread and w.of_runnable_share is not None]
    threads = verdict.find(GilThreads)
    if not own or threads is None:
        return None
    for index, site in enumerate(threads.sites):
        if (site.thread != holder.thread and not site.thread.startswith(CANARY_PREFIX)
                and not (_startup_frame(site) or _glmfb_frame(site)) and not site.wait):  # a wait: the gil probe says so
            waiter = _Waiter.of(own[0])
            return waiter, site, f"gil_threads.sites[{index}] (the top holder, {holder.thread}, waited for the GIL too)"
    return None


def finding_from_verdict(verdict: Verdict, baseline: Verdict | None = None) -> GilFinding:
    """Read a gil verdict into a finding, through its typed evidence; ``baseline``, a gil
    verdict of the baseline target, tells the threads the CPU contention slowed from those the
    candidate added."""
    holder, holder_source = _steady_state_holder(verdict)
    starvation = verdict.find(Starvation)
    status = verdict.status.value
    if status == "error":
        return GilFinding(available=False, status=status, reason=f"the gil probe could not run: {verdict.why}",
                          artifacts=dict(verdict.artifacts))
    holder_thread = holder.thread if holder else None
    contention = _cpu_contention(verdict.find(ThreadTimes), holder_thread,
                                 baseline.find(ThreadTimes) if baseline is not None else None)
    victim_waits = [w for w in (starvation.waiting_for_gil if starvation else ())
                    if contention.get("cpu_victim") is not None and w.thread == contention["cpu_victim"]]
    if len(victim_waits) == 1 and victim_waits[0].of_runnable_ci:
        contention["cpu_victim_gil_of_runnable_ci"] = tuple(victim_waits[0].of_runnable_ci)
    finding = GilFinding(
        available=True,
        status=status,
        reason=None if holder else holder_source,
        holder_source=holder_source,
        **_holder_fields(holder),
        **_waiter_fields(_starved_thread(starvation, holder_thread)),
        **contention,
        canary_p50_ms=_lateness_ms(starvation.p50_ms) if starvation else None,
        canary_p99_ms=_lateness_ms(starvation.p99_ms) if starvation else None,
        canary_max_ms=_lateness_ms(starvation.max_ms) if starvation else None,
        gil_why=verdict.why,
        gil_missing=tuple(f"{m.signal}: {m.reason}" for m in verdict.find_all(MissingSignal)),
        next=tuple(verdict.next),
        artifacts=dict(verdict.artifacts),
    )
    own = _holders_own_wait(verdict, starvation, holder)
    if own is None:
        return finding
    waiter, site, source = own
    return replace(finding, holder_own_wait=replace(finding, holder_source=source, **_holder_fields(site),
                                                    **_waiter_fields(waiter)))


def _gil_config(config_type: type, config: GapConfig, side: str, **overrides: Any) -> Any:
    """The gil probe's config for one side's target, as the attribution runs it."""
    return config_type(**{
        "name": f"{config.name}/gil" + ("" if side == "candidate" else f"-{side}"),
        "target": config.candidate if side == "candidate" else config.baseline,
        # The gil probe samples once the target is built and has run once (steady state).
        "duration_s": config.gil_duration_s,
        "setup_timeout_s": max(config.gil_startup_s, 1.0),
        "rate_hz": config.gil_rate_hz,
        **overrides,
    })


def gil_rerun_step(config: GapConfig, duration_s: float = 15.0) -> Step:
    """The step that runs the gil probe on the candidate as the attribution does, sampling
    ``duration_s`` (at least as long as the attribution did)."""
    from glmfb.gil import GilConfig

    gil_config = _gil_config(GilConfig, config, "candidate", duration_s=max(duration_s, config.gil_duration_s))
    return rerun_step("gil", gil_config, "sample the candidate's GIL holder for longer",
                      intent=Intent.DEEPER)


def _trace(config: GapConfig, ctx: ProbeContext, side: str) -> Verdict | str:
    """The gil probe's verdict on one side's target, or why there is none."""
    from glmfb.core.host import run_probe

    try:
        probe = get_probe("gil")
    except InputError as exc:
        return f"the gil probe is not installed ({exc})"
    try:
        verdict: Verdict = run_probe(probe, _gil_config(probe.config_type, config, side), ctx)
    except Exception as exc:
        return f"the gil probe broke: {type(exc).__name__}: {exc}"
    with contextlib.suppress(OSError):
        write_json_atomic(ctx.artifact("gil-verdict.json"), verdict.to_dict())
    return verdict


def trace_candidate_gil(config: GapConfig, ctx: ProbeContext) -> GilFinding:
    """Run the gil probe on the candidate target (artifacts in ``ctx``'s folder), and on the
    baseline too when a thread of the candidate waited for a CPU (its folder ``baseline/``);
    never raises for a probe failure: the attribution degrades, the gap itself stands."""
    verdict = _trace(config, ctx, "candidate")
    if isinstance(verdict, str):
        return GilFinding(available=False, reason=verdict)
    finding = finding_from_verdict(verdict)
    if finding.available and waits_for_cpu(verdict.find(ThreadTimes)):
        ctx.progress("running the gil probe on the baseline (which threads the contention slowed)")
        baseline = _trace(config, ctx.child("baseline"), "baseline")
        if isinstance(baseline, str):
            finding = finding.amended(baseline_reason=baseline)
        elif baseline.status.value == "error":
            finding = finding.amended(baseline_reason=f"the gil probe could not run the baseline: {baseline.why}")
        else:
            finding = finding_from_verdict(verdict, baseline)
            if not finding.baseline_compared:
                finding = finding.amended(baseline_reason="no thread the baseline also runs waited longer for a CPU")
    artifacts = dict(finding.artifacts)
    for key, path in (("verdict", ctx.artifact_dir / "gil-verdict.json"),
                      ("baseline_verdict", ctx.artifact_dir / "baseline" / "gil-verdict.json")):
        if path.is_file():
            artifacts[key] = str(path)
    return finding.amended(artifacts=artifacts)
