"""diff plots: where the error starts, how it grows, which module adds it, which knob closes it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from glmfb.report.plots._base import (
    BASELINE_COLOR,
    CANDIDATE_COLOR,
    FAIL_COLOR,
    MUTED_COLOR,
    PASS_COLOR,
    NoData,
    Plot,
    PlotSpec,
    VerdictView,
    at_least_a_decade,
    element_id,
    new_axes,
    number,
    numbers,
    short,
)

MAX_MODULE_BARS = 24


def error_by_position(view: VerdictView) -> Plot:
    """Relative L2 error along the token positions of the worst request, with the first
    position outside tolerance marked."""
    item = view.require("error_by_position")
    # Bin centres are 1-based in the evidence; positions in ``where`` are 0-based indices.
    pairs = [
        (x - 1.0, y)
        for x, y in zip(numbers(item.get("positions")), numbers(item.get("rel_l2")), strict=False)
        if x is not None and y is not None
    ]
    if not pairs:
        raise NoData("the error_by_position evidence holds no finite points")
    xs = [p[0] for p in pairs]
    ys = [p[1] for p in pairs]
    tap = str(item.get("tap") or "")
    own = bool(item.get("local"))
    figure, axes = new_axes(6.4, 3.0)
    axes.plot(xs, ys, color=CANDIDATE_COLOR, marker="o", markersize=3, linewidth=1.4,
              label=f"{'own error of' if own else 'error at'} {short(tap, 40)}", gid="error-by-position")
    if all(y > 0 for y in ys):
        axes.set_yscale("log")
        at_least_a_decade(axes, ys)
    first = item.get("first_failing_position")
    caption = f"Relative L2 error per token position of request {item.get('request')} at {tap}"
    caption += " (the module run on the baseline's inputs)." if own else "."
    if isinstance(first, int) and not isinstance(first, bool):
        axes.axvline(first, color=FAIL_COLOR, linestyle="--", linewidth=1.4,
                     label=f"first failing position: {first}", gid="first-failing-position")
        axes.annotate(f"first failing\nposition {first}", xy=(first, 1.0), xycoords=("data", "axes fraction"),
                      xytext=(4, -4), textcoords="offset points", va="top", color=FAIL_COLOR, fontsize=8)
        failing = item.get("failing_positions")
        caption += f" First position outside tolerance: {first}"
        caption += f"; {failing} positions fail." if failing is not None else "."
    else:
        caption += " No position is outside tolerance."
    axes.set_xlabel("token position (averaged over equal bins)")
    axes.set_ylabel("relative L2 error")
    axes.set_title(f"Error by position: {short(tap, 48)}")
    span = max(xs) - min(0.0, min(xs))
    axes.set_xlim(min(0.0, min(xs)) - 0.02 * span, max(xs) + 0.02 * span)  # a mark at 0 stays visible
    axes.legend(loc="lower right")
    return Plot(figure, caption)


def _fit_points(view: VerdictView) -> tuple[str, list[float], list[float], Mapping[str, Any] | None]:
    shape = view.first("error_shape")
    fit = shape.get("fit") if shape is not None else None
    if isinstance(fit, Mapping):
        pairs = [
            (x, y)
            for x, y in zip(numbers(fit.get("lengths")), numbers(fit.get("errors")), strict=False)
            if x is not None and y is not None
        ]
        if pairs:
            return str(fit.get("basis") or "requests"), [p[0] for p in pairs], [p[1] for p in pairs], fit
    requests = view.first("requests")
    rows = requests.get("rows") if requests is not None else None
    pairs = []
    for row in rows or []:
        x, y = number(row.get("length")), number(row.get("output_rel_l2"))
        if x is not None and y is not None:
            pairs.append((x, y))
    if not pairs:
        raise NoData("the verdict has neither a growth fit nor requests with lengths")
    return "requests", [p[0] for p in pairs], [p[1] for p in pairs], None


def _power_law(xs: Sequence[float], ys: Sequence[float], exponent: float) -> tuple[float, float] | None:
    """The prefactor of ``y = a x^k`` for the evidence's exponent ``k``: the least-squares
    line in log-log space passes through the mean of the points, so ``log a`` follows."""
    logs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=False) if x > 0 and y > 0]
    if len(logs) < 2:
        return None
    mean_x = sum(p[0] for p in logs) / len(logs)
    mean_y = sum(p[1] for p in logs) / len(logs)
    return math.exp(mean_y - exponent * mean_x), exponent


def error_growth(view: VerdictView) -> Plot:
    """Output error against context length (per request), with the fitted power law."""
    basis, xs, ys, fit = _fit_points(view)
    shape = view.first("error_shape")
    shape_name = str(shape.get("shape")) if shape is not None else "unknown"
    status_by_length: dict[float, str] = {}
    requests = view.first("requests")
    for row in (requests.get("rows") if requests is not None else None) or []:
        length = number(row.get("length"))
        if length is not None:
            status_by_length[length] = str(row.get("status"))
    figure, axes = new_axes(6.4, 3.0)
    log_axes = all(x > 0 for x in xs) and all(y > 0 for y in ys)
    if basis == "requests":
        for label, wanted, color in (("request passes", "pass", PASS_COLOR), ("request fails", "fail", FAIL_COLOR),
                                     ("request", None, CANDIDATE_COLOR)):
            points = [(x, y) for x, y in zip(xs, ys, strict=False)
                      if (status_by_length.get(x) == wanted if wanted else status_by_length.get(x) not in ("pass", "fail"))]
            if points:
                axes.scatter([p[0] for p in points], [p[1] for p in points], color=color, s=28, zorder=3, label=label,
                             gid=element_id("requests", wanted or "other"))
    else:
        axes.plot(xs, ys, color=CANDIDATE_COLOR, marker="o", markersize=3, linewidth=1.0, label="error by position")
    caption = f"Error shape: {shape_name}."
    exponent = number(fit.get("loglog_exponent")) if fit is not None else None
    if fit is not None and exponent is not None and log_axes:
        law = _power_law(xs, ys, exponent)
        if law is not None:
            prefactor, k = law
            grid = [min(xs) * (max(xs) / min(xs)) ** (i / 50) for i in range(51)]
            r2 = number(fit.get("loglog_r2"))
            axes.plot(grid, [prefactor * g**k for g in grid], color=BASELINE_COLOR, linestyle="--", linewidth=1.3,
                      gid="growth-fit",
                      label=f"fit: error ∝ length^{k:.2f}" + (f" (r² {r2:.2f})" if r2 is not None else ""))
            caption += f" Fitted growth: error ∝ length^{k:.2f}" + (f", log-log r² {r2:.2f}." if r2 is not None else ".")
    elif not any(y > 0 for y in ys):
        axes.annotate("zero error at every length", xy=(0.5, 0.6), xycoords="axes fraction", ha="center",
                      color=PASS_COLOR, fontsize=10)
        axes.set_ylim(-0.1, 1.0)
        axes.set_yticks([0.0], ["0"])
        caption += " Every request matches exactly."
    if log_axes:
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        at_least_a_decade(axes, ys)
    unit = "context length (tokens)" if basis == "requests" else "token position"
    axes.set_xlabel(unit)
    axes.set_ylabel("relative L2 error of the outputs")
    axes.set_title(f"Error against context length: {shape_name}")
    axes.legend(loc="upper left")
    return Plot(figure, caption)


def module_errors(view: VerdictView) -> Plot:
    """Per module: the error it adds by itself (run on the baseline's inputs) against the error
    it shows in the captures (own plus inherited from the modules before it)."""
    local = view.first("local_error")
    culprit = str(view.where.get("module") or "")
    labels: list[str] = []
    own: list[float | None] = []
    total: list[float | None] = []
    failed: list[bool] = []
    if local is not None and local.get("rows"):
        for row in local["rows"][:MAX_MODULE_BARS]:
            call = row.get("call")
            label = str(row.get("module") or row.get("tap"))
            labels.append(label if not call else f"{label}#{call}")
            own.append(number(row.get("local_rel_l2")))
            total.append(number(row.get("total_rel_l2")))
            failed.append(bool(row.get("local_exceeds_tolerance")))
        source = f"request {local.get('request')}"
    else:
        modules = view.first("modules")
        rows = [r for r in (modules.get("rows") if modules is not None else None) or []
                if (number(r.get("rel_l2")) or 0.0) > 0]
        if not rows:
            raise NoData("no module shows any error" if modules is not None else "the verdict has no modules evidence")
        for row in rows[:MAX_MODULE_BARS]:
            labels.append(str(row.get("tap")))
            own.append(None)
            total.append(number(row.get("rel_l2")))
            failed.append(row.get("status") == "fail")
        source = f"request {modules.get('request') if modules is not None else '?'}"
    positive = [v for v in [*own, *total] if v is not None and v > 0]
    if not positive:
        raise NoData("every module's error is zero")
    floor = min(positive) / 4
    height_in = max(2.4, 0.8 + 0.24 * len(labels))
    figure, axes = new_axes(6.8, height_in)
    ys = list(range(len(labels)))
    has_own = any(v is not None for v in own)
    bar = 0.38 if has_own else 0.6
    bars = axes.barh([y + (bar / 2 if has_own else 0) for y in ys], [t if t and t > 0 else 0 for t in total],
                     height=bar, color=BASELINE_COLOR, label="in the captures (own + inherited)", left=0)
    for patch, label in zip(bars, labels, strict=False):
        patch.set_gid(element_id("total", label))
    if has_own:
        own_bars = axes.barh([y - bar / 2 for y in ys], [o if o and o > 0 else 0 for o in own], height=bar,
                             color=[FAIL_COLOR if f else CANDIDATE_COLOR for f in failed],
                             label="own (run on the baseline's inputs)")
        for patch, label in zip(own_bars, labels, strict=False):
            patch.set_gid(element_id("own", label))
        for y, value in zip(ys, own, strict=False):
            if value is not None and value <= 0:
                axes.annotate("own 0", xy=(floor, y - bar / 2), va="center", fontsize=7, color=MUTED_COLOR,
                              xytext=(2, 0), textcoords="offset points")
    axes.set_xscale("log")
    axes.set_xlim(left=floor)
    axes.set_yticks(ys, [short(label) for label in labels])
    for tick, label, is_failed in zip(axes.get_yticklabels(), labels, failed, strict=False):
        if label == culprit:
            tick.set_fontweight("bold")
            tick.set_color(FAIL_COLOR)
        elif is_failed and not has_own:
            tick.set_color(FAIL_COLOR)
    axes.invert_yaxis()
    axes.set_xlabel("relative L2 error (log scale)")
    axes.set_title("Error by module: own against inherited" if has_own else "Error by module")
    figure.legend(loc="outside lower center", ncol=2)
    caption = f"Modules of {source} in execution order."
    if has_own:
        starts = [label for label, is_failed in zip(labels, failed, strict=False) if is_failed]
        caption += (" Red: the module's own error exceeds tolerance" + (f" ({', '.join(starts[:3])})" if starts else "")
                    + "; a long blue bar with a short own bar is error inherited from upstream.")
    if culprit:
        caption += f" The verdict names {culprit} (bold)."
    return Plot(figure, caption)


def counterfactuals(view: VerdictView) -> Plot:
    """The candidate rerun with each alternative value of a precision knob: the error each
    leaves, and which one closes the gap.

    Reads ``counterfactual`` evidence: ``knob``, ``candidate_value``, ``candidate_rel_l2``,
    ``results`` (each ``value``, ``rel_l2``, ``failed``, optional ``lengths`` and ``errors``),
    ``closes`` (the value that passes) — see the report's notes on evidence fields.
    """
    items = view.evidence("counterfactual")
    if not items:
        raise NoData("the verdict has no counterfactual evidence")
    item = items[0]
    knob = str(item.get("knob") or "knob")
    results = [r for r in item.get("results") or [] if isinstance(r, Mapping)]
    if not results:
        raise NoData("the counterfactual evidence lists no results")
    closes = item.get("closes")
    by_length = all(r.get("lengths") and r.get("errors") for r in results)
    figure, axes = new_axes(6.4, 3.0)
    if by_length:
        for result in results:
            pairs = [(x, y) for x, y in zip(numbers(result.get("lengths")), numbers(result.get("errors")), strict=False)
                     if x is not None and y is not None and x > 0 and y > 0]
            value = str(result.get("value"))
            color = PASS_COLOR if value == closes else (FAIL_COLOR if result.get("failed") else BASELINE_COLOR)
            axes.plot([p[0] for p in pairs], [p[1] for p in pairs], marker="o", markersize=3, color=color,
                      gid=element_id("counterfactual", value),
                      label=f"{knob}={value}" + (" (closes the gap)" if value == closes else ""))
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("context length (tokens)")
    else:
        names = []
        values = []
        colors = []
        reference = number(item.get("candidate_rel_l2"))
        if reference is not None:
            names.append(f"{item.get('candidate_value', 'candidate')} (as run)")
            values.append(reference)
            colors.append(FAIL_COLOR)
        for result in results:
            value = str(result.get("value"))
            names.append(value)
            values.append(number(result.get("rel_l2")) or 0.0)
            colors.append(PASS_COLOR if value == closes else (FAIL_COLOR if result.get("failed") else BASELINE_COLOR))
        for patch, name in zip(axes.bar(range(len(names)), values, color=colors), names, strict=False):
            patch.set_gid(element_id("counterfactual", name))
        axes.set_xticks(range(len(names)), names)
        if all(v > 0 for v in values):
            axes.set_yscale("log")
        axes.set_xlabel(knob)
    axes.set_ylabel("relative L2 error of the outputs")
    axes.set_title(f"Counterfactual: {knob}")
    if by_length:
        axes.legend(loc="upper left")
    caption = f"The candidate rerun with each value of {knob}."
    caption += f" {knob}={closes} closes the gap." if closes else " No value closes the gap."
    return Plot(figure, caption)


PLOTS = (
    PlotSpec("diff-error-by-position", "error by position", ("error_by_position",), error_by_position),
    PlotSpec("diff-error-growth", "error against context length", ("error_shape", "requests"), error_growth),
    PlotSpec("diff-module-errors", "own against inherited error by module", ("local_error", "modules"), module_errors),
    PlotSpec("diff-counterfactual", "counterfactual precision", ("counterfactual",), counterfactuals,
             optional=True),
)
