"""glmfb's command lines as data: each command's :class:`Signature`, and a next step
(:class:`~glmfb.contract.step.Step`) rendered as the shell line that takes it.

This is the one place that knows how a step's arguments are written on a command line: a
probe's signature comes from its form and its declared options (an installed probe's too),
a command a probe brings (``capture``) from its :class:`~glmfb.core.probe.ProbeCommand`, and
``run`` and ``gate`` are declared here (``tests/test_commandline.py`` checks each against
the CLI's own parameters, so the two cannot drift). Nothing parses a command line back:
agents get ``step.command`` and ``step.arguments`` as a tool call.

Engines build their steps here too: :func:`rerun_step` writes the arguments that rerun a
probe from its config (generically, from the declared options), :func:`run_step` those of
``glmfb run -k NAME``.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from glmfb.contract.errors import InputError
from glmfb.contract.step import Intent, Step


@dataclass(frozen=True)
class Signature:
    """How a command's arguments are written: ``positional`` in order without a flag,
    ``rest`` (a list) after ``--``, ``flags`` (a list argument repeats its flag), ``kwargs``
    (an object, one ``KEY=VALUE`` per entry) and ``switches`` (``--x`` / ``--no-x``)."""

    command: str
    positional: tuple[str, ...] = ()
    rest: str | None = None
    flags: Mapping[str, str] = field(default_factory=dict)
    kwargs: Mapping[str, str] = field(default_factory=dict)
    switches: Mapping[str, str] = field(default_factory=dict)

    @property
    def arguments(self) -> frozenset[str]:
        """Every argument name this command takes."""
        named = (*self.positional, *self.flags, *self.kwargs, *self.switches)
        return frozenset((*named, self.rest) if self.rest else named)


FOLLOW_FLAGS = {"follow_depth": "--follow-depth", "follow_budget": "--follow-budget"}  # and the switches below
FOLLOW_SWITCHES = {"follow": "--follow", "follow_commands": "--follow-commands"}
RUN = Signature("run", positional=("paths",), flags={"select": "-k", "timeout": "--timeout", "shard": "--shard",
                                                  "history": "--history", **FOLLOW_FLAGS},
                switches=dict(FOLLOW_SWITCHES))
GATE = Signature("gate", positional=("source",), flags={"policy": "--policy", "history": "--history"})
BISECT = Signature("bisect", positional=("good", "bad", "definition"),
                   flags={"select": "-k", "setup": "--setup", "max_evaluations": "--max-evaluations",
                          "timeout": "--timeout"})
DECLARED: dict[str, Signature] = {"run": RUN, "gate": GATE, "bisect": BISECT}


def _with_options(config_type: type, flags: dict[str, str], switches: dict[str, str]) -> None:
    from glmfb.contract.options import options_of

    for spec in options_of(config_type):
        if spec.cli:
            (switches if spec.type.is_flag else flags)[spec.key] = spec.flag


def probe_signature(probe: Any) -> Signature:
    """A probe command's signature, from the probe's form and declared options."""
    from glmfb.core.probe import ProbeForm

    flags = {"name": "--name", "timeout": "--timeout", "rules": "--rules", "history": "--history", **FOLLOW_FLAGS}
    kwargs = {"args": "--arg"}
    switches: dict[str, str] = dict(FOLLOW_SWITCHES)
    positional: tuple[str, ...] = ()
    rest = None
    if probe.form is ProbeForm.PAIR:
        positional = ("baseline", "candidate")
        kwargs.update(baseline_args="--baseline-arg", candidate_args="--candidate-arg")
    else:
        flags["target"] = "--target"
        rest = "command" if probe.accepts_command else None
    _with_options(probe.config_type, flags, switches)
    return Signature(probe.kind, positional, rest, flags, kwargs, switches)


def command_signature(command: Any) -> Signature:
    """The signature of a command a probe brings (a :class:`~glmfb.core.probe.ProbeCommand`)."""
    flags = {**command.flags, "timeout": "--timeout"}
    switches: dict[str, str] = {}
    _with_options(command.config_type, flags, switches)
    return Signature(command.name, tuple(command.positional), None, flags, dict(command.kwargs), switches)


def signature(command: str) -> Signature | None:
    """The signature of a glmfb command (a probe kind, run, gate, or a probe's own command);
    None when this installation has no such command."""
    if command in DECLARED:
        return DECLARED[command]
    from glmfb.contract.errors import InputError
    from glmfb.core.probe import get_probe, probe_commands
    from glmfb.core.registry import known_kinds

    if command in known_kinds():
        try:
            return probe_signature(get_probe(command))
        except InputError:
            return None
    extra = probe_commands().get(command)  # the same lookup the CLI and the MCP server make
    return command_signature(extra) if extra is not None else None


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


_NON_FINITE = ("NaN", "Infinity", "-Infinity")  # how a step holds a non-finite number (JSON has none)


def _kwarg(key: str, value: Any) -> str:
    """``KEY=VALUE`` as ``--arg`` reads it back: JSON where the text would parse as JSON (a
    non-finite number, held as its text, is written bare so that it reads back a number)."""
    if value in _NON_FINITE:
        return f"{key}={value}"
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return f"{key}={value}"
    return f"{key}={json.dumps(value)}"


def argv(step: Step) -> list[str]:
    """A step's command as an argument vector (``["glmfb", "bench", ...]``); a step that is
    not a command has none (raises ValueError)."""
    if step.command is None:
        raise ValueError("the step is not a command")
    sig = signature(step.command) or Signature(step.command)
    arguments = dict(step.arguments)
    words = ["glmfb", step.command]
    for name in sig.positional:
        value = arguments.pop(name, None)
        if value is None:
            continue
        words.extend(_value(v) for v in (value if isinstance(value, list) else [value]))
    rest = arguments.pop(sig.rest, None) if sig.rest else None
    for name, value in arguments.items():
        if name in sig.kwargs:
            for key, item in dict(value).items():
                words += [sig.kwargs[name], _kwarg(key, item)]
        elif name in sig.switches:
            flag = sig.switches[name]
            words.append(flag if value else "--no-" + flag.removeprefix("--"))
        else:
            flag = sig.flags.get(name, "--" + name.replace("_", "-"))
            for item in value if isinstance(value, list) else [value]:
                words += [flag, _value(item)]
    if rest:
        words += ["--", *(_value(v) for v in rest)]
    return words


def command_line(step: Step) -> str:
    """A step's command as one shell line, without why (raises ValueError for a plain step)."""
    return shlex.join(argv(step))


def shell_line(step: Step) -> str:
    """A step for people: the command line to paste, with why after ``#``; a plain step is
    its text."""
    if step.command is None:
        return step.why
    line = command_line(step)
    return f"{line}  # {step.why}" if step.why else line


# --------------------------------------------------------------------------------------------
# Building steps (the engines' side)
# --------------------------------------------------------------------------------------------


def rerun_step(kind: str, config: Any, why: str, *, intent: Intent = Intent.OTHER, **overrides: Any) -> Step:
    """A step that runs probe ``kind`` as ``config`` (its config dataclass) describes it: the
    targets (as one types them here, with their keyword arguments), the command line, and
    every declared option whose value differs from its default, written as a user writes it
    in a probe definition (``"5%"``, ``"2s"``, ``["8x4096"]``, ints, booleans).

    ``overrides`` are keyed as the arguments are: an option's key (``shapes``, ``budget``)
    takes any form the option parses (``["8x4096"]`` or ``((8, 4096),)``, ``"12s"`` or
    ``12.0``) and is written the same way; a fixed argument (``target``, ``args`` ...) is taken
    as given; None leaves the argument out (``save=None``: a rerun must not overwrite a file).
    ``intent``: what the step is for (:class:`~glmfb.contract.step.Intent`)."""
    from glmfb.contract.options import options_of

    specs = {spec.key: spec for spec in options_of(type(config))}
    arguments = {**_targets_of(config), **_changed_options(config)}
    for key, value in overrides.items():
        if value is None:
            arguments.pop(key, None)
        elif key in specs:
            arguments[key] = specs[key].write(specs[key].parse(value))
        else:
            arguments[key] = value
    return Step(why, command=kind, arguments=arguments, intent=intent)


# --------------------------------------------------------------------------------------------
# Following steps (--follow): how far
# --------------------------------------------------------------------------------------------


DEFAULT_DEPTH = 3
DEFAULT_BUDGET_S = 600.0


@dataclass(frozen=True)
class FollowOptions:
    """How far to follow: ``depth`` levels of follow-ups, ``budget_s`` seconds for the whole
    chain, and whether a step may run a command line (``allow_commands``, off as on the agent
    server)."""

    depth: int = DEFAULT_DEPTH
    budget_s: float = DEFAULT_BUDGET_S
    allow_commands: bool = False

    @classmethod
    def parse(cls, depth: Any, budget: Any, label: str, *, allow_commands: bool = False) -> FollowOptions:
        """Options from a command line, a definition or a tool call (``budget`` as ``"5m"``,
        ``"90s"`` or seconds); a bad value is a :class:`UsageError` naming ``label``."""
        if depth is None:
            depth = DEFAULT_DEPTH
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise InputError(f"{label}: the follow depth must be a whole number, 0 or more, got {depth!r}")
        from glmfb.core.probe import parse_timeout

        budget_s = DEFAULT_BUDGET_S if budget is None else parse_timeout(budget, f"{label}: the follow budget")
        return cls(depth=depth, budget_s=budget_s, allow_commands=allow_commands)


def run_step(names: Sequence[str], why: str = "run it again", intent: Intent = Intent.CONFIRM) -> Step:
    """A step that runs the named probe definitions with ``glmfb run -k`` (by default to
    confirm: the same question again)."""
    return Step(why, command="run", arguments={"select": list(names)}, intent=intent)


def _changed_options(config: Any) -> dict[str, Any]:
    """The declared options of ``config`` that differ from their defaults, as written."""
    from glmfb.contract.options import options_of

    changed: dict[str, Any] = {}
    for spec in options_of(type(config)):
        value = getattr(config, spec.attr)
        if value != spec.default:
            changed[spec.key] = spec.write(value)
    return changed


def _targets_of(config: Any) -> dict[str, Any]:
    """What a config runs against, as arguments: ``baseline`` and ``candidate`` (with ``args``
    when both sides take the same keyword arguments, else ``baseline_args`` and
    ``candidate_args``), or ``target`` with ``args``, or ``command``. A side is a
    :class:`~glmfb.core.targets.Target` or a reference (with ``<side>_args`` and ``base_dir``
    beside it on the config, as diff's)."""
    from glmfb.core.targets import Target, portable_ref

    names = {f.name for f in dataclasses.fields(config)}
    refs: dict[str, str] = {}
    side_args: dict[str, dict[str, Any]] = {}
    for which in ("baseline", "candidate", "target"):
        side = getattr(config, which) if which in names else None
        if isinstance(side, Target):
            refs[which], side_args[which] = side.portable_ref, dict(side.args)
        elif isinstance(side, str) and side:
            refs[which] = portable_ref(side, getattr(config, "base_dir", None))
            side_args[which] = dict(getattr(config, f"{which}_args", None) or {})
    arguments: dict[str, Any] = dict(refs)
    if side_args.get("target"):
        arguments["args"] = side_args["target"]
    pair = [side_args.get("baseline", {}), side_args.get("candidate", {})]
    if pair[0] and pair[0] == pair[1]:
        arguments["args"] = pair[0]
    else:
        for which, given in zip(("baseline_args", "candidate_args"), pair, strict=True):
            if given:
                arguments[which] = given
    command = getattr(config, "command", ()) if "command" in names else ()
    if command:
        arguments["command"] = list(command)
    return arguments
