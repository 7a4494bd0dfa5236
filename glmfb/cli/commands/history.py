"""``glmfb history [PATTERN...]``: the series of recorded verdicts and their change points
(:mod:`glmfb.workflows.history`); ``--check`` exits 1 when a series regressed (a step or a creep), 4
when none did but one's runs are too noisy or too few to rule a regression out, else 0."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from glmfb.cli.commands.common import HistoryOpt, console, dump_json
from glmfb.contract.errors import UsageError


def history_command(
    patterns: Annotated[
        list[str] | None,
        typer.Argument(metavar="[PATTERN...]", help="Definition names to show (glob or substring, as glmfb run -k); "
                       "all when none."),
    ] = None,
    history: HistoryOpt = None,
    out: Annotated[Path, typer.Option("--out", help="The reports folder whose history.sqlite is the default store.")] = Path(
        "reports"
    ),
    all_machines: Annotated[
        bool, typer.Option("--all-machines", help="One series per definition and metric over every machine "
                           "(default: one per machine; machines are never mixed unless asked)."),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the glmfb.history/1 document on stdout (glmfb schema history)."),
    ] = False,
    csv: Annotated[
        Path | None, typer.Option("--csv", metavar="FILE", help="Also write every run of every series to FILE as CSV."),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 when a series regressed by more than --threshold (its newest "
                           "segment against the one before, or a creep in its newest runs), 4 when none did but a "
                           "series' runs are too noisy or too few to rule that out (cannot tell), else 0."),
    ] = False,
    threshold: Annotated[
        str, typer.Option("--threshold", metavar="FRACTION", help="For --check: how much worse counts, 5% or 0.05 "
                          "(points of the baseline for a relative metric such as time_change, else a fraction of "
                          "the level before)."),
    ] = "5%",
) -> None:
    from glmfb.contract.units import OptionValueError, parse_fraction
    from glmfb.workflows.history.series import build_series, history_document
    from glmfb.workflows.history.store import chosen_url, describe, open_store

    try:
        limit = parse_fraction(threshold)
    except OptionValueError as exc:
        raise UsageError(f"--threshold {threshold}: {exc}") from None
    url = chosen_url(history, out, os.environ)
    with open_store(url, create=False) as store:
        records = store.records()
    if not records:
        raise UsageError(f"the history {describe(url)} holds no verdicts", "glmfb run records every verdict it writes")
    chosen = patterns or []
    series = build_series(records, chosen, all_machines=all_machines)
    if not series:
        names = sorted({r.definition for r in records if r.value is not None})
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise UsageError(f"no series in the history {describe(url)} matches {' '.join(repr(p) for p in chosen)}"
                         if chosen else f"the history {describe(url)} holds no verdict with a metric value",
                         f"definitions with values: {shown}" if shown else "glmfb run records every verdict")
    document = history_document(series, store=describe(url), patterns=chosen, all_machines=all_machines,
                                threshold=limit if check else None)
    if csv is not None:
        from glmfb.workflows.history.render import write_history_csv

        rows = write_history_csv(document, csv)
        console(stderr=True).print(f"{rows} runs written to {csv}")
    if as_json:
        dump_json(document)
    else:
        from glmfb.workflows.history.render import render_history

        console().print(render_history(document))
    if check:
        regressed, unknown = document["regressed"], document["cannot_tell"]
        lines = [f"glmfb history --check: {regressed} of {len(series)} series regressed by more than {limit:.1%} "
                 f"(a step in the newest segment, or a creep in its newest runs); {unknown} cannot tell"]
        for item in document["series"]:
            if item["check"]["status"] != "pass":
                lines.append(f"  {item['definition']} {item['metric']} on {item['machine_label']}: "
                             f"{item['check']['status'].replace('_', ' ')}: {item['check']['reason']}")
        sys.stderr.write("\n".join(lines) + "\n")
        raise typer.Exit(int(document["exit_code"]))
