"""glmfb's command lines as data: each command's :class:`Signature`, and a next step
(:class:`~glmfb.step.Step`) rendered as the shell line that takes it.

This is the one place that knows how a step's arguments are written on a command line: a
probe's signature comes from its form and its declared options (an installed probe's too),
a command a probe brings (``capture``) from its :class:`~glmfb.probe.ProbeCommand`, and
``run`` and ``gate`` are declared here (``tests/test_commandline.py`` checks each against
the CLI's own parameters, so the two cannot drift). Nothing parses a command line back:
agents get ``step.command`` and ``step.arguments`` as a tool call.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from glmfb.step import Step


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


RUN = Signature("run", positional=("paths",), flags={"select": "-k", "timeout": "--timeout"})
GATE = Signature("gate", positional=("source",), flags={"policy": "--policy"})
DECLARED: dict[str, Signature] = {"run": RUN, "gate": GATE}


def _with_options(config_type: type, flags: dict[str, str], switches: dict[str, str]) -> None:
    from glmfb.options import options_of

    for spec in options_of(config_type):
        if spec.cli:
            (switches if spec.type.is_flag else flags)[spec.key] = spec.flag


def probe_signature(probe: Any) -> Signature:
    """A probe command's signature, from the probe's form and declared options."""
    from glmfb.probe import ProbeForm

    flags = {"name": "--name", "timeout": "--timeout", "rules": "--rules"}
    kwargs = {"args": "--arg"}
    switches: dict[str, str] = {}
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
    """The signature of a command a probe brings (a :class:`~glmfb.probe.ProbeCommand`)."""
    flags = {**command.flags, "timeout": "--timeout"}
    switches: dict[str, str] = {}
    _with_options(command.config_type, flags, switches)
    return Signature(command.name, tuple(command.positional), None, flags, dict(command.kwargs), switches)


def signature(command: str) -> Signature | None:
    """The signature of a glmfb command (a probe kind, run, gate, or a probe's own command);
    None when this installation has no such command."""
    if command in DECLARED:
        return DECLARED[command]
    from glmfb.errors import InputError
    from glmfb.probe import all_probes, get_probe, known_kinds

    if command in known_kinds():
        try:
            return probe_signature(get_probe(command))
        except InputError:
            return None
    for probe in all_probes():
        for extra in probe.commands:
            if extra.name == command:
                return command_signature(extra)
    return None


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _kwarg(key: str, value: Any) -> str:
    """``KEY=VALUE`` as ``--arg`` reads it back: JSON where the text would parse as JSON."""
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


def shell_line(step: Step) -> str:
    """A step for people: the command line to paste, with why after ``#``; a plain step is
    its text."""
    if step.command is None:
        return step.why
    line = shlex.join(argv(step))
    return f"{line}  # {step.why}" if step.why else line
