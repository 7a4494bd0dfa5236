"""``glmfb run [PATH...]``: load the suite's definitions, run them through :mod:`glmfb.workflows.suite`, finish
the run with :mod:`glmfb.workflows.invocation` (run.json, history, report.html), show it, exit with its code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glmfb.cli.commands.common import (
    FollowBudgetOpt,
    FollowCommandsOpt,
    FollowDepthOpt,
    FollowOpt,
    HistoryOpt,
    JsonOpt,
    NoHistoryOpt,
    console,
    emit_run,
    folder_size,
    follow_options,
    history_url,
    interactive,
    parse_timeout,
    show_finished,
)
from glmfb.core.probe import TIMEOUT
from glmfb.workflows.report.text import status_label


def run_command(
    paths: Annotated[
        list[str] | None,
        typer.Argument(help="Probe definition files or folders (default: probes/)."),
    ] = None,
    as_json: JsonOpt = False,
    out: Annotated[Path, typer.Option("--out", help="Folder for reports/<run-id>/.")] = Path(
        "reports"
    ),
    select: Annotated[
        list[str] | None,
        typer.Option(
            "-k", "--select", help="Run only probes whose name matches (glob or substring)."
        ),
    ] = None,
    timeout: Annotated[
        str | None,
        typer.Option(TIMEOUT.flag, metavar=TIMEOUT.metavar,
                     help=f"{TIMEOUT.help} [default: a definition's timeout, else {TIMEOUT.show_default()}]"),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("-v", "--verbose", help="A panel for every verdict, not only those that need a look."),
    ] = False,
    shard: Annotated[
        str | None,
        typer.Option("--shard", metavar="K/N", help="Run only shard K of N (definitions split by name); "
                                                    "glmfb gate takes the N runs as one."),
    ] = None,
    history: HistoryOpt = None,
    no_history: NoHistoryOpt = False,
    follow: FollowOpt = False,
    follow_depth: FollowDepthOpt = None,
    follow_budget: FollowBudgetOpt = None,
    follow_commands: FollowCommandsOpt = False,
) -> None:
    from glmfb.core import workers
    from glmfb.workflows import suite
    from glmfb.workflows.follow import follower
    from glmfb.workflows.invocation import begin

    invocation = begin(out)  # the gate's pointer, before anything can fail (bad input included)
    run_id, report_dir = invocation.run_id, invocation.report_dir
    with workers.pool("run") as warm:  # the zygote imports while the definitions load
        timeout_s = parse_timeout(timeout)
        store = history_url(history, out, no_history)
        following = follow_options(follow, follow_depth, follow_budget, follow_commands)
        search = paths or ["probes"]
        definitions = suite.selected(suite.load_definitions(suite.discover(search)), select or [], search)
        notes = console(stderr=True)
        part = None
        if shard is not None:
            from glmfb.core.shards import parse_shard

            total = len(definitions)
            definitions, part = suite.take_shard(definitions, *parse_shard(shard))
            notes.print(f"shard {part.label} of suite {part.suite}: {len(definitions)} of its {total} definitions")
        show_progress = interactive()

        if show_progress:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=notes,
                transient=True,
            )
            task = bar.add_task("probes", total=len(definitions))
            context = suite.SuiteContext(
                run_id, report_dir, on_progress=lambda m: bar.update(task, description=m), timeout_s=timeout_s,
                follow=following, follower=follower(Path.cwd(), run_id),
            )
            with bar:
                run = suite.run_suite(
                    definitions,
                    context,
                    on_start=lambda d: bar.update(task, description=f"{d.probe} {d.name}"),
                    on_done=lambda d, v: bar.advance(task),
                    shard=part,
                )
        else:
            context = suite.SuiteContext(run_id, report_dir, timeout_s=timeout_s, follow=following,
                                         follower=follower(Path.cwd(), run_id))
            run = suite.run_suite(
                definitions,
                context,
                on_done=lambda d, v: notes.print(f"{status_label(v):>24}  {d.probe:<5} {d.name}"),
                shard=part,
            )
    from glmfb.workflows.history.record import suite_origins

    finished = invocation.finish(run.verdicts, interrupted=run.interrupted, shard=run.shard,
                                 env=workers.recorded(run.env, warm), history=store,
                                 origins=lambda: suite_origins(definitions))
    if part is not None and part.count > 1 and store is not None:
        notes.print(f"shard {part.label}: its verdicts go into the history when glmfb gate takes the "
                    f"{part.count} shards as one run")
    show_finished(finished)
    emit_run(finished.run, as_json, verbose=verbose, folder_size=folder_size(report_dir))
