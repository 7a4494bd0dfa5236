"""The tool of a command a probe brings (diff's ``capture``), derived from its
:class:`~glmfb.core.probe.ProbeCommand` as the CLI command is: its fixed arguments (targets and
paths under the root, ``KEY=VALUE`` objects) and its declared options. It runs the command's
job in a supervised child and answers with the job's result."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import InputError, UsageError
from glmfb.contract.options import OptionSpec, options_of, parse_table
from glmfb.core.probe import ProbeCommand
from glmfb.workflows.mcp.tools.base import (
    NOTES,
    Answer,
    CallContext,
    Prepared,
    ToolDef,
    duration_schema,
    kwargs_argument,
    refuse_unknown,
)

if TYPE_CHECKING:
    from glmfb.workflows.mcp.tools import Toolbox


@dataclass
class CommandTool:
    """The tool of one command a probe brings."""

    command: ProbeCommand
    box: Toolbox

    @property
    def label(self) -> str:
        return f"glmfb {self.command.name}"

    @cached_property
    def options(self) -> tuple[OptionSpec, ...]:
        """The options the command line offers, every one accepted by its key."""
        return tuple(dataclasses.replace(spec, toml=True) for spec in options_of(self.command.config_type)
                     if spec.cli)

    @cached_property
    def definition(self) -> ToolDef:
        command = self.command
        properties: dict[str, Any] = {}
        for name in command.fixed:
            kind = "object" if name in command.kwargs else "string"
            properties[name] = {"type": kind, "description": command.help.get(name, "")
                                + (" Under the root." if name in (*command.paths, *command.targets) else "")}
        properties["timeout"] = duration_schema(self.box.boundary)
        for spec in self.options:
            properties.setdefault(spec.key, spec.json_schema())
        required = [*command.positional, *(name for name in command.required if name not in command.positional)]
        input_schema = {"type": "object", "properties": properties, "required": required,
                        "additionalProperties": False}
        output = {
            "type": "object",
            "required": [*(name for name in command.paths if name in required), *command.result],
            "properties": {
                **{name: {"type": "string", "description": f"the {name}, relative to the root"}
                   for name in command.paths},
                **command.result, "notes": NOTES,
            },
        }
        description = f"{command.summary} Long: reports progress, honours cancellation."
        return ToolDef(command.name, self.label, description, input_schema, output)

    def prepare(self, arguments: dict[str, Any]) -> Prepared:
        command, label, boundary = self.command, self.label, self.box.boundary
        refuse_unknown(label, arguments, self.definition.input_schema["properties"])
        for key in self.definition.input_schema["required"]:
            if key not in arguments:
                raise InputError(f"{label}: argument {key!r} is required")
        options = self._options(arguments)
        fixed, shown = self._fixed(arguments)
        timeout_s, note = boundary.timeout(arguments.get("timeout"))
        try:
            config = command.config_type(**fixed, **options)
        except UsageError as exc:
            raise InputError(f"{label}: {exc.message}", exc.hint) from None
        notes = (note,) if note else ()

        def work(ctx: CallContext) -> Answer:
            return self._run(config, shown, ctx, notes)

        what = " ".join(str(shown.get(name, fixed[name])) for name in command.positional)
        return Prepared(command.name, timeout_s, work, runs_probes=True, notes=notes,
                        label=f"{command.name} {what}".strip())

    def _options(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The declared options given, parsed; a path confined under the root (an input must
        be a file there)."""
        boundary = self.box.boundary
        keys = {spec.key for spec in self.options}
        options = parse_table(self.command.config_type, {k: v for k, v in arguments.items() if k in keys},
                              self.label, extra=self.options)
        for spec in self.options:
            value = options.get(spec.attr)
            if spec.type.name != "path" or value is None:
                continue
            options[spec.attr] = path = boundary.path(str(value), spec.key, must_exist=spec.key in self.command.inputs)
            if spec.key in self.command.inputs and not path.is_file():
                raise InputError(f"{self.label}: argument {spec.key!r}: {arguments[spec.key]} is not a file")
        return options

    def _fixed(self, arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """The fixed arguments for the config, and the targets and paths as written relative to
        the root (for the answer)."""
        command, boundary = self.command, self.box.boundary
        fixed: dict[str, Any] = {}
        shown: dict[str, str] = {}
        for name in command.fixed:
            if name not in arguments:
                continue
            value = arguments[name]
            if name in command.kwargs:
                fixed[name] = kwargs_argument(arguments, name)
            elif name in command.targets:
                fixed[name] = shown[name] = boundary.side(value, name)
                if ":" not in fixed[name]:
                    raise InputError(f"argument {name!r}: expected a target (path/to/file.py:factory), "
                                     f"got {fixed[name]!r}")
            elif name in command.paths:
                fixed[name] = boundary.path(value, name, must_exist=name in command.inputs)
                shown[name] = boundary.relative(fixed[name])
            elif isinstance(value, str):
                fixed[name] = value
            else:
                raise InputError(f"argument {name!r}: expected a string, got {value!r:.80}")
        return fixed, shown

    def _run(self, config: Any, shown: dict[str, str], ctx: CallContext, notes: tuple[str, ...]) -> Answer:
        """The job in a supervised child (when the slot is free); its result as the answer."""
        from glmfb.core.supervise import call_isolated_scratch

        command = self.command
        refused = ctx.take_slot()
        if refused is not None:
            raise InputError(f"{self.label}: not run: {refused}")
        try:
            result = call_isolated_scratch(command.job, config, name=command.name, progress=ctx.progress,
                                           timeout_s=max(ctx.remaining_s(), 0.1), cancel=ctx.cancel)
        finally:
            ctx.slot.release()
        structured: dict[str, Any] = {**{name: shown[name] for name in command.paths if name in shown},
                                      **{key: result[key] for key in command.result if key in result}}
        if notes:
            structured["notes"] = list(notes)
        text = command.done.format(**{**shown, **result}) if command.done else f"{self.label}: done"
        return Answer(text, structured)
