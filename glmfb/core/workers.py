"""Warm workers: probe children forked from a process that has already imported what they run.

A cold child (``python -m glmfb.core.child``) pays an interpreter, glmfb's imports and torch's import
(1.7-2.6 s here) before its first measurement. While :func:`pool` is open, :mod:`glmfb.core.supervise`
hands each job to a fork server instead (:mod:`glmfb.core.zygote`, started with the pool, which
imports those modules once): a job there is a fresh process forked for it alone, never reused,
supervised exactly as a cold child is. ``glmfb run``, ``glmfb bisect`` and ``glmfb mcp`` open a
pool; a single probe command does not (its zygote would pay the same imports as its child).

Whether a job goes warm is decided in one place, :meth:`Pool.refusal`; a job goes cold when

- no pool is open (:func:`enabled`: ``GLMFB_WORKERS=off`` turns the pool off everywhere,
  ``GLMFB_WORKERS=on`` turns it on for every surface, a single probe command too);
- the zygote is gone (it exited, failed its imports, or left a thread running after them);
- the job's environment differs from the zygote's in a variable read at start-up or import
  time by what the zygote imported (:func:`read_at_import`: the interpreter's ``PYTHON*``,
  the dynamic loader's ``LD_*``, glibc's ``MALLOC_*`` and ``GLIBC_TUNABLES``, the locale and
  time zone, the temporary folder, OpenMP's and the BLAS libraries' ``OMP_* KMP_* GOMP_* MKL_*
  OPENBLAS_* GOTO_* BLIS_*``, numpy's ``NPY_* NUMPY_*``, torch's ``TORCH* PYTORCH_*``, CUDA's
  ``CUDA_* NVIDIA_*``): the zygote's modules were set up with the values it started with;
- the job's import path does not begin with the zygote's, or its working folder holds a glmfb
  package other than the one the zygote runs (a cold child, started there, would import that
  one: ``glmfb bisect`` of glmfb's own repository).

How the job went is counted (:meth:`Pool.summary`, which ``glmfb run`` records in its run's
``env.workers``); the verdict is the same either way.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKERS_ENV = "GLMFB_WORKERS"
WARM_SURFACES = frozenset({"run", "mcp", "bisect"})  # where a pool is open unless GLMFB_WORKERS says otherwise
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "LC_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "GOTO_",
                        "BLIS_", "NPY_", "NUMPY_", "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_")
IMPORT_TIME_NAMES = frozenset({"GLIBC_TUNABLES", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP"})
READY_WAIT_S = 120.0  # the longest a job waits for the zygote's imports before it goes cold
START_WAIT_S = 30.0  # the longest from the job sent to its process's pid (two forks)
CLOSE_WAIT_S = 5.0
READY = "ready"  # the zygote's first message: its imports are done


# --------------------------------------------------------------------------------------------
# Messages between the supervisor, the zygote and its workers: JSON lines
# --------------------------------------------------------------------------------------------


class Channel:
    """JSON lines over a connected stream socket, both ways."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive(self, timeout_s: float | None = None, *, wake: Callable[[], bool] | None = None) -> dict[str, Any] | None:
        """The next message; None at end-of-file. Raises :class:`TimeoutError` after
        ``timeout_s``, or as soon as ``wake()`` (asked every 0.1 s) says true."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self.buffer:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError("no message in time")
            step = remaining
            if wake is not None:
                step = 0.1 if remaining is None else min(0.1, remaining)
            ready, _, _ = select.select([self.sock], [], [], step)
            if not ready:
                if wake is not None and wake():
                    raise TimeoutError("woken")
                continue
            try:
                chunk = self.sock.recv(65536)
            except ConnectionError:
                chunk = b""
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    def close(self) -> None:
        self.sock.close()


def read_at_import(name: str) -> bool:
    """Whether an environment variable is read when the interpreter starts or when the zygote's
    modules are imported, so that a job whose value differs must go cold."""
    return name in IMPORT_TIME_NAMES or name.startswith(IMPORT_TIME_PREFIXES)


def enabled(surface: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``surface`` (``run``, ``mcp``, ``bisect``, ``probe``) opens a pool:
    ``GLMFB_WORKERS`` off/on, else the surfaces of :data:`WARM_SURFACES`."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "send_fds"):
        return False
    setting = (os.environ if environ is None else environ).get(WORKERS_ENV, "").strip().lower()
    if setting in ("off", "0", "no", "false"):
        return False
    if setting in ("on", "1", "yes", "true"):
        return True
    return surface in WARM_SURFACES


class WorkerLost(OSError):
    """The warm worker went away after the job was handed to it: the job may have started, so
    it is not run again cold; the supervisor reports it as a child that could not start."""


@dataclass
class Pool:
    """One zygote, the environment and import path it started with, and how jobs went."""

    process: subprocess.Popen[bytes]
    control: socket.socket
    environ: dict[str, str]
    sys_path: list[str]
    cwd: Path
    warm: int = 0
    cold: int = 0
    why_cold: dict[str, int] = field(default_factory=dict)
    handed: int = 0  # the jobs' sockets given to the zygote (each one may have become a worker)
    ready: dict[str, Any] | None = None  # the zygote's ready message: what it imported, how long it took
    failed: str | None = None  # why the zygote is no use
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(cls) -> Pool:
        """Start a zygote (it imports in the background; the first job waits for it)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        environ = dict(os.environ)
        sys_path = [p for p in sys.path if p]
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "glmfb.core.zygote", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, env=environ, close_fds=True,
            )
        finally:
            theirs.close()
        ours.send(json.dumps({"sys_path": sys_path, "parent": os.getpid()}).encode())
        return cls(process, ours, environ, sys_path, Path.cwd())

    # ---- the decision --------------------------------------------------------------------

    def refusal(self, env: Mapping[str, str], sys_path: Sequence[str], cwd: Path) -> str | None:
        """Why a job with this environment, import path and folder must go cold; None: warm."""
        if self.failed is None and self.process.poll() is not None:
            self.failed = f"the zygote exited with status {self.process.returncode}"
        if self.failed is not None:
            return self.failed
        changed = sorted(name for name in set(env) | set(self.environ)
                         if read_at_import(name) and env.get(name) != self.environ.get(name))
        if changed:
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            return f"${changed[0]}{more} differs from the zygote's environment"
        if list(sys_path[: len(self.sys_path)]) != self.sys_path:
            return "the import path changed since the zygote started"
        if glmfb_run_in(cwd) != glmfb_run_in(self.cwd):
            return f"{cwd} holds a glmfb package other than the one the zygote runs"
        return None

    # ---- a job -------------------------------------------------------------------------------

    def start_job(self, job: dict[str, Any], env: dict[str, str], workdir: Path | None, stdout_fd: int,
                  stderr_fd: int, result_fd: int) -> WarmChild | None:
        """Hand ``job`` to a warm worker, to run in ``workdir`` (None: this process's folder):
        its process, as a :class:`WarmChild`; None when it must go cold (the reason counted).
        Raises :class:`WorkerLost` once the job was handed over."""
        cwd = workdir if workdir is not None else Path.cwd()
        with self.lock:
            why = self.refusal(env, job.get("sys_path", []), cwd)
        child = WarmChild.start(self, {"env": env, "cwd": str(cwd), "job": job},
                                (stdout_fd, stderr_fd, result_fd)) if why is None else why
        with self.lock:
            if isinstance(child, WarmChild):
                self.warm += 1
                return child
            self.cold += 1
            self.why_cold[child] = self.why_cold.get(child, 0) + 1
        return None

    def send(self, sock: socket.socket, fds: Sequence[int]) -> str | None:
        """Give the zygote a job's socket and file descriptors (one message, SCM_RIGHTS); why
        that failed, or None."""
        with self.lock:
            if self.failed is None:
                try:
                    socket.send_fds(self.control, [b"job"], [sock.fileno(), *fds])
                    self.handed += 1
                except OSError as exc:
                    self.failed = f"the zygote is gone ({exc.strerror or exc})"
            return self.failed

    def give_up(self, why: str) -> str:
        """Mark the zygote as no use (every later job goes cold at once) and say why: the
        reason already known (it exited, its imports failed), else ``why``."""
        self.note_ready()
        with self.lock:
            if self.failed is None and self.process.poll() is not None:
                self.failed = f"the zygote exited with status {self.process.returncode}"
            if self.failed is None:
                self.failed = why
            return self.failed

    def wait_ready(self, timeout_s: float = READY_WAIT_S) -> bool:
        """Wait for the zygote's imports (tests, benchmarks); whether it is ready."""
        deadline = time.monotonic() + timeout_s
        while self.ready is None and self.failed is None and time.monotonic() < deadline:
            self._read_control(min(0.1, max(0.0, deadline - time.monotonic())))
        return self.ready is not None

    def _read_control(self, timeout_s: float) -> None:
        with self.lock:
            ready, _, _ = select.select([self.control], [], [], timeout_s)
            if not ready:
                if self.process.poll() is not None and self.failed is None:
                    self.failed = f"the zygote exited with status {self.process.returncode}"
                return
            data = self.control.recv(1 << 16)
            message = json.loads(data) if data else {"failed": "the zygote closed its socket"}
            if READY in message:
                self.ready = message
            else:
                self.failed = f"the zygote could not start: {message.get('failed')}"

    def note_ready(self) -> None:
        """Read the zygote's ready (or failure) message if it has come, without waiting."""
        if self.ready is None and self.failed is None:
            self._read_control(0.0)

    def summary(self) -> dict[str, Any]:
        """How jobs went while the pool was open: ``{"warm": n, "cold": n}``, and why jobs went
        cold (each reason with its count) when some did."""
        with self.lock:
            data: dict[str, Any] = {"warm": self.warm, "cold": self.cold}
            if self.why_cold:
                data["why_cold"] = dict(self.why_cold)
            return data

    def close(self) -> None:
        """End the zygote: it reads end-of-file and exits (SIGKILL if it does not in time). Jobs
        still running stay supervised: each is tied to its own socket, not to the zygote. A
        zygote that was never handed a job has started nothing (it forks only for a job): it
        is stopped at once instead of being waited for, since one still importing reads the
        end-of-file only when its imports are done (a refused ``glmfb run`` waited 1.8 s so)."""
        with contextlib.suppress(OSError):
            self.control.close()
        with self.lock:
            handed = self.handed
        if handed == 0:
            with contextlib.suppress(OSError):
                self.process.terminate()
        try:
            self.process.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def glmfb_run_in(folder: Path) -> Path:
    """The glmfb package that ``python -m glmfb...`` started in ``folder`` imports: the one in
    the folder itself (it comes first on the import path), else this process's."""
    package = folder / "glmfb"
    if (package / "__init__.py").is_file():
        return package.resolve()
    import glmfb

    return Path(glmfb.__file__).parent.resolve()


class WarmChild:
    """A job's process in a warm worker, as :func:`glmfb.core.supervise._supervise` sees a Popen:
    ``pid`` (the job's process), ``wait(timeout)``, ``returncode`` (minus the signal number for
    a signal), no ``stdin`` (the job went over the worker's socket), and as a context manager
    whose exit lets the worker's reaper go (it kills whatever is still below it). ``reaper`` is
    the reaper's pid: the supervisor's process tree walks below it too."""

    stdin = None

    def __init__(self, channel: Channel, pid: int, reaper: int) -> None:
        self.channel = channel
        self.pid = pid
        self.reaper = reaper
        self.returncode: int | None = None
        self.lost = False  # the reaper went away before reporting: the status is unknown

    @classmethod
    def start(cls, pool: Pool, message: dict[str, Any], fds: tuple[int, int, int]) -> WarmChild | str:
        """Hand the job over to a new worker of ``pool``: its process, or why the job goes
        cold (nothing was started). Raises :class:`WorkerLost` when the worker went away after
        it had the job."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        channel = Channel(ours)
        try:
            try:
                failed = pool.send(theirs, fds)
            finally:
                theirs.close()
            hello = None
            if failed is None:
                try:  # the zygote may still be importing
                    hello = channel.receive(READY_WAIT_S, wake=lambda: pool.process.poll() is not None)
                except TimeoutError:
                    failed = pool.give_up(f"the zygote started no worker within {READY_WAIT_S:g} s")
            if hello is None or "hello" not in hello:
                channel.close()
                return failed or pool.give_up("a warm worker exited before it could take a job")
            channel.send(message)  # from here on, the job may have started: it never goes cold
            try:
                started = channel.receive(START_WAIT_S)
            except TimeoutError:
                raise WorkerLost(f"the warm worker did not start the probe's process within {START_WAIT_S:g} s"
                                 ) from None
            if started is None or "pid" not in started:
                raise WorkerLost("the warm worker went away before starting the probe's process")
            return cls(channel, int(started["pid"]), int(hello["hello"]))
        except BaseException:
            channel.close()  # the worker reads end-of-file: it exits, killing whatever it started
            raise

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the job's process to end (its exit status, as the reaper reports it);
        :class:`subprocess.TimeoutExpired` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None and not self.lost:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                message = self.channel.receive(remaining)
            except TimeoutError:
                raise subprocess.TimeoutExpired(f"warm worker {self.pid}", timeout or 0.0) from None
            except OSError:
                message = None
            if message is None:
                self.lost = True
            elif "returncode" in message:
                self.returncode = int(message["returncode"])
        if self.returncode is None:
            self._wait_gone(deadline)
        return self.returncode

    def _wait_gone(self, deadline: float | None) -> None:
        """The reaper is gone (killed), so the status is unknown: wait for the job's process
        itself, by its pid."""
        import psutil

        try:
            psutil.Process(self.pid).wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except psutil.TimeoutExpired:
            raise subprocess.TimeoutExpired(f"warm worker {self.pid}", 0.0) from None
        except psutil.Error:
            pass

    def __enter__(self) -> WarmChild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()


# --------------------------------------------------------------------------------------------
# The pool of this process
# --------------------------------------------------------------------------------------------

_current: Pool | None = None
_current_lock = threading.Lock()


@contextlib.contextmanager
def pool(surface: str) -> Iterator[Pool | None]:
    """Open a pool for ``surface`` while the block runs (if :func:`enabled`; inside an open
    pool, that one), and close it after: the zygote never outlives this. Yields the pool, or
    None when jobs go cold."""
    global _current
    with _current_lock:
        opened = None
        if _current is None and enabled(surface):
            with contextlib.suppress(OSError):  # no zygote: every job goes cold
                opened = _current = Pool.start()
    try:
        yield opened or _current
    finally:
        if opened is not None:
            with _current_lock:
                _current = None
            opened.close()


def recorded(env: Mapping[str, Any], opened: Pool | None) -> dict[str, Any]:
    """A run's environment with how its jobs went (``workers``: :meth:`Pool.summary`) when a
    pool was open."""
    return {**env, "workers": opened.summary()} if opened is not None else dict(env)


def current() -> Pool | None:
    """The pool open in this process, if any."""
    return _current


def start_job(job: dict[str, Any], env: dict[str, str], workdir: Path | None, stdout_fd: int, stderr_fd: int,
              result_fd: int) -> WarmChild | None:
    """The job's process in a warm worker, or None: no pool is open, or the pool says cold."""
    opened = _current
    if opened is None:
        return None
    return opened.start_job(job, env, workdir, stdout_fd, stderr_fd, result_fd)
