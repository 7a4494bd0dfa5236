"""The fork server of glmfb's warm workers (``python -m glmfb.core.zygote FD``; see :mod:`glmfb.core.workers`).

A cold probe child (``python -m glmfb.core.child``) pays an interpreter, glmfb's imports and torch's
import before its first measurement. This process pays them once: it imports the modules a
child runs (:func:`preload_modules`: glmfb's child side and each built-in probe's engine, then
numpy, pandas, psutil, and last torch and what needs it), runs nothing, starts no thread, and then
forks a fresh process for each job, never reusing one.

Per job, three processes:

- the zygote (this process) receives the job's socket and file descriptors over its control
  socket (``SCM_RIGHTS``) and forks the *reaper* J, then closes its copies;
- J makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``: every process orphaned below
  it is reparented to it, not to init, so a daemon that double-forks, with or without exec,
  stays in J's tree where the supervisor's walk finds it), says hello, reads the job (its
  environment, its folder, the job itself), forks the job process C, tells the supervisor C's
  pid, then C's exit status when it reaps it (as Popen's ``returncode``: minus the signal
  number), and stays until the supervisor closes the socket: then it kills whatever is still
  below it and exits. A supervisor that dies closes the socket too, so nothing below J
  outlives glmfb, not even when glmfb is SIGKILLed;
- C starts a session of its own (as the cold child does), takes the job's stdout and stderr
  files as fds 1 and 2 and ``/dev/null`` as fd 0, the job's environment as ``os.environ``,
  its folder, then runs :func:`glmfb.core.child.serve` on the job: the same code as the cold
  child's ``main``.

What a fork inherits that a fresh interpreter would not have is reset in C: numpy's global
random state is reseeded from the OS (Python's ``random`` reseeds itself at fork; torch's
default generator starts from its fixed seed either way), the import system's directory
caches are dropped (a target file written after the zygote started is found), and the
modules torch's import brought in are taken out of ``sys.modules`` and put back, at no cost,
the first time the job imports any of them: a job that never imports torch sees no torch in
``sys.modules``, as in a cold child (the verdict's environment records torch's threads only
when torch was imported). What the preload printed on stderr (a library's import-time warning)
is written to each job's stderr first, where a cold child would have printed it. One thing
stays shared: the hash seed of ``str`` (``PYTHONHASHSEED`` random), the zygote's for every job.

The zygote exits when the glmfb process that started it goes away: its control socket reads
end-of-file (the owner closed the pool, or exited, or was killed), and ``PR_SET_PDEATHSIG``
kills it should the owner die while it is still importing.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Iterable
from typing import Any

from glmfb.core.workers import READY, Channel

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
MAX_FDS = 8
REAP_S = 0.5  # how often the zygote and a reaper look for exited children when nothing else wakes them
SWEEP_S = 5.0  # a reaper's longest attempt at killing what is left below it

# The modules a job would import, in the order they are preloaded: glmfb's child side and each
# built-in probe's engine (glmfb.core.registry.BUILTIN_PROBES adds its probe and engine modules), the
# libraries the engines use, and torch last: TORCH_GROUP and everything imported from it on is
# hidden from a job's sys.modules until the job imports one of them.
GLMFB_MODULES = ("glmfb.core.child", "glmfb.core.host", "glmfb.core.env", "glmfb.core.process", "glmfb.core.supervise", "glmfb.core.targets")
LIBRARIES = ("numpy", "numpy.random", "pandas", "psutil")
TORCH_GROUP = ("torch", "safetensors.torch")


# --------------------------------------------------------------------------------------------
# The zygote
# --------------------------------------------------------------------------------------------


def _prctl(option: int, value: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value}) failed")


def preload_modules() -> tuple[str, ...]:
    """What the zygote imports, in order: glmfb's child side, each built-in probe's probe and
    engine module, the libraries, torch's group last."""
    from glmfb.core.registry import BUILTIN_PROBES

    probes = []
    for _, ref in BUILTIN_PROBES:
        module = ref.partition(":")[0]
        probes += [module, module.rpartition(".")[0] + ".engine"]
    return (*GLMFB_MODULES, *probes, *LIBRARIES, *TORCH_GROUP)


def _preload(names: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """Import each module: (imported, not installed, the names torch's group added to
    ``sys.modules``). Any other failure is raised: a half-imported library in the zygote would
    make every job differ from a cold child."""
    imported: list[str] = []
    missing: list[str] = []
    before_torch: set[str] | None = None
    for name in names:
        if name in TORCH_GROUP and before_torch is None:
            before_torch = set(sys.modules)
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                raise  # installed, but something it needs is not: not a clean "absent"
            missing.append(name)
            continue
        imported.append(name)
    added = set(sys.modules) - before_torch if before_torch is not None else set()
    # the standard library's modules torch brought in stay: a job importing asyncio must not
    # bring torch back with it
    hidden = sorted(name for name in added
                    if name.partition(".")[0] not in sys.stdlib_module_names and not name.startswith("__"))
    return imported, missing, hidden


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    setup = _receive_setup(control)
    parent = int(setup["parent"])
    with contextlib.suppress(OSError):
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the owner died before the line above
        os._exit(0)
    sys.path[:] = [p for p in setup["sys_path"] if p]
    started = time.monotonic()
    noise = os.memfd_create("glmfb-zygote-stderr")  # what the imports print, for each job's stderr
    saved_stderr = os.dup(2)
    os.dup2(noise, 2)
    try:
        imported, missing, hidden = _preload(preload_modules())
    except BaseException as exc:
        os.dup2(saved_stderr, 2)
        with contextlib.suppress(OSError):
            control.send(json.dumps({"failed": f"{type(exc).__name__}: {exc}"[:500]}).encode())
        os._exit(1)
    sys.stderr.flush()
    os.dup2(saved_stderr, 2)
    os.close(saved_stderr)
    os.lseek(noise, 0, os.SEEK_SET)
    printed = b""
    while chunk := os.read(noise, 65536):
        printed += chunk
    os.close(noise)
    _settle()
    threads = _threads()
    if threads != 1:  # a library started a thread that a fork does not stop: forking is unsafe
        with contextlib.suppress(OSError):
            control.send(json.dumps({"failed": f"the preloaded modules left {threads} threads running"}).encode())
        os._exit(1)
    import gc

    gc.freeze()  # the preloaded objects: never scanned by a job's collector, so their pages stay shared
    state = Preloaded(hidden=tuple(hidden), printed=printed)
    control.send(json.dumps({READY: True, "imported": imported, "missing": missing, "hidden": len(hidden),
                             "seconds": round(time.monotonic() - started, 3),
                             "printed": printed[-2000:].decode("utf-8", "replace")}).encode())
    _serve(control, parent, state)


def _receive_setup(control: socket.socket) -> dict[str, Any]:
    data = control.recv(1 << 20)
    if not data:
        os._exit(0)
    setup: dict[str, Any] = json.loads(data)
    return setup


def _settle() -> None:
    """Fork once and let the child exit at once: a library that keeps a thread pool (numpy's
    OpenBLAS starts one at import) stops it in its before-fork handler, so the zygote is left
    with its one thread before the first job, and the check after this sees that."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


class Preloaded:
    """What every job inherits from the preload: the module names to hide until imported, and
    what the imports printed on stderr."""

    def __init__(self, hidden: tuple[str, ...], printed: bytes) -> None:
        self.hidden = hidden
        self.printed = printed


def _serve(control: socket.socket, parent: int, state: Preloaded) -> None:
    """Fork a reaper for each job received; exit when the owner's end closes."""
    while True:
        _reap_any()
        ready, _, _ = select.select([control], [], [], REAP_S)
        if not ready:
            if os.getppid() != parent:
                break
            continue
        try:
            message, fds, _, _ = socket.recv_fds(control, 4096, MAX_FDS)
        except OSError:
            break
        if not message:
            break  # the owner closed the pool, exited or was killed
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                _reaper(control, fds, state)
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)
    os._exit(0)


def _reap_any() -> list[tuple[int, int]]:
    """Reap every exited child now: (pid, wait status) of each."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


# --------------------------------------------------------------------------------------------
# The reaper (J) and the job (C)
# --------------------------------------------------------------------------------------------


def _reaper(control: socket.socket, fds: list[int], state: Preloaded) -> None:
    control.close()
    job_fd, stdout_fd, stderr_fd, result_fd = fds
    channel = Channel(socket.socket(fileno=job_fd))
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        channel.send({"hello": os.getpid()})
        job = channel.receive()
    except OSError:
        job = None
    if job is None:  # the supervisor gave up before the job was sent
        os._exit(0)
    settled_r, settled_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(settled_r)
        _job(job, channel, stdout_fd, stderr_fd, result_fd, settled_w, state)
    os.close(settled_w)
    for fd in (stdout_fd, stderr_fd, result_fd):
        os.close(fd)  # the result pipe must close when C (and what it started) does, not when J does
    os.read(settled_r, 1)  # C has its session (or is gone): its pid is safe to walk from
    os.close(settled_r)
    try:
        channel.send({"pid": pid})
        _watch(channel, pid)
    except OSError:
        pass  # the supervisor is gone
    _sweep()
    os._exit(0)


def _watch(channel: Channel, pid: int) -> None:
    """Report C's exit status when it is reaped (and reap every orphan reparented here) until
    the supervisor closes the socket."""
    try:
        pidfd: int | None = os.pidfd_open(pid)  # readable when C exits: no polling for it
    except (AttributeError, OSError):
        pidfd = None
    ended = False
    while True:
        for reaped, status in _reap_any():
            if reaped == pid:
                channel.send({"returncode": os.waitstatus_to_exitcode(status)})
                ended = True
                if pidfd is not None:
                    os.close(pidfd)
                    pidfd = None
        watched = [channel.fileno()] if pidfd is None else [channel.fileno(), pidfd]
        ready, _, _ = select.select(watched, [], [], REAP_S if pidfd is not None or ended else 0.05)
        if channel.fileno() in ready:
            try:
                if not channel.sock.recv(4096):
                    return  # the supervisor is done with the leftover check, or gone
            except ConnectionError:
                return


def _sweep() -> None:
    """Kill every process below this one: stop them first so none forks again, then SIGKILL,
    reaping until nothing is left (orphans come here, as this process is their subreaper)."""
    import psutil

    deadline = time.monotonic() + SWEEP_S
    while time.monotonic() < deadline:
        _reap_any()
        below = []
        for process in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if process.status() != psutil.STATUS_ZOMBIE:
                    below.append(process)
        if not below:
            return
        for number in (signal.SIGSTOP, signal.SIGKILL):
            for process in below:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(number)
        time.sleep(0.01)


def _job(job: dict[str, Any], channel: Channel, stdout_fd: int, stderr_fd: int, result_fd: int, settled_w: int,
         state: Preloaded) -> None:
    """C: become what a cold child is, then run the job with glmfb.core.child's code. Never returns."""
    try:
        os.setsid()
        os.write(settled_w, b".")
        os.close(settled_w)
        channel.close()
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (stdout_fd, 1), (stderr_fd, 2)):
            os.dup2(fd, target)
            os.close(fd)
        if state.printed:
            os.write(2, state.printed)
        env = dict(job["env"])
        env["GLMFB_RESULT_FD"] = str(result_fd)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(job["cwd"])
        import glmfb.core.child

        sys.argv[:] = [glmfb.core.child.__file__ or "glmfb/core/child.py"]
        _fresh_state(state.hidden)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    glmfb.core.child.serve(job["job"])
    os._exit(0)


def _fresh_state(hidden: tuple[str, ...]) -> None:
    """Undo what a fork copies and a fresh interpreter would not have (module docstring)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    importlib.invalidate_caches()
    if hidden:
        _hide(hidden)


def _hide(names: tuple[str, ...]) -> None:
    """Take ``names`` out of ``sys.modules``; the first import of any of them puts them all back
    (the module objects themselves: nothing runs again)."""
    import importlib.abc
    import importlib.machinery
    import importlib.util

    stash = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    specs = {name: getattr(module, "__spec__", None) for name, module in stash.items()}

    class Restore(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
            original = specs.get(fullname)
            if fullname not in stash:
                return None
            return importlib.util.spec_from_loader(
                fullname, self, origin=getattr(original, "origin", None),
                is_package=getattr(original, "submodule_search_locations", None) is not None)

        def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)
            for name, module in stash.items():
                if name != spec.name:
                    sys.modules.setdefault(name, module)
            return stash[spec.name]

        def exec_module(self, module: Any) -> None:
            # the import system set our spec on it: it keeps its own
            module.__spec__ = specs.get(module.__name__, module.__spec__)

    sys.meta_path.insert(0, Restore())


if __name__ == "__main__":
    main()
