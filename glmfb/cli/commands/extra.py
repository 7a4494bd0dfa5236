"""The commands probes bring (diff's ``glmfb capture``), generated from their
:class:`~glmfb.core.probe.ProbeCommand`.

Not probes (they answer with the job's result, not a verdict), but built the same way: the
fixed arguments from the declaration (``positional``, ``flags``, ``kwargs``), the options
from the declarations on the command's config type, so a command an installed probe brings
gets a full ``glmfb <name>`` with no code here. The body is thin: parse, build the config,
run the job in a supervised child, say what it did.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from glmfb.cli.commands.common import Command, console, parse_timeout, progress_messages
from glmfb.cli.commands.probes import given_options, option_parameters
from glmfb.contract.errors import UsageError
from glmfb.contract.options import options_of
from glmfb.core.probe import ProbeCommand
from glmfb.core.registry import import_ref


def _fixed_parameters(command: ProbeCommand) -> list[inspect.Parameter]:
    """typer parameters of the fixed arguments: positional ones, flags, ``KEY=VALUE`` objects."""
    pos = inspect.Parameter.POSITIONAL_OR_KEYWORD
    kw = inspect.Parameter.KEYWORD_ONLY
    params: list[inspect.Parameter] = []
    for name in command.positional:
        annotation: Any = Annotated[Path if name in command.paths else str, typer.Argument(
            metavar=name.upper(), help=command.help.get(name, ""))]
        params.append(inspect.Parameter(name, pos, annotation=annotation))
    for name, flag in command.flags.items():
        required = name in command.required
        value_type: Any = Path if name in command.paths else str
        annotation = Annotated[value_type if required else value_type | None, typer.Option(
            flag, metavar="PATH" if name in command.paths else "TEXT", help=command.help.get(name, ""))]
        params.append(inspect.Parameter(name, kw, default=inspect.Parameter.empty if required else None,
                                        annotation=annotation))
    for name, flag in command.kwargs.items():
        params.append(inspect.Parameter(name, kw, default=None, annotation=Annotated[list[str] | None, typer.Option(
            flag, metavar="KEY=VALUE", help=command.help.get(name, "Keyword argument.") + " Repeatable.")]))
    params.append(inspect.Parameter("timeout", kw, default=None, annotation=Annotated[str | None, typer.Option(
        "--timeout", metavar="DURATION", help="Stop it (and everything it started) after this long.")]))
    return params


def build_config(command: ProbeCommand, values: dict[str, Any]) -> Any:
    """The command's config from its parsed command line; a required option not given, or an
    input file that is not there, is a :class:`UsageError` naming its flag."""
    from glmfb.core.targets import parse_args

    fixed: dict[str, Any] = {name: values[name] for name in (*command.positional, *command.flags)}
    fixed.update({name: parse_args(values.get(name) or []) for name in command.kwargs})
    options = given_options(command.config_type, values)
    for spec in options_of(command.config_type):
        if spec.key in command.required and spec.attr not in options:
            raise UsageError(f"glmfb {command.name} needs {spec.flag} {spec.metavar}")
        if spec.key in command.inputs and spec.attr in options and not Path(options[spec.attr]).is_file():
            raise UsageError(f"{spec.flag} {options[spec.attr]}: no such file")
    for name in command.inputs:
        if name in fixed and not Path(fixed[name]).is_file():
            raise UsageError(f"{command.flags.get(name, name)} {fixed[name]}: no such file")
    return command.config_type(**fixed, **options)


def register_command(app: typer.Typer, command: ProbeCommand) -> None:
    """Add ``glmfb <name>`` for one command a probe brings."""

    def run_command(**values: Any) -> None:
        import os

        from glmfb.core.supervise import call_isolated_scratch

        config = build_config(command, values)
        timeout_s = parse_timeout(values.get("timeout"))
        with progress_messages() as progress:
            if os.environ.get("GLMFB_ISOLATE", "1") == "0":  # debugging: in this process
                result = import_ref(command.job)(config, progress)
            else:
                result = call_isolated_scratch(command.job, config, name=command.name, progress=progress,
                                               timeout_s=timeout_s)
        if command.done:
            console(stderr=True).print(command.done.format(**{**values, **result}))

    params = [*_fixed_parameters(command), *option_parameters(command.config_type)]
    run_command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run_command.__doc__ = command.summary
    run_command.__name__ = f"{command.name}_command"
    app.command(command.name, help=command.summary, cls=Command)(run_command)
