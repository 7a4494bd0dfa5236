"""Starting the traced program in its own process group, and leaving nothing behind (the
stopping is :class:`glmfb.core.process.ProcessTree`'s, the one way glmfb stops a process tree)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from glmfb.core.process import ProcessTree


class Launched:
    """A child process started in a new session (its own process group)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        stdout_path: Path,
        stderr_path: Path,
    ) -> None:
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self._stdout: IO[bytes] = open(stdout_path, "wb")  # noqa: SIM115 - closed in close()
        self._stderr: IO[bytes] = open(stderr_path, "wb")  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=self._stdout,
                stderr=self._stderr,
                start_new_session=True,
            )
        except BaseException:
            self.close()
            raise
        self.pid = self.process.pid
        self.tree = ProcessTree(self.pid, leads_group=True)
        self.stopped_by_glmfb = False

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace_s: float = 5.0, first_signal: int = signal.SIGTERM) -> None:
        """Signal the program, its group and every process seen below it, then SIGKILL
        whatever is left (also after the leader exited); the leader is reaped.

        A leader that already ended is not "stopped by glmfb", even while its exit cannot be
        collected yet (a tracer such as py-spy still holds it): its own status is what the
        wait below returns, so a crash is not mistaken for glmfb's stop."""
        if self.process.poll() is None and not exited(self.pid):
            self.stopped_by_glmfb = True
        self.tree.stop(grace_s, first_signal)
        self.wait(5.0)

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def close(self) -> None:
        """Close the program's logs; once it has ended, each is cut to a bounded size
        (:func:`glmfb.core.io.bound_log`), whatever it printed."""
        for handle in (getattr(self, "_stdout", None), getattr(self, "_stderr", None)):
            if handle is not None:
                handle.close()
        process = getattr(self, "process", None)
        if process is not None and process.poll() is not None:
            from glmfb.core.io import bound_log

            bound_log(self.stdout_path)
            bound_log(self.stderr_path)

    def stderr_tail(self, limit: int = 600) -> str:
        from glmfb.core.io import last_lines

        return last_lines(self.stderr_path, 6, limit)


def exited(pid: int) -> bool:
    """Whether process ``pid`` ended (gone, or a zombie not reaped yet), without reaping it."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def wait_until(predicate: object, timeout_s: float, poll_s: float = 0.01) -> bool:
    """Poll ``predicate()`` until true or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return True
        time.sleep(poll_s)
    return bool(callable(predicate) and predicate())
