"""A verdict's ``next`` steps as tool calls an agent can pass straight back.

A step that is a glmfb command (``glmfb bench a.py:f b.py:g --shape 8x4096 --json  # why``)
is split like a shell would (:func:`shlex.split`, comments dropped) and read against the
command's own arguments: the probe's form (``BASELINE CANDIDATE``, ``--target``, ``-- COMMAND``)
and its declared options (:mod:`glmfb.options`), so an installed probe's steps are read too.
Flags that only shape the CLI's output (``--json``, ``--out``, ``--csv``; ``--junit`` and
``--summary`` of ``glmfb gate``) are dropped: a tool always answers with JSON and writes its
run under the root.

Each call is then checked the way the tool would check it (paths under the root, targets that
exist, option values that parse), so that a call given is a call that is accepted. A command
that reads as a glmfb command but would be refused keeps its reason (``error``) instead of
arguments; a step that is not a glmfb command stays text only.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from typing import Any

from glmfb.errors import GlmfbError
from glmfb.options import OptionSpec, options_of
from glmfb.probe import Probe, ProbeForm, get_probe, known_kinds
from glmfb.targets import parse_arg

# Flags of every probe command that only shape the CLI's output: (flag, takes a value).
_DROPPED = {"--json": False, "--out": True, "--csv": True}


class _Unreadable(ValueError):
    """The step is a glmfb command this reader cannot turn into a call."""


def parse_step(step: str) -> tuple[str, dict[str, Any]] | None:
    """``(tool, arguments)`` for a step that is a glmfb command, or None. Raises
    :class:`_Unreadable` when it is a glmfb command with something a tool does not take."""
    try:
        tokens = shlex.split(step, comments=True)
    except ValueError:
        return None
    if len(tokens) < 2 or tokens[0] != "glmfb":
        return None
    command, argv = tokens[1], tokens[2:]
    if command in known_kinds():
        return command, _probe_arguments(get_probe(command), argv)
    if command == "run":
        return command, _run_arguments(argv)
    if command == "gate":
        return command, _gate_arguments(argv)
    if command == "capture":
        return command, _capture_arguments(argv)
    raise _Unreadable(f"glmfb {command} has no tool")


def next_calls(steps: Sequence[str], check: Callable[[str, dict[str, Any]], None]) -> list[dict[str, Any]]:
    """One entry per step that is a glmfb command: ``{"index", "text", "tool", "arguments"}``,
    or ``{"index", "text", "tool", "error"}`` when the call would be refused now (``check``
    raises the tool's error)."""
    calls: list[dict[str, Any]] = []
    for index, step in enumerate(steps):
        try:
            parsed = parse_step(step)
        except _Unreadable as exc:
            calls.append({"index": index, "text": step, "error": f"not callable as a tool: {exc}"})
            continue
        if parsed is None:
            continue
        tool, arguments = parsed
        entry: dict[str, Any] = {"index": index, "text": step, "tool": tool}
        try:
            check(tool, arguments)
        except GlmfbError as exc:
            entry["error"] = str(exc)
        else:
            entry["arguments"] = arguments
        calls.append(entry)
    return calls


# --------------------------------------------------------------------------------------------
# Reading argv against a command's arguments
# --------------------------------------------------------------------------------------------


class _Argv:
    def __init__(self, argv: Sequence[str]) -> None:
        self.items = list(argv)
        self.index = 0

    def __bool__(self) -> bool:
        return self.index < len(self.items)

    def next(self) -> str:
        item = self.items[self.index]
        self.index += 1
        return item

    def value(self, flag: str, inline: str | None) -> str:
        if inline is not None:
            return inline
        if not self:
            raise _Unreadable(f"{flag} has no value")
        return self.next()

    def rest(self) -> list[str]:
        rest = self.items[self.index:]
        self.index = len(self.items)
        return rest


def _split_flag(token: str) -> tuple[str, str | None]:
    flag, eq, inline = token.partition("=")
    return flag, (inline if eq else None)


def _json_value(spec: OptionSpec, raw: str) -> Any:
    """A CLI string as the JSON value the tool's schema asks for (``--repeats 80`` -> 80)."""
    kind = spec.type.schema.get("type")
    try:
        if kind == "integer":
            return int(raw)
        if kind == "number":
            return float(raw)
    except ValueError:
        return raw  # left for the check to refuse, naming the option
    return raw


def _option(specs: Sequence[OptionSpec], flag: str, inline: str | None, argv: _Argv,
            arguments: dict[str, Any]) -> bool:
    """Read one declared option's flag into ``arguments``; False when no option has it."""
    for spec in specs:
        if not spec.cli:
            continue
        if spec.type.is_flag and flag in (spec.flag, "--no-" + spec.flag.removeprefix("--")):
            if not spec.toml:
                raise _Unreadable(f"{spec.flag} is a command-line option only")
            arguments[spec.key] = flag == spec.flag
            return True
        if flag != spec.flag:
            continue
        if not spec.toml:
            raise _Unreadable(f"{spec.flag} is a command-line option only")
        raw = argv.value(flag, inline)
        if spec.type.repeatable:
            arguments.setdefault(spec.key, []).append(raw)
        else:
            arguments[spec.key] = _json_value(spec, raw)
        return True
    return False


def _key_value(raw: str, flag: str) -> tuple[str, Any]:
    try:
        return parse_arg(raw)
    except GlmfbError:
        raise _Unreadable(f"{flag} {raw!r} is not KEY=VALUE") from None


def _probe_arguments(probe: Probe, items: Sequence[str]) -> dict[str, Any]:
    specs = options_of(probe.config_type)
    argv = _Argv(items)
    arguments: dict[str, Any] = {}
    positional: list[str] = []
    kwargs_flags = {"--arg": "args"}
    if probe.form is ProbeForm.PAIR:
        kwargs_flags.update({"--baseline-arg": "baseline_args", "--candidate-arg": "candidate_args"})
    while argv:
        token = argv.next()
        if token == "--":
            if not probe.accepts_command:
                raise _Unreadable(f"glmfb {probe.kind} takes no command line")
            arguments["command"] = argv.rest()
            break
        if not token.startswith("-") or token == "-":
            positional.append(token)
            continue
        flag, inline = _split_flag(token)
        if flag in _DROPPED:
            if _DROPPED[flag]:
                argv.value(flag, inline)
        elif flag in kwargs_flags:
            key, value = _key_value(argv.value(flag, inline), flag)
            arguments.setdefault(kwargs_flags[flag], {})[key] = value
        elif flag in ("--name", "--timeout"):
            arguments[flag[2:]] = argv.value(flag, inline)
        elif flag == "--rules":
            arguments.setdefault("rules", []).append(argv.value(flag, inline))
        elif flag == "--target" and probe.form is ProbeForm.SINGLE:
            arguments["target"] = argv.value(flag, inline)
        elif not _option(specs, flag, inline, argv, arguments):
            raise _Unreadable(f"glmfb {probe.kind} has no option {flag}")
    if probe.form is ProbeForm.PAIR:
        if not positional or len(positional) > 2:
            raise _Unreadable(f"glmfb {probe.kind} takes BASELINE CANDIDATE, got {len(positional)} arguments")
        arguments["baseline"] = positional[0]
        if len(positional) == 2:
            arguments["candidate"] = positional[1]
    elif positional:
        raise _Unreadable(f"glmfb {probe.kind} takes no positional arguments (use --target or -- COMMAND)")
    return arguments


def _run_arguments(items: Sequence[str]) -> dict[str, Any]:
    argv = _Argv(items)
    arguments: dict[str, Any] = {}
    while argv:
        token = argv.next()
        if not token.startswith("-"):
            arguments.setdefault("paths", []).append(token)
            continue
        flag, inline = _split_flag(token)
        if flag in ("-k", "--select"):
            arguments.setdefault("select", []).append(argv.value(flag, inline))
        elif flag == "--timeout":
            arguments["timeout"] = argv.value(flag, inline)
        elif flag in _DROPPED:
            if _DROPPED[flag]:
                argv.value(flag, inline)
        else:
            raise _Unreadable(f"glmfb run has no option {flag}")
    return arguments


def _gate_arguments(items: Sequence[str]) -> dict[str, Any]:
    argv = _Argv(items)
    arguments: dict[str, Any] = {}
    while argv:
        token = argv.next()
        if not token.startswith("-"):
            if "source" in arguments:
                raise _Unreadable("glmfb gate takes one source")
            arguments["source"] = token
            continue
        flag, inline = _split_flag(token)
        if flag == "--policy":
            arguments["policy"] = argv.value(flag, inline)
        elif flag in ("--junit", "--summary", "--out"):
            argv.value(flag, inline)
        else:
            raise _Unreadable(f"glmfb gate has no option {flag}")
    return arguments


def _capture_arguments(items: Sequence[str]) -> dict[str, Any]:
    from glmfb.diff.config import CaptureConfig

    specs = [spec for spec in options_of(CaptureConfig)]
    argv = _Argv(items)
    arguments: dict[str, Any] = {}
    positional: list[str] = []
    while argv:
        token = argv.next()
        if not token.startswith("-"):
            positional.append(token)
            continue
        flag, inline = _split_flag(token)
        if flag == "--out":
            arguments["out"] = argv.value(flag, inline)
        elif flag == "--arg":
            key, value = _key_value(argv.value(flag, inline), flag)
            arguments.setdefault("args", {})[key] = value
        elif flag == "--timeout":
            arguments["timeout"] = argv.value(flag, inline)
        elif flag == "--force":
            arguments["force"] = True
        elif not _option(specs, flag, inline, argv, arguments):
            raise _Unreadable(f"glmfb capture has no option {flag}")
    if len(positional) != 1:
        raise _Unreadable("glmfb capture takes one TARGET")
    arguments["target"] = positional[0]
    return arguments
