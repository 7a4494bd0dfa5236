"""Running a probe in a child process that glmfb supervises.

A target is someone else's code: it may exit, crash, hang, print or leave threads behind. So
the CLI, the suite and the agent server run each probe in a child process
(``python -m glmfb.core.child``) in a session of its own:

- the config goes down as JSON on the child's stdin (:func:`encode` / :func:`decode`, tagged
  JSON for dataclasses, paths and tuples: never pickle); progress and the verdict come back
  as JSON lines on a pipe of their own, so nothing the target prints can be mistaken for
  them;
- the child's file descriptors 1 and 2 go to ``probe-stdout.txt`` and ``probe-stderr.txt``
  in the probe's artifact folder (native code's output too); their last lines are quoted
  when the child fails;
- an exit before answering (``sys.exit``, ``os._exit``), a signal (a segfault, the
  out-of-memory killer) or a hang past the timeout becomes an error verdict that says what
  happened, and the rest of a run goes on;
- on a timeout, a cancellation or Ctrl-C/SIGTERM in glmfb, the child and every process below
  it (:class:`~glmfb.core.process.ProcessTree`) get SIGTERM, then SIGKILL: nothing is left behind;
- when the child answers, whatever the target left running (a server it forgot to stop, a
  daemon that double-forked, a process in a session of its own: found below the child or by
  the cookie every process below it inherits in its environment) is stopped, and the verdict
  lists it (evidence ``stopped_processes``).

While a pool of warm workers is open (:mod:`glmfb.core.workers`: ``glmfb run``, ``glmfb bisect``,
``glmfb mcp``), the child is forked from a process that has already imported glmfb, numpy and
torch instead of started afresh; :func:`_supervise` follows it the same way, the one
lifecycle for both.

The timing of ``glmfb bench`` happens entirely inside the child.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib
import json
import math
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import HarnessError, UsageError
from glmfb.contract.evidence import ProcessExit, StoppedProcess, StoppedProcesses
from glmfb.contract.verdict import ExitCode, Verdict
from glmfb.core.io import bound_log, last_lines
from glmfb.core.probe import TIMEOUT
from glmfb.core.process import COOKIE_ENV, ProcessTree, describe_returncode, new_cookie
from glmfb.core.workers import WarmChild, start_job

if TYPE_CHECKING:
    from glmfb.core.targets import ImportFence

RESULT_FD_ENV = "GLMFB_RESULT_FD"
STDOUT_NAME = "probe-stdout.txt"
STDERR_NAME = "probe-stderr.txt"
DEFAULT_TIMEOUT_S: float = TIMEOUT.default  # per probe, unless a definition or --timeout says otherwise
STOP_GRACE_S = 5.0  # SIGTERM -> SIGKILL: time for the child's own clean-up (gil, gap)
POLL_S = 0.2
FINAL_KEYS = frozenset({"verdict", "usage_error", "result", "glmfb_error"})  # the child's last message


class Interrupted(KeyboardInterrupt):
    """glmfb got SIGINT or SIGTERM (a cancelled CI job); ``signal_name`` says which."""

    def __init__(self, signal_name: str = "SIGINT") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


# --------------------------------------------------------------------------------------------
# Tagged JSON for configs
# --------------------------------------------------------------------------------------------


def _qualified(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _load_class(name: str) -> Any:
    module_name, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def encode(value: Any) -> Any:
    """A config (frozen dataclasses of JSON-like leaves, paths, tuples, enums) as JSON data."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, enum.Enum):
        return {"$enum": _qualified(type(value)), "value": encode(value.value)}
    if isinstance(value, Path):
        return {"$path": str(value)}
    if isinstance(value, tuple):
        return {"$tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict) or (hasattr(value, "items") and hasattr(value, "keys")):
        return {"$dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return {"$dataclass": _qualified(type(value)), "fields": fields}
    raise TypeError(f"a probe config holds a {type(value).__name__} ({value!r:.60}), which cannot cross "
                    "to the child process; use plain values, paths, tuples and dataclasses")


def decode(data: Any) -> Any:
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "$float" in data:
        return float(data["$float"])
    if "$path" in data:
        return Path(data["$path"])
    if "$tuple" in data:
        return tuple(decode(v) for v in data["$tuple"])
    if "$dict" in data:
        return {decode(k): decode(v) for k, v in data["$dict"]}
    if "$enum" in data:
        return _load_class(data["$enum"])(decode(data["value"]))
    if "$dataclass" in data:
        cls = _load_class(data["$dataclass"])
        return cls(**{k: decode(v) for k, v in data["fields"].items()})
    raise ValueError(f"not a tagged value: {sorted(data)[:3]}")


# --------------------------------------------------------------------------------------------
# The parent side
# --------------------------------------------------------------------------------------------


def _tail(path: Path, lines: int = 8, limit: int = 1200) -> str:
    return last_lines(path, lines, limit)


def call_isolated_scratch(function: str, config: Any, *, name: str, progress: Callable[[str], None],
                          timeout_s: float | None = None, cancel: threading.Event | None = None) -> Any:
    """:func:`call_isolated` with the child's stdout and stderr in a temporary folder
    (``glmfb-<name>-*``) that is removed unless the child ended without answering: then the
    :class:`HarnessError` names the stderr file in it, and the folder stays for the user to read."""
    import shutil
    import tempfile

    logs = Path(tempfile.mkdtemp(prefix=f"glmfb-{name}-"))
    keep = False
    try:
        return call_isolated(function, config, artifact_dir=logs, progress=progress, timeout_s=timeout_s,
                             cancel=cancel)
    except HarnessError:
        keep = True
        raise
    finally:
        if not keep:
            shutil.rmtree(logs, ignore_errors=True)


def call_isolated(function: str, config: Any, *, artifact_dir: Path, progress: Callable[[str], None],
                  timeout_s: float | None = None, cancel: threading.Event | None = None) -> Any:
    """Run ``function`` (``module:function`` taking ``(config, progress)`` and returning JSON
    data) in a supervised child; its result, or the :class:`GlmfbError` it raised (with its exit
    code), or a :class:`HarnessError` saying how the child ended (stopped after ``timeout_s``,
    or when ``cancel`` is set)."""
    from glmfb.contract.errors import GlmfbError

    messages, returncode, outcome = _supervise(
        {"call": function, "config": encode(config), "sys_path": [p for p in sys.path if p]},
        artifact_dir, progress, timeout_s, cancel,
    )
    stderr_tail = _tail(artifact_dir / STDERR_NAME)
    for message in messages:
        if "result" in message:
            return message["result"]
        if "glmfb_error" in message:
            error = GlmfbError(str(message["glmfb_error"]))
            error.exit_code = ExitCode(int(message["exit_code"]))
            raise error
    if outcome == "cancelled":
        raise HarnessError(f"the process running {function.rpartition(':')[2]} was cancelled: it and every "
                           "process it started were stopped")
    what = (f"was killed after {DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s:g} s timeout"
            if outcome == "timeout" else describe_returncode(returncode if returncode is not None else -9))
    last = stderr_tail.splitlines()[-1] if stderr_tail else ""
    raise HarnessError(f"the process running {function.rpartition(':')[2]} {what}" + (f": {last[:200]}" if last else ""),
                       f"read {artifact_dir / STDERR_NAME}")


def _supervise(job: dict[str, Any], artifact_dir: Path, progress: Callable[[str], None], timeout_s: float | None,
               cancel: threading.Event | None,
               workdir: Path | None = None) -> tuple[list[dict[str, Any]], int | None, str]:
    """Start the job's child (a warm worker's process when a pool takes it, else
    ``python -m glmfb.core.child``); collect its messages until it answers, times out or is
    cancelled; stop its process tree. ``(messages, returncode, outcome)``."""
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    artifact_dir.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = artifact_dir / STDOUT_NAME, artifact_dir / STDERR_NAME
    read_fd, write_fd = os.pipe()
    cookie = new_cookie()  # every process below the child inherits it, also one that leaves the tree
    env = {**os.environ, RESULT_FD_ENV: str(write_fd), COOKIE_ENV: cookie}
    started = time.monotonic()
    try:
        with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
            child = _start_child(job, env, workdir, stdout.fileno(), stderr.fileno(), write_fd)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    tree = ProcessTree(child.pid, cookie=cookie, reaper=child.reaper if isinstance(child, WarmChild) else None)
    messages: list[dict[str, Any]] = []
    buffer = b""
    outcome = "answered"
    # a warm worker's reaper stays until the leftover check below is done (a Popen's own exit
    # would wait for the child, also when glmfb itself fails here: not used)
    with child if isinstance(child, WarmChild) else contextlib.nullcontext():
        try:
            if child.stdin is not None:  # a cold child reads its job on stdin
                try:
                    child.stdin.write(json.dumps(job).encode())
                    child.stdin.close()
                except BrokenPipeError:
                    pass
            last_refresh = 0.0
            while True:
                if cancel is not None and cancel.is_set():
                    outcome = "cancelled"
                    break
                remaining = timeout_s - (time.monotonic() - started)
                if remaining <= 0:
                    outcome = "timeout"
                    break
                ready, _, _ = select.select([read_fd], [], [], min(POLL_S, remaining))
                if ready:
                    chunk = os.read(read_fd, 65536)
                    if not chunk:
                        break  # the child closed its end: it answered, or it is gone
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if not line.strip():
                            continue
                        message = json.loads(line)
                        if "progress" in message:
                            progress(str(message["progress"]))
                        else:
                            messages.append(message)
                    if any(FINAL_KEYS & m.keys() for m in messages):
                        break  # it answered: a process it forked may still hold the pipe open
                if time.monotonic() - last_refresh > 1.0:
                    tree.refresh()
                    last_refresh = time.monotonic()
        except KeyboardInterrupt:
            tree.stop(STOP_GRACE_S)
            child.wait()
            raise
        finally:
            os.close(read_fd)
        if outcome != "answered":
            tree.stop(STOP_GRACE_S)
            child.wait()
            return messages, child.returncode, outcome
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=STOP_GRACE_S)
        left = tree.left_running()  # what the target left: a server, a daemon, a thread's child process
        killed = tree.stop(0.5) if left else []
        child.wait()
    if left:
        messages.append({"leftovers": [p.to_dict() for p in left], "killed": killed})
    for log in (stdout_path, stderr_path):  # whatever the target printed, the run folder keeps a bounded log
        bound_log(log)
    return messages, child.returncode, outcome


def _start_child(job: dict[str, Any], env: dict[str, str], workdir: Path | None, stdout_fd: int, stderr_fd: int,
                 result_fd: int) -> subprocess.Popen[bytes] | WarmChild:
    """The job's child: a warm worker's process when the open pool takes the job
    (:func:`glmfb.core.workers.start_job` decides), else a fresh ``python -m glmfb.core.child`` in a
    session of its own, its job still to be written to its stdin."""
    try:
        warm = start_job(job, env, workdir, stdout_fd, stderr_fd, result_fd)
        if warm is not None:
            return warm
        return subprocess.Popen(
            [sys.executable, "-m", "glmfb.core.child"], stdin=subprocess.PIPE, stdout=stdout_fd, stderr=stderr_fd,
            pass_fds=(result_fd,), start_new_session=True, env=env, close_fds=True, cwd=workdir,
        )
    except OSError as exc:
        raise HarnessError(f"cannot start the probe's child process: {exc}") from exc


def run_isolated(
    kind: str,
    name: str,
    config: Any,
    *,
    run_id: str,
    artifact_dir: Path,
    progress: Callable[[str], None],
    rules_files: tuple[Path, ...] = (),
    usage_errors: bool = True,
    timeout_s: float | None = None,
    cancel: threading.Event | None = None,
    workdir: Path | None = None,
    fence: ImportFence | None = None,
) -> Verdict:
    """Run probe ``kind`` on ``config`` in a supervised child and return its verdict. The child
    runs in ``workdir`` (default: this process's folder) and checks its imports against
    ``fence`` (:class:`~glmfb.core.probe.ProbeContext`).

    Raises :class:`~glmfb.contract.errors.UsageError` when the child reports one (and
    ``usage_errors``), and :class:`KeyboardInterrupt` after stopping the child when glmfb
    itself is interrupted."""
    stdout_path, stderr_path = artifact_dir / STDOUT_NAME, artifact_dir / STDERR_NAME
    job = {
        "kind": kind, "config": encode(config), "run_id": run_id, "artifact_dir": str(artifact_dir),
        "rules_files": [str(p) for p in rules_files], "usage_errors": usage_errors,
        "sys_path": [p for p in sys.path if p], "fence": fence.to_dict() if fence is not None else None,
    }
    started = time.monotonic()
    messages, returncode, outcome = _supervise(job, artifact_dir, progress, timeout_s, cancel, workdir)
    elapsed_s = time.monotonic() - started
    if outcome != "answered":
        limit = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
        why = (f"killed after {limit:g} s timeout (the target hung, or needs more time: raise the timeout)"
               if outcome == "timeout" else "cancelled: the probe and every process it started were stopped")
        return _failed(kind, name, f"glmfb {kind}: {why}", returncode, stdout_path, stderr_path,
                       elapsed_s, stopped=True)
    usage = next((m for m in messages if "usage_error" in m), None)
    if usage is not None:
        raise UsageError(str(usage["usage_error"]))
    verdict_message = next((m for m in messages if "verdict" in m), None)
    if verdict_message is None:
        what = describe_returncode(returncode if returncode is not None else -9)
        return _failed(kind, name, f"glmfb {kind}: the probe's process {what} before answering",
                       returncode, stdout_path, stderr_path, elapsed_s)
    from glmfb.core.probe import load_evidence_types

    load_evidence_types()  # the verdict's evidence, typed
    verdict = Verdict.from_dict(verdict_message["verdict"])
    artifacts = dict(verdict.artifacts)
    for label, path in (("probe_stdout", stdout_path), ("probe_stderr", stderr_path)):
        if path.is_file() and path.stat().st_size > 0:
            artifacts.setdefault(label, str(path))
    stopped = _stopped_processes(messages)
    if stopped is None:
        return dataclasses.replace(verdict, artifacts=artifacts)
    return dataclasses.replace(verdict, artifacts=artifacts, evidence=(*verdict.evidence, stopped))


def _stopped_processes(messages: list[dict[str, Any]]) -> StoppedProcesses | None:
    """The evidence of what the target left running and glmfb stopped (None: nothing)."""
    message = next((m for m in messages if "leftovers" in m), None)
    if message is None:
        return None
    rows = tuple(StoppedProcess.from_dict(row) for row in message["leftovers"])
    return StoppedProcesses(processes=rows, killed=tuple(message.get("killed", ())))


def _failed(kind: str, name: str, why: str, returncode: int | None, stdout_path: Path, stderr_path: Path,
            elapsed_s: float, *, stopped: bool = False) -> Verdict:
    stderr_tail, stdout_tail = _tail(stderr_path), _tail(stdout_path)
    last = next((line for line in reversed(stderr_tail.splitlines()) if line.strip()), "")
    if last and not stopped:  # glmfb stopped it (timeout, cancel): its last line is that stop's noise
        why += f"; its last line on stderr: {last[:200]}"
    evidence = ProcessExit(
        returncode=returncode, description=describe_returncode(returncode) if returncode is not None else None,
        stderr_tail=stderr_tail or None, stdout_tail=stdout_tail or None,
        stderr=str(stderr_path), stdout=str(stdout_path),
    )
    return Verdict.harness_error(
        kind, name, why, evidence=[evidence], duration_s=elapsed_s,
        next=(f"read {stderr_path} and {stdout_path}; run the target alone to see it fail",),
    )
