"""``glmfb report RUN_JSON...``: report.html again from a saved run, or from every shard of a suite."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glmfb.cli.commands.common import console, history_url, run_history, shards_home
from glmfb.contract.errors import UsageError


def report_command(
    source: Annotated[
        list[str],
        typer.Argument(metavar="RUN_JSON...", help="A saved run.json (or a verdict, or a run folder); several: the "
                                                   "shards of one suite (glmfb run --shard K/N), as one page."),
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the page here (default: report.html beside RUN_JSON; "
                                                "for several shards, in the current folder).")
    ] = None,
    history: Annotated[
        str | None,
        typer.Option("--history", metavar="URL", help="The history store whose series the page draws [default: "
                     "$GLMFB_HISTORY, else history.sqlite beside the run folder, when there is one]"),
    ] = None,
    no_history: Annotated[bool, typer.Option("--no-history", help="Draw no history.")] = False,
) -> None:
    from glmfb.core.shards import combine, read_sources, verdict_folders
    from glmfb.workflows.report.html import REPORT_NAME, write_html

    sources = read_sources(source)
    run = combine(sources)
    whole = len(sources) == 1 and sources[0].folder is not None
    folder = sources[0].folder if whole else None
    target = out if out is not None else (folder or Path.cwd()) / REPORT_NAME
    series = run_history(history_url(history, shards_home(sources), no_history), run.id) if len(sources) > 1 else [
        found for given in sources if given.folder is not None
        for found in run_history(history_url(history, given.folder.parent, no_history), given.run.id)]
    try:
        written = write_html(run, folder, target, folders=None if whole else verdict_folders(sources),
                             history=series)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}", "pass --out FILE in a writable folder") from None
    console(stderr=True).print(f"report written to {written}")
