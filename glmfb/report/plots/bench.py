"""bench plots: which shape changed by how much (and how sure), which ops account for it, and
what the samples looked like."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from glmfb.report.plots._base import (
    BAND_COLOR,
    BASELINE_COLOR,
    CANDIDATE_COLOR,
    FAIL_COLOR,
    MUTED_COLOR,
    PASS_COLOR,
    UNDECIDED_COLOR,
    NoData,
    Plot,
    PlotSpec,
    VerdictView,
    element_id,
    interval,
    new_axes,
    new_figure,
    number,
    percent,
    short,
)

DECISION_COLORS = {
    "regression": FAIL_COLOR,
    "improvement": PASS_COLOR,
    "equivalent": BASELINE_COLOR,
    "undecided": UNDECIDED_COLOR,
}
MAX_SAMPLE_PANELS = 4


def _ratio_label(ratio: float, _position: Any = None) -> str:
    change = ratio - 1.0
    if abs(change) < 1e-9:
        return "±0%"
    return f"{change * 100:+.0f}%"


def forest(view: VerdictView) -> Plot:
    """Each shape's time change with its interval, on a log scale of the time ratio, against
    the ±threshold band and the A/A noise floor; the geometric mean last."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    shapes = [s for s in view.evidence("shape") if number(s.get("change")) is not None]
    if not shapes:
        raise NoData("the verdict has no per-shape change")
    summary = view.first("summary")
    threshold = number(summary.get("threshold")) if summary is not None else None
    if threshold is None:
        threshold = number(view.metric.get("threshold"))
    rows: list[tuple[str, float, tuple[float, float] | None, str, tuple[float, float] | None]] = []
    for item in shapes:
        change = number(item.get("change"))
        assert change is not None
        rows.append((str(item.get("shape")), change, interval(item.get("ci")), str(item.get("decision", "")),
                     interval(item.get("aa_ci"))))
    if summary is not None and len(shapes) > 1 and number(summary.get("geomean_change")) is not None:
        geomean = number(summary.get("geomean_change"))
        assert geomean is not None
        rows.append(("geomean", geomean, interval(summary.get("geomean_ci")), "", None))
    figure, axes = new_axes(6.4, max(2.2, 1.1 + 0.5 * len(rows)))
    if threshold is not None:
        axes.axvspan(1 - threshold, 1 + threshold, color=BAND_COLOR, zorder=0,
                     label=f"±{threshold:.0%} threshold: no change called", gid="threshold-band")
    axes.axvline(1.0, color=MUTED_COLOR, linewidth=0.8)
    extremes: list[float] = [1 - (threshold or 0.05), 1 + (threshold or 0.05)]
    floor_labelled = False
    for y, (label, change, ci, decision, aa_ci) in enumerate(rows):
        ratio = 1 + change
        color = DECISION_COLORS.get(decision, "#333333")
        if aa_ci is not None:
            axes.plot([1 + aa_ci[0], 1 + aa_ci[1]], [y + 0.28, y + 0.28], color=MUTED_COLOR, linewidth=3,
                      solid_capstyle="butt", label=None if floor_labelled else "A/A noise floor (baseline vs itself)")
            floor_labelled = True
        if ci is not None:
            low, high = max(1 + ci[0], 1e-3), 1 + ci[1]
            axes.plot([low, high], [y, y], color=color, linewidth=2, gid=element_id("interval", label))
            axes.plot([low, high], [y, y], "|", color=color, markersize=10)
            extremes += [low, high]
        axes.plot([ratio], [y], "D" if label == "geomean" else "o", color=color, markersize=7, zorder=3,
                  gid=element_id("change", label))
        extremes.append(ratio)
        text = percent(change, 1) + (f"  [{percent(ci[0], 0)}, {percent(ci[1], 0)}]" if ci else "")
        axes.annotate(f"{text}  {decision}".rstrip(), xy=(ratio, y), xytext=(0, 7), textcoords="offset points",
                      ha="center", va="bottom", fontsize=8, color=color)
    low, high = min(extremes), max(extremes)
    axes.set_xscale("log")
    axes.set_xlim(low / 1.25, high * 1.25)
    axes.xaxis.set_major_locator(LogLocator(base=2))
    axes.xaxis.set_major_formatter(FuncFormatter(_ratio_label))
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set_yticks(range(len(rows)), [r[0] for r in rows])
    axes.set_ylim(len(rows) - 0.4, -0.7)
    axes.set_xlabel("time change, candidate against baseline (log scale of the time ratio)")
    axes.set_title("Change per shape, with its interval")
    figure.legend(loc="outside lower center", ncol=2)
    regressions = [r[0] for r in rows if r[3] == "regression"]
    improvements = [r[0] for r in rows if r[3] == "improvement"]
    caption = "Median of paired block ratios with its bootstrap interval; right of the band is slower."
    if regressions:
        caption += f" Slower beyond the threshold: {', '.join(regressions)}."
    if improvements:
        caption += f" Faster beyond the threshold: {', '.join(improvements)}."
    return Plot(figure, caption)


def op_diff(view: VerdictView) -> Plot:
    """The profiled ops of both sides: calls and self time per kernel call."""
    item = view.require("op_diff")
    ops = [op for op in item.get("ops") or [] if isinstance(op, Mapping)]
    if not ops:
        raise NoData("the op diff lists no ops")
    labels = [str(op.get("op")) + ("  (reduction)" if op.get("reduction") else "") for op in ops]
    figure = new_figure(7.2, max(2.4, 1.0 + 0.28 * len(ops)))
    calls_axes, time_axes = figure.subplots(1, 2, sharey=True)
    ys = list(range(len(ops)))
    bar = 0.38
    for axes, key, title in ((calls_axes, "calls", "calls per kernel call"),
                             (time_axes, "self_us", "self time per kernel call (µs)")):
        base = [number(op.get(f"baseline_{key}")) or 0.0 for op in ops]
        cand = [number(op.get(f"candidate_{key}")) or 0.0 for op in ops]
        axes.barh([y - bar / 2 for y in ys], base, height=bar, color=BASELINE_COLOR, label="baseline")
        axes.barh([y + bar / 2 for y in ys], cand, height=bar, color=CANDIDATE_COLOR, label="candidate")
        axes.set_title(title, fontsize=9)
        axes.set_gid(element_id("op", key))
    calls_axes.set_yticks(ys, [short(label, 30) for label in labels])
    for tick, op in zip(calls_axes.get_yticklabels(), ops, strict=False):
        if op.get("reduction"):
            tick.set_fontweight("bold")
    calls_axes.invert_yaxis()
    time_axes.legend(loc="lower right")
    rule = item.get("rule")
    figure.suptitle(f"Op diff on {item.get('shape')}" + (f": {rule}" if rule else ""), fontsize=10, fontweight="bold")
    repeated = item.get("repeated_reductions") or []
    caption = f"Profiled over {item.get('profiled_calls')} calls a side, ops ranked by the time they add."
    if repeated:
        caption += f" Repeated reductions (bold): {', '.join(map(str, repeated))}."
    return Plot(figure, caption)


def samples(view: VerdictView) -> Plot:
    """Per-call time of every sample, both sides, one panel per shape (from the saved
    samples file)."""
    path = view.artifact("samples")
    if path is None:
        raise NoData("no samples artifact (the probe saves one unless save = false)")
    document = json.loads(path.read_text(encoding="utf-8"))
    shapes = document.get("shapes") if isinstance(document, Mapping) else None
    if not isinstance(shapes, Mapping) or not shapes:
        raise NoData(f"{path.name} holds no samples")
    keys = list(shapes)[:MAX_SAMPLE_PANELS]
    figure = new_figure(min(7.2, 2.6 + 2.2 * len(keys)), 3.0)
    panels = figure.subplots(1, len(keys), squeeze=False)[0]
    import numpy as np

    rng = np.random.default_rng(0)
    for axes, key in zip(panels, keys, strict=False):
        entry = shapes[key]
        data: list[list[float]] = []
        names: list[str] = []
        colors: list[str] = []
        for side, color in (("baseline", BASELINE_COLOR), ("candidate", CANDIDATE_COLOR)):
            read = [number(v) for v in entry.get(side) or []]
            finite = [v * 1e6 for v in read if v is not None]
            if finite:
                data.append(finite)
                names.append(side)
                colors.append(color)
        if not data:
            axes.set_visible(False)
            continue
        parts = axes.violinplot(data, showextrema=False, widths=0.8)
        for body, color in zip(parts["bodies"], colors, strict=False):
            body.set_facecolor(color)
            body.set_alpha(0.35)
        for index, (values, color) in enumerate(zip(data, colors, strict=False), start=1):
            jitter = rng.uniform(-0.12, 0.12, len(values))
            axes.scatter(index + jitter, values, s=7, color=color, zorder=3)
            median = float(np.median(values))
            axes.plot([index - 0.3, index + 0.3], [median, median], color="#222222", linewidth=1.4)
            axes.annotate(f"{median:.3g} µs", xy=(index + 0.32, median), va="center", fontsize=7)
        axes.set_xticks(range(1, len(names) + 1), names)
        axes.set_xlim(0.4, len(names) + 0.9)
        axes.set_title(str(key), fontsize=9)
        axes.set_gid(element_id("samples", key))
        axes.set_ylim(bottom=0)
    panels[0].set_ylabel("time per call (µs)")
    figure.suptitle("Samples: per-call time of each sample", fontsize=10, fontweight="bold")
    caption = f"Every sample from {path.name}; the line is the median."
    return Plot(figure, caption)


PLOTS = (
    PlotSpec("bench-forest", "change per shape against the threshold", ("shape", "summary"), forest),
    PlotSpec("bench-op-diff", "op diff", ("op_diff",), op_diff),
    PlotSpec("bench-samples", "sample distributions", (), samples),
)
