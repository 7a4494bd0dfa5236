"""``glmfb gate [RUN...]``: a run (or every shard of a suite) into a CI exit code, a JUnit file and a
Markdown summary (:mod:`glmfb.workflows.gate`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from glmfb.cli.commands.common import console, history_url, record_shards, shards_home


def gate_command(
    source: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[RUN_JSON | RUN_DIR | -]...",
            help="A run or verdict JSON file, a run folder, or - for stdin (default: the latest run into --out); "
                 "several: the shards of one suite (glmfb run --shard K/N), gated as one run.",
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="The reports folder whose latest run to gate.")] = Path(
        "reports"
    ),
    policy: Annotated[Path | None, typer.Option("--policy", help="TOML policy file.")] = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML here.")] = None,
    summary: Annotated[
        Path | None,
        typer.Option(
            "--summary",
            help="Write a Markdown summary here (default: $GITHUB_STEP_SUMMARY when set, appended).",
        ),
    ] = None,
    history: Annotated[
        str | None,
        typer.Option("--history", metavar="URL", help="Where the shards of a suite are recorded as one run "
                     "[default: $GLMFB_HISTORY, else history.sqlite beside the first shard's run folder]"),
    ] = None,
    no_history: Annotated[bool, typer.Option("--no-history", help="Record nothing in the history.")] = False,
) -> None:
    from glmfb.core.io import write_text_atomic
    from glmfb.core.runs import latest_run
    from glmfb.core.shards import combine, describe, read_sources
    from glmfb.workflows.gate import evaluate, load_policy
    from glmfb.workflows.report.terminal import gate_lines, render_gate

    sources = read_sources(source or [str(latest_run(out))], typed=False)
    run = combine(sources)
    sys.stderr.write(f"glmfb gate: read {describe(sources)}\n")
    if len(sources) > 1:  # shards, which recorded nothing themselves: one run in the history
        record_shards(history_url(history, shards_home(sources), no_history), run, sources)
    result = evaluate(run, load_policy(policy) if policy is not None else None)
    for warning in result.warnings:
        sys.stderr.write(f"glmfb: warning: {warning}\n")
    if junit is not None:
        from glmfb.workflows.report.junit import render_junit

        write_text_atomic(junit, render_junit(result))
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary is not None or step_summary:
        from glmfb.workflows.report.markdown import render_markdown

        text = render_markdown(result)
        if summary is not None:
            write_text_atomic(summary, text)
        elif step_summary:
            with open(step_summary, "a", encoding="utf-8") as handle:
                handle.write(text)
    if sys.stdout.isatty() or os.environ.get("FORCE_COLOR"):
        console().print(render_gate(result))
    else:  # a CI log, a pipe: the same lines, unstyled and unwrapped, without loading rich
        sys.stdout.write("".join(f"{text}\n" for text, _ in gate_lines(result)))
    raise typer.Exit(int(result.exit_code))
