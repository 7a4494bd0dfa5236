"""``trace_gil``: run (or attach to) a Python program, sample the GIL holder with py-spy, measure
starvation with an injected heartbeat and watch GIL waiters in /proc; what it observed goes to
:func:`glmfb.gil.verdict.decide`, which assembles the verdict the rules decide."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import UsageError
from glmfb.contract.evidence import ProcessExit
from glmfb.contract.step import Intent, Step
from glmfb.contract.verdict import Layer, Status, Verdict
from glmfb.core.commandline import rerun_step
from glmfb.core.io import last_lines, read_end
from glmfb.core.measure.hostload import HostLoad, HostLoadMeter
from glmfb.core.probe import ProbeContext
from glmfb.core.process import describe_returncode
from glmfb.gil import heartbeat as hb
from glmfb.gil import pyspy
from glmfb.gil.config import HEARTBEAT_THREAD, PYTHON, GilConfig
from glmfb.gil.evidence import LoadRun, Readiness, reported_fields
from glmfb.gil.groups import ThreadGroups, thread_groups, unnamed
from glmfb.gil.process import Launched, exited, wait_until
from glmfb.gil.procwatch import GilWaitSampler, ThreadTime
from glmfb.gil.rules import RULES
from glmfb.gil.target_loop import READY_ENV
from glmfb.gil.verdict import MIN_WAITING_SHARE, Observations, decide

if TYPE_CHECKING:
    from glmfb.gil.native import SnapshotCalls

STARTUP_TIMEOUT_S = 10.0  # for the heartbeat to appear (interpreter start, imports)
STOP_GRACE_S = 5.0
NATIVE_CHECK_S = 0.3  # py-spy that cannot do --native exits within this
MAX_WINDOWS = 10  # the longest starvation windows shown in evidence
MAX_TIMELINE_THREADS = 12
MIN_STEADY_S = 1.0  # of the window kept after the program's start-up imports settled
TRACE_STOP_GRACE_S = 30.0  # viztracer writes its trace on SIGTERM; large traces take a while
READY_POLL_S = 0.1  # --ready: GET the URL this often (each try waits up to READY_GET_TIMEOUT_S)
READY_GET_TIMEOUT_S = 2.0
LOAD_STOP_GRACE_S = 2.0  # --load: SIGTERM, then SIGKILL to its process tree after this
# The signals a verdict can be decided from, as its why and the gil_signals evidence name them.
SIGNAL_HOLDERS = "py-spy's GIL holder samples"
SIGNAL_NATIVE = "py-spy --native samples"
SIGNAL_PROC = "/proc per-thread states"
SIGNAL_HEARTBEAT = "the injected heartbeat"
SIGNAL_SNAPSHOTS = "native snapshots"


def trace_gil(config: GilConfig, ctx: ProbeContext) -> Verdict:
    """Trace one program's GIL and return the verdict (artifacts go to ``ctx.artifact_dir``).

    A program that cannot start, exits non-zero or crashes gives an error verdict. Raises
    :class:`~glmfb.contract.errors.UsageError` for a configuration it cannot run (``trace`` with a
    command that is not ``python ...``, a ``pid`` that does not exist). The program runs in its
    own process group, killed whole at the end: nothing is left behind.
    """
    started = ctx.clock.monotonic()
    artifact_dir = Path(ctx.artifact_dir)
    artifact_dir.mkdir(parents=True, exist_ok=True)
    verdict = _Session(config, artifact_dir, ctx.progress, ctx).run()
    from glmfb.core.env import fingerprint

    return replace(verdict, duration_s=ctx.clock.monotonic() - started, env=fingerprint())


def _net_of_holder_cpu_waits(beat: hb.Heartbeat, sampler: GilWaitSampler, holder_tid: int,
                             members: tuple[int, ...] = ()) -> hb.Heartbeat:
    """The heartbeat with each late wake-up's CPU wait widened by the time the GIL holder
    itself (``members``: the threads of its group) waited for a CPU meanwhile: a holder
    descheduled while it holds the GIL makes others wait longer on a busy machine, and that
    part is the machine's, not the program's."""
    widened = []
    for wake, late, own in zip(beat.wake_s, beat.lateness_s, beat.cpu_wait_s, strict=True):
        if late <= beat.period_s:
            widened.append(own)
            continue
        holder_wait = sampler.runqueue_between(holder_tid, wake - late, wake, members)
        widened.append(min(late, own + holder_wait))
    return replace(beat, cpu_wait_s=tuple(widened))


def python_command(config: GilConfig) -> list[str]:
    """The argv that runs the program: the command itself, or the runner for a target."""
    if config.command:
        return list(config.command)
    assert config.target is not None
    target = config.target
    argv = [
        sys.executable,
        "-m",
        "glmfb.gil.target_loop",
        "--target",
        target.ref,
        "--args",
        json.dumps(dict(target.args)),
        "--duration",
        repr(config.duration_s),
    ]
    if target.base_dir is not None:
        argv += ["--base-dir", str(target.base_dir)]
    return argv


def trace_step(config: GilConfig) -> Step | None:
    """The step that reruns this probe in trace mode (ranks what overlaps the starved
    slices); None when it attached to a pid (a rerun needs a program glmfb starts)."""
    if config.pid is not None:
        return None
    return rerun_step("gil", config, "ranks what overlaps the starved slices", trace=True,
                      intent=Intent.DEEPER)


def longer_step(config: GilConfig) -> Step | None:
    """The step that reruns this probe with a window long enough to reach the program's steady
    state (twice this one, 30 s at least); None when it attached to a pid."""
    if config.pid is not None:
        return None
    seconds = max(30.0, 2 * config.duration_s)
    return rerun_step("gil", config, "samples long enough to reach the program's steady state", duration=seconds,
                      intent=Intent.CONFIRM)


@dataclass(frozen=True)
class _Files:
    """Where one trace writes in its artifact folder (files a previous trace left are removed
    first, so nothing stale is read as this trace's)."""

    dir: Path

    @property
    def heartbeat_prefix(self) -> Path:
        return self.dir / "heartbeat"

    @property
    def pyspy_output(self) -> Path:
        return self.dir / "gil-samples.txt"

    @property
    def trace_output(self) -> Path:
        return self.dir / "gil-trace.json"

    @property
    def ready_file(self) -> Path:
        return self.dir / "target-ready"

    @property
    def load_stdout(self) -> Path:
        return self.dir / "load-stdout.txt"

    @property
    def load_stderr(self) -> Path:
        return self.dir / "load-stderr.txt"

    def remove_stale(self) -> None:
        for stale in (
            self.pyspy_output,
            self.trace_output,
            self.heartbeat_prefix.with_suffix(".bin"),
            self.heartbeat_prefix.with_suffix(".json"),
            self.heartbeat_prefix.with_suffix(".threads"),
            self.ready_file,
            self.load_stdout,
            self.load_stderr,
        ):
            stale.unlink(missing_ok=True)


# ---- launching ---------------------------------------------------------------------------


def _launch(config: GilConfig, files: _Files, progress: Callable[[str], None]) -> Launched | Verdict:
    """Start the program in its own process group, the heartbeat injected (and the runner told
    where to mark a target's set-up done); a program that cannot start is an error verdict."""
    argv = python_command(config)
    if config.trace:
        argv = _under_viztracer(argv, files.trace_output)
    env = dict(os.environ)
    env.update(dict(config.env))
    if config.target is not None:  # the runner imports glmfb: make sure it can
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
        )
        env[READY_ENV] = str(files.ready_file)
    if config.ready_log is not None:  # a ready line must reach the output file when it is printed
        env.setdefault("PYTHONUNBUFFERED", "1")
    if config.heartbeat:
        env = hb.injection_env(files.heartbeat_prefix, env)
    progress(f"starting {shlex.join(argv)[:80]}")
    try:
        return Launched(
            argv,
            env=env,
            cwd=config.cwd,
            stdout_path=files.dir / "stdout.txt",
            stderr_path=files.dir / "stderr.txt",
        )
    except FileNotFoundError:
        return _harness_error(
            config, f"command not found: {argv[0]!r}", ["check the command after --, and PATH"]
        )
    except PermissionError:
        return _harness_error(config, f"command not executable: {argv[0]!r}", ["check its permissions"])
    except OSError as exc:
        return _harness_error(config, f"cannot start {argv[0]!r}: {exc}", [])


def _under_viztracer(argv: list[str], trace_output: Path) -> list[str]:
    """``python [-m mod | script] args`` -> the same under viztracer, writing the trace."""
    if not argv or not Path(argv[0]).name.startswith("python") or len(argv) < 2:
        raise UsageError(
            "--trace needs a command of the form 'python script.py ...' or 'python -m module ...'",
            "or give a Python target (--target file.py:factory)",
        )
    interpreter, rest = argv[0], argv[1:]
    tracer = [
        interpreter,
        "-m",
        "viztracer",
        "--quiet",
        "--output_file",
        str(trace_output),
    ]
    if rest[0] == "-m":
        return [*tracer, "-m", *rest[1:]]
    if rest[0].startswith("-"):
        raise UsageError(
            f"--trace cannot pass the interpreter option {rest[0]!r} through viztracer"
        )
    return [*tracer, "--", *rest]


def _harness_error(
    config: GilConfig, why: str, next_steps: list[str], evidence: list[ProcessExit] | None = None
) -> Verdict:
    return Verdict.harness_error("gil", config.name, why, next=next_steps, evidence=evidence or [])


def _early_exit(config: GilConfig, launched: Launched, *, during_setup: bool = False) -> Verdict:
    """The verdict of a program that ended before it could be sampled."""
    code = launched.poll()
    assert code is not None
    if code != 0:
        return _crashed(config, launched, code)
    if during_setup or config.target is not None:
        # The runner never exits 0 before its first call returned: the target itself exited.
        return _harness_error(
            config,
            "the target's process exited with status 0 during its set-up (the factory or its first call "
            "called sys.exit or os._exit), so nothing was sampled",
            ["a target must return a callable, not exit; remove the exit from the code glmfb calls"],
            [ProcessExit(returncode=code, description=describe_returncode(code),
                         stderr_tail=launched.stderr_tail() or None, stderr=str(launched.stderr_path))],
        )
    return Verdict(
        probe="gil",
        name=config.name,
        status=Status.INCONCLUSIVE,
        layer=Layer.RUNTIME,
        why=(
            "The program exited (status 0) before glmfb could sample it: it ran too briefly, "
            "or it is not a Python program that reads sitecustomize (python -S and -I skip it)."
        ),
        evidence=(ProcessExit(returncode=code, stderr_tail=launched.stderr_tail()),),
        next=(Step("give a program that runs at least as long as --duration"),),
    )


def _crashed(config: GilConfig, launched: Launched, code: int) -> Verdict:
    tail = launched.stderr_tail()
    why = f"the traced program {describe_returncode(code)}"
    if tail:
        why += f": {tail.splitlines()[-1][:200]}"
    return _harness_error(
        config,
        why,
        [f"run it alone to see its output: {launched.stderr_path}"],
        [
            ProcessExit(
                returncode=code,
                description=describe_returncode(code),
                stderr_tail=tail,
                stderr=str(launched.stderr_path),
            )
        ],
    )


def _sample_until_exit(launched: Launched, sampler: GilWaitSampler, remaining_s: float, trace: bool,
                       window_closed: Callable[[], None] | None = None) -> float:
    """Sample until the program ends or the duration is up (then call ``window_closed``, and
    stop the program, patiently under viztracer); the time sampling ended (monotonic)."""
    # Not Popen.wait while the sampler may hold a thread under ptrace: waitpid on the
    # program would take the stop meant for the sampler. Poll /proc instead.
    wait_until(lambda: exited(launched.pid), remaining_s, poll_s=0.02)
    sampling_ended = time.monotonic()
    sampler.stop()
    if window_closed is not None:
        window_closed()
    returncode = launched.poll()
    if returncode is None and exited(launched.pid):
        # It ended, but the exit may not be collectable yet while the sampler's ptrace
        # stop is being undone: wait for the status rather than "stop" a dead program
        # (which would lose its exit code and read as a clean end).
        deadline = time.monotonic() + 2.0
        while returncode is None and time.monotonic() < deadline:
            time.sleep(0.02)
            returncode = launched.poll()
    if returncode is None:
        grace = TRACE_STOP_GRACE_S if trace else STOP_GRACE_S
        launched.stop(grace_s=grace, first_signal=signal.SIGTERM)
    return sampling_ended


# ---- readiness and load ------------------------------------------------------------------


@dataclass
class _Ready:
    """What the wait for --ready / --ready-log saw."""

    url_ok: bool
    log_line: str | None
    status: int | None = None  # the URL's last answer
    error: str | None = None  # the URL's last failure (connection refused...)
    polls: int = 0
    ready_s: float | None = None  # from the program's start


def _get_status(url: str, timeout_s: float) -> tuple[int | None, str | None]:
    """The status GET ``url`` answers (no proxy: the server is usually local), or the error."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, method="GET"), timeout=timeout_s) as answer:
            return int(answer.status), None
    except urllib.error.HTTPError as exc:
        return int(exc.code), None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, str(reason)[:200]


class _OutputScanner:
    """New complete lines of the program's output files, searched for a pattern."""

    def __init__(self, paths: tuple[Path, ...], pattern: str) -> None:
        self.pattern = re.compile(pattern)
        self.offsets = dict.fromkeys(paths, 0)
        self.partial = dict.fromkeys(paths, b"")

    def match(self) -> str | None:
        for path, offset in self.offsets.items():
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except OSError:
                continue
            self.offsets[path] = offset + len(data)
            *lines, self.partial[path] = (self.partial[path] + data).split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip("\r")
                if self.pattern.search(line):
                    return line.strip()[:300]
        return None


class _Load:
    """The load command (--load): started as the window opens, in a session of its own, its
    output in the artifact folder; stopped with its whole process tree when the window closes."""

    def __init__(self, config: GilConfig, files: _Files) -> None:
        self.argv = [word.replace(PYTHON, sys.executable) for word in config.load]
        self.files = files
        self.error: str | None = None
        self.launched: Launched | None = None
        self.started_s = time.monotonic()
        self.ended_s: float | None = None  # when it ended by itself (seen by the watcher)
        try:
            self.launched = Launched(self.argv, env=dict(os.environ), cwd=config.cwd,
                                     stdout_path=files.load_stdout, stderr_path=files.load_stderr)
        except FileNotFoundError:
            self.error = f"command not found: {self.argv[0]!r}"
        except PermissionError:
            self.error = f"command not executable: {self.argv[0]!r}"
        except OSError as exc:
            self.error = f"cannot start {self.argv[0]!r}: {exc}"
        self._done = False
        self._watcher: Any = None
        if self.launched is not None:
            import threading

            self._watcher = threading.Thread(target=self._watch, name="glmfb-load-watch", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        """Note when the load ends by itself (polled: its exit time is evidence)."""
        assert self.launched is not None
        while not self._done:
            if self.launched.poll() is not None:
                self.ended_s = time.monotonic()
                return
            time.sleep(0.05)

    def stop(self, window_started_s: float, window_ended_s: float) -> LoadRun:
        """Stop it (its process tree: SIGTERM, then SIGKILL) unless it ended; how it ran."""
        window_s = max(0.0, window_ended_s - window_started_s)
        command = tuple(self.argv)
        if self.launched is None:
            return LoadRun(command=command, window_s=round(window_s, 3), failed=True, error=self.error)
        launched = self.launched
        stopped = launched.poll() is None
        self._done = True
        if self._watcher is not None:
            self._watcher.join(timeout=1.0)
        ended_s = None if stopped else (self.ended_s or time.monotonic())
        launched.stop(grace_s=LOAD_STOP_GRACE_S, first_signal=signal.SIGTERM)
        launched.close()
        code = None if stopped else launched.poll()
        failed = not stopped and code != 0
        return LoadRun(
            command=command, window_s=round(window_s, 3), failed=failed,
            started_s=round(self.started_s - window_started_s, 3),
            ended_s=round(ended_s - window_started_s, 3) if ended_s is not None else None,
            stopped=stopped, returncode=code,
            description=describe_returncode(code) if code is not None else "still running when the window closed: "
            "stopped with its process tree",
            stdout_tail=last_lines(self.files.load_stdout, 6, 600) or None,
            stderr_tail=last_lines(self.files.load_stderr, 6, 600) or None,
            stdout=str(self.files.load_stdout), stderr=str(self.files.load_stderr),
            reported=reported_fields(read_end(self.files.load_stdout, 65536)),
        )


# ---- py-spy ------------------------------------------------------------------------------


class _Recordings:
    """py-spy on the program: the holder sampler (``--nonblocking``: never pauses the program)
    at ``rate_hz`` and, with ``native``, a slower ``--native`` sampler for the active/idle
    split. What they could not give is appended to ``missing``."""

    def __init__(self, config: GilConfig, files: _Files, missing: list[dict[str, str]]) -> None:
        self.config = config
        self.files = files
        self.missing = missing
        self.main: pyspy.Recording | None = None
        self.native: pyspy.Recording | None = None
        self.startup: pyspy.HolderProfile | None = None  # GIL holders inside imports (start-up)

    def start(self, pid: int) -> None:
        if not self.config.use_pyspy:
            self.missing.append(
                {"signal": "holder sampling", "reason": "py-spy disabled (--no-pyspy)"}
            )
            return
        executable = pyspy.find_pyspy()
        if executable is None:
            self.missing.append(
                {
                    "signal": "holder sampling",
                    "reason": "py-spy is not installed (pip install py-spy)",
                }
            )
            return
        self.main = pyspy.Recording(
            executable,
            pid,
            self.files.pyspy_output,
            self.files.dir / "py-spy.log",
            rate_hz=round(self.config.rate_hz),
            native=False,
            nonblocking=True,
        )
        if self.config.native:
            self._start_native(executable, pid, self.main)

    def _start_native(self, executable: str, pid: int, main: pyspy.Recording) -> None:
        """Native unwinding pauses the program for each sample, so it runs at ``native_rate_hz``;
        a py-spy that cannot do it exits at once (said unless ptrace refused both)."""
        native = pyspy.Recording(
            executable,
            pid,
            self.files.dir / "gil-native-samples.txt",
            self.files.dir / "py-spy-native.log",
            rate_hz=round(self.config.native_rate_hz),
            native=True,
            nonblocking=False,
        )
        self.native = native
        if native.exited_early(NATIVE_CHECK_S) and os.path.isdir(f"/proc/{pid}"):
            native.stop(target_running=False)
            reason = pyspy.explain_failure(native.log_text())
            self.native = None
            if not (main.exited_early(0.0) and reason.startswith("ptrace refused")):
                self.missing.append(
                    {
                        "signal": "native frames",
                        "reason": f"py-spy --native failed ({reason}), so the active/idle split is unknown",
                    }
                )

    def stop(self, *, target_running: bool, sampling_ended_s: float | None = None) -> None:
        for recording in (self.main, self.native):
            if recording is not None:
                recording.stop(target_running=target_running, sampling_ended_s=sampling_ended_s)
        if self.main is not None:
            failure = self.main.failure()
            if failure is not None:
                self.missing.append({"signal": "holder sampling", "reason": failure})
        native_failure = self.native.failure() if self.native else None
        if native_failure is not None:
            if self.main is not None and self.main.failure() is None:
                reason = f"py-spy --native: {native_failure}; the active/idle split is unknown"
                self.missing.append({"signal": "native frames", "reason": reason})
            self.native = None

    def thread_names(self, names: dict[int, str]) -> dict[int, str]:
        """``names`` with the name py-spy saw for each thread it sampled that ``names`` lacks."""
        for recording in (self.main, self.native):
            for sample in recording.samples() if recording is not None else ():
                if sample.thread_name:
                    names.setdefault(sample.thread_id, sample.thread_name)
        return names

    def dump_names(self, pid: int) -> dict[int, str]:
        """Every Python thread's name by id, from ``py-spy dump`` (when py-spy sampled cleanly)."""
        if self.main is None or self.main.failure() is not None or not os.path.isdir(f"/proc/{pid}"):
            return {}
        executable = pyspy.find_pyspy()
        return pyspy.dump_thread_names(executable, pid) if executable is not None else {}

    def sampled_tids(self) -> set[int]:
        """The threads either sampler saw holding the GIL."""
        return {sample.thread_id for recording in (self.main, self.native) if recording is not None
                for sample in recording.samples()}

    def holder_profile(self, names: dict[int, str], exclude: set[int],
                       groups: ThreadGroups | None = None) -> pyspy.HolderProfile | None:
        """Who held the GIL, per thread and call site (a group of short-lived threads counted
        as one thread)."""
        main = self.main if self.main and self.main.failure() is None else None
        split = self.native
        if main is None and split is None:
            return None

        def samples(recording: pyspy.Recording) -> list[pyspy.Sample]:
            """The steady state's samples (start-up's, inside an import, go to ``startup``),
            a group's threads under its id."""
            found = []
            for sample in recording.samples():
                if pyspy.in_tracer_exit(sample):  # the tracer writing its trace: not the program's
                    continue
                if groups and groups.of(sample.thread_id) != sample.thread_id:
                    sample = replace(sample, thread_id=groups.of(sample.thread_id), thread_name=None)
                if pyspy.in_startup(sample):
                    if recording is main or main is None:
                        startup.append(sample)
                else:
                    found.append(sample)
            return found

        startup: list[pyspy.Sample] = []

        split_profile = None
        if split is not None:
            split_profile = pyspy.profile_holders(
                samples(split),
                native=True,
                names=names,
                exclude_tids=exclude,
                sample_instants=split.sample_instants,
            )
        if main is None:
            self.startup = self._startup_profile(startup, names, exclude, split)
            return split_profile
        main_profile = pyspy.profile_holders(
            samples(main),
            native=False,
            names=names,
            exclude_tids=exclude,
            sample_instants=main.sample_instants,
        )
        self.startup = self._startup_profile(startup, names, exclude, main)
        return (
            pyspy.merge_split(main_profile, split_profile)
            if split_profile is not None
            else main_profile
        )

    @staticmethod
    def _startup_profile(samples: list[pyspy.Sample], names: dict[int, str], exclude: set[int],
                         recording: pyspy.Recording | None) -> pyspy.HolderProfile | None:
        """Who held the GIL inside imports (the program's start-up), apart from the steady state."""
        if not samples or recording is None:
            return None
        return pyspy.profile_holders(samples, native=recording.native, names=names, exclude_tids=exclude,
                                     sample_instants=recording.sample_instants)

    def artifacts(self) -> dict[str, str]:
        artifacts: dict[str, str] = {}
        if self.files.pyspy_output.is_file():
            artifacts["pyspy_raw"] = str(self.files.pyspy_output)
        if self.native is not None and self.native.output.is_file():
            artifacts["pyspy_native_raw"] = str(self.native.output)
        return artifacts


# ---- one trace ---------------------------------------------------------------------------


class _Session:
    """One trace: launch the program (or attach to ``pid``), wait for its heartbeat and a
    target's set-up, sample it for the duration, stop it, and assemble the observations."""

    def __init__(
        self, config: GilConfig, artifact_dir: Path, progress: Callable[[str], None], ctx: ProbeContext
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.files = _Files(artifact_dir)
        self.progress = progress
        self.missing: list[dict[str, str]] = []  # the signals this trace could not get, in order
        self.recordings = _Recordings(config, self.files, self.missing)
        self.host_load: HostLoad | None = None
        # Whether the program's start-up imports settled inside the window (None: no heartbeat).
        self.startup_settled: bool | None = None
        self.launched_s: float | None = None  # when the program was started (monotonic)
        self.ready: _Ready | None = None  # what --ready / --ready-log saw
        self.window_start_s: float | None = None  # when sampling started (monotonic)
        self.load_run: LoadRun | None = None
        self.files.remove_stale()

    def run(self) -> Verdict:
        config = self.config
        launched: Launched | None = None
        if config.pid is not None:
            pid = config.pid
            if not os.path.isdir(f"/proc/{pid}"):
                raise UsageError(f"--pid {pid}: no such process")
            self.missing.append(
                {"signal": "heartbeat", "reason": "attached by --pid: no heartbeat can be injected"}
            )
        else:
            self.launched_s = time.monotonic()
            started = _launch(config, self.files, self.progress)
            if isinstance(started, Verdict):
                return started
            launched = started
            pid = launched.pid
        try:
            return self._observe(pid, launched)
        finally:
            if launched is not None:
                launched.stop(grace_s=0.5)
                launched.close()

    def _observe(self, pid: int, launched: Launched | None) -> Verdict:
        header = self._wait_for_heartbeat(launched) if launched is not None and self.config.heartbeat else None
        python_pid = int(header["pid"]) if header is not None else pid
        if launched is not None:
            not_ready = self._wait_for_setup(launched, header)
            if not_ready is None and (self.config.ready_url is not None or self.config.ready_log is not None):
                not_ready = self._wait_for_ready(launched)
            if not_ready is not None:
                return not_ready
        sampler, started_s, ended_s = self._sample(pid, python_pid, header, launched)
        self.recordings.stop(target_running=launched is None and os.path.isdir(f"/proc/{pid}"),
                             sampling_ended_s=ended_s)
        if launched is not None and not launched.stopped_by_glmfb:
            code = launched.poll()
            if code is not None and code != 0:
                return _crashed(self.config, launched, code)
        return self._decide(sampler, started_s, launched)

    def _wait_for_heartbeat(self, launched: Launched) -> dict[str, Any] | None:
        """The heartbeat's header (the Python process's pid, the heartbeat's thread), or None
        when the program ended or never started it (not Python: do not wait long)."""
        prefix = self.files.heartbeat_prefix
        self.progress("waiting for the heartbeat")
        wait_until(
            lambda: hb.read_header(prefix) is not None or launched.poll() is not None,
            min(STARTUP_TIMEOUT_S, max(2.0, self.config.duration_s)),
        )
        return hb.read_header(prefix)

    def _wait_for_setup(self, launched: Launched, header: dict[str, Any] | None) -> Verdict | None:
        """None when the program runs and a target finished its set-up (its factory and first
        call), so the steady state is sampled; else the verdict of why nothing can be."""
        config = self.config
        if launched.poll() is not None and header is None:
            return _early_exit(config, launched)
        if config.target is None:
            return None
        self.progress("waiting for the target's set-up")
        ready_file = self.files.ready_file
        wait_until(lambda: ready_file.exists() or launched.poll() is not None, config.setup_timeout_s, poll_s=0.02)
        if launched.poll() is not None:
            return _early_exit(config, launched, during_setup=True)
        try:
            float(ready_file.read_text(encoding="utf-8"))  # the runner writes when the set-up ended
        except (OSError, ValueError):
            # Nothing ran: the factory or the first call never returned. Not a pass, and
            # not a measurement either.
            return _harness_error(
                config,
                f"the target's set-up (its factory and first call) did not finish within "
                f"{config.setup_timeout_s:g} s, so nothing was sampled",
                [f"run the factory alone; if it is only slow, raise --setup-timeout above "
                 f"{config.setup_timeout_s:g}s"],
                [ProcessExit(stderr_tail=launched.stderr_tail() or None, stderr=str(launched.stderr_path))],
            )
        return None

    def _wait_for_ready(self, launched: Launched) -> Verdict | None:
        """None once the program is ready (``--ready``: GET URL answered 200; ``--ready-log``: a
        line of its output matched; both when both are given); else the verdict of why nothing
        was sampled: it ended first, or it was not ready within ``ready_timeout_s``."""
        config = self.config
        url, pattern = config.ready_url, config.ready_log
        wanted = " and ".join(([f"GET {url} to answer 200"] if url else [])
                              + ([f"a line of its output to match {pattern!r}"] if pattern else []))
        self.progress(f"waiting for {wanted}")
        scanner = _OutputScanner((launched.stdout_path, launched.stderr_path), pattern) if pattern else None
        ready = self.ready = _Ready(url_ok=url is None, log_line=None)
        deadline = time.monotonic() + config.ready_timeout_s
        while True:
            if scanner is not None and ready.log_line is None:
                ready.log_line = scanner.match()
            if url is not None and not ready.url_ok:
                ready.polls += 1
                ready.status, ready.error = _get_status(url, min(READY_GET_TIMEOUT_S,
                                                                 max(0.1, deadline - time.monotonic())))
                ready.url_ok = ready.status == 200
            if ready.url_ok and (scanner is None or ready.log_line is not None):
                ready.ready_s = time.monotonic() - (self.launched_s or time.monotonic())
                return None
            if exited(launched.pid):
                return self._not_ready(launched, wanted, exited=True)
            if time.monotonic() >= deadline:
                return self._not_ready(launched, wanted, exited=False)
            time.sleep(READY_POLL_S)

    def _not_ready(self, launched: Launched, wanted: str, *, exited: bool) -> Verdict:
        """The error verdict of a program that ended, or was not ready in time, before sampling."""
        config, ready = self.config, self.ready
        assert ready is not None
        seen = []
        if config.ready_url is not None and not ready.url_ok:
            last = f"answered {ready.status}" if ready.status is not None else (ready.error or "no answer")
            seen.append(f"GET {config.ready_url} last {last} ({ready.polls} tries)")
        if config.ready_log is not None and ready.log_line is None:
            seen.append(f"no line of its output matched {config.ready_log!r}")
        if exited:
            code = launched.wait(2.0)
            why = (f"the program {describe_returncode(code) if code is not None else 'ended'} before it was ready "
                   f"(glmfb waited for {wanted}: {'; '.join(seen)}), so nothing was sampled")
            steps = [f"run it alone to see its output: {launched.stderr_path}"]
        else:
            code = None
            why = (f"the program was not ready within {config.ready_timeout_s:g} s (glmfb waited for {wanted}: "
                   f"{'; '.join(seen)}), so nothing was sampled")
            steps = [f"check the URL or the pattern; if the program is only slow to start, raise --ready-timeout "
                     f"above {config.ready_timeout_s:g}s"]
        return _harness_error(config, why, steps, [ProcessExit(
            returncode=code, description=describe_returncode(code) if code is not None else None,
            stderr_tail=launched.stderr_tail() or None, stderr=str(launched.stderr_path))])

    def _readiness(self) -> Readiness | None:
        """The readiness evidence: when the program was ready and when the window opened."""
        ready, launched_s = self.ready, self.launched_s
        if ready is None or ready.ready_s is None or launched_s is None:
            return None
        config = self.config
        return Readiness(
            ready_s=round(ready.ready_s, 3),
            window_start_s=round(self.window_start_s - launched_s, 3) if self.window_start_s is not None else None,
            url=config.ready_url, status=ready.status, polls=ready.polls, log_regex=config.ready_log,
            log_line=ready.log_line,
        )

    def _sample(self, pid: int, python_pid: int, header: dict[str, Any] | None,
                launched: Launched | None) -> tuple[GilWaitSampler, float, float]:
        """/proc and py-spy over the program for the duration; the sampler and when sampling
        started and ended (monotonic)."""
        config = self.config
        sampler = GilWaitSampler(python_pid, round(config.rate_hz), native=config.native)
        if header is not None:
            sampler.skip_native.add(int(header["heartbeat_tid"]))  # glmfb's own thread
        sampler.start()
        # how busy the rest of the host was while sampling ran (a program attached by --pid is
        # not this process's descendant: its CPU time, and its children's, is counted as the
        # measured program's, not as the rest of the host's)
        meter = HostLoadMeter() if launched is not None else HostLoadMeter(also=(pid,))
        sampling_started = self.window_start_s = time.monotonic()
        self.recordings.start(python_pid)
        load = _Load(config, self.files) if config.load else None
        self.progress(f"sampling for {config.duration_s:g} s" + (" under the load command" if load else ""))
        remaining_s = max(0.0, config.duration_s - (time.monotonic() - sampling_started))

        def window_closed() -> None:
            """The load is stopped as the window closes, before the program is."""
            if load is not None and self.load_run is None:
                self.load_run = load.stop(sampling_started, time.monotonic())

        try:
            if launched is not None:
                sampling_ended = _sample_until_exit(launched, sampler, remaining_s, config.trace, window_closed)
            else:
                wait_until(lambda: not os.path.isdir(f"/proc/{pid}"), remaining_s, poll_s=0.05)
                sampling_ended = time.monotonic()
        finally:
            window_closed()
        sampler.stop()
        self.host_load = meter.stop()
        return sampler, sampling_started, sampling_ended

    def _decide(self, sampler: GilWaitSampler, started_s: float, launched: Launched | None) -> Verdict:
        config = self.config
        end_s = sampler.stopped_s or time.monotonic()
        sampling_started_s = started_s
        started_s = self._steady_state_start(started_s, end_s)
        beat = self._heartbeat(started_s, end_s)
        names = self.recordings.thread_names(dict(beat.thread_names) if beat else {})
        if config.pid is not None:  # no heartbeat recorded the threads' names: ask py-spy for them
            names = {**names, **self.recordings.dump_names(sampler.pid)}
        exclude = (
            {beat.thread_id} if beat else {tid for tid, n in names.items() if n == HEARTBEAT_THREAD}
        )
        groups = self._groups(sampler, started_s, end_s, names, exclude)
        names.update(groups.names)
        holders = self.recordings.holder_profile(names, exclude, groups)
        top_holder = next((t for t in holders.threads if not t["excluded"]), None) if holders is not None else None
        own_p99_ms: float | None = None
        holder_cpu_wait_s = 0.0
        if beat is not None and top_holder is not None and sampler.error is None:
            own_p99_ms = beat.percentile_ms(99) if beat.ticks else None
            widened = _net_of_holder_cpu_waits(beat, sampler, top_holder["tid"], groups.tids(top_holder["tid"]))
            holder_cpu_wait_s = sum(widened.cpu_wait_s) - sum(beat.cpu_wait_s)
            beat = widened
        # Without a heartbeat the /proc accounts still say who waited for the GIL (its futex is
        # found in _PyRuntime): attached by --pid, that is what decides.
        seen = (_seen_in_proc(config, beat, sampler, started_s, end_s, names, top_holder, groups, holders)
                if sampler.error is None and (beat is not None or config.pid is not None) else _SeenInProc())
        if sampler.error is not None:
            self.missing.append({"signal": "GIL waiters", "reason": sampler.error})
        elif beat is None and config.pid is not None and sampler.gil_source(None) is None:
            self.missing.append({"signal": "GIL waiters", "reason": "the GIL's futex was not found (no _PyRuntime "
                                 "symbol in the process's interpreter or libpython: not CPython?), so a wait for "
                                 "the GIL cannot be told from other waits"})
        if sampler.native_error is not None and not sampler.native_stacks and config.native:
            self.missing.append({"signal": "native snapshots", "reason": sampler.native_error})
        artifacts = self.recordings.artifacts()
        blame = self._trace_blame(seen.waiting, beat, artifacts) if config.trace else None
        if launched is not None:
            artifacts["stderr"] = str(launched.stderr_path)
        return decide(
            Observations(
                config=config, heartbeat=beat, holders=holders, waiting=seen.waiting, windows=seen.windows,
                window_summary=seen.window_summary, blame=blame, missing=self.missing, artifacts=artifacts,
                reproduce_trace=trace_step(config),
                rerun_longer=longer_step(config) if self.startup_settled is False else None,
                observed_s=max(0.0, end_s - started_s), window_start_s=started_s, thread_times=seen.times,
                thread_names=names, cpus=dict(sampler.cpus), native_votes=seen.native_votes,
                native_foreign=seen.native_foreign, native_released=seen.native_released,
                native_error=sampler.native_error,
                native_snapshots=len(sampler.native_stacks), stall=seen.stall, timeline=seen.timeline,
                own_p99_ms=own_p99_ms, holder_cpu_wait_s=holder_cpu_wait_s,
                thread_counts={tid: len(members) for tid, members in groups.members.items()},
                startup=self.recordings.startup, startup_excluded_s=started_s - sampling_started_s,
                startup_settled=self.startup_settled,
                host_load=self.host_load,
                attached=config.pid is not None,
                signals_used=self._signals_used(beat, holders, sampler),
                gil_futex=sampler.gil_source(beat.thread_id if beat is not None else None)
                if sampler.error is None else None,
                waits_measured=sampler.error is None and len(sampler.ticks) >= 2
                and (beat is not None or sampler.gil_source(None) is not None),
                wait_holder_states=seen.holder_states,
                readiness=self._readiness(),
                load=self.load_run,
            ),
            self.ctx.rules("gil", RULES),
        )

    def _signals_used(self, beat: hb.Heartbeat | None, holders: pyspy.HolderProfile | None,
                      sampler: GilWaitSampler) -> tuple[str, ...]:
        """The signals this trace measured, in the words the why uses."""
        used = []
        if holders is not None:
            used.append(SIGNAL_HOLDERS)
        if self.recordings.native is not None and holders is not None and holders.native:
            used.append(SIGNAL_NATIVE)
        if sampler.error is None and len(sampler.ticks) >= 2:
            used.append(SIGNAL_PROC)
        if sampler.native_stacks:
            used.append(SIGNAL_SNAPSHOTS)
        if beat is not None:
            used.append(SIGNAL_HEARTBEAT)
        return tuple(used)

    def _steady_state_start(self, started_s: float, end_s: float) -> float:
        """When the steady state began: sampling's start, or later when the program's start-up
        imports settled inside the window (the heartbeat saw ``sys.modules`` stop growing), so
        their GIL holds are left out of the heartbeat's lateness and the /proc accounts. At
        least ``MIN_STEADY_S`` of the window is kept."""
        header = hb.read_header(self.files.heartbeat_prefix) if self.config.heartbeat else None
        settled = header.get("imports_settled_s") if header is not None else None
        if header is not None:  # whether the program got past its start-up inside the window
            self.startup_settled = isinstance(settled, (int, float)) and settled <= end_s
        if isinstance(settled, (int, float)) and started_s < settled <= end_s - MIN_STEADY_S:
            return float(settled)
        return started_s

    def _groups(self, sampler: GilWaitSampler, started_s: float, end_s: float, names: dict[int, str],
                exclude: set[int]) -> ThreadGroups:
        """The program's short-lived threads taken as one per name (glmfb.gil.groups): those
        /proc saw start or end inside the window, and those only py-spy saw (they lived
        between two ticks)."""
        seen_in_proc = {tid for tick in sampler.ticks for tid in tick.cpu_ns}
        sampled = self.recordings.sampled_tids()
        short = sampler.short_lived(started_s, end_s) | (sampled - seen_in_proc if sampler.error is None else set())
        return thread_groups(names, seen_in_proc | sampled, short, exclude)

    def _heartbeat(self, started_s: float, end_s: float) -> hb.Heartbeat | None:
        """The heartbeat of the sampled window (a target's set-up is before it), or None."""
        config = self.config
        if not config.heartbeat or config.pid is not None:
            return None
        beat = hb.read_heartbeat(self.files.heartbeat_prefix)
        if beat is None:
            self.missing.append(
                {
                    "signal": "heartbeat",
                    "reason": "the program never started the heartbeat (not Python, or run with -S/-I)",
                }
            )
            return None
        return hb.between(beat, started_s, end_s)

    def _trace_blame(self, waiting: list[dict[str, Any]], beat: hb.Heartbeat | None,
                     artifacts: dict[str, str]) -> list[dict[str, Any]] | None:
        """Trace mode: the functions viztracer saw overlapping the starved slices (the trace is
        added to ``artifacts``), or None when it wrote no trace."""
        config, trace = self.config, self.files.trace_output
        if not trace.is_file():
            self.missing.append({"signal": "trace", "reason": "viztracer wrote no trace"})
            return None
        from glmfb.gil.trace import overlap_blame

        artifacts["trace"] = str(trace)
        starved = {w["thread"] for w in waiting if w["waiting_share"] >= MIN_WAITING_SHARE}
        heartbeat_windows = (
            [(w.start_s, w.end_s) for w in beat.windows(config.starvation_p99_ms / 1e3)]
            if beat is not None
            else []
        )
        return overlap_blame(trace, starved, config.starvation_p99_ms / 1e3, extra_windows_s=heartbeat_windows)


# ---- what /proc saw ----------------------------------------------------------------------


@dataclass
class _SeenInProc:
    """What /proc showed of the sampled window: the threads that waited for the GIL, the
    starved windows (the longest first), each thread's time account, the heartbeat's longest
    stall, the timeline of the threads shown, and what the native snapshots saw per thread."""

    waiting: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)
    window_summary: dict[str, Any] = field(default_factory=dict)
    times: dict[int, ThreadTime] = field(default_factory=dict)
    stall: dict[str, Any] = field(default_factory=dict)
    timeline: dict[int, list[list[float | str]]] = field(default_factory=dict)
    native_votes: dict[int, Counter[tuple[str, str]]] = field(default_factory=dict)
    native_foreign: dict[int, Counter[str]] = field(default_factory=dict)
    # waiter tid -> holder tid -> (the /proc ticks the waiter waited for the GIL, what the
    # holder's thread did at them)
    holder_states: dict[int, dict[int, tuple[int, Counter[str]]]] = field(default_factory=dict)
    native_released: dict[int, Counter[str]] = field(default_factory=dict)  # snapshots blocked with the GIL released


def _seen_in_proc(config: GilConfig, beat: hb.Heartbeat | None, sampler: GilWaitSampler, started_s: float,
                  end_s: float, names: dict[int, str], top_holder: dict[str, Any] | None,
                  groups: ThreadGroups | None = None, holders: pyspy.HolderProfile | None = None) -> _SeenInProc:
    """What /proc saw of the window. Without a heartbeat (attached by --pid) the GIL's futex is
    the one inside ``_PyRuntime`` and what needs the heartbeat's clock is left out: its starved
    windows and its longest stall."""
    groups = groups or ThreadGroups()
    beat_tid = beat.thread_id if beat is not None else None
    times = sampler.thread_times(beat_tid, started_s, end_s, groups.members)
    waiting = _gil_waiters(sampler, beat_tid, times, names, groups)
    windows: list[dict[str, Any]] = []
    window_summary: dict[str, Any] = {}
    stall: dict[str, Any] = {}
    if beat is not None:
        windows, window_summary = _starved_windows(config, beat, sampler, started_s, names, top_holder)
        stall = _stall(beat, sampler, started_s, end_s)
        if top_holder is not None and stall:
            stall["holder"] = top_holder["thread"]
    shown = [tid for tid, _ in sorted(times.items(), key=lambda item: -(item[1].cpu_s + item[1].gil_wait_s))]
    timeline = sampler.timeline(beat_tid, top_holder["tid"] if top_holder else None,
                                started_s, end_s, shown[:MAX_TIMELINE_THREADS])
    calls = _native_calls(sampler)
    holder_states: dict[int, dict[int, tuple[int, Counter[str]]]] = {}
    for waiter in waiting:
        for thread in (holders.threads[:8] if holders is not None else ()):
            if thread["excluded"] or thread["tid"] == waiter["tid"]:
                continue
            holder_states.setdefault(waiter["tid"], {})[thread["tid"]] = sampler.holder_while_waiting(
                groups.tids(waiter["tid"]), groups.tids(thread["tid"]), beat_tid, started_s, end_s)
    return _SeenInProc(waiting, windows, window_summary, times, stall, timeline, groups.merge(calls.votes),
                       groups.merge(calls.foreign), holder_states, groups.merge(calls.released))


def _gil_waiters(sampler: GilWaitSampler, heartbeat_tid: int | None, times: dict[int, ThreadTime],
                 names: dict[int, str], groups: ThreadGroups | None = None) -> list[dict[str, Any]]:
    """The threads that waited for the GIL (the heartbeat left out), the most waiting first."""
    counts, ticks = sampler.waiting_counts(heartbeat_tid)
    if groups:  # a group's ticks seen waiting are its members' added up
        merged: Counter[int] = Counter()
        for tid, seen in counts.items():
            merged[groups.of(tid)] += seen
        counts = merged
    waiting: list[dict[str, Any]] = []
    for tid, account in sorted(times.items(), key=lambda item: -item[1].gil_wait_s):
        if tid == heartbeat_tid or (account.gil_wait_s <= 0 and not counts.get(tid)):
            continue
        of_runnable = account.of_runnable_share
        waiting.append({
            "thread": names.get(tid, unnamed(tid)), "tid": tid,
            "waiting_share": round(account.gil_wait_share, 4),
            "waiting_ci": tuple(round(x, 4) for x in account.gil_wait_ci),
            "of_runnable_share": round(of_runnable, 4) if of_runnable is not None else None,
            "of_runnable_ci": tuple(round(x, 4) for x in account.of_runnable_ci)
            if of_runnable is not None else (),
            "seen_share": round(counts.get(tid, 0) / ticks, 4) if ticks else None,
            "of_ready_share": round(account.of_ready_share, 4) if account.of_ready_share is not None else None,
            "of_ready_ci": tuple(round(x, 4) for x in account.of_ready_ci) if account.of_ready_share is not None else (),
        })
        if len(waiting) >= 8:
            break
    return waiting


def _starved_windows(config: GilConfig, beat: hb.Heartbeat, sampler: GilWaitSampler, started_s: float,
                     names: dict[int, str], top_holder: dict[str, Any] | None
                     ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The longest windows the heartbeat was late beyond the threshold (who waited, what the
    heartbeat and the top holder were doing meanwhile, per /proc), and their count and total."""
    all_windows = beat.windows(config.starvation_p99_ms / 1e3)
    summary = {
        "windows_total": len(all_windows),
        "starved_ms_total": round(1e3 * sum(w.duration_s for w in all_windows), 1),
    }
    windows: list[dict[str, Any]] = []
    for window in sorted(all_windows, key=lambda w: -w.max_lateness_s)[:MAX_WINDOWS]:
        seen = sampler.waiting_between(beat.thread_id, window.start_s, window.end_s)
        entry: dict[str, Any] = {
            "start_s": round(window.start_s - started_s, 4),
            "duration_ms": round(1e3 * window.duration_s, 2),
            "max_lateness_ms": round(1e3 * window.max_lateness_s, 2),
            "waiting_threads": [
                names.get(t, unnamed(t)) for t, _ in seen.most_common(4)
            ],
        }
        beat_states = sampler.states_between(
            beat.thread_id, window.start_s, window.end_s, beat.thread_id
        )
        entry["heartbeat_states"] = dict(beat_states.most_common(3))
        if top_holder is not None:  # what the main GIL holder did meanwhile, per /proc
            states = sampler.states_between(
                top_holder["tid"], window.start_s, window.end_s, beat.thread_id
            )
            entry["holder"] = top_holder["thread"]
            entry["holder_states"] = dict(states.most_common(3))
        windows.append(entry)
    return windows, summary


def _stall(beat: hb.Heartbeat, sampler: GilWaitSampler, start_s: float, end_s: float) -> dict[str, Any]:
    """The heartbeat's longest stretch without a wake-up in the window, and how much of it
    it spent blocked on the GIL (/proc): the ticks that never came, explained."""
    for begin, finish in hb.gaps(beat, start_s, end_s)[:5]:
        account = sampler.thread_times(beat.thread_id, begin, finish).get(beat.thread_id)
        share = account.gil_wait_share if account is not None and account.wall_s > 0 else None
        if share is None:
            continue
        return {"stall_s": finish - begin, "start_s": begin - start_s, "gil_share": share}
    gaps = hb.gaps(beat, start_s, end_s)
    if gaps:
        begin, finish = gaps[0]
        return {"stall_s": finish - begin, "start_s": begin - start_s, "gil_share": None}
    return {}


def _native_calls(sampler: GilWaitSampler) -> SnapshotCalls:
    """Per thread, the C call each native snapshot shows it in where it could hold the GIL
    (``(name, symbol)``), the library functions below Python in those, and the snapshots that
    found it blocked with the GIL released (a queue's get, a lock, a sleep, take_gil)."""
    from glmfb.gil.native import snapshot_calls

    return snapshot_calls(stack for _at, stack in sampler.native_stacks)
