"""The history plot of report.html: one series of the history store (a definition's metric on
one machine, as a ``glmfb.history/1`` series document), every run's value with its interval,
the level of each segment, the change points as vertical lines labelled with their size, and
the run the page is about marked.

The series come from the caller (:func:`glmfb.workflows.history.series.history_of_run`: the commands that
record a run pass them in), so the page needs no store: without them it has no such plot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from glmfb.core.plotting import (
    BASELINE_COLOR,
    CANDIDATE_COLOR,
    FAIL_COLOR,
    MUTED_COLOR,
    PASS_COLOR,
    NoData,
    Plot,
    PlotSpec,
    VerdictView,
    element_id,
    new_axes,
    number,
)

PLOT_ID = "history"
TITLE = "the history of this metric"


def series_for(history: Sequence[Mapping[str, Any]], verdict: Mapping[str, Any], run_id: str) -> list[Mapping[str, Any]]:
    """The series a verdict of run ``run_id`` belongs to: its definition and metric, with that
    run in it (one per machine, and a run is measured on one)."""
    metric = verdict.get("metric")
    name = metric.get("name") if isinstance(metric, Mapping) else None
    return [s for s in history if s.get("definition") == verdict.get("name") and s.get("metric") == name
            and any(p.get("run_id") == run_id for p in s.get("points", ()))]


def history_spec(series: Mapping[str, Any], run_id: str) -> PlotSpec:
    """The plot of one series, with run ``run_id`` marked, as a spec :func:`~glmfb.workflows.report.plots.draw` draws."""

    def build(view: VerdictView) -> Plot:
        return history_plot(series, run_id)

    return PlotSpec(PLOT_ID, TITLE, (), build)


def _scale(unit: str) -> tuple[float, str]:
    """How values are shown: a ratio or fraction as percent, anything else in its unit."""
    from glmfb.workflows.history.render import PERCENT_UNITS

    return (100.0, "%") if unit in PERCENT_UNITS else (1.0, unit)


def history_plot(series: Mapping[str, Any], run_id: str) -> Plot:
    """Value per run (1 is the oldest) with its interval; segment levels; change points; this run."""
    from glmfb.workflows.history.render import change_point_line, show_regression

    points = list(series.get("points") or [])
    if len(points) < 2:
        raise NoData("the history holds one run of this metric")
    unit = str(series.get("unit") or "")
    factor, shown_unit = _scale(unit)
    runs = list(range(1, len(points) + 1))
    values = [(number(p.get("value")) or 0.0) * factor for p in points]
    figure, axes = new_axes(6.4, 3.0)
    lows, highs = [], []
    for point, value in zip(points, values, strict=True):
        ci = point.get("ci") or [None, None]
        low, high = number(ci[0]), number(ci[1])
        lows.append(value - low * factor if low is not None else 0.0)
        highs.append(high * factor - value if high is not None else 0.0)
    axes.errorbar(runs, values, yerr=[lows, highs], fmt="o", markersize=3.5, color=BASELINE_COLOR,
                  ecolor=MUTED_COLOR, elinewidth=0.9, capsize=1.5, label="a run (its interval)", zorder=3,
                  gid=element_id(PLOT_ID, "runs"))
    changes = list(series.get("change_points") or [])
    _segments(axes, changes, len(points), factor)
    for number_, change in enumerate(changes):
        index = int(change["index"])  # the first run after it, 0-based: between runs index and index + 1
        worse = (number(change.get("regression")) or 0.0) > 0
        color = FAIL_COLOR if worse else PASS_COLOR
        axes.axvline(index + 0.5, color=color, linestyle="--", linewidth=1.2, zorder=2,
                     gid=element_id(PLOT_ID, "change", index))
        ci = change.get("regression_ci") or [None, None]
        size = show_regression(number(change.get("regression")), number(ci[0]), number(ci[1]),
                               bool(series.get("relative")))
        late = index > len(points) / 2  # the label goes on the side with room, each on a line of its own
        axes.annotate(f"{'worse' if worse else 'better'} {size}", (index + 0.5, 0.99 - 0.07 * (number_ % 3)),
                      xycoords=("data", "axes fraction"), xytext=(-3 if late else 3, 0), textcoords="offset points",
                      color=color, fontsize=8, va="top", ha="right" if late else "left")
    current = [n for n, p in zip(runs, points, strict=True) if p.get("run_id") == run_id]
    for n in current:
        axes.plot([n], [values[n - 1]], marker="D", markersize=8, color=CANDIDATE_COLOR, linestyle="none",
                  markeredgecolor="#222", zorder=4, label="this run", gid=element_id(PLOT_ID, "current"))
    axes.set_xlabel("run (oldest first)")
    axes.set_ylabel(f"{series.get('metric', '')}" + (f" ({shown_unit})" if shown_unit else ""))
    axes.set_xlim(0.4, len(points) + 0.6)
    axes.margins(y=0.18 + 0.07 * min(len(changes), 3))  # room above the runs for the labels
    axes.xaxis.get_major_locator().set_params(integer=True)  # type: ignore[call-arg]
    held = int(series.get("runs_in_store") or len(points))
    of = f" (the newest {len(points)} of {held})" if held > len(points) else ""
    axes.set_title(f"{series.get('definition', '')}: {series.get('metric', '')} over {len(points)} runs{of}")
    axes.legend(loc="best")
    caption = (f"{len(points)} runs of {series.get('definition', '')} on {series.get('machine_label', '')}{of}, "
               f"oldest first ({series.get('worse', 'higher')} is worse); the diamond is this run"
               + (f" (run {current[0]})" if current else "") + ". ")
    if of:
        caption += "Its change points are found in these runs. "
    if changes:
        caption += "Change points: " + "; ".join(change_point_line(c, unit, bool(series.get("relative")))
                                                  for c in changes) + "."
    else:
        caption += "No change point."
    return Plot(figure, caption)


def _segments(axes: Any, changes: Sequence[Mapping[str, Any]], count: int, factor: float) -> None:
    """Each segment's level as a horizontal line over its runs (only where there are change points)."""
    if not changes:
        return
    starts = [0] + [int(c["index"]) for c in changes]
    ends = [int(c["index"]) for c in changes] + [count]
    levels = [number(changes[0].get("before"))] + [number(c.get("after")) for c in changes]
    for number_, (start, end, level) in enumerate(zip(starts, ends, levels, strict=True)):
        if level is None:
            continue
        axes.hlines(level * factor, start + 0.6, end + 0.4, color=MUTED_COLOR, linewidth=1.6, zorder=1,
                    label="segment level" if number_ == 0 else None)
