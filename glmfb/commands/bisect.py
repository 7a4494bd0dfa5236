"""``glmfb bisect GOOD BAD DEFINITION``: parse, call :func:`glmfb.bisect.bisect`, write the run
folder, show the verdict and exit with its code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glmfb.commands.common import console, emit_verdict, parse_timeout


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
    """Find the commit between GOOD and BAD where a probe definition starts to fail."""
    from glmfb.bisect import BisectRequest, bisect, choose_definition
    from glmfb.clock import new_run_id, utc_now
    from glmfb.env import fingerprint
    from glmfb.gate import evaluate
    from glmfb.io import write_json_atomic, write_text_atomic
    from glmfb.report.html import write_html
    from glmfb.report.junit import render_junit
    from glmfb.runs import start_run
    from glmfb.verdict import Run

    request = BisectRequest(good=good, bad=bad, definition=definition, select=tuple(select or ()), setup=setup,
                            max_evaluations=max_evaluations, timeout_s=parse_timeout(timeout))
    choose_definition(definition, request.select)  # bad input is exit 2 before a run folder exists
    run_id = new_run_id()
    report_dir = start_run(out, run_id)
    notes = console(stderr=True)
    started = utc_now()
    result = bisect(request, run_id, report_dir, progress=lambda message: notes.print(message, markup=False))
    run = Run(id=run_id, started=started, finished=utc_now(), verdicts=(result.verdict,), env=fingerprint(),
              interrupted=result.interrupted)
    run_file = report_dir / "run.json"
    write_json_atomic(run_file, run.to_dict())
    write_html(run, report_dir)
    write_text_atomic(report_dir / "junit.xml", render_junit(evaluate(run)))
    notes.print(f"bisection written to {run_file} (report.html, junit.xml beside it)")
    emit_verdict(result.verdict, as_json)
