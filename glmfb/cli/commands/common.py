"""What every command shares: output, progress, the options several commands take."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

from glmfb.contract.verdict import Run, Verdict

if TYPE_CHECKING:
    from rich.console import Console

    from glmfb.workflows.invocation import Finished


class Command(TyperCommand):
    """A typer command whose usage line writes a required argument as click does, ``NAME``
    (typer writes ``{NAME}``, which reads as a set of choices)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in pieces]


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    from glmfb.workflows.report.terminal import theme

    stream = sys.stderr if stderr else sys.stdout
    # Not a terminal (CI logs, pipes): wide enough that tables of paths and metrics stay legible.
    width = None if stream.isatty() or os.environ.get("COLUMNS") else 160
    return Console(stderr=stderr, theme=theme(), highlight=False, width=width)


def interactive() -> bool:
    """Whether to show progress bars: stderr is a terminal and we are not in CI."""
    return sys.stderr.isatty() and not os.environ.get("CI")


def dump_json(data: object) -> None:
    from glmfb.core.io import dumps_json

    sys.stdout.write(dumps_json(data))
    sys.stdout.flush()


def emit_verdict(verdict: Verdict, as_json: bool) -> NoReturn:
    """Show a verdict (JSON or rich) and exit with its code."""
    if as_json:
        dump_json(verdict.to_dict())
    else:
        from glmfb.workflows.report.terminal import render_verdict

        console().print(render_verdict(verdict))
    raise typer.Exit(int(verdict.exit_code))


def emit_run(run: Run, as_json: bool, *, verbose: bool = False, folder_size: str | None = None) -> NoReturn:
    if as_json:
        dump_json(run.to_dict())
    else:
        from glmfb.workflows.report.terminal import render_run

        console().print(render_run(run, verbose=verbose, folder_size=folder_size))
    raise typer.Exit(int(run.exit_code))


def folder_size(folder: object) -> str:
    """``12.3 MB``: what a run folder takes on disk."""
    total = sum(p.stat().st_size for p in Path(str(folder)).rglob("*") if p.is_file() and not p.is_symlink())
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if total >= scale:
            return f"{total / scale:.1f} {unit}"
    return f"{total} B"


@contextmanager
def progress_messages(enabled: bool | None = None) -> Iterator[Callable[[str], None]]:
    """A callback for engines' progress messages: a live status line on a terminal, else quiet."""
    if enabled is None:
        enabled = interactive()
    if not enabled:
        yield lambda message: None
        return
    with console(stderr=True).status("starting") as status:
        yield lambda message: status.update(message)


def history_url(given: str | None, out: object, no_history: bool) -> str | None:
    """The store a command records into (None with ``--no-history``): ``--history``, else
    ``$GLMFB_HISTORY``, else ``<out>/history.sqlite``. A URL that names no store is bad input,
    refused before anything runs."""
    if no_history:
        return None
    from glmfb.workflows.history.store import check_url, chosen_url

    url = chosen_url(given, Path(str(out)), os.environ)
    check_url(url)
    return url


def show_finished(finished: Finished) -> None:
    """What an invocation wrote, on stderr: its warnings (a history store that failed), then
    where the run went and what a signal left unwritten."""
    for warning in finished.warnings:
        sys.stderr.write(f"glmfb: warning: {warning}\n")
    console(stderr=True).print(finished.summary(), markup=False, soft_wrap=True)


def record_shards(url: str | None, run: Run, sources: Any) -> None:
    """Record the shards ``sources`` (made one run, ``run``) in the history at ``url`` once:
    gated again, they are not written twice. A warning line when the store fails, as for a run."""
    if url is None:
        return
    from glmfb.workflows.history.store import describe

    try:
        from glmfb.workflows.history.record import record_run, shard_origins

        written = record_run(url, run, shard_origins([s.run for s in sources]), once=True)
    except Exception as exc:  # the gate's exit code is the verdicts', whatever the store does
        sys.stderr.write(f"glmfb: warning: the shards were not recorded in the history {describe(url)}: {exc}\n")
        return
    what = f"recorded as one run in the history {describe(url)}" if written else (
        f"already recorded in the history {describe(url)}")
    sys.stderr.write(f"glmfb gate: the {len(sources)} shards' {len(run.verdicts)} verdicts {what}\n")


def run_history(url: str | None, run_id: str) -> list[dict[str, Any]]:
    """The history series of the run's verdicts, for its report (none with ``--no-history``,
    or before a second run). A store that cannot be read is one warning line; the report goes
    without its history plots."""
    if url is None:
        return []
    from glmfb.workflows.history.store import describe

    try:
        from glmfb.workflows.history.series import history_of_run

        return history_of_run(url, run_id)
    except Exception as exc:  # the report is written whatever the store does
        sys.stderr.write(f"glmfb: warning: the report shows no history from {describe(url)}: {exc}\n")
        return []


def parse_timeout(text: str | None) -> float | None:
    """``--timeout 30s`` -> 30.0; None when not given (the default, :data:`glmfb.core.probe.TIMEOUT`)."""
    from glmfb.core.probe import TIMEOUT
    from glmfb.core.probe import parse_timeout as parse

    return None if text is None else parse(text, TIMEOUT.flag)


JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print exactly one JSON document on stdout; human text goes to stderr."),
]
HistoryOpt = Annotated[
    str | None,
    typer.Option("--history", metavar="URL", help="The history store: sqlite:///PATH or "
                 "postgresql://USER@HOST:PORT/DB [default: $GLMFB_HISTORY, else sqlite:///<out>/history.sqlite]"),
]
NoHistoryOpt = Annotated[
    bool, typer.Option("--no-history", help="Do not record the verdicts in the history store."),
]
FollowOpt = Annotated[
    bool, typer.Option("--follow/--no-follow", help="After a failing verdict, run its deeper steps (then theirs) and attach each "
                       "follow-up verdict to it: a chain down to the line. Paths under the working folder; no step "
                       "that runs a command line unless --follow-commands."),
]
FollowDepthOpt = Annotated[
    int | None, typer.Option("--follow-depth", metavar="N", min=0,
                             help="How many levels of follow-ups (implies --follow). [default: 3]"),
]
FollowCommandsOpt = Annotated[
    bool, typer.Option("--follow-commands/--no-follow-commands", help="Let a follow-up run a command line (gil's trace of the command you "
                       "gave; implies --follow). Off by default, as on the agent server."),
]
FollowBudgetOpt = Annotated[
    str | None, typer.Option("--follow-budget", metavar="DURATION",
                             help="Time for a whole chain, e.g. 5m (implies --follow). [default: 10min]"),
]


def follow_options(follow: bool, depth: int | None, budget: str | None, commands: bool = False) -> Any:
    """``--follow``, ``--follow-depth``, ``--follow-budget``, ``--follow-commands`` as
    :class:`~glmfb.core.commandline.FollowOptions`; None when none was given."""
    if not follow and depth is None and budget is None and not commands:
        return None
    from glmfb.core.commandline import FollowOptions

    return FollowOptions.parse(depth, budget, "--follow", allow_commands=commands)


def shards_home(sources: Any) -> Path:
    """Where the history of several shards is kept by default: the reports folder of the first
    shard's run folder (the current folder for runs read from files or stdin)."""
    folder = sources[0].folder
    return folder.parent if folder is not None else Path.cwd()
