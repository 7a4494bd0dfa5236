"""Driving ``py-spy record --gil --idle --threads [--native] -f raw`` and reading what it wrote.

With ``--gil`` py-spy keeps only the thread holding the GIL at each sample; ``--idle`` keeps it
even when the OS says the thread is blocked (without it a holder blocked in a native call is
dropped on some systems). Raw output does not mark a sample idle, so the active/idle split comes
from ``--native``: a holder whose native frames below its innermost Python frame end in a
blocking call (``clock_nanosleep``, ``poll``, ``pthread_cond_wait``...) is blocked while holding
the GIL; one computing is active. Without ``--native`` the split is unknown and said so.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmfb.gil.groups import unnamed

# Native functions in which a thread is blocked (not on a CPU).
BLOCKING_NATIVE = frozenset(
    {
        "clock_nanosleep",
        "nanosleep",
        "usleep",
        "sleep",
        "select",
        "pselect",
        "pselect6",
        "poll",
        "ppoll",
        "epoll_wait",
        "epoll_pwait",
        "read",
        "__libc_read",
        "recv",
        "recvfrom",
        "recvmsg",
        "accept",
        "accept4",
        "connect",
        "pthread_cond_wait",
        "pthread_cond_timedwait",
        "pthread_cond_clockwait",
        "sem_wait",
        "sem_timedwait",
        "sem_clockwait",
        "pthread_join",
        "__futex_abstimed_wait_common",
        "__futex_abstimed_wait_common64",
        "futex_wait",
        "__lll_lock_wait",
        "waitpid",
        "wait4",
        "pause",
        "sigwait",
        "sigtimedwait",
        "sigwaitinfo",
        "msgrcv",
        "ioctl",
        "flock",
        "fcntl",
        "fsync",
        "fdatasync",
    }
)
# Frames of the binding machinery between Python and the called native function.
_PLUMBING_PREFIXES = (
    "_ctypes",
    "_call_function_pointer",
    "ffi_",
    "Py",
    "_Py",
    "cfunction",
    "method_vectorcall",
    "0x",
    "PyCFuncPtr",
    "call_function",
    "vectorcall",
    "pybind11::",
    "_PyEval",
)
_PLUMBING_FILES = ("callproc.c", "_ctypes.c", "ceval.c", "call.c", "methodobject.c")
_LINE_RE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_THREAD_RE = re.compile(r"^thread \((?P<tid>\d+|0x[0-9a-fA-F]+)\)(?:: (?P<name>.*))?$")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int | None
    native: bool

    def label(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{self.function} ({where})"

    @property
    def short_function(self) -> str:
        """``make_dispatch.<locals>.intranode_dispatch`` -> ``intranode_dispatch``."""
        return (
            self.function.rsplit(".", 1)[-1] if not self.function.startswith("<") else self.function
        )


@dataclass(frozen=True)
class Sample:
    """One distinct stack of the raw output and how many samples it got."""

    thread_id: int
    thread_name: str | None
    frames: tuple[Frame, ...]  # outermost first
    count: int

    @property
    def python_frames(self) -> tuple[Frame, ...]:
        return tuple(f for f in self.frames if not f.native)

    @property
    def native_tail(self) -> tuple[Frame, ...]:
        """Native frames below the innermost Python frame (the call it is inside)."""
        last_python = max((i for i, f in enumerate(self.frames) if not f.native), default=-1)
        return self.frames[last_python + 1 :]

    def blocked(self) -> bool:
        return any(f.function in BLOCKING_NATIVE for f in self.native_tail)

    def c_call(self) -> tuple[str, str] | None:
        """``(python name, C symbol)`` of the C function the innermost Python frame called
        (``pickle.dumps``, ``_pickle_dumps``), past call machinery; None when py-spy shows none
        (py-spy leaves out most of the interpreter's own functions: ``sorted`` is not shown)."""
        from glmfb.gil.native import Symbol, c_call_symbol

        return c_call_symbol(tuple(Symbol(f.function, f.file) for f in self.native_tail))

    def native_call(self) -> str | None:
        """The native function the innermost Python frame called, past ctypes/pybind plumbing."""
        for frame in self.native_tail:
            basename = os.path.basename(frame.file)
            if frame.function.startswith(_PLUMBING_PREFIXES) or basename.startswith("libffi"):
                continue
            if basename in _PLUMBING_FILES:
                continue
            return frame.function
        return None


# The import system's frozen modules: a sample inside them is the program's start-up (imports,
# extension loading), not its steady state.
STARTUP_FILES = ("<frozen importlib._bootstrap",)


def in_startup(sample: Sample) -> bool:
    """Whether the sample's Python stack is inside an import (``import torch`` loading its
    libraries: ``dlopen`` under ``_call_with_frames_removed``)."""
    return any(frame.file.startswith(STARTUP_FILES) for frame in sample.python_frames)


# Under --trace the program runs under viztracer, which writes its trace on the way out: a sample
# inside its exit routine is the tracer's own work (the JSON of the whole trace, the GIL held for
# seconds after the window closed), never the program's. Its other frames (the entry point that
# runs the script) stay: the program's own stack hangs under them.
TRACER_EXIT = (("/viztracer/", "exit_routine"),)


def in_tracer_exit(sample: Sample) -> bool:
    """Whether the sample is the tracer (viztracer) saving its trace as the program ends."""
    return any(part in frame.file and frame.short_function == function
               for frame in sample.python_frames for part, function in TRACER_EXIT)


def _parse_frame(text: str) -> Frame:
    function, sep, rest = text.rpartition(" (")
    if not sep or not rest.endswith(")"):
        return Frame(text, "", None, native=True)
    location = rest[:-1]
    file, colon, line = location.rpartition(":")
    if colon and line.isdigit():
        python = file.endswith(".py") or file.startswith("<") or "<frozen" in file
        return Frame(function, file, int(line), native=not python)
    return Frame(function, location, None, native=True)


def parse_raw(text: str) -> list[Sample]:
    """Samples from py-spy's raw (collapsed stack) format, as written with ``--threads``."""
    samples: list[Sample] = []
    for raw_line in text.splitlines():
        match = _LINE_RE.match(raw_line.strip())
        if not match:
            continue
        parts = match["stack"].split(";")
        thread = _THREAD_RE.match(parts[0])
        if thread is None:
            continue
        tid_text = thread["tid"]
        tid = int(tid_text, 16) if tid_text.startswith("0x") else int(tid_text)
        frames = tuple(_parse_frame(p) for p in parts[1:] if p)
        samples.append(Sample(tid, thread["name"], frames, int(match["count"])))
    return samples


@dataclass
class CallSite:
    thread_id: int
    thread_name: str
    function: str
    file: str
    line: int
    samples: int = 0
    idle: int = 0
    split_samples: int = 0  # samples with native frames behind ``idle`` (0: split unknown)
    lines: Counter[int] = field(default_factory=Counter)
    native_calls: Counter[str] = field(default_factory=Counter)
    c_calls: Counter[tuple[str, str]] = field(default_factory=Counter)  # (python name, symbol)
    stacks: Counter[tuple[str, ...]] = field(default_factory=Counter)
    thread_count: int = 1  # short-lived threads of one name taken as this one (glmfb.gil.groups)


@dataclass(frozen=True)
class HolderProfile:
    """Who held the GIL in the samples, split active/idle where native frames allow."""

    total_samples: int  # samples in which some thread held the GIL
    sample_instants: int  # samples taken (rate x time sampled): the denominator of shares
    threads: tuple[dict[str, Any], ...]  # per thread: thread, tid, samples, share, active, idle
    sites: tuple[CallSite, ...]  # ranked by samples
    native: bool


def profile_holders(
    samples: list[Sample],
    *,
    native: bool,
    names: dict[int, str],
    exclude_tids: set[int],
    sample_instants: int | None = None,
) -> HolderProfile:
    """Aggregate GIL-holder samples per thread and per innermost Python call site.

    ``sample_instants`` is how many samples py-spy took (rate times time sampled): with
    ``--gil`` an instant where nobody held the GIL leaves no line, so shares of the time a
    thread held the GIL are taken over the instants, not over the lines.
    """
    total = sum(s.count for s in samples)
    instants = max(total, sample_instants or 0)
    per_thread: dict[int, dict[str, Any]] = {}
    sites: dict[tuple[int, str, str], CallSite] = {}
    for sample in samples:
        # The names the program's threads recorded as they started (or the heartbeat read since)
        # first: py-spy can show a new thread under the name of an ended one.
        name = names.get(sample.thread_id) or sample.thread_name or unnamed(sample.thread_id)
        record = per_thread.setdefault(
            sample.thread_id, {"thread": name, "tid": sample.thread_id, "samples": 0, "idle": 0}
        )
        record["samples"] += sample.count
        blocked = native and sample.blocked()
        if blocked:
            record["idle"] += sample.count
        python = sample.python_frames
        if sample.thread_id in exclude_tids or not python:
            continue
        inner = python[-1]
        key = (sample.thread_id, inner.function, inner.file)
        site = sites.get(key)
        if site is None:
            site = sites[key] = CallSite(
                sample.thread_id, name, inner.function, inner.file, inner.line or 0
            )
        site.samples += sample.count
        site.split_samples += sample.count if native else 0
        site.idle += sample.count if blocked else 0
        site.lines[inner.line or 0] += sample.count
        call = sample.native_call() if native else None
        if call:
            site.native_calls[call] += sample.count
        named = sample.c_call() if native else None
        if named:
            site.c_calls[named] += sample.count
        site.stacks[tuple(f.label() for f in python)] += sample.count
    for site in sites.values():
        site.line = site.lines.most_common(1)[0][0]
    threads = []
    for record in sorted(per_thread.values(), key=lambda r: -r["samples"]):
        share = record["samples"] / instants if instants else 0.0
        threads.append(
            {
                **record,
                "share": round(share, 4),
                "active": record["samples"] - record["idle"] if native else None,
                "idle": record["idle"] if native else None,
                "excluded": record["tid"] in exclude_tids,
            }
        )
    ranked = tuple(sorted(sites.values(), key=lambda s: -s.samples))
    return HolderProfile(total, instants, tuple(threads), ranked, native)


def find_pyspy() -> str | None:
    """The py-spy executable: on PATH, or beside this interpreter (a virtualenv's bin/)."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def record_command(
    pyspy: str, pid: int, output: Path, *, rate_hz: int, native: bool, nonblocking: bool = False
) -> list[str]:
    command = [
        pyspy,
        "record",
        "--pid",
        str(pid),
        "--gil",
        "--idle",
        "--threads",
        "--full-filenames",
        "--rate",
        str(rate_hz),
        "--format",
        "raw",
        "--output",
        str(output),
    ]
    if native:
        command.append("--native")
    if nonblocking:
        command.append("--nonblocking")
    return command


class Recording:
    """One ``py-spy record`` attached to a process, writing raw samples and a log."""

    def __init__(
        self,
        executable: str,
        pid: int,
        output: Path,
        log: Path,
        *,
        rate_hz: int,
        native: bool,
        nonblocking: bool,
    ) -> None:
        self.output = output
        self.log = log
        self.rate_hz = rate_hz
        self.native = native
        output.unlink(missing_ok=True)
        command = record_command(
            executable, pid, output, rate_hz=rate_hz, native=native, nonblocking=nonblocking
        )
        self._log_handle = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.started_s = time.monotonic()
        self.elapsed_s = 0.0
        self.attempted_s = 0.0  # how long it was asked to sample (for the share of failed samples)
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def exited_early(self, within_s: float) -> bool:
        """Whether py-spy gave up within ``within_s`` (bad option, refused attach...)."""
        try:
            self.process.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, *, target_running: bool, sampling_ended_s: float | None = None) -> None:
        """Let py-spy write its output: it does so by itself once the traced process is gone,
        and on SIGINT (Ctrl-C) while it still runs (attached by --pid).

        ``sampling_ended_s`` (a ``time.monotonic()`` reading) is when the window ended: the
        traced program exited or the duration passed. The share of the time a thread held the
        GIL is taken over the instants up to then, whether py-spy noticed the exit by itself
        before this call or is stopped by it (else a py-spy that ended first would leave only
        the held instants as the denominator, and every share would be inflated)."""
        now = time.monotonic()
        self.attempted_s = now - self.started_s
        ended = now if sampling_ended_s is None else min(now, sampling_ended_s)
        self.elapsed_s = max(0.0, ended - self.started_s)
        try:
            if target_running and self.process.poll() is None:
                self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        finally:
            self._log_handle.close()

    def log_text(self) -> str:
        try:
            return self.log.read_text("utf-8", "replace")
        except OSError:
            return ""

    def failure(self) -> str | None:
        """Why there is no usable output, or None when py-spy sampled cleanly."""
        if self.output.is_file():
            log = self.log_text()
            # A failed sample now and then (the program's thread briefly held by glmfb's own
            # native snapshots) is not a failed recording; a quarter of them failing is.
            tolerated = max(1, int(self.rate_hz * self.attempted_s) // 4)
            if self.output.stat().st_size or sampled_cleanly(log, tolerated):
                return None  # samples, or a clean run in which nobody held the GIL
            return explain_failure(log)
        code = self.process.returncode
        status = (
            f"exited with status {code}"
            if code is not None and code >= 0
            else f"ended by signal {-(code or 0)}"
        )
        return (
            f"{explain_failure(self.log_text())} (py-spy {status} without output after "
            f"{self.elapsed_s:.1f} s; log: {self.log})"
        )

    def samples(self) -> list[Sample]:
        try:
            return parse_raw(self.output.read_text("utf-8", "replace"))
        except OSError:
            return []

    @property
    def sample_instants(self) -> int:
        return int(self.rate_hz * self.elapsed_s)


def merge_split(main: HolderProfile, split: HolderProfile) -> HolderProfile:
    """The main (fast, no --native) profile with each call site's active/idle split and native
    frames taken from the slower --native profile, scaled to the main site's samples.

    A site the --native sampler never saw keeps ``split_samples = 0``: its split is unknown.
    """
    by_key = {(s.thread_id, s.function, s.file): s for s in split.sites}
    for site in main.sites:
        other = by_key.get((site.thread_id, site.function, site.file))
        if other is None or not other.samples:
            continue
        site.split_samples = other.samples
        site.idle = round(site.samples * other.idle / other.samples)
        site.native_calls = Counter(other.native_calls)
        site.c_calls = Counter(other.c_calls)
    split_threads = {t["tid"]: t for t in split.threads}
    threads = []
    for thread in main.threads:
        other_thread = split_threads.get(thread["tid"])
        if other_thread and other_thread["samples"]:
            idle = round(thread["samples"] * other_thread["idle"] / other_thread["samples"])
            thread = {**thread, "idle": idle, "active": thread["samples"] - idle}
        threads.append(thread)
    return HolderProfile(
        main.total_samples, main.sample_instants, tuple(threads), main.sites, native=True
    )


_SUMMARY_RE = re.compile(r"Samples: (?P<samples>\d+) Errors: (?P<errors>\d+)")


def sampled_cleanly(log: str, max_errors: int = 0) -> bool:
    """Whether py-spy's log reports a finished recording without sampling errors (or with at
    most ``max_errors`` of them).

    With ``--gil``, ``Samples: 0 Errors: 0`` means no thread held the GIL at any sample
    instant (every thread waited with the GIL released): an observation, not a failure.
    """
    match = _SUMMARY_RE.search(log)
    return match is not None and int(match["errors"]) <= max_errors


def explain_failure(stderr: str) -> str:
    """One line on why py-spy produced nothing, from its stderr."""
    lowered = stderr.lower()
    if "permission denied" in lowered or "operation not permitted" in lowered:
        return (
            "ptrace refused (run as root, or set kernel.yama.ptrace_scope=0, or add CAP_SYS_PTRACE)"
        )
    if "no such process" in lowered:
        return "the process exited before py-spy attached"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]  # before its Rust backtrace
    if errors:
        return errors[0][:200]
    return lines[-1][:200] if lines else "py-spy exited without output"


# A native thread id is printed in decimal; a hexadecimal one is a pthread_t, not a /proc tid.
_DUMP_THREAD_RE = re.compile(r'^Thread (?P<tid>\d+) \([^)]*\): "(?P<name>.*)"$')


def dump_thread_names(executable: str, pid: int, timeout_s: float = 10.0) -> dict[int, str]:
    """The names of the process's Python threads by native id (``py-spy dump --nonblocking``:
    the program is not paused). A process attached by ``--pid`` has no heartbeat to record its
    threads' names, and a thread that only waited for the GIL never shows in the holder samples.
    Empty when py-spy cannot dump."""
    try:
        done = subprocess.run([executable, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names: dict[int, str] = {}
    for line in done.stdout.splitlines():
        match = _DUMP_THREAD_RE.match(line.strip())
        if match is not None:
            names[int(match["tid"])] = match["name"]
    return names
