"""Child processes glmfb starts: how they ended, and leaving none of them behind.

A :class:`ProcessTree` follows a child and every process below it (psutil), remembering each
one it has seen with its start time, so that a grandchild that moved to a process group of
its own (the gil probe's traced program, the gap scenario's receiver) or was orphaned when its
parent died is still found and stopped: SIGTERM first (so the child's own clean-up runs),
then SIGKILL for whatever is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field


def describe_returncode(returncode: int) -> str:
    """``exited with status 3`` or ``was killed by signal 11 (SIGSEGV)``."""
    if returncode < 0:
        number = -returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "unknown signal"
        text = f"was killed by signal {number} ({name})"
        if number == signal.SIGKILL:
            text += ", for example by the kernel's out-of-memory killer"
        return text
    return f"exited with status {returncode}"


@dataclass
class ProcessTree:
    """A process and its descendants, as far as they have been seen."""

    pid: int
    leads_group: bool = False  # the root leads a process group: signal the group, also after the root exited
    seen: dict[int, float] = field(default_factory=dict)  # pid -> create time

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Remember every descendant alive now (cheap: one walk of the process table)."""
        import psutil

        try:
            root = psutil.Process(self.pid)
            self.seen.setdefault(self.pid, root.create_time())
            for child in root.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.seen.setdefault(child.pid, child.create_time())
        except psutil.Error:
            pass

    def alive(self) -> list[int]:
        """The remembered processes still running (the same processes: start times match)."""
        import psutil

        living = []
        for pid, created in self.seen.items():
            try:
                process = psutil.Process(pid)
                if abs(process.create_time() - created) < 0.01 and process.status() != psutil.STATUS_ZOMBIE:
                    living.append(pid)
            except psutil.Error:
                continue
        return living

    def add(self, pid: int) -> None:
        """Remember a process the walk may miss (one that reported its pid in its own session)."""
        import psutil

        with contextlib.suppress(psutil.Error):
            self.seen.setdefault(pid, psutil.Process(pid).create_time())

    def _signal(self, number: int) -> None:
        if self.leads_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, number)
        for pid in self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, number)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, number)

    def stop(self, grace_s: float = 3.0, first_signal: int = signal.SIGTERM) -> list[int]:
        """SIGTERM (or ``first_signal``) every remembered process (and the groups they lead),
        wait up to ``grace_s``, SIGKILL what is left. Returns the pids that needed SIGKILL."""
        self.refresh()
        self._signal(first_signal)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.alive():
            self.refresh()  # a process may start children while it shuts down
            time.sleep(0.05)
        stubborn = self.alive()
        if stubborn or self.leads_group:  # the group may hold processes the walk never saw
            self._signal(signal.SIGKILL)
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and self.alive():
                time.sleep(0.02)
        return stubborn
