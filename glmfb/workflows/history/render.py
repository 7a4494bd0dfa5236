"""``glmfb history`` for people (a rich table) and for pandas (a CSV file of every run).

Both read the ``glmfb.history/1`` document (:mod:`glmfb.workflows.history.series`), so what a person
sees and what ``--json`` prints cannot disagree. rich and pandas are imported here only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.workflows.report.text import format_number

if TYPE_CHECKING:
    from rich.console import RenderableType

PERCENT_UNITS = ("ratio", "fraction", "%")


def show_value(value: float | None, unit: str) -> str:
    """A metric's value as the verdicts show it: a ratio or fraction as a signed percentage."""
    if value is None:
        return "n/a"
    if unit in PERCENT_UNITS:
        return f"{value * 100:+.1f}%"
    return f"{format_number(value)} {unit}".rstrip()


def _interval(ci: Sequence[float | None] | None, unit: str) -> str:
    """`` [low, high]`` in the value's terms (the unit once, on the value before it)."""
    if not ci or ci[0] is None or ci[1] is None:
        return ""
    if unit in PERCENT_UNITS:
        return f" [{show_value(ci[0], unit)}, {show_value(ci[1], unit)}]"
    return f" [{format_number(ci[0])}, {format_number(ci[1])}]"


def show_regression(value: float | None, low: float | None, high: float | None, relative: bool) -> str:
    """How much worse, with its interval: points of the baseline for a relative metric
    (``+8.1 pts [+6.0, +10.2]``), a percentage of the level before otherwise."""
    if value is None:
        return "from 0"
    text = f"{value * 100:+.1f}"
    if low is not None and high is not None:
        text += f" [{low * 100:+.1f}, {high * 100:+.1f}]"
    return text + (" pts" if relative else "%")


def short_commit(run: Mapping[str, Any]) -> str:
    commit = run.get("commit")
    if not commit:
        return "no git"
    return commit[:10] + ("+dirty" if run.get("dirty") else "")


def change_point_line(point: Mapping[str, Any], unit: str, relative: bool) -> str:
    """``run 12 -> 13 (a1b2c3d4e5..f6a7b8c9d0): +2.0% -> +10.1%, worse by +8.1 [+6.0, +10.2] pts,
    confidence 99.9%``: the last run before and the first after, by number and commit."""
    before, after = point["last_before"], point["first_after"]
    ci = point.get("regression_ci") or (None, None)
    size = show_regression(point.get("regression"), ci[0], ci[1], relative)
    word = "worse" if (point.get("regression") or 0) > 0 else "better"
    line = (f"run {point['index']} -> {point['index'] + 1} ({short_commit(before)}..{short_commit(after)}): "
            f"{show_value(point['before'], unit)} -> {show_value(point['after'], unit)}, {word} by {size}, "
            f"confidence {point['confidence'] * 100:.1f}%")
    where = point.get("location")
    if where is not None and where["earliest"] != where["latest"]:
        line += (f"; the split's bootstrap puts its first run at runs {where['earliest'] + 1}-{where['latest'] + 1} "
                 f"({short_commit(where['earliest_run'])}..{short_commit(where['latest_run'])})")
    return line


def render_history(document: Mapping[str, Any]) -> RenderableType:
    """One row per series: runs, the newest value with its interval, each change point."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"history: {document['store']}", title_justify="left", show_lines=True)
    for header in ("definition", "metric", "machine", "runs", "newest", "change points"):
        table.add_column(header, overflow="fold")
    for series in document["series"]:
        unit, newest = series["unit"], series["newest"]
        newest_text = (show_value(newest["value"], unit) + _interval(newest["ci"], unit)
                       + f"\n{newest['status']}, {short_commit(newest)}")
        points = [change_point_line(p, unit, series["relative"]) for p in series["change_points"]]
        marks = "[bold red]REGRESSED[/] " if series.get("regressed") else ""
        judged = series.get("check")
        if judged is not None and judged["status"] == "cannot_tell":
            marks = "[bold yellow]CANNOT TELL[/] "
        text = marks + ("\n".join(points) if points else "none")
        if judged is not None:  # the check's reason, whatever it answered
            text += f"\n{escape(judged['reason'])}"
        table.add_row(series["definition"], f"{series['metric']} ({series['worse']} is worse)",
                      series["machine_label"], str(series["runs"]), newest_text, text)
    return table


def write_history_csv(document: Mapping[str, Any], path: Path) -> int:
    """Every run of every series as one CSV row (through pandas), with the segment it sits in
    (0 before the first change point); written atomically. Returns the rows written."""
    import pandas as pd

    from glmfb.core.io import atomic_writer

    rows = []
    for series in document["series"]:
        starts = [p["index"] for p in series["change_points"]]
        for index, point in enumerate(series["points"]):
            ci = point["ci"] or [None, None]
            rows.append({
                "definition": series["definition"], "metric": series["metric"], "unit": series["unit"],
                "worse": series["worse"], "machine": point["machine"], "machine_label": series["machine_label"],
                "run_id": point["run_id"], "time": point["time"], "commit": point["commit"], "dirty": point["dirty"],
                "status": point["status"], "value": point["value"], "low": ci[0], "high": ci[1],
                "segment": sum(1 for start in starts if start <= index),
            })
    with atomic_writer(path) as handle:
        pd.DataFrame(rows).to_csv(handle, index=False)
    return len(rows)
