"""gap plots: where the iteration's time went on each side, the gap against the threshold, and
the transfer's bandwidth against what the path moves alone."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from itertools import combinations

from glmfb.core.plotting import (
    BAND_COLOR,
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
    interval,
    new_axes,
    number,
    percent,
)

PHASE_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3", "#ccb974", "#64b5cd")
# Phases whose medians add up to more than this share of a side's iteration median overlap.
OVERLAP_TOLERANCE = 1.05


def _seconds(value: object) -> float:
    number_value = number(value)
    return number_value if number_value is not None else 0.0


def _order(phase: Mapping[str, object]) -> float:
    value = number(phase.get("order"))
    return value if value is not None else float("inf")


def stacked_phases(phases: Sequence[Mapping[str, object]], totals: Sequence[float | None]) -> tuple[list[str], list[str]]:
    """Split the critical-path phases into those that tile the iteration (stacked) and those
    nested in them (a target may time ``dispatch_s`` inside ``prefill_s``).

    A phase with a ``within`` field is nested by declaration. Otherwise the stack is the
    largest set of phases whose medians add up to no more than each side's iteration median
    (within 5%); the rest overlap it.
    """
    names = [str(p.get("phase")) for p in phases]
    declared = [str(p.get("phase")) for p in phases if p.get("within")]
    if declared:
        return [n for n in names if n not in declared], declared
    known = [t for t in totals if t is not None and t > 0]
    if not known:
        return names, []
    for size in range(len(phases), 0, -1):
        fitting = []
        for subset in combinations(range(len(phases)), size):
            sums = [sum(_seconds(phases[i].get(key)) for i in subset) for key in ("baseline_s", "candidate_s")]
            if all(total is None or s <= total * OVERLAP_TOLERANCE for s, total in zip(sums, totals, strict=False)):
                fitting.append((sum(sums), subset))
        if fitting:
            _, best = max(fitting)
            chosen = [names[i] for i in best]
            return chosen, [n for n in names if n not in chosen]
    return [], names


def phases(view: VerdictView) -> Plot:
    """Per side, the iteration split into its phases (stacked), phases nested in them and the
    concurrent transfer thread's busy time drawn thin below."""
    items = view.evidence("phase")
    if not items:
        raise NoData("the verdict has no phase evidence (the target returns no phase timings)")
    gap = view.first("gap")
    totals = [number(gap.get("baseline_median_s")), number(gap.get("candidate_median_s"))] if gap else [None, None]
    # Phases on both sides first, then those only in the candidate: the stack reads as
    # "the baseline's iteration, plus what the candidate adds".
    # In the iteration's own order where the verdict records it (``order``).
    critical = sorted((p for p in items if not p.get("concurrent")),
                      key=lambda p: (p.get("baseline_s") is None, _order(p)))
    concurrent = [p for p in items if p.get("concurrent")]
    stacked, nested = stacked_phases(critical, totals)
    by_name = {str(p.get("phase")): p for p in items}
    # Colours by sorted name, so one target's phases keep their colours from card to card.
    ordered = sorted(str(p.get("phase")) for p in items)
    colors = {name: PHASE_COLORS[i % len(PHASE_COLORS)] for i, name in enumerate(ordered)}
    sides = (("baseline", "baseline_s", 1.0), ("candidate", "candidate_s", 0.0))
    figure, axes = new_axes(6.8, 3.0)
    labelled: set[str] = set()
    longest = max([t for t in totals if t is not None] + [sum(_seconds(by_name[n].get(k)) for n in stacked) for _, k, _ in sides])
    for side, key, y in sides:
        left = 0.0
        for name in stacked:
            width = _seconds(by_name[name].get(key))
            if width <= 0:
                continue
            axes.barh(y, width, left=left, height=0.42, color=colors[name],
                      label=name if name not in labelled else None, edgecolor="white", linewidth=0.6,
                      gid=element_id("phase", side, name))
            if width >= 0.06 * longest:
                axes.annotate(f"{width * 1000:.0f} ms", xy=(left + width / 2, y), ha="center", va="center",
                              fontsize=7, color="white")
            labelled.add(name)
            left += width
        offset = -0.29
        for name in nested:
            width = _seconds(by_name[name].get(key))
            if width > 0:
                axes.barh(y + offset, width, height=0.1, color=colors[name],
                          label=f"{name} (inside the phases above)" if name not in labelled else None,
                          gid=element_id("phase", side, name))
                labelled.add(name)
                offset -= 0.11
        for item in concurrent:
            name = str(item.get("phase"))
            width = _seconds(item.get(key))
            if width > 0:
                axes.barh(y + 0.29, width, height=0.1, color="none", edgecolor=colors[name], hatch="////",
                          label=f"{name} (concurrent thread)" if name not in labelled else None,
                          gid=element_id("phase", side, name))
                labelled.add(name)
        total = totals[0 if side == "baseline" else 1]
        if total is not None:
            axes.plot([total, total], [y - 0.26, y + 0.26], color="#222222", linewidth=1.6,
                      gid=element_id("iteration", side),
                      label="iteration median" if "iteration" not in labelled else None)
            labelled.add("iteration")
    axes.set_yticks([1.0, 0.0], ["baseline", "candidate"])
    axes.set_ylim(-0.55, 1.55)
    axes.set_xlabel("seconds per iteration (medians)")
    axes.set_title("Where the iteration's time goes, per side")
    axes.grid(axis="y", visible=False)
    figure.legend(loc="outside lower center", ncol=3)
    caption = f"Stacked: {', '.join(stacked) or 'none'}."
    if nested:
        caption += f" Thin: {', '.join(nested)}, timed inside the stacked phases."
    if concurrent:
        caption += f" Hatched: {', '.join(str(p.get('phase')) for p in concurrent)}, off the critical path."
    grown = [str(p.get("phase")) for p in critical if p.get("baseline_s") is None and _seconds(p.get("candidate_s")) > 0]
    if grown:
        caption += f" Only in the candidate: {', '.join(grown)}."
    return Plot(figure, caption)


def gap_interval(view: VerdictView) -> Plot:
    """The gap (candidate against baseline iteration time) with its interval against the
    threshold, and each compared phase's change beneath it."""
    gap = view.require("gap")
    value = number(gap.get("gap"))
    if value is None:
        raise NoData("the gap evidence holds no gap value")
    threshold = number(gap.get("threshold"))
    rows: list[tuple[str, float, tuple[float, float] | None, bool]] = [("iteration (gap)", value, interval(gap.get("ci")), True)]
    for item in view.evidence("phase"):
        change = number(item.get("change"))
        if change is not None:
            rows.append((str(item.get("phase")), change, interval(item.get("ci")), False))
    figure, axes = new_axes(6.4, max(2.0, 1.1 + 0.45 * len(rows)))
    if threshold is not None:
        axes.axvspan(-threshold * 100, threshold * 100, color=BAND_COLOR, zorder=0, label=f"±{threshold:.0%} threshold")
        axes.axvline(threshold * 100, color=FAIL_COLOR, linewidth=0.9, linestyle="--", gid="threshold")
    axes.axvline(0, color=MUTED_COLOR, linewidth=0.8)
    for y, (label, change, ci, headline) in enumerate(rows):
        over = threshold is not None and ci is not None and ci[0] > threshold
        color = (FAIL_COLOR if over else PASS_COLOR) if headline else MUTED_COLOR
        if ci is not None:
            axes.plot([ci[0] * 100, ci[1] * 100], [y, y], color=color, linewidth=2.2 if headline else 1.4,
                      gid=element_id("interval", label))
            axes.plot([ci[0] * 100, ci[1] * 100], [y, y], "|", color=color, markersize=9)
        axes.plot([change * 100], [y], "D" if headline else "o", color=color, markersize=7 if headline else 5)
        text = percent(change) + (f" [{percent(ci[0])}, {percent(ci[1])}]" if ci else "")
        axes.annotate(text, xy=(change * 100, y), xytext=(0, 7), textcoords="offset points", ha="center",
                      fontsize=8, color=color)
    axes.set_yticks(range(len(rows)), [r[0] for r in rows])
    axes.set_ylim(len(rows) - 0.4, -0.7)
    axes.set_xlabel("change of the candidate against the baseline (%)")
    axes.set_title("Gap against the threshold")
    axes.legend(loc="lower right")
    caption = f"The gap: {percent(value)}"
    ci = interval(gap.get("ci"))
    if ci is not None:
        caption += f", {gap.get('confidence', 0.95):.0%} interval [{percent(ci[0])}, {percent(ci[1])}]"
    if threshold is not None:
        caption += f", threshold {threshold:.0%}"
    caption += f"; {gap.get('iterations_per_side')} interleaved iterations a side."
    return Plot(figure, caption)


def _share(fraction: float) -> str:
    return f"{fraction:.0%}" if fraction >= 0.095 else f"{fraction:.1%}"


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e6:.1f} MB/s" if bytes_per_s < 1e9 else f"{bytes_per_s / 1e9:.2f} GB/s"


def bandwidth(view: VerdictView) -> Plot:
    """What the transfer moved while busy, against the page-by-page rate and the engine's
    ceiling measured alone on this host."""
    item = view.require("bandwidth")
    achieved = number(item.get("achieved_bytes_per_s"))
    if achieved is None:
        raise NoData(str(item.get("error") or "no transfer bandwidth reported"))
    rows = [("achieved while busy", achieved, CANDIDATE_COLOR, "achieved")]
    page = number(item.get("page_rate_bytes_per_s"))
    ceiling = number(item.get("ceiling_bytes_per_s"))
    if page is not None:
        rows.append(("page by page, alone", page, BASELINE_COLOR, "page-rate"))
    if ceiling is not None:
        rows.append(("ceiling: one big write, alone", ceiling, MUTED_COLOR, "ceiling"))
    if len(rows) == 1:
        raise NoData("no ceiling was measured to compare the achieved bandwidth with")
    figure, axes = new_axes(6.4, 2.3)
    ys = list(range(len(rows)))
    drawn = axes.barh(ys, [r[1] for r in rows], color=[r[2] for r in rows], height=0.55)
    for patch, row in zip(drawn, rows, strict=False):
        patch.set_gid(row[3])
    for y, (_, rate, _color, _key) in zip(ys, rows, strict=False):
        share = f"  ({_share(achieved / rate)} achieved)" if y > 0 else ""
        axes.annotate(_rate(rate) + share, xy=(rate, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    axes.set_xscale("log")
    axes.set_xlim(min(r[1] for r in rows) / 3, max(r[1] for r in rows) * 20)
    axes.set_yticks(ys, [r[0] for r in rows])
    axes.invert_yaxis()
    axes.set_xlabel("bytes per second (log scale)")
    path = item.get("transfer_path") or "transfer"
    axes.set_title(f"Transfer bandwidth: {path}")
    caption = f"The {path} path moved {_rate(achieved)} while its thread was busy."
    if page is not None:
        caption += f" {achieved / page:.0%} of its page-by-page rate alone"
        caption += " (held back, not the link)." if achieved / page < 0.5 else "."
    if ceiling is not None:
        caption += f" {achieved / ceiling:.1%} of the ceiling."
    return Plot(figure, caption)


def gil_timeline(view: VerdictView) -> Plot:
    """The GIL timeline of the attribution run a failing gap makes (its saved gil verdict)."""
    from glmfb.gil import timeline_plot

    path = view.artifact("gil_verdict")
    if path is None:
        raise NoData("no gil_verdict artifact (the GIL is attributed only when the gap fails)")
    nested = VerdictView(json.loads(path.read_text(encoding="utf-8")), run_dir=view.run_dir, run_id=view.run_id)
    plot = timeline_plot(nested)
    plot.caption = f"From the GIL attribution run of the candidate ({path.name}). {plot.caption}"
    return plot


PLOTS = (
    PlotSpec("gap-phases", "phases per side", ("phase",), phases),
    PlotSpec("gap-interval", "gap against the threshold", ("gap",), gap_interval),
    PlotSpec("gap-bandwidth", "bandwidth against the ceiling", ("bandwidth",), bandwidth),
    PlotSpec("gap-gil-timeline", "GIL timeline of the candidate", ("gil_attribution",), gil_timeline, optional=True),
)
