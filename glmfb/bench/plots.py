"""bench plots: which shape changed by how much (and how sure), which ops account for it, and
what the samples looked like."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from glmfb.core.plotting import (
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
QUANTILES = (0, 5, 25, 50, 75, 95, 100)  # the percentiles in a shape's quantiles_s


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


MAX_OP_ROWS = 12
ONLY_IN = {"candidate": "only in candidate", "baseline": "only in baseline"}


def _op_rows(ops: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The operators that added the most time, then those only the baseline runs (the ones
    the candidate lost), at most :data:`MAX_OP_ROWS`."""
    removed = [op for op in ops if op.get("only_in") == "baseline"]
    removed.sort(key=lambda op: -(number(op.get("baseline_self_us")) or 0.0))
    kept_removed = removed[: max(0, min(3, MAX_OP_ROWS // 4))]
    rest = [op for op in ops if op not in kept_removed][: MAX_OP_ROWS - len(kept_removed)]
    return rest + kept_removed


def _op_label(op: Mapping[str, Any]) -> str:
    notes = [ONLY_IN[str(op["only_in"])]] if op.get("only_in") in ONLY_IN else []
    if op.get("reduction"):
        notes.append("reduction")
    return str(op.get("op")) + (f"  ({', '.join(notes)})" if notes else "")


def op_diff(view: VerdictView) -> Plot:
    """The profiled ops of both sides: calls and self time per kernel call, the operators only
    one side runs marked."""
    item = view.require("op_diff")
    all_ops = [op for op in item.get("ops") or [] if isinstance(op, Mapping)]
    if not all_ops:
        raise NoData("the op diff lists no ops")
    ops = _op_rows(all_ops)
    labels = [_op_label(op) for op in ops]
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
    calls_axes.set_yticks(ys, [short(label, 40) for label in labels])
    for tick, op in zip(calls_axes.get_yticklabels(), ops, strict=False):
        if op.get("reduction"):
            tick.set_fontweight("bold")
        if op.get("only_in") == "candidate":
            tick.set_color(CANDIDATE_COLOR)
        elif op.get("only_in") == "baseline":
            tick.set_color(BASELINE_COLOR)
    calls_axes.invert_yaxis()
    time_axes.legend(loc="lower right")
    rule = item.get("rule")
    figure.suptitle(f"Op diff on {item.get('shape')}" + (f": {rule}" if rule else ""), fontsize=10, fontweight="bold")
    caption = f"Profiled over {item.get('profiled_calls')} calls a side, ops ranked by the time they add."
    if len(ops) < len(all_ops):
        caption += f" {len(ops)} of {len(all_ops)} ops shown."
    for side in ("candidate", "baseline"):
        names = [str(name) for name in item.get(f"only_in_{side}") or []]
        share = number(item.get(f"only_in_{side}_share"))
        if names:
            caption += (f" Only in the {side}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                        + (f" ({percent(share, 0)} of the added time)." if share is not None else "."))
    repeated_inputs = [str(name) for name in item.get("repeated_inputs") or []]
    share = number(item.get("repeated_inputs_share"))
    if repeated_inputs and share is not None:
        caption += (f" Called as often again on the same inputs: {', '.join(repeated_inputs[:4])} "
                    f"({percent(share, 0)} of the added time).")
    repeated = item.get("repeated_reductions") or []
    if repeated:
        caption += f" Repeated reductions (bold): {', '.join(map(str, repeated))}."
    return Plot(figure, caption)


def _quantile_panels(view: VerdictView) -> list[tuple[str, dict[str, list[float]]]]:
    """Each shape's per-side quantiles from its ``shape`` evidence (``quantiles_s``)."""
    panels = []
    for item in view.evidence("shape"):
        quantiles = item.get("quantiles_s")
        if not isinstance(quantiles, Mapping):
            continue
        sides = {}
        for side in ("baseline", "candidate"):
            values = [number(v) for v in quantiles.get(side) or []]
            if len(values) == len(QUANTILES) and all(v is not None for v in values):
                sides[side] = [float(v) * 1e6 for v in values if v is not None]
        if sides:
            panels.append((str(item.get("shape")), sides))
    return panels[:MAX_SAMPLE_PANELS]


def _quantiles(view: VerdictView, why: str) -> Plot:
    """The sample distributions drawn from the quantiles in the verdict (no samples file)."""
    panels = _quantile_panels(view)
    if not panels:
        raise NoData(why)
    figure = new_figure(min(7.2, 2.6 + 2.2 * len(panels)), 3.0)
    axes_row = figure.subplots(1, len(panels), squeeze=False)[0]
    for axes, (key, sides) in zip(axes_row, panels, strict=False):
        names = list(sides)
        stats = [{"whislo": q[1], "q1": q[2], "med": q[3], "q3": q[4], "whishi": q[5], "fliers": [q[0], q[6]],
                  "label": side} for side, q in sides.items()]
        parts = axes.bxp(stats, patch_artist=True, widths=0.5)
        for body, side in zip(parts["boxes"], names, strict=False):
            body.set_facecolor(BASELINE_COLOR if side == "baseline" else CANDIDATE_COLOR)
            body.set_alpha(0.45)
        for index, side in enumerate(names, start=1):
            median = sides[side][3]
            axes.annotate(f"{median:.3g} µs", xy=(index + 0.3, median), va="center", fontsize=7)
        axes.set_xlim(0.4, len(names) + 0.9)
        axes.set_title(key, fontsize=9)
        axes.set_gid(element_id("quantiles", key))
        axes.set_ylim(bottom=0)
    axes_row[0].set_ylabel("time per call (µs)")
    figure.suptitle("Samples: per-call time of each sample", fontsize=10, fontweight="bold")
    caption = ("From the quantiles in the verdict (no samples file): the box spans the 25th to 75th percentile, "
               "the whiskers the 5th to 95th, the dots the fastest and slowest sample.")
    return Plot(figure, caption)


def samples(view: VerdictView) -> Plot:
    """Per-call time of every sample, both sides, one panel per shape (from the saved
    samples file, else from the quantiles each ``shape`` evidence carries)."""
    path = view.artifact("samples")
    if path is None:
        return _quantiles(view, "no samples artifact (the probe saves one unless save = false)")
    document = json.loads(path.read_text(encoding="utf-8"))
    shapes = document.get("shapes") if isinstance(document, Mapping) else None
    if not isinstance(shapes, Mapping) or not shapes:
        return _quantiles(view, f"{path.name} holds no samples")
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
