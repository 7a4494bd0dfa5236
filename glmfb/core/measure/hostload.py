"""How busy the rest of the host was while a probe measured.

A timing probe compares two sides interleaved, so load from other processes falls on both
sides alike; but it widens the interval, and it slows a side that runs more threads than the
other (a candidate with a sender thread beside its prefill competes for CPUs the baseline
leaves idle). An undecided verdict should say so when it happened, from a measurement, not
from a guess: :class:`HostLoadMeter` reads the host's busy CPU time (``/proc/stat``: user,
nice, system, irq, softirq and steal, which counts CPU time a hypervisor gave to other
machines) at the start and the end of a window, and subtracts what this process and its
descendants used meanwhile (psutil), which leaves what every other process (and, with steal,
every other virtual machine) used.

A descendant that exited and was reaped inside the window is counted in its parent's
``children_*`` times only when that parent is this process; one reaped by another descendant
is lost, which errs towards calling the host busier than it was. Unavailable (no ``/proc``,
no psutil): :meth:`HostLoadMeter.stop` returns None.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glmfb.contract.evidence import HostActivity

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system [idle iowait] irq softirq steal (guest is in user)
# Other processes busy on average on this many CPUs or more make a busy host, which an
# undecided verdict names (a quiet 2-core development host read 0.017-0.046 while bench measured;
# two busy loops beside a gap read 1.75).
BUSY_OTHER_CPUS = 0.25


@dataclass(frozen=True)
class HostLoad:
    """Busy CPU seconds over a window: the host's, and this process tree's."""

    window_s: float
    cpus: int  # CPUs online on the host
    host_busy_s: float
    own_busy_s: float

    @property
    def other_cpus(self) -> float:
        """CPUs other processes kept busy, on average over the window."""
        if self.window_s <= 0:
            return 0.0
        return max(0.0, self.host_busy_s - self.own_busy_s) / self.window_s

    def evidence(self) -> HostActivity:
        """The ``host_load`` evidence item."""
        from glmfb.contract.evidence import HostActivity

        per_s = 1.0 / self.window_s if self.window_s > 0 else 0.0
        return HostActivity(window_s=round(self.window_s, 3), cpus=self.cpus,
                            host_busy_cpus=round(self.host_busy_s * per_s, 3),
                            own_busy_cpus=round(self.own_busy_s * per_s, 3), other_busy_cpus=round(self.other_cpus, 3),
                            busy=self.busy)

    @property
    def resolution_cpus(self) -> float:
        """How far :attr:`other_cpus` may be off from the counters' clock ticks alone: each
        CPU's busy time and this tree's are counted in whole ticks, at both ends of the window
        (a 0.12 s window of a 2-core host: 0.67 CPUs; a 5 s one: 0.016)."""
        if self.window_s <= 0:
            return float("inf")
        return 2 * (self.cpus + 1) / os.sysconf("SC_CLK_TCK") / self.window_s

    @property
    def busy(self) -> bool:
        """Other processes kept :data:`BUSY_OTHER_CPUS` or more busy, beyond the counters'
        resolution (a window of a few ticks says nothing either way)."""
        return self.other_cpus - self.resolution_cpus >= BUSY_OTHER_CPUS

    def phrase(self) -> str:
        """``other processes kept 1.3 of the host's 2 CPUs busy while it measured``."""
        return (f"other processes kept {self.other_cpus:.1f} of the host's {self.cpus} CPUs busy while it "
                "measured")


def busy_note(load: HostLoad | None) -> str:
    """`` The host was busy: other processes kept ...`` for a why, or "" (no load measured, or
    a quiet host)."""
    return f" The host was busy: {load.phrase()}." if load is not None and load.busy else ""


def cpu_ticks() -> list[int] | None:
    """The host's CPU time by state since boot (``/proc/stat``'s ``cpu`` line, in clock ticks:
    user nice system idle iowait irq softirq steal ...), or None where it cannot be read."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
        if not fields or fields[0] != "cpu":
            return None
        return [int(v) for v in fields[1:]]
    except (OSError, ValueError):
        return None


def _host_busy_s() -> float | None:
    values = cpu_ticks()
    if values is None:
        return None
    return sum(values[i] for i in BUSY_FIELDS if i < len(values)) / os.sysconf("SC_CLK_TCK")


def _tree_busy_s(also: Sequence[int] = ()) -> tuple[float, dict[int, tuple[float, float]]] | None:
    """This process's CPU time (with its reaped children's) and each live descendant's
    (pid -> (create time, CPU seconds)); ``also``: processes that are not its descendants (a
    program attached by pid) counted with it, with their own descendants."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        me = psutil.Process()
        times = me.cpu_times()
        own = times.user + times.system + times.children_user + times.children_system
        descendants: dict[int, tuple[float, float]] = {}
        others: list[Any] = []
        for pid in also:
            with contextlib.suppress(psutil.Error):
                other = psutil.Process(pid)
                others.append(other)
                others.extend(other.children(recursive=True))
        for child in [*me.children(recursive=True), *others]:
            with contextlib.suppress(psutil.Error):
                child_times = child.cpu_times()
                descendants[child.pid] = (child.create_time(), child_times.user + child_times.system)
    except psutil.Error:
        return None
    return own, descendants


class HostLoadMeter:
    """Started at construction; :meth:`stop` gives the window's :class:`HostLoad`. ``also``:
    processes measured that are not this one's descendants (a program attached by pid), whose
    CPU time (and their descendants') is the measurement's own, not the rest of the host's."""

    def __init__(self, also: Sequence[int] = ()) -> None:
        self.also = tuple(also)
        self.started = time.monotonic()
        self.host = _host_busy_s()
        self.tree = _tree_busy_s(self.also)

    def stop(self) -> HostLoad | None:
        host, tree = _host_busy_s(), _tree_busy_s(self.also)
        window_s = time.monotonic() - self.started
        if self.host is None or host is None or self.tree is None or tree is None or window_s <= 0:
            return None
        own_before, before = self.tree
        own_after, after = tree
        own = own_after - own_before
        for pid, (created, busy) in after.items():
            then = before.get(pid)
            own += busy - then[1] if then is not None and abs(then[0] - created) < 0.01 else busy
        return HostLoad(window_s=window_s, cpus=os.cpu_count() or 1, host_busy_s=host - self.host,
                        own_busy_s=max(0.0, own))
