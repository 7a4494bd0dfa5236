"""The glmfb starvation heartbeat, injected into a traced Python process without ptrace.

glmfb puts this folder first on ``PYTHONPATH`` and sets ``GLMFB_GIL_HEARTBEAT`` to a file
prefix. At start-up a daemon thread named ``glmfb-heartbeat`` sleeps 1 ms in a loop and records
how late each wake-up was (a thread that must wait for the GIL wakes up late). Every 100 ms it
appends ``(wake_monotonic_s, lateness_s, cpu_wait_s)`` triples of doubles to ``<prefix>.bin``
and rewrites ``<prefix>.json`` (pid, its own native thread id, the thread names) atomically.
``cpu_wait_s`` is the part of a late wake-up the thread spent runnable without a CPU (its
run-queue time from ``/proc/thread-self/schedstat``), so lateness from a busy machine is not
blamed on the GIL.

Only the standard library; any failure disables the heartbeat and never breaks the program.
A ``sitecustomize`` further down ``sys.path`` (the user's own) is still imported.
"""

from __future__ import annotations

import os
import sys

_ENV = "GLMFB_GIL_HEARTBEAT"
_PERIOD_S = float(os.environ.get("GLMFB_GIL_HEARTBEAT_PERIOD_S", "0.001"))
_FLUSH_S = 0.1
_LATE_S = 0.0005  # read the run-queue time only after a wake-up at least this late
# The program's imports settled once no module was added in this many checks in a row (one a
# flush, 0.1 s apart or more): counted in checks, not seconds, so a long dlopen that keeps the
# heartbeat from running is not taken for a quiet stretch.
_SETTLED_CHECKS = 5


def _importing() -> bool:
    """Whether some thread is inside an import: the import system keeps a lock per module
    being imported (weakly, so it leaves when that import ends). A long native load inside an
    import (``import torch`` loading its libraries through ctypes, which releases the GIL)
    adds no module for seconds: without this, that was taken for settled imports."""
    bootstrap = sys.modules.get("_frozen_importlib")
    return bool(getattr(bootstrap, "_module_locks", None))


def _start(prefix: str) -> None:
    import atexit
    import io
    import json
    import threading
    import time
    from array import array

    header_path = prefix + ".json"
    data_path = prefix + ".bin"

    started_s = time.monotonic()
    imports = {"count": len(sys.modules), "quiet": 0}  # modules seen, checks in a row without a new one
    last_import_s = [started_s]  # when a new module was last seen
    settled_s: list[float] = []  # when the start-up imports settled, once they did

    def write_header(native_id: int, names: dict[str, str]) -> None:
        tmp = f"{header_path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "schema": "glmfb.heartbeat/1",
                    "pid": os.getpid(),
                    "heartbeat_tid": native_id,
                    "period_s": _PERIOD_S,
                    "started_s": started_s,
                    "fields": ["wake_s", "lateness_s", "cpu_wait_s"],
                    "threads": names,
                    "argv": list(sys.argv),
                    # when the program's start-up imports settled: the last time sys.modules
                    # grew before it stayed the same for _SETTLED_CHECKS checks (None: not yet)
                    "imports_settled_s": settled_s[0] if settled_s else None,
                },
                handle,
            )
        os.replace(tmp, header_path)

    def thread_names() -> dict[str, str]:
        return {str(t.native_id): t.name for t in threading.enumerate() if t.native_id is not None}

    def open_schedstat() -> io.FileIO | None:
        try:  # opened by the heartbeat thread: the file stays this thread's
            return open("/proc/thread-self/schedstat", "rb", buffering=0)
        except OSError:
            return None

    def run_queue_s(schedstat: io.FileIO) -> float:
        """Seconds this thread has been runnable but without a CPU, since it started."""
        schedstat.seek(0)
        return int(schedstat.read().split()[1]) / 1e9

    def beat() -> None:
        native_id = threading.get_native_id()
        names = thread_names()
        write_header(native_id, names)
        schedstat = open_schedstat()
        last_run_queue_s = run_queue_s(schedstat) if schedstat is not None else 0.0
        out = open(data_path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the thread
        samples = array("d")

        closed = []

        owner_pid = os.getpid()

        def flush_at_exit() -> None:  # the last < 100 ms of samples; runs with the GIL held
            if os.getpid() != owner_pid:
                return  # a forked child: its copy of the samples is not its own
            closed.append(True)
            pending = samples.tobytes()
            del samples[:]
            out.write(pending)

        atexit.register(flush_at_exit)
        monotonic = time.monotonic
        sleep = time.sleep
        next_flush = monotonic() + _FLUSH_S
        while True:
            before = monotonic()
            sleep(_PERIOD_S)
            after = monotonic()
            late = after - before - _PERIOD_S
            cpu_wait = 0.0
            if schedstat is not None and late > _LATE_S:
                now_run_queue_s = run_queue_s(schedstat)
                cpu_wait = min(late, max(0.0, now_run_queue_s - last_run_queue_s))
                last_run_queue_s = now_run_queue_s
            samples.extend((after, late, cpu_wait))  # one call: records stay whole
            if after >= next_flush and not closed:
                if schedstat is not None:
                    last_run_queue_s = run_queue_s(schedstat)
                pending = samples.tobytes()
                del samples[:]
                out.write(pending)
                current = thread_names()
                settled = False
                if not settled_s:
                    if len(sys.modules) != imports["count"] or _importing():
                        imports.update(count=len(sys.modules), quiet=0)
                        last_import_s[0] = after
                    else:
                        imports["quiet"] += 1
                        if imports["quiet"] >= _SETTLED_CHECKS:
                            settled_s.append(last_import_s[0])
                            settled = True
                if current != names or settled:
                    names.update(current)  # keep threads that ended: they may be in samples
                    write_header(native_id, names)
                next_flush = after + _FLUSH_S

    _record_thread_names(prefix + ".threads")
    thread = threading.Thread(target=beat, name="glmfb-heartbeat", daemon=True)
    thread.start()


def _record_thread_names(path: str) -> None:
    """Append ``native_id<TAB>name`` to ``path`` as each thread starts, from the new thread
    itself: a starved heartbeat may not wake before the process ends, the names must not
    wait for it. Skipped where ``Thread._set_native_id`` does not exist."""
    import threading

    original = getattr(threading.Thread, "_set_native_id", None)
    if original is None:
        return

    def _set_native_id(self: threading.Thread) -> None:
        original(self)
        try:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(f"{self.native_id}\t{self.name}\n")
        except Exception:
            pass

    threading.Thread._set_native_id = _set_native_id  # type: ignore[attr-defined]


def _chain_user_sitecustomize() -> None:
    """Import the next ``sitecustomize`` on sys.path, as if this one were not there."""
    import importlib

    here = os.path.dirname(os.path.abspath(__file__))
    saved_path = list(sys.path)
    saved_module = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved_path
        if saved_module is not None:
            sys.modules["sitecustomize"] = saved_module


_prefix = os.environ.pop(_ENV, None)  # popped: child processes do not start their own
if _prefix:
    try:
        _start(_prefix)
    except Exception as exc:  # never break the traced program
        sys.stderr.write(f"glmfb: heartbeat disabled: {type(exc).__name__}: {exc}\n")
_chain_user_sitecustomize()
