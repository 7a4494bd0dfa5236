"""``glmfb bisect GOOD BAD DEFINITION``: parse, call :func:`glmfb.workflows.bisect.bisect`, write the run
folder, show the verdict and exit with its code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glmfb.cli.commands.common import console, emit_verdict, parse_timeout, show_finished


def bisect_command(
    good: Annotated[str, typer.Argument(metavar="GOOD", help="A revision where the definition passes.")],
    bad: Annotated[str, typer.Argument(metavar="BAD", help="A later revision where it fails.")],
    definition: Annotated[
        Path, typer.Argument(metavar="DEFINITION", help="The probe definition file (.toml) in the repository to bisect."),
    ],
    select: Annotated[
        list[str] | None,
        typer.Option("-k", "--select", metavar="NAME", help="The definition to follow, when the file holds several (glob or substring)."),
    ] = None,
    setup: Annotated[
        str | None,
        typer.Option("--setup", metavar="CMD",
                     help="Shell command run in each commit's worktree before it is evaluated; failing skips the commit."),
    ] = None,
    max_evaluations: Annotated[
        int, typer.Option("--max-evaluations", metavar="N", min=1, help="Most probe runs in all, retries included."),
    ] = 40,
    timeout: Annotated[
        str | None,
        typer.Option("--timeout", metavar="DURATION",
                     help="Stop one evaluation (or one set-up) after this long [default: a definition's timeout, "
                          "else 15min]."),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for reports/<run-id>/.")] = Path("reports"),
    as_json: Annotated[
        bool, typer.Option("--json", help="Print exactly one JSON document on stdout; human text goes to stderr."),
    ] = False,
) -> None:
    from glmfb.core import workers
    from glmfb.core.env import fingerprint
    from glmfb.workflows.bisect import BisectRequest, bisect, choose_definition
    from glmfb.workflows.invocation import begin

    invocation = begin(out)  # the gate's pointer, before anything can fail (bad input included)
    request = BisectRequest(good=good, bad=bad, definition=definition, select=tuple(select or ()), setup=setup,
                            max_evaluations=max_evaluations, timeout_s=parse_timeout(timeout))
    choose_definition(definition, request.select)  # bad input is exit 2
    notes = console(stderr=True)
    with workers.pool("bisect") as warm:  # each evaluation's probe forks from one warm zygote
        result = bisect(request, invocation.run_id, invocation.report_dir,
                        progress=lambda message: notes.print(message, markup=False))
    finished = invocation.finish([result.verdict], interrupted=result.interrupted,  # a bisection records no history
                                 env=workers.recorded(fingerprint(), warm))
    show_finished(finished)
    emit_verdict(finished.run.verdicts[0], as_json)
