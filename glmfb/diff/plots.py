"""diff plots: where the error starts, how it grows, which module adds it, which knob closes it."""

from __future__ import annotations

import math
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
    at_least_a_decade,
    element_id,
    new_axes,
    number,
    numbers,
    short,
)

MAX_MODULE_BARS = 24


def _position_points(item: Mapping[str, Any]) -> tuple[list[float], list[float], list[tuple[int, int, float]]]:
    """0-based bin centres, errors, and the bins with elements outside tolerance (start, end,
    fraction). ``bin_edges`` (0-based) is used when the evidence has it; older evidence has
    only 1-based bin centres."""
    rel = numbers(item.get("rel_l2"))
    edges = [int(e) for e in numbers(item.get("bin_edges")) if e is not None]
    fractions = numbers(item.get("outside_fraction"))
    if len(edges) == len(rel) + 1 and rel:
        xs, ys, failing = [], [], []
        for index, y in enumerate(rel):
            start, end = edges[index], edges[index + 1]
            if y is not None:
                xs.append((start + end - 1) / 2)
                ys.append(y)
            fraction = fractions[index] if index < len(fractions) else None
            if fraction is not None and fraction > 0:
                failing.append((start, end, fraction))
        return xs, ys, failing
    # Bin centres are 1-based in older evidence; positions in ``where`` are 0-based indices.
    pairs = [(x - 1.0, y) for x, y in zip(numbers(item.get("positions")), rel, strict=False)
             if x is not None and y is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs], []


def error_by_position(view: VerdictView) -> Plot:
    """Relative L2 error along the token positions of the worst request, with the first
    position outside tolerance marked and the bins with elements outside tolerance shaded."""
    item = view.require("error_by_position")
    xs, ys, failing = _position_points(item)
    if not xs:
        raise NoData("the error_by_position evidence holds no finite points")
    tap = str(item.get("tap") or "")
    own = bool(item.get("local"))
    figure, axes = new_axes(6.4, 3.0)
    axes.plot(xs, ys, color=CANDIDATE_COLOR, marker="o", markersize=3, linewidth=1.4,
              label=f"{'own error of' if own else 'error at'} {short(tap, 40)}", gid="error-by-position")
    for index, (start, end, _) in enumerate(failing):
        axes.axvspan(start - 0.5, end - 0.5, color=FAIL_COLOR, alpha=0.08, linewidth=0,
                     gid=element_id("outside-tolerance", index),
                     label="elements outside tolerance" if index == 0 else None)
    if all(y > 0 for y in ys):
        axes.set_yscale("log")
        at_least_a_decade(axes, ys)
    first = item.get("first_failing_position")
    length = item.get("length")
    caption = f"Relative L2 error per token position of request {item.get('request')}"
    caption += f" ({length} positions)" if isinstance(length, int) and not isinstance(length, bool) else ""
    caption += f" at {tap}"
    caption += " (the module run on the baseline's inputs)." if own else "."
    if isinstance(first, int) and not isinstance(first, bool):
        axes.axvline(first, color=FAIL_COLOR, linestyle="--", linewidth=1.4,
                     label=f"first failing position: {first}", gid="first-failing-position")
        axes.annotate(f"first failing\nposition {first}", xy=(first, 1.0), xycoords=("data", "axes fraction"),
                      xytext=(4, -4), textcoords="offset points", va="top", color=FAIL_COLOR, fontsize=8)
        failing_count = item.get("failing_positions")
        caption += f" First position outside tolerance: {first}"
        caption += f"; {failing_count} positions fail." if failing_count is not None else "."
    else:
        caption += " No position is outside tolerance."
    if failing:
        caption += " Shaded: bins with elements outside tolerance."
    axes.set_xlabel("token position (0-based, averaged over equal bins)")
    axes.set_ylabel("relative L2 error")
    axes.set_title(f"Error by position: {short(tap, 48)}")
    span = max(xs) - min(0.0, min(xs))
    axes.set_xlim(min(0.0, min(xs)) - 0.02 * span - 0.5, max(xs) + 0.02 * span + 0.5)  # a mark at 0 stays visible
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
        intercept = number(fit.get("loglog_intercept"))
        law = (math.exp(intercept), exponent) if intercept is not None else _power_law(xs, ys, exponent)
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
    inherited: list[float | None] = []
    failed: list[bool] = []
    if local is not None and local.get("rows"):
        for row in local["rows"][:MAX_MODULE_BARS]:
            call = row.get("call")
            label = str(row.get("module") or row.get("tap"))
            labels.append(label if not call else f"{label}#{call}")
            own.append(number(row.get("local_rel_l2")))
            total.append(number(row.get("total_rel_l2")))
            inherited.append(number(row.get("inherited_rel_l2")))
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
            inherited.append(None)
            failed.append(row.get("status") == "fail")
        source = f"request {modules.get('request') if modules is not None else '?'}"
    positive = [v for v in [*own, *total, *inherited] if v is not None and v > 0]
    if not positive:
        raise NoData("every module's error is zero")
    floor = min(positive) / 4
    height_in = max(2.4, 0.8 + 0.24 * len(labels))
    figure, axes = new_axes(6.8, height_in)
    ys = list(range(len(labels)))
    has_own = any(v is not None for v in own)
    has_inherited = any(v is not None for v in inherited)
    bar = (0.27 if has_inherited else 0.38) if has_own else 0.6
    total_offset = bar if has_inherited else (bar / 2 if has_own else 0)
    bars = axes.barh([y + total_offset for y in ys], [t if t and t > 0 else 0 for t in total],
                     height=bar, color=BASELINE_COLOR, label="in the captures (own + inherited)", left=0)
    for patch, label in zip(bars, labels, strict=False):
        patch.set_gid(element_id("total", label))
    if has_inherited:
        inherited_bars = axes.barh(ys, [v if v and v > 0 else 0 for v in inherited], height=bar, color=MUTED_COLOR,
                                   label="at its inputs (inherited, measured)")
        for patch, label in zip(inherited_bars, labels, strict=False):
            patch.set_gid(element_id("inherited", label))
    if has_own:
        own_offset = -bar if has_inherited else -bar / 2
        own_bars = axes.barh([y + own_offset for y in ys], [o if o and o > 0 else 0 for o in own], height=bar,
                             color=[FAIL_COLOR if f else CANDIDATE_COLOR for f in failed],
                             label="own (run on the baseline's inputs)")
        for patch, label in zip(own_bars, labels, strict=False):
            patch.set_gid(element_id("own", label))
        for y, value in zip(ys, own, strict=False):
            if value is not None and value <= 0:
                axes.annotate("own 0", xy=(floor, y + own_offset), va="center", fontsize=7, color=MUTED_COLOR,
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
    figure.legend(loc="outside lower center", ncol=3 if has_inherited else 2)
    caption = f"Modules of {source} in execution order."
    if has_own:
        starts = [label for label, is_failed in zip(labels, failed, strict=False) if is_failed]
        caption += (" Red: the module's own error exceeds tolerance" + (f" ({', '.join(starts[:3])})" if starts else "")
                    + "; a long blue bar with a short own bar is error inherited from upstream"
                    + (", and the grey bar is the error measured at the module's inputs." if has_inherited else "."))
    if culprit:
        caption += f" The verdict names {culprit} (bold)."
    return Plot(figure, caption)


def counterfactuals(view: VerdictView) -> Plot:
    """The candidate rerun with each alternative value of a precision knob: the error each
    leaves, and which one closes the gap.

    Reads ``counterfactual`` evidence: ``knob``, ``candidate_value``, ``candidate_rel_l2``,
    ``results`` (each ``value``, ``rel_l2``, ``failed``, optional ``lengths`` and ``errors``,
    ``tried`` and ``note``), ``closes`` (the value that passes) — see the report's notes on
    evidence fields. Values that were not tried (torch's switch on a CPU candidate) are named
    in the caption, not drawn as zero.
    """
    items = view.evidence("counterfactual")
    if not items:
        raise NoData("the verdict has no counterfactual evidence")
    item = items[0]
    knob = str(item.get("knob") or "knob")
    results = [r for r in item.get("results") or [] if isinstance(r, Mapping)]
    if not results:
        raise NoData("the counterfactual evidence lists no results")
    tried = [r for r in results if r.get("tried", True) is not False and number(r.get("rel_l2")) is not None]
    untried = [r for r in results if r not in tried]
    closes_raw = item.get("closes")
    closes = None if closes_raw is None else _shown(closes_raw)
    by_length = bool(tried) and all(r.get("lengths") and r.get("errors") for r in tried)
    figure, axes = new_axes(6.4, 3.0)
    if by_length:
        positive = [y for r in tried for y in numbers(r.get("errors")) if y is not None and y > 0]
        floor = min(positive) / 10 if positive else 1e-12
        for result in tried:
            pairs = [(x, y) for x, y in zip(numbers(result.get("lengths")), numbers(result.get("errors")), strict=False)
                     if x is not None and y is not None and x > 0]
            value = _shown(result.get("value"))
            color = PASS_COLOR if value == closes else (FAIL_COLOR if result.get("failed") else BASELINE_COLOR)
            zero = bool(pairs) and all(p[1] <= 0 for p in pairs)
            axes.plot([p[0] for p in pairs], [p[1] if p[1] > 0 else floor for p in pairs],
                      marker="v" if zero else "o", markersize=3, color=color, gid=element_id("counterfactual", value),
                      label=f"{knob}={value}" + (" (zero error)" if zero else "")
                      + (" (closes the gap)" if value == closes else ""))
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("context length (tokens)")
    else:
        names = []
        values = []
        colors = []
        reference = number(item.get("candidate_rel_l2"))
        if reference is not None:
            names.append(f"{_shown(item.get('candidate_value', 'candidate'))} (as run)")
            values.append(reference)
            colors.append(FAIL_COLOR)
        for result in tried:
            value = _shown(result.get("value"))
            names.append(value)
            values.append(number(result.get("rel_l2")) or 0.0)
            colors.append(PASS_COLOR if value == closes else (FAIL_COLOR if result.get("failed") else BASELINE_COLOR))
        for patch, name in zip(axes.bar(range(len(names)), values, color=colors), names, strict=False):
            patch.set_gid(element_id("counterfactual", name))
        axes.set_xticks(range(len(names)), names)
        if values and all(v > 0 for v in values):
            axes.set_yscale("log")
        axes.set_xlabel(knob)
    axes.set_ylabel("relative L2 error of the outputs")
    axes.set_title(f"Counterfactual: {knob}")
    if by_length:
        axes.legend(loc="upper left")
    caption = f"The candidate rerun with each value of {knob}."
    caption += f" {knob}={closes} closes the gap." if closes else " No value closes the gap."
    if untried:
        caption += " Not tried: " + "; ".join(
            f"{_shown(r.get('value'))}" + (f" ({r.get('note')})" if r.get("note") else "") for r in untried) + "."
    if len(items) > 1:
        caption += f" {len(items) - 1} more knobs are in the evidence."
    return Plot(figure, caption)


def _shown(value: Any) -> str:
    """A knob's value as the verdict writes it (JSON booleans as true / false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def serving_requests(view: VerdictView) -> Plot:
    """Two servers, per request: the largest difference of the chosen token's logprob before the
    outputs part, against the tolerance; a request that parts (or drifts) in red, at a tie flip grey."""
    item = view.require("serving_requests")
    rows = [r for r in item.get("rows") or [] if isinstance(r, Mapping)]
    if not rows:
        raise NoData("the serving_requests evidence holds no request")
    metric = view.data.get("metric") or {}
    tolerance = number(metric.get("threshold")) if isinstance(metric, Mapping) else None
    names = [short(str(r.get("request")), 18) for r in rows]
    values = [abs(number(r.get("logprob_diff_max")) or 0.0) for r in rows]
    colors = [FAIL_COLOR if r.get("status") in ("diverged", "drift") else MUTED_COLOR if r.get("status") == "tie"
              else PASS_COLOR for r in rows]
    figure, axes = new_axes(6.4, 3.0)
    for index, (patch, row) in enumerate(zip(axes.bar(range(len(rows)), values, color=colors), rows, strict=False)):
        patch.set_gid(element_id("serving-request", row.get("request") or index))
    if tolerance is not None:
        axes.axhline(tolerance, color=FAIL_COLOR, linestyle="--", linewidth=1.2, label=f"tolerance {tolerance:g} nats")
        axes.legend(loc="upper right")
    axes.set_xticks(range(len(rows)), names, rotation=30 if len(rows) > 6 else 0, ha="right" if len(rows) > 6 else "center")
    axes.set_ylabel("largest |logprob diff| (nats)")
    axes.set_title("Chosen token's logprob, baseline against candidate")
    parted = [r for r in rows if r.get("first_divergent") is not None]
    caption = (f"Per request ({len(rows)}), the largest difference of the chosen token's logprob over the tokens both "
               "servers generated alike, before their outputs part.")
    if parted:
        caption += " Parted: " + "; ".join(
            f"{r.get('request')} at token {r.get('first_divergent')} ({r.get('status')})" for r in parted[:6]) + "."
    else:
        caption += " No request's outputs part."
    return Plot(figure, caption)


def serving_drift(view: VerdictView) -> Plot:
    """Before two servers part: per position, the chosen token's logprob difference and the KL of
    the top-k distributions on their shared support, with the first divergent position marked."""
    item = view.require("serving_drift")
    rows = [r for r in item.get("rows") or [] if isinstance(r, Mapping)]
    positions = [number(r.get("position")) for r in rows]
    diffs = [number(r.get("logprob_diff")) for r in rows]
    kls = [number(r.get("kl_shared")) for r in rows]
    figure, axes = new_axes(6.4, 3.0)
    points = [(x, y) for x, y in zip(positions, diffs, strict=False) if x is not None and y is not None]
    kl_points = [(x, y) for x, y in zip(positions, kls, strict=False) if x is not None and y is not None]
    if points:
        axes.plot([x for x, _ in points], [y for _, y in points], color=CANDIDATE_COLOR, marker="o", markersize=3,
                  linewidth=1.4, label="logprob diff (candidate - baseline)", gid="serving-logprob-diff")
    if kl_points:
        axes.plot([x for x, _ in kl_points], [y for _, y in kl_points], color=BASELINE_COLOR, marker="s",
                  markersize=3, linewidth=1.0, label="KL on the shared top-k", gid="serving-kl")
    divergence = view.first("serving_divergence")
    request = item.get("request")
    caption = f"Request {request}: each token both servers generated alike"
    if divergence is not None and divergence.get("request") == request:
        at = number(divergence.get("position"))
        if at is not None:
            axes.axvline(at, color=FAIL_COLOR, linestyle="--", linewidth=1.4, label="first divergent token",
                         gid="serving-divergence")
            caption += (f", up to token {int(at)}, where the baseline generated {divergence.get('baseline_token')!r}"
                        f" and the candidate {divergence.get('candidate_token')!r}")
    if not points and not kl_points and divergence is None:
        raise NoData("the serving_drift evidence holds no position")
    from matplotlib.ticker import MaxNLocator

    axes.axhline(0.0, color=MUTED_COLOR, linewidth=0.8)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # token positions
    axes.set_xlabel("generated token")
    axes.set_ylabel("nats")
    axes.set_title("How the distributions drifted before the outputs part")
    axes.legend(loc="best")
    return Plot(figure, caption + ".")


PLOTS = (
    PlotSpec("diff-error-by-position", "error by position", ("error_by_position",), error_by_position),
    PlotSpec("diff-error-growth", "error against context length", ("error_shape", "requests"), error_growth),
    PlotSpec("diff-module-errors", "own against inherited error by module", ("local_error", "modules"), module_errors),
    PlotSpec("diff-counterfactual", "counterfactual precision", ("counterfactual",), counterfactuals,
             optional=True),
    PlotSpec("diff-serving-requests", "two servers, per request", ("serving_requests",), serving_requests,
             optional=True),
    PlotSpec("diff-serving-drift", "drift before the outputs part", ("serving_drift", "serving_divergence"),
             serving_drift, optional=True),
)
