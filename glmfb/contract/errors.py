"""The exceptions glmfb raises on purpose.

- :class:`GlmfbError` and its subclasses: an error a user can act on; each carries its exit
  code and a hint, and the CLI turns it into one line (see :mod:`glmfb.cli`).
- :class:`TargetFailed`: the one exception for "the target raised". Engines raise it around
  every call into a target; the host boundary (:mod:`glmfb.core.host`) turns it into an error
  verdict that names the side and the stage and keeps the traceback in evidence.
"""

from __future__ import annotations

import traceback
from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes: a public contract, never renumbered."""

    OK = 0
    REGRESSION = 1
    USAGE = 2
    HARNESS_ERROR = 3
    INCONCLUSIVE = 4


class GlmfbError(Exception):
    """An error a user can act on. ``str(error)`` is one line: what is wrong and what to do."""

    exit_code: ExitCode = ExitCode.HARNESS_ERROR

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


class UsageError(GlmfbError):
    """Bad command-line usage or bad input data (exit code 2)."""

    exit_code = ExitCode.USAGE


class InputError(UsageError):
    """A file or value given by the user is missing, malformed, or inconsistent (exit code 2)."""


class TargetError(UsageError):
    """A target reference cannot be resolved (exit code 2)."""


class HarnessError(GlmfbError):
    """A probe could not run for a reason outside the user's input (exit code 3)."""

    exit_code = ExitCode.HARNESS_ERROR


TRACEBACK_FRAMES = 8  # the innermost entries of a target's traceback kept in evidence


class TargetFailed(Exception):
    """A target raised (or misbehaved) while glmfb called it.

    ``side`` is "baseline", "candidate" or "target"; ``stage`` says when ("while building",
    "on request r3", "on a warm-up call of shape 8x4096"); ``error`` is the original
    exception. The traceback is formatted when this is built, so it survives the trip out of
    a child process as text.
    """

    def __init__(self, side: str, stage: str, error: BaseException) -> None:
        detail = str(error).strip().splitlines()
        message = f"{type(error).__name__}: {detail[-1]}" if detail else type(error).__name__
        super().__init__(f"the {side} raised {message} {stage}".rstrip())
        self.side = side
        self.stage = stage
        self.error = error
        lines = traceback.format_exception(type(error), error, error.__traceback__)
        self.traceback_text = "".join(lines[-TRACEBACK_FRAMES:])

    @property
    def error_line(self) -> str:
        """``TypeError: bad shape``: the original exception in one line."""
        detail = str(self.error).strip().splitlines()
        return f"{type(self.error).__name__}: {detail[-1]}" if detail else type(self.error).__name__
