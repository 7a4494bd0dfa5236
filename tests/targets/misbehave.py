"""Targets that misbehave the way real kernels, extensions and serving code do: they raise,
exit, crash, hang, leave a thread running, leave a daemon running or print. One factory per probe kind; ``behavior``
says what to do (``none`` behaves). Used by tests/test_isolation.py through the real CLI."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
import time
from typing import Any


def act(behavior: str) -> None:
    if behavior == "raise":
        raise RuntimeError("planted failure in the target")
    if behavior == "exit":
        sys.exit(0)
    if behavior == "os_exit":
        os._exit(0)
    if behavior == "segfault":
        ctypes.string_at(0)
    if behavior == "hang":
        time.sleep(3600)
    if behavior == "thread":  # a non-daemon thread that outlives the probe
        threading.Thread(target=time.sleep, args=(3600,), name="leaked").start()
    if behavior == "print":
        print("TARGET NOISE ON STDOUT", flush=True)
    if behavior in ("daemon", "double_fork", "double_fork_no_exec") and not _STARTED:
        _STARTED.append(_daemon(behavior))


_STARTED: list[int] = []
SLEEPER = [sys.executable, "-c", "import time; time.sleep(3600)  # left by misbehave"]


def _daemon(behavior: str) -> int:
    """A process that outlives the target: a server started in a session of its own and never
    stopped (``daemon``), or a daemon the classic way (``double_fork``: fork, setsid, fork, the
    middle process exits, so init adopts the last one and it is no longer below the target);
    ``double_fork_no_exec`` does the same without exec, so the daemon is a copy of the target's
    process, with its command line and (in /proc) the environment that process started with."""
    if behavior == "daemon":
        return subprocess.Popen(SLEEPER, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            if behavior == "double_fork_no_exec":
                time.sleep(3600)
                os._exit(0)
            os.execv(SLEEPER[0], SLEEPER)
        os._exit(0)
    os.waitpid(middle, 0)
    return middle


def bench(shape: tuple[int, ...], behavior: str = "none") -> Any:
    import torch

    act(behavior)
    x = torch.ones(shape)

    def kernel() -> Any:
        if behavior == "print":
            print("noise from the kernel")
        return x * 2.0

    return kernel


def diff(behavior: str = "none") -> Any:
    import torch

    def run(request: dict[str, Any]) -> Any:
        act(behavior)
        return {"y": request["input_ids"].to(torch.float32)}

    return run


def gap(behavior: str = "none") -> Any:
    act(behavior)

    def iteration() -> dict[str, float]:
        started = time.perf_counter()
        sum(range(20_000))
        return {"work_s": time.perf_counter() - started}

    return iteration


def gil(behavior: str = "none") -> Any:
    act(behavior)
    return lambda: time.sleep(0.001)
