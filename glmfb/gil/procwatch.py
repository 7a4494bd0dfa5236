"""Which threads of the traced process wait for the GIL, read from /proc without ptrace stops.

Every tick reads ``/proc/PID/task/TID/syscall`` for each thread: the syscall a blocked thread
is in and its first argument. A thread waiting for the GIL is in ``futex`` on the address of
the GIL's condition variable. The heartbeat thread only ever blocks in its 1 ms sleep or on
that futex, so the futex addresses seen for the heartbeat name the GIL; any other thread seen
on one of them was waiting for the GIL at that moment (runnable, but starved).
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

_ARCH = platform.machine().lower()
FUTEX_SYSCALL = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(_ARCH)
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


class GilWaitSampler:
    """A background thread sampling the syscalls of one process's threads."""

    def __init__(self, pid: int, rate_hz: int) -> None:
        self.pid = pid
        self.period_s = 1.0 / max(1, rate_hz)
        self.ticks: list[Tick] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="glmfb-gil-waits", daemon=True)

    @property
    def supported(self) -> bool:
        return FUTEX_SYSCALL is not None and os.path.isdir(f"/proc/{self.pid}/task")

    def start(self) -> None:
        if not self.supported:
            self.error = "no /proc syscall view on this system"
            return
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)

    def _loop(self) -> None:
        task_dir = f"/proc/{self.pid}/task"
        while not self._stop.is_set():
            tick = Tick(at_s=time.monotonic())
            running: set[int] = set()
            try:
                tids = os.listdir(task_dir)
            except OSError:
                return  # the process is gone
            for name in tids:
                try:
                    with open(f"{task_dir}/{name}/syscall", encoding="ascii") as handle:
                        fields = handle.read().split()
                except OSError as exc:
                    if isinstance(exc, PermissionError):
                        self.error = "reading /proc/PID/task/TID/syscall was refused"
                        return
                    continue
                if not fields:
                    continue
                if fields[0] == "running":
                    running.add(int(name))
                elif fields[0].isdigit():
                    number = int(fields[0])
                    tick.syscall[int(name)] = number
                    if number == FUTEX_SYSCALL and len(fields) > 1:
                        tick.futex[int(name)] = int(fields[1], 16)
            tick.running = frozenset(running)
            self.ticks.append(tick)
            self._stop.wait(self.period_s)

    def gil_addresses(self, heartbeat_tid: int) -> set[int]:
        return {tick.futex[heartbeat_tid] for tick in self.ticks if heartbeat_tid in tick.futex}

    def waiting_counts(self, heartbeat_tid: int) -> tuple[Counter[int], int]:
        """Per thread id, in how many ticks it waited for the GIL; and the number of ticks."""
        addresses = self.gil_addresses(heartbeat_tid)
        counts: Counter[int] = Counter()
        for tick in self.ticks:
            for tid, address in tick.futex.items():
                if address in addresses and tid != heartbeat_tid:
                    counts[tid] += 1
        return counts, len(self.ticks)

    def waiting_between(self, heartbeat_tid: int, start_s: float, end_s: float) -> Counter[int]:
        addresses = self.gil_addresses(heartbeat_tid)
        counts: Counter[int] = Counter()
        for tick in self.ticks:
            if start_s <= tick.at_s <= end_s:
                for tid, address in tick.futex.items():
                    if address in addresses and tid != heartbeat_tid:
                        counts[tid] += 1
        return counts

    def states_between(
        self, tid: int, start_s: float, end_s: float, heartbeat_tid: int
    ) -> Counter[str]:
        """What thread ``tid`` was doing in the ticks of a window: ``running``, ``waiting for
        the GIL``, or the syscall it was blocked in (``clock_nanosleep``...)."""
        addresses = self.gil_addresses(heartbeat_tid)
        states: Counter[str] = Counter()
        for tick in self.ticks:
            if not start_s <= tick.at_s <= end_s:
                continue
            if tid in tick.running:
                states["running"] += 1
            elif tick.futex.get(tid) in addresses:
                states["waiting for the GIL"] += 1
            elif tid in tick.syscall:
                number = tick.syscall[tid]
                states[f"in {SYSCALL_NAMES.get(number, f'syscall {number}')}"] += 1
        return states
