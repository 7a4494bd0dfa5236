"""The ``glmfb`` command line: thin commands and one error boundary.

Every :class:`~glmfb.contract.errors.GlmfbError` becomes one line on stderr and its exit code; click's
usage errors become one line and exit 2; anything unexpected becomes one line and exit 3
(``GLMFB_DEBUG=1`` shows the traceback). Commands never compute: they call an engine.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from glmfb.contract.errors import GlmfbError

# The commands, as data: name, "module:function" (imported only when that command runs) and
# its one line of help (`glmfb --help` and `glmfb NAME --help`). The probes' commands follow,
# from the registry (glmfb.core.registry: each probe's package declares its line).
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("run", "glmfb.cli.commands.run:run_command",
     "Run the probe definitions of a suite and write reports/<run-id>/run.json."),
    ("gate", "glmfb.cli.commands.gate:gate_command",
     "Turn a run (or one verdict, or every shard of a suite) into a CI exit code, a JUnit file and a summary."),
    ("report", "glmfb.cli.commands.report:report_command",
     "Re-render report.html from a saved run (or from every shard of a suite)."),
    ("bisect", "glmfb.cli.commands.bisect:bisect_command",
     "Find the commit between GOOD and BAD where a probe definition starts to fail."),
    ("history", "glmfb.cli.commands.history:history_command",
     "The history of recorded verdicts: a series per definition, metric and machine, with its change points."),
    ("schema", "glmfb.cli.commands.schema:schema_command",
     "Print the JSON Schema (draft 2020-12) of verdict and run documents, or of the history document."),
    ("mcp", "glmfb.cli.commands.mcp:mcp_command",
     "Serve glmfb's probes, runs and verdicts as MCP tools and resources (stdio by default)."),
)
_COMMANDS = {name: (ref, summary) for name, ref, summary in COMMANDS}


def _fail(message: str, code: int) -> typer.Exit:
    sys.stderr.write(f"glmfb: error: {message}\n")
    sys.stderr.flush()
    return typer.Exit(code)


def _listing() -> list[tuple[str, str]]:
    """Every command's name and line of help, in the order ``glmfb --help`` lists them: the
    table's, then the probes' and the commands they bring (:func:`glmfb.core.registry.command_list`)."""
    from glmfb.core.registry import command_list

    return [(name, summary) for name, _, summary in COMMANDS] + [
        (name, summary) for name, summary in command_list() if name not in _COMMANDS]


def _code(name: str) -> int:
    """An exit code of :class:`glmfb.contract.verdict.ExitCode`, imported when an error needs one (the
    contract is not loaded for ``glmfb --help``)."""
    from glmfb.contract.verdict import ExitCode

    return int(ExitCode[name])


def _usage_error_types() -> tuple[type[BaseException], ...]:
    """click's UsageError, from the click that typer uses (recent typer vendors its own)."""
    for module_name in ("typer._click.exceptions", "click.exceptions"):
        try:
            module = __import__(module_name, fromlist=["UsageError"])
        except ImportError:
            continue
        return (module.UsageError,)
    return ()


_USAGE_ERRORS = _usage_error_types()


class _BoundaryGroup(TyperGroup):
    """The one place errors turn into exit codes; also where probe commands come from: one
    per registered probe kind, built when first asked for (so ``glmfb gate`` never imports a
    probe, and a probe installed by another package gets its command)."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [name for name, _ in _listing()]

    def get_command(self, ctx: Any, name: str) -> Any:
        if name in _COMMANDS:
            ref, summary = _COMMANDS[name]
            return _built(lambda holder: _declare(holder, name, ref, summary), name)
        from glmfb.core.registry import known_kinds

        if name in known_kinds():
            return _probe_command(name)
        from glmfb.core.probe import probe_commands

        extra = probe_commands().get(name)  # a command a probe brings (diff's capture)
        if extra is None:
            return None
        from glmfb.cli.commands.extra import register_command

        return _built(lambda holder: register_command(holder, extra), name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The list of commands in ``glmfb --help``, from the tables: no command is built and
        no probe imported to write it."""
        listed = _listing()
        limit = formatter.width - 6 - max(len(name) for name, _ in listed)
        with formatter.section("Commands"):
            formatter.write_dl([(name, typer.core.TyperCommand(name, help=summary).get_short_help_str(limit))
                                for name, summary in listed])

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except GlmfbError as exc:
            raise _fail(str(exc), int(exc.exit_code)) from None
        except _USAGE_ERRORS as exc:
            sub = getattr(ctx, "invoked_subcommand", None)
            command = f"glmfb {sub} --help" if sub else "glmfb --help"
            raise _fail(f"{exc.format_message()} (see {command})", _code("USAGE")) from None  # type: ignore[attr-defined]
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt as exc:
            signal_name = getattr(exc, "signal_name", "SIGINT")
            raise _fail(f"interrupted ({signal_name}) before anything could be written",
                        143 if signal_name == "SIGTERM" else 130) from None
        except Exception as exc:
            if os.environ.get("GLMFB_DEBUG"):
                raise
            raise _fail(
                f"internal error: {type(exc).__name__}: {exc} (rerun with GLMFB_DEBUG=1 for the traceback)",
                _code("HARNESS_ERROR"),
            ) from None


app = typer.Typer(
    cls=_BoundaryGroup,
    name="glmfb",
    help="Dense-feedback benchmarking and diagnostics: which layer regressed, where, and why.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: rich help formatting costs ~100 ms of start-up
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from glmfb import __version__

        sys.stdout.write(f"glmfb {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Dense-feedback benchmarking and diagnostics: which layer regressed, where, and why."""


def _declare(holder: typer.Typer, name: str, ref: str, summary: str) -> None:
    """Command ``name`` of :data:`COMMANDS` declared on ``holder``: its function imported now."""
    from glmfb.cli.commands.common import Command
    from glmfb.core.registry import import_ref

    holder.command(name, cls=Command, help=summary)(import_ref(ref))


def _built(register: Any, name: str) -> Any:
    """The click command ``register(typer_app)`` adds, built on its own."""
    holder = typer.Typer(cls=TyperGroup, rich_markup_mode=None, add_completion=False,
                         context_settings={"help_option_names": ["-h", "--help"]})
    register(holder)
    holder.callback()(lambda: None)  # a group, so the command can be taken out of it
    group = typer.main.get_command(holder)
    return group.commands[name]  # type: ignore[attr-defined]


def _probe_command(kind: str) -> Any:
    """The click command of one probe kind, generated from its declarations."""
    from glmfb.cli.commands.probes import register_probe
    from glmfb.core.probe import get_probe

    return _built(lambda holder: register_probe(holder, get_probe(kind)), kind)


def _on_sigterm(number: int, frame: Any) -> None:
    from glmfb.core.supervise import Interrupted

    raise Interrupted("SIGTERM")


def main() -> None:
    """Console-script entry point. SIGTERM (a cancelled CI job) is handled like Ctrl-C: every
    child process is stopped and what finished is kept."""
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    app(prog_name="glmfb")


if __name__ == "__main__":
    main()
