"""``glmfb gil``: which thread holds the GIL, which one starves, and why (thin CLI)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glmfb.commands.common import ArgOpt, JsonOpt, emit_verdict, progress_messages
from glmfb.errors import UsageError


def gil_command(
    command: Annotated[
        list[str] | None,
        typer.Argument(metavar="[-- COMMAND [ARGS...]]", help="The program to trace, after --."),
    ] = None,
    rate: Annotated[
        int, typer.Option("--rate", help="GIL-holder samples per second (py-spy --nonblocking).")
    ] = 100,
    duration: Annotated[
        float,
        typer.Option(
            "--duration", help="Seconds to sample; a program still running then is stopped."
        ),
    ] = 5.0,
    pid: Annotated[
        int | None, typer.Option("--pid", help="Attach to a running process instead.")
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(
            "--target", help="A Python target (file.py:factory) whose callable is called in a loop."
        ),
    ] = None,
    args: ArgOpt = None,
    starvation: Annotated[
        str,
        typer.Option(
            "--starvation-p99",
            help="Fail when a thread's p99 wake-up lateness exceeds this (10ms).",
        ),
    ] = "10ms",
    trace: Annotated[
        bool,
        typer.Option(
            "--trace", help="Also record a viztracer trace and rank what overlaps starved slices."
        ),
    ] = False,
    native: Annotated[
        bool,
        typer.Option(
            "--native/--no-native",
            help="A second py-spy with --native: native frames and the active/idle split.",
        ),
    ] = True,
    native_rate: Annotated[
        int,
        typer.Option(
            "--native-rate",
            help="Samples per second of the --native py-spy (it pauses the program per sample).",
        ),
    ] = 10,
    use_pyspy: Annotated[
        bool, typer.Option("--pyspy/--no-pyspy", help="Sample the GIL holder with py-spy.")
    ] = True,
    name: Annotated[str, typer.Option("--name", help="The verdict's name.")] = "gil",
    out: Annotated[Path, typer.Option("--out", help="Folder for reports/<run-id>/<name>/.")] = Path(
        "reports"
    ),
    as_json: JsonOpt = False,
) -> None:
    """Trace GIL contention: name the thread that holds the GIL (and where), and the starved one."""
    from glmfb.gil import GilConfig, trace_gil
    from glmfb.gil.config import parse_milliseconds
    from glmfb.suite import new_run_id
    from glmfb.targets import Target, parse_args

    config = GilConfig(
        name=name,
        command=tuple(command or ()),
        target=Target(target, parse_args(args or [])) if target else None,
        pid=pid,
        duration_s=duration,
        rate_hz=rate,
        starvation_p99_ms=parse_milliseconds(starvation),
        native=native,
        native_rate_hz=native_rate,
        trace=trace,
        use_pyspy=use_pyspy,
    )
    if args and not target:
        raise UsageError("--arg goes with --target", "pass arguments to a command after --")
    artifact_dir = out / new_run_id() / name
    with progress_messages() as progress:
        verdict = trace_gil(config, artifact_dir, progress=progress)
    emit_verdict(verdict, as_json)


def register(app: typer.Typer) -> None:
    app.command("gil", context_settings={"allow_interspersed_args": False})(gil_command)
