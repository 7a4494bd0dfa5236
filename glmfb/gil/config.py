"""The frozen configuration of one ``glmfb gil`` probe."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from glmfb.contract.errors import UsageError
from glmfb.contract.options import (
    BOOL,
    HERTZ,
    MILLISECONDS,
    POSITIVE_INT,
    SECONDS,
    ValueType,
    check_declared,
    command_type,
    option,
)
from glmfb.contract.units import OptionValueError, parse_str
from glmfb.core.targets import Target, names_a_target

DEFAULT_RATE_HZ = 100
DEFAULT_NATIVE_RATE_HZ = 10
DEFAULT_DURATION_S = 5.0
# Twice CPython's default switch interval (5 ms): a thread that wants the GIL beside a busy
# pure-Python thread already waits up to one interval, so only more than that is starvation.
DEFAULT_STARVATION_P99_MS = 10.0
HEARTBEAT_THREAD = "glmfb-heartbeat"
DEFAULT_READY_TIMEOUT_S = 120.0
PYTHON = "{python}"  # in a load command: the interpreter running glmfb


# A command line glmfb runs (its type's name, "command", is what the agent server refuses
# unless it runs with --allow-commands: glmfb/workflows/mcp/tools/probes.py).
COMMAND = command_type("a command line: a string split as a shell would (no shell runs it), or a list of strings; "
                       "{python} is the interpreter running glmfb", '["{python}", "load.py", "--requests", "16"]')


def _parse_url(raw: Any) -> str:
    text = parse_str(raw).strip()
    if not re.match(r"^https?://[^/\s]+", text):
        raise OptionValueError(f"{raw!r} is not an http(s) URL", "write e.g. http://127.0.0.1:8000/health")
    return text


def _parse_regex(raw: Any) -> str:
    text = parse_str(raw)
    try:
        re.compile(text)
    except re.error as exc:
        raise OptionValueError(f"{raw!r} is not a regular expression: {exc}", "escape it as Python's re expects") from None
    return text


URL = ValueType("url", "URL", _parse_url, lambda v: v or "none", {"type": "string", "description": "an http(s) URL"})
REGEX = ValueType("regex", "REGEX", _parse_regex, lambda v: v or "none",
                  {"type": "string", "description": "a Python regular expression, searched in each output line"})


@dataclass(frozen=True)
class GilConfig:
    """What to trace and how.

    Give exactly one of ``command`` (a command line that starts a Python program), ``target``
    (a :class:`~glmfb.core.targets.Target` whose factory returns a zero-argument callable, called
    in a loop in a child process for ``duration_s``) or ``pid`` (attach to a running process;
    no heartbeat then, since injecting one needs the process to start under glmfb).
    """

    name: str = "gil"
    command: tuple[str, ...] = ()
    target: Target | None = None
    pid: int | None = option(None, POSITIVE_INT, "Attach to a running process instead (no heartbeat then).",
                             toml=False)
    duration_s: float = option(DEFAULT_DURATION_S, SECONDS, "Time to sample; a program still running then is stopped.",
                               key="duration")
    rate_hz: float = option(DEFAULT_RATE_HZ, HERTZ, "GIL-holder samples per second (py-spy --nonblocking).",
                            key="rate")
    starvation_p99_ms: float = option(DEFAULT_STARVATION_P99_MS, MILLISECONDS,
                                      "Fail when a thread's p99 wake-up lateness exceeds this.", key="starvation_p99")
    native: bool = option(True, BOOL, "A second py-spy with --native: native frames and the active/idle split.")
    native_rate_hz: float = option(DEFAULT_NATIVE_RATE_HZ, HERTZ,
                                   "Samples per second of the --native py-spy (it pauses the program per sample).",
                                   key="native_rate")
    trace: bool = option(False, BOOL, "Also record a viztracer trace and rank what overlaps starved slices.")
    use_pyspy: bool = option(True, BOOL, "Sample the GIL holder with py-spy.", key="pyspy")
    heartbeat: bool = True
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = field(default=())
    min_holder_share: float = 0.05  # a holder must hold the GIL in this share of sample instants
    setup_timeout_s: float = option(60.0, SECONDS, "Target form: longest wait for imports, the factory, a warm-up call.",
                                    key="setup_timeout")
    ready_url: str | None = option(None, URL, "Command form: start sampling once GET URL answers 200 (a server's "
                                   "start-up left out).", key="ready")
    ready_log: str | None = option(None, REGEX, "Command form: start sampling once a line of the program's output "
                                   "(stdout or stderr) matches REGEX.", key="ready_log")
    ready_timeout_s: float = option(DEFAULT_READY_TIMEOUT_S, SECONDS, "Longest wait for --ready / --ready-log; "
                                    "past it the verdict is an error.", key="ready_timeout")
    load: tuple[str, ...] = option((), COMMAND, "A command run during the sampling window (a load generator): "
                                   "started when the window opens, stopped with its process tree when it closes; "
                                   "its exit status and output tail are evidence.")

    def __post_init__(self) -> None:
        check_declared(self)
        object.__setattr__(self, "command", tuple(str(part) for part in self.command))
        given = [self.command != (), self.target is not None, self.pid is not None]
        if sum(given) != 1:
            raise UsageError(
                "glmfb gil needs exactly one of a command, a target or --pid",
                "glmfb gil -- python prog.py   |   glmfb gil --target file.py:make   |   glmfb gil --pid 1234",
            )
        if self.command and names_a_target(self.command[0]):
            # on the command line every word after the program's is the program's: say which were
            rest = f" ({shlex.join(self.command[1:])} was read as its arguments)" if len(self.command) > 1 else ""
            raise UsageError(f"glmfb gil: {self.command[0]!r} is a Python target, not a program{rest}",
                             f"give it as --target {self.command[0]}, or a program to run after --")
        if not self.duration_s > 0:
            raise UsageError(f"--duration must be positive, got {self.duration_s}")
        if not 1 <= self.rate_hz <= 10_000:
            raise UsageError(f"--rate must be between 1 and 10000 Hz, got {self.rate_hz:g}")
        if not 1 <= self.native_rate_hz <= 10_000:
            raise UsageError(f"--native-rate must be between 1 and 10000 Hz, got {self.native_rate_hz:g}")
        if not self.starvation_p99_ms > 0:
            raise UsageError(f"the starvation threshold must be positive, got {self.starvation_p99_ms} ms")
        if not self.setup_timeout_s > 0:
            raise UsageError(f"the setup timeout must be positive, got {self.setup_timeout_s} s")
        if self.pid is not None and self.pid <= 0:
            raise UsageError(f"--pid must be a positive process id, got {self.pid}")
        if (self.ready_url is not None or self.ready_log is not None) and not self.command:
            raise UsageError(
                "--ready and --ready-log wait for a program glmfb starts: give its command line",
                "glmfb gil --ready http://127.0.0.1:8000/health -- python serve.py   (with --pid the server is "
                "already up: sampling starts at once)",
            )
        if not self.ready_timeout_s > 0:
            raise UsageError(f"the ready timeout must be positive, got {self.ready_timeout_s} s")
        object.__setattr__(self, "load", tuple(str(part) for part in self.load))
