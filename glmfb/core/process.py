"""Child processes glmfb starts: how they ended, and leaving none of them behind.

A :class:`ProcessTree` follows a child and every process below it (psutil), remembering each
one it has seen with its start time, so that a grandchild that moved to a process group of
its own (the gil probe's traced program, the gap scenario's receiver) or was orphaned when its
parent died is still found and stopped: SIGTERM first (so the child's own clean-up runs),
then SIGKILL for whatever is left.

The walk misses a process that left the tree between two looks: a daemon that double-forks
(its parent exits, so init adopts it) or a server started with ``start_new_session=True`` whose
starter exited. So a supervised child gets a cookie in its environment (``COOKIE_ENV``, as
Jenkins' process-tree killer does with its build id); every process below it inherits it,
whatever session or parent it ends up with, and :meth:`ProcessTree.stop` also stops every
process of this user that carries it. A process that clears its own environment escapes this
search; nothing else a target starts does.

A warm worker's job process (:mod:`glmfb.core.zygote`) is forked, not executed, so its own
``/proc/PID/environ`` and that of every process it forks without exec still show the fork
server's environment, without the cookie. There the tree has a ``reaper``: the job's parent, a
child subreaper that every orphan below it is reparented to; the walk goes below it too (the
reaper itself is glmfb's, never signalled nor listed), so a daemon that double-forked, with or
without exec, is still below it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field

from glmfb.contract.evidence import StoppedProcess


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


COOKIE_ENV = "GLMFB_PROBE_COOKIE"


def new_cookie() -> str:
    """A value for ``COOKIE_ENV`` that no other probe's processes carry."""
    import uuid

    return uuid.uuid4().hex


def marked(cookie: str) -> dict[int, float]:
    """Every live process of this user whose environment carries ``cookie`` (pid -> create time)."""
    import psutil

    found: dict[int, float] = {}
    me = os.getpid()
    for process in psutil.process_iter(["pid", "uids"]):
        try:
            if process.pid == me or process.info["uids"] is None or process.info["uids"].real != os.getuid():
                continue
            if process.environ().get(COOKIE_ENV) == cookie and process.status() != psutil.STATUS_ZOMBIE:
                found[process.pid] = process.create_time()
        except (psutil.Error, OSError):
            continue
    return found


@dataclass
class ProcessTree:
    """A process and its descendants, as far as they have been seen; with a ``cookie``, also
    every process that carries it in its environment."""

    pid: int
    leads_group: bool = False  # the root leads a process group: signal the group, also after the root exited
    cookie: str | None = None  # the COOKIE_ENV value the root was started with
    seen: dict[int, float] = field(default_factory=dict)  # pid -> create time
    walked: set[int] = field(default_factory=set)  # the pids seen below the root (not only by the cookie)
    session: int | None = None  # the root's session
    reaper: int | None = None  # a subreaper above the root (a warm worker's): everything below it is the root's

    def __post_init__(self) -> None:
        with contextlib.suppress(OSError):
            self.session = os.getsid(self.pid)
        self.refresh()

    def refresh(self, *, marked_too: bool = False) -> None:
        """Remember every descendant alive now (cheap: one walk of the process table); with
        ``marked_too``, every process carrying the cookie as well (a scan of every process's
        environment, done when stopping)."""
        import psutil

        for top in (self.pid, self.reaper):
            if top is None:
                continue
            try:
                root = psutil.Process(top)
                if top == self.pid:
                    self.seen.setdefault(self.pid, root.create_time())
                for child in root.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        self.seen.setdefault(child.pid, child.create_time())
                        self.walked.add(child.pid)
            except psutil.Error:
                pass
        if marked_too and self.cookie is not None:
            for pid, created in marked(self.cookie).items():
                self.seen.setdefault(pid, created)

    def left_running(self) -> list[StoppedProcess]:
        """The processes below the root (or carrying its cookie) still running, the root
        excluded: what the root's program left behind when it answered."""
        import psutil

        self.refresh(marked_too=True)
        left = []
        for pid in self.alive():
            if pid == self.pid:
                continue
            try:
                process = psutil.Process(pid)
                command = " ".join(process.cmdline()) or process.name()
                own = self.session is None or os.getsid(pid) != self.session
            except (psutil.Error, OSError):
                continue
            left.append(StoppedProcess(pid=pid, command=command[:200], own_session=own,
                                       found_by_cookie=pid not in self.walked))
        return left

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
        self.refresh(marked_too=True)
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
