"""The one exception family the CLI catches: each error carries its exit code and a hint."""

from __future__ import annotations

from glmfb.verdict import ExitCode


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
