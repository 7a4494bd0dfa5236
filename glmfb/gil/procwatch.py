"""Where each thread of the traced process spends its time, read from /proc without ptrace stops.

Every tick reads, for each thread, ``/proc/PID/task/TID/syscall`` (the syscall a blocked thread
is in and its first argument: for ``futex``, the address it waits on) and
``/proc/PID/task/TID/schedstat`` (the kernel's exact counters of the time the thread ran on a
CPU and the time it waited, runnable, for one). Files stay open and are re-read with
``pread``, so a tick costs a few microseconds per thread.

**Which futex is the GIL.** CPython's GIL is a mutex and condition variables side by side in
one struct (``struct _gil_runtime_state``: ``cond``, ``mutex``, ``switch_cond``,
``switch_mutex``, 176 bytes with glibc). A thread blocks on the condition variable's words
while another holds the GIL, on the mutex while it takes or drops it, and on the switch
condition after a forced hand-over. The heartbeat thread only ever blocks in its 1 ms sleep
or in ``take_gil``, so the futex addresses seen for it lie in that struct; every futex word
within the struct's span around them is the GIL (``GIL_SPAN_BEFORE``/``GIL_SPAN_AFTER``).

**Time waiting for the GIL, per thread.** Sampled states alone are biased when the CPUs are
busy: the sampler itself needs a CPU to look, so it runs when the traced threads leave one
free, which is when they block or sleep, and it misses the waits (under a real-time
scheduler a thread blocked 60% of the time on the GIL was seen waiting in 17% of ticks). The
kernel's counters are exact: in each interval between two ticks a thread's blocked time is
the interval minus its CPU time minus its run-queue time. That blocked time is attributed to
what the thread was seen blocked on at the interval's ends (the GIL, or anything else: a
sleep, I/O, a lock); blocked time between two ticks that both saw it running is split in the
proportion of the attributed time. The share of the window each thread spent waiting for the
GIL comes with a block-bootstrap interval over 100 ms stretches.
"""

from __future__ import annotations

import itertools
import os
import platform
import random
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from glmfb.gil.native import NativeStack

_ARCH = platform.machine().lower()
FUTEX_SYSCALL = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(_ARCH)
# The GIL struct around the condition-variable words the heartbeat waits on (glibc: cond's
# __g_signals at +40 of 48 bytes; then the mutex (40), switch_cond (48), switch_mutex (40)).
GIL_SPAN_BEFORE = 48
GIL_SPAN_AFTER = 144
BLOCK_S = 0.5  # bootstrap blocks: long enough that the lumpy counters even out in each
RESAMPLES = 1000
NATIVE_EVERY_S = 0.1  # native snapshots of running threads, this often
NATIVE_PER_ROUND = 3  # at most this many threads a round, the least snapshotted first
# Names of the syscalls a thread usually blocks in, to show what a holder was doing.
SYSCALL_NAMES: dict[int, str] = (
    {
        0: "read",
        7: "poll",
        23: "select",
        35: "nanosleep",
        16: "ioctl",
        45: "recvfrom",
        47: "recvmsg",
        61: "wait4",
        202: "futex",
        230: "clock_nanosleep",
        232: "epoll_wait",
        219: "restart_syscall",
        270: "pselect6",
        271: "ppoll",
        281: "epoll_pwait",
    }
    if _ARCH in ("x86_64", "amd64")
    else {
        63: "read",
        29: "ioctl",
        73: "ppoll",
        22: "epoll_pwait",
        72: "pselect6",
        98: "futex",
        101: "nanosleep",
        115: "clock_nanosleep",
        128: "restart_syscall",
        207: "recvfrom",
        212: "recvmsg",
        260: "wait4",
    }
    if _ARCH in ("aarch64", "arm64")
    else {}
)


@dataclass
class Tick:
    at_s: float  # time.monotonic() of this process: the same clock as the heartbeat's
    futex: dict[int, int] = field(default_factory=dict)  # tid -> futex address
    running: frozenset[int] = frozenset()
    syscall: dict[int, int] = field(default_factory=dict)  # tid -> syscall it is blocked in
    cpu_ns: dict[int, int] = field(default_factory=dict)  # tid -> CPU time so far (schedstat)
    runqueue_ns: dict[int, int] = field(default_factory=dict)  # tid -> run-queue time so far
    read_s: dict[int, float] = field(default_factory=dict)  # tid -> when its counters were read


@dataclass(frozen=True)
class ThreadTime:
    """Where one thread's time went over the window: shares of wall time that sum to 1."""

    tid: int
    wall_s: float
    cpu_s: float  # on a CPU
    runqueue_s: float  # runnable, waiting for a CPU
    gil_wait_s: float  # blocked on the GIL
    other_wait_s: float  # blocked on anything else (sleep, I/O, locks, queues)
    gil_wait_ci: tuple[float, float]  # share of wall time, 95% block-bootstrap interval
    longest_gil_wait_s: float  # the longest stretch of ticks it was seen waiting for the GIL
    ticks: int
    of_runnable_ci: tuple[float, float] = (0.0, 0.0)  # the same for the share of wall - run queue
    of_ready_ci: tuple[float, float] = (0.0, 0.0)  # the same for the share of the time it was ready to run

    @property
    def of_runnable_share(self) -> float | None:
        runnable = self.wall_s - self.runqueue_s
        return self.gil_wait_s / runnable if runnable > 0 else None

    @property
    def of_ready_share(self) -> float | None:
        """The GIL wait as a share of the time the thread was ready to run Python code: on a
        CPU, waiting for one, or waiting for the GIL (not blocked on anything else). A server's
        thread idles in ``recv`` most of the time, which dilutes its share of wall time; of the
        time it had work to do, this is what the GIL cost it."""
        ready = self.cpu_s + self.runqueue_s + self.gil_wait_s
        return self.gil_wait_s / ready if ready > 0 else None

    @property
    def gil_wait_share(self) -> float:
        return self.gil_wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def runqueue_share(self) -> float:
        return self.runqueue_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def cpu_share(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def other_wait_share(self) -> float:
        return self.other_wait_s / self.wall_s if self.wall_s > 0 else 0.0


def _interpolate(points: list[tuple[float, float]], at_s: float) -> float:
    import bisect

    index = bisect.bisect_left(points, (at_s, float("-inf")))
    if index <= 0:
        return points[0][1]
    if index >= len(points):
        return points[-1][1]
    (t0, v0), (t1, v1) = points[index - 1], points[index]
    return v0 + (v1 - v0) * (at_s - t0) / (t1 - t0) if t1 > t0 else v1


def gil_region(addresses: Iterable[int]) -> tuple[int, int] | None:
    """The span of the GIL struct around the futex addresses the heartbeat waited on."""
    seen = list(addresses)
    if not seen:
        return None
    return min(seen) - GIL_SPAN_BEFORE, max(seen) + GIL_SPAN_AFTER


def _in(region: tuple[int, int] | None, address: int | None) -> bool:
    return region is not None and address is not None and region[0] <= address <= region[1]


class GilWaitSampler:
    """A background thread sampling the states and CPU counters of one process's threads
    (and, with ``native``, a native stack of each running thread a few times a second)."""

    def __init__(self, pid: int, rate_hz: int, *, native: bool = False) -> None:
        self.pid = pid
        self.period_s = 1.0 / max(1, rate_hz)
        self.ticks: list[Tick] = []
        self.error: str | None = None
        self.native = native
        self.native_stacks: list[tuple[float, NativeStack]] = []  # (at_s, a native snapshot)
        self.native_error: str | None = None
        self.skip_native: set[int] = set()  # threads never stopped (glmfb's own heartbeat)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="glmfb-gil-waits", daemon=True)
        self._native_thread = threading.Thread(target=self._native_loop, name="glmfb-gil-native", daemon=True)
        self._files: dict[int, tuple[int, int]] = {}
        self.cpus: dict[int, str] = {}  # tid -> Cpus_allowed_list
        self.stopped_s: float | None = None
        self.runtime: tuple[int, int, str] | None = None  # _PyRuntime: (start, end, file)
        self._region_key: tuple[int | None, int] | None = None
        self._region: tuple[int, int] | None = None

    @property
    def supported(self) -> bool:
        return FUTEX_SYSCALL is not None and os.path.isdir(f"/proc/{self.pid}/task")

    def start(self) -> None:
        if not self.supported:
            self.error = "no /proc syscall view on this system"
            return
        from glmfb.gil.native import find_object

        self.runtime = find_object(self.pid, "_PyRuntime")
        self._thread.start()
        if self.native:
            self._native_thread.start()

    def stop(self) -> None:
        if self.stopped_s is None:
            self.stopped_s = time.monotonic()
        self._stop.set()
        for thread in (self._thread, self._native_thread):
            if thread.is_alive():
                thread.join(timeout=2.0)
        for syscall_fd, sched_fd in self._files.values():
            for fd in (syscall_fd, sched_fd):
                if fd >= 0:
                    os.close(fd)
        self._files.clear()

    def _open(self, task_dir: str, tid: int) -> tuple[int, int] | None:
        try:
            syscall_fd = os.open(f"{task_dir}/{tid}/syscall", os.O_RDONLY)
        except PermissionError:
            self.error = "reading /proc/PID/task/TID/syscall was refused"
            return None
        except OSError:
            return None
        try:
            sched_fd = os.open(f"{task_dir}/{tid}/schedstat", os.O_RDONLY)
        except OSError:
            sched_fd = -1
        self._files[tid] = (syscall_fd, sched_fd)
        try:
            with open(f"{task_dir}/{tid}/status", encoding="ascii", errors="replace") as handle:
                for line in handle:
                    if line.startswith("Cpus_allowed_list:"):
                        self.cpus[tid] = line.split(":", 1)[1].strip()
        except OSError:
            pass
        return syscall_fd, sched_fd

    def _forget(self, tid: int) -> None:
        for fd in self._files.pop(tid, (-1, -1)):
            if fd >= 0:
                os.close(fd)

    def _loop(self) -> None:
        task_dir = f"/proc/{self.pid}/task"
        while not self._stop.is_set():
            tick = Tick(at_s=time.monotonic())
            running: set[int] = set()
            try:
                tids = [int(name) for name in os.listdir(task_dir)]
            except OSError:
                return  # the process is gone
            for tid in tids:
                files = self._files.get(tid) or self._open(task_dir, tid)
                if files is None:
                    if self.error is not None:
                        return
                    continue
                syscall_fd, sched_fd = files
                try:
                    read_s = time.monotonic()
                    fields = os.pread(syscall_fd, 256, 0).split()
                    counters = os.pread(sched_fd, 128, 0).split() if sched_fd >= 0 else []
                except OSError:
                    self._forget(tid)
                    continue
                if len(counters) >= 2:
                    tick.cpu_ns[tid] = int(counters[0])
                    tick.runqueue_ns[tid] = int(counters[1])
                    tick.read_s[tid] = read_s
                if not fields:
                    continue
                if fields[0] == b"running":
                    running.add(tid)
                elif fields[0].isdigit():
                    number = int(fields[0])
                    tick.syscall[tid] = number
                    if number == FUTEX_SYSCALL and len(fields) > 1:
                        tick.futex[tid] = int(fields[1], 16)
            for gone in set(self._files) - set(tids):
                self._forget(gone)
            tick.running = frozenset(running)
            self.ticks.append(tick)
            self._stop.wait(self.period_s)

    def _native_loop(self) -> None:
        """Every ``NATIVE_EVERY_S``, a native snapshot of each thread the last tick saw
        running (a thread of its own: a stop can take a while on a busy machine, and the
        ticks must keep their pace; ptrace wants one tracer thread throughout)."""
        from glmfb.gil.native import NativeSampler

        native = NativeSampler(self.pid)
        if native.error is not None:
            self.native_error = native.error
            return
        while not self._stop.wait(NATIVE_EVERY_S):
            if not self.ticks:
                continue
            tick = self.ticks[-1]
            taken = Counter(stack.tid for _at, stack in self.native_stacks)
            for tid in sorted(tick.running - self.skip_native, key=lambda t: taken[t])[:NATIVE_PER_ROUND]:
                if self._stop.is_set():
                    break
                stack = native.snapshot(tid)
                if stack is not None:
                    self.native_stacks.append((tick.at_s, stack))
            if native.error is not None and not self.native_stacks:
                self.native_error = native.error

    # ---- the GIL's futex ----------------------------------------------------------------

    def gil_addresses(self, heartbeat_tid: int | None) -> set[int]:
        if heartbeat_tid is None:
            return set()
        return {tick.futex[heartbeat_tid] for tick in self.ticks if heartbeat_tid in tick.futex}

    def region(self, heartbeat_tid: int | None) -> tuple[int, int] | None:
        """The GIL's futex span: around the words the heartbeat waited on, or (no heartbeat, or
        one that never waited for the GIL) around the words seen inside ``_PyRuntime``."""
        key = (heartbeat_tid, len(self.ticks))
        if self._region_key != key:
            self._region_key = key
            self._region = gil_region(self.gil_addresses(heartbeat_tid)) or self._runtime_region()
        return self._region

    def _runtime_region(self) -> tuple[int, int] | None:
        """The span of the GIL struct inside ``_PyRuntime`` around the futex word threads waited
        on most there (CPython 3.9-3.12 keep the main interpreter's GIL in that object: its
        condition variables and mutexes are the only futex words in it), or None when no thread
        waited on one."""
        if self.runtime is None:
            return None
        low, high, _path = self.runtime
        seen: Counter[int] = Counter(address for tick in self.ticks for address in tick.futex.values()
                                     if low <= address < high)
        if not seen:
            return None
        anchor = seen.most_common(1)[0][0]
        region = gil_region(a for a in seen if abs(a - anchor) <= GIL_SPAN_BEFORE + GIL_SPAN_AFTER)
        assert region is not None
        return max(low, region[0]), min(high, region[1])

    def gil_source(self, heartbeat_tid: int | None) -> str | None:
        """How the GIL's futex words were found: from the heartbeat's waits, from
        ``_PyRuntime`` (no heartbeat), or None (not found: GIL waits cannot be told from others)."""
        if gil_region(self.gil_addresses(heartbeat_tid)) is not None:
            return "the futex words the heartbeat waited on"
        if self.runtime is not None:
            return f"_PyRuntime in {os.path.basename(self.runtime[2])}"
        return None

    def waiting(self, tick: Tick, tid: int, region: tuple[int, int] | None) -> bool:
        return _in(region, tick.futex.get(tid))

    def holder_while_waiting(self, waiter: Sequence[int], holder: Sequence[int], heartbeat_tid: int | None,
                             start_s: float, end_s: float) -> tuple[int, Counter[str]]:
        """At the ticks of the window where a thread of ``waiter`` (a thread, or a group's
        members) waited for the GIL: how many there were, and what the threads of ``holder`` did
        at them (``running``, ``waiting for the GIL``, ``in <syscall>``; running first when
        several members were seen)."""
        region = self.region(heartbeat_tid)
        count = 0
        states: Counter[str] = Counter()
        for tick in self.ticks:
            if not start_s <= tick.at_s <= end_s or not any(_in(region, tick.futex.get(t)) for t in waiter):
                continue
            count += 1
            seen = [self.state_name(tick, t, region) for t in holder]
            state = "running" if "running" in seen else next((s for s in seen if s), "")
            if state:
                states[state] += 1
        return count, states

    def waiting_counts(self, heartbeat_tid: int | None) -> tuple[Counter[int], int]:
        """Per thread id, in how many ticks it was seen waiting for the GIL; and the ticks."""
        region = self.region(heartbeat_tid)
        counts: Counter[int] = Counter()
        for tick in self.ticks:
            for tid, address in tick.futex.items():
                if _in(region, address) and tid != heartbeat_tid:
                    counts[tid] += 1
        return counts, len(self.ticks)

    def waiting_between(self, heartbeat_tid: int | None, start_s: float, end_s: float) -> Counter[int]:
        region = self.region(heartbeat_tid)
        counts: Counter[int] = Counter()
        for tick in self.ticks:
            if start_s <= tick.at_s <= end_s:
                for tid, address in tick.futex.items():
                    if _in(region, address) and tid != heartbeat_tid:
                        counts[tid] += 1
        return counts

    def states_between(
        self, tid: int, start_s: float, end_s: float, heartbeat_tid: int | None
    ) -> Counter[str]:
        """What thread ``tid`` was doing in the ticks of a window: ``running``, ``waiting for
        the GIL``, or the syscall it was blocked in (``clock_nanosleep``...)."""
        region = self.region(heartbeat_tid)
        states: Counter[str] = Counter()
        for tick in self.ticks:
            if not start_s <= tick.at_s <= end_s:
                continue
            states[self.state_name(tick, tid, region)] += 1
        states.pop("", None)
        return states

    def state_name(self, tick: Tick, tid: int, region: tuple[int, int] | None) -> str:
        if tid in tick.running:
            return "running"
        if _in(region, tick.futex.get(tid)):
            return "waiting for the GIL"
        if tid in tick.syscall:
            number = tick.syscall[tid]
            return f"in {SYSCALL_NAMES.get(number, f'syscall {number}')}"
        return ""

    def runqueue_between(self, tid: int, start_s: float, end_s: float, members: Sequence[int] = ()) -> float:
        """Seconds thread ``tid`` (or the threads ``members`` of its group, added up) waited for
        a CPU between two instants (each counter interpolated between the ticks around them)."""
        total = 0.0
        for member in members or (tid,):
            points = [(t.read_s[member], t.runqueue_ns[member] / 1e9) for t in self.ticks
                      if member in t.read_s and member in t.runqueue_ns]
            if len(points) >= 2:
                total += max(0.0, _interpolate(points, end_s) - _interpolate(points, start_s))
        return total

    def timeline(self, heartbeat_tid: int | None, holder_tid: int | None, start_s: float, end_s: float,
                 tids: Iterable[int], max_spans: int = 600) -> dict[int, list[list[float | str]]]:
        """Per thread, spans ``[start_s, end_s, state]`` (from ``start_s``) where it was
        ``waiting`` for the GIL, ``holding`` it (``holder_tid`` at ticks where another thread
        waited) or ``running``; at most ``max_spans`` bins a thread (the state most ticks of a
        bin saw)."""
        region = self.region(heartbeat_tid)
        ticks = [t for t in self.ticks if start_s <= t.at_s <= end_s]
        if not ticks:
            return {}
        span_s = max(end_s - start_s, 1e-9)
        bins = min(max_spans, len(ticks))
        width = span_s / bins
        result: dict[int, list[list[float | str]]] = {}
        for tid in tids:
            votes: list[Counter[str]] = [Counter() for _ in range(bins)]
            for tick in ticks:
                waiting = self.waiting(tick, tid, region)
                if waiting:
                    state = "waiting"
                elif tid == holder_tid and any(_in(region, a) for t, a in tick.futex.items() if t != tid):
                    state = "holding"
                elif tid in tick.running:
                    state = "running"
                else:
                    state = ""
                votes[min(bins - 1, int((tick.at_s - start_s) / width))][state] += 1
            spans: list[list[float | str]] = []
            for index, counter in enumerate(votes):
                if not counter:
                    continue
                state = counter.most_common(1)[0][0]
                if not state:
                    continue
                begin, end = round(index * width, 4), round((index + 1) * width, 4)
                if spans and spans[-1][2] == state and abs(float(spans[-1][1]) - begin) < 1e-6:
                    spans[-1][1] = end
                else:
                    spans.append([begin, end, state])
            result[tid] = spans
        return result

    # ---- time accounting ----------------------------------------------------------------

    def thread_times(self, heartbeat_tid: int | None, start_s: float | None = None,
                     end_s: float | None = None,
                     groups: Mapping[int, Sequence[int]] | None = None) -> dict[int, ThreadTime]:
        """Where each thread's time went between ``start_s`` and ``end_s`` (the whole
        sampling by default), from the kernel's counters and the states seen; each group of
        ``groups`` (representative -> member tids: threads that came and went) is accounted
        as one thread under its representative (:func:`account_group`)."""
        region = self.region(heartbeat_tid)
        ticks = self._window(start_s, end_s)
        tids = {tid for tick in ticks for tid in tick.cpu_ns}
        grouped = {tid for members in (groups or {}).values() for tid in members}
        times = {tid: account(ticks, tid, region) for tid in sorted(tids - grouped)}
        for representative, members in (groups or {}).items():
            times[representative] = account_group(ticks, members, region)
        return times

    def _window(self, start_s: float | None, end_s: float | None) -> list[Tick]:
        return [t for t in self.ticks
                if (start_s is None or t.at_s >= start_s) and (end_s is None or t.at_s <= end_s)]

    def short_lived(self, start_s: float | None = None, end_s: float | None = None) -> set[int]:
        """The threads the window did not see from its first tick to its last: they started
        or ended inside it."""
        ticks = self._window(start_s, end_s)
        if not ticks:
            return set()
        seen = {tid for tick in ticks for tid in tick.cpu_ns}
        return {tid for tid in seen if tid not in ticks[0].cpu_ns or tid not in ticks[-1].cpu_ns}


def _blocked_kind(tick: Tick, tid: int, region: tuple[int, int] | None) -> str:
    if tid in tick.running or tid not in tick.syscall:
        return "run"
    return "gil" if _in(region, tick.futex.get(tid)) else "other"


@dataclass
class _Block:
    """One ``BLOCK_S`` stretch of one thread: wall, counters, blocked time by what was seen."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    runqueue_s: float = 0.0
    gil_weight: float = 0.0
    other_weight: float = 0.0


def account(ticks: list[Tick], tid: int, region: tuple[int, int] | None) -> ThreadTime:
    """One thread's :class:`ThreadTime` over ``ticks`` (see the module's docstring).

    The kernel's counters give the blocked time exactly over any stretch (wall minus CPU
    minus run-queue time); per interval they are lumpy (CPU time of a running thread is
    brought up to date at scheduler ticks, a run-queue wait is added when it ends), so they
    are summed over blocks, never clipped per interval. Each blocked state seen at a tick
    (GIL or other) is weighted by the blocked time of the two intervals around it; the
    blocked time of a block is split between the GIL and the rest in the proportion of those
    weights over the window (a state seen in one block stands for its neighbours too).
    """
    seen = [t for t in ticks if tid in t.cpu_ns and tid in t.read_s]
    if len(seen) < 2:
        return ThreadTime(tid, 0.0, 0.0, 0.0, 0.0, 0.0, (0.0, 0.0), 0.0, len(seen))
    blocks, longest = _blocks(seen, tid, region, seen[0].read_s[tid])
    return _thread_time(tid, list(blocks.values()), longest, len(seen))


def account_group(ticks: list[Tick], tids: Sequence[int], region: tuple[int, int] | None) -> ThreadTime:
    """The :class:`ThreadTime` of threads that came and went (one sender per iteration), taken
    as one thread under the first id: over the whole window, its time on a CPU, in the run
    queue and blocked on the GIL are its members' added up, and the time no member was alive
    counts as blocked on something else (an idle sender between iterations, as a long-lived
    one waits on its queue). Shares are of the window's wall time, as for any other thread."""
    if len(ticks) < 2:
        return ThreadTime(tids[0], 0.0, 0.0, 0.0, 0.0, 0.0, (0.0, 0.0), 0.0, 0)
    origin = ticks[0].at_s
    summed: dict[int, _Block] = {}
    longest = 0.0
    count = 0
    for tid in tids:
        seen = [t for t in ticks if tid in t.cpu_ns and tid in t.read_s]
        count += len(seen)
        if len(seen) < 2:
            continue
        blocks, member_longest = _blocks(seen, tid, region, origin)
        longest = max(longest, member_longest)
        for index, block in blocks.items():
            into = summed.setdefault(index, _Block())
            into.wall_s += block.wall_s
            into.cpu_s += block.cpu_s
            into.runqueue_s += block.runqueue_s
            into.gil_weight += block.gil_weight
            into.other_weight += block.other_weight
    span_s = ticks[-1].at_s - origin
    for index in range(int(span_s / BLOCK_S) + 1):  # no member alive: blocked, not on the GIL
        block = summed.setdefault(index, _Block())
        length = min(BLOCK_S, span_s - index * BLOCK_S)
        if block.wall_s < length:
            block.other_weight += length - block.wall_s
            block.wall_s = length
    return _thread_time(tids[0], [summed[i] for i in sorted(summed)], longest, count)


def _blocks(seen: list[Tick], tid: int, region: tuple[int, int] | None,
            origin: float) -> tuple[dict[int, _Block], float]:
    """One thread's ``BLOCK_S`` stretches (numbered from ``origin``) over the ticks that saw
    it, and its longest stretch seen waiting for the GIL."""
    blocked: list[float] = []
    for before, after in itertools.pairwise(seen):
        dt = after.read_s[tid] - before.read_s[tid]
        cpu = (after.cpu_ns[tid] - before.cpu_ns[tid]) / 1e9
        runqueue = (after.runqueue_ns.get(tid, 0) - before.runqueue_ns.get(tid, 0)) / 1e9
        blocked.append(max(0.0, dt - cpu - runqueue))
    blocks: dict[int, _Block] = {}
    longest = current = 0.0
    for index, tick in enumerate(seen):
        kind = _blocked_kind(tick, tid, region)
        block = blocks.setdefault(int((tick.read_s[tid] - origin) / BLOCK_S), _Block())
        if index + 1 < len(seen):
            after = seen[index + 1]
            dt = after.read_s[tid] - tick.read_s[tid]
            block.wall_s += dt
            block.cpu_s += (after.cpu_ns[tid] - tick.cpu_ns[tid]) / 1e9
            block.runqueue_s += (after.runqueue_ns.get(tid, 0) - tick.runqueue_ns.get(tid, 0)) / 1e9
        around = (blocked[index - 1] if index > 0 else 0.0) + (blocked[index] if index < len(blocked) else 0.0)
        weight = around / 2 if around > 0 else 1e-9  # a state seen counts even in a lumpy stretch
        if kind == "gil":
            block.gil_weight += weight
            if index > 0 and _blocked_kind(seen[index - 1], tid, region) == "gil":
                current += tick.read_s[tid] - seen[index - 1].read_s[tid]
                longest = max(longest, current)
        else:
            current = 0.0
            if kind == "other":
                block.other_weight += weight
    return blocks, longest


def _thread_time(tid: int, values: list[_Block], longest: float, ticks: int) -> ThreadTime:
    wall, cpu, runqueue, gil_fraction = _totals(values)
    blocked_total = max(0.0, wall - cpu - runqueue)
    gil = blocked_total * gil_fraction
    return ThreadTime(
        tid=tid, wall_s=wall, cpu_s=cpu, runqueue_s=runqueue, gil_wait_s=gil, other_wait_s=blocked_total - gil,
        gil_wait_ci=_share_interval(values), longest_gil_wait_s=longest, ticks=ticks,
        of_runnable_ci=_share_interval(values, base="runnable"), of_ready_ci=_share_interval(values, base="ready"),
    )


def _totals(blocks: list[_Block]) -> tuple[float, float, float, float]:
    wall = sum(b.wall_s for b in blocks)
    cpu = sum(b.cpu_s for b in blocks)
    runqueue = sum(b.runqueue_s for b in blocks)
    weights = sum(b.gil_weight + b.other_weight for b in blocks)
    fraction = sum(b.gil_weight for b in blocks) / weights if weights > 0 else 0.0
    return wall, cpu, runqueue, fraction


def _share_interval(blocks: list[_Block], *, base: str = "wall") -> tuple[float, float]:
    """95% interval of the GIL-wait share of wall time (``base="runnable"``: of the time off the
    run queue; ``"ready"``: of the time on a CPU, waiting for one or for the GIL): a bootstrap
    over ``BLOCK_S`` stretches."""
    if not blocks:
        return (0.0, 0.0)
    rng = random.Random(0)
    shares = []
    for _ in range(RESAMPLES):
        sample = [blocks[rng.randrange(len(blocks))] for _ in blocks]
        wall, cpu, runqueue, fraction = _totals(sample)
        gil = max(0.0, wall - cpu - runqueue) * fraction
        total = {"wall": wall, "runnable": wall - runqueue, "ready": cpu + runqueue + gil}[base]
        shares.append(min(1.0, gil / total) if total > 0 else 0.0)
    shares.sort()
    return (shares[int(0.025 * RESAMPLES)], shares[int(0.975 * RESAMPLES) - 1])
