"""gil plots: when threads were starved and who held the GIL then; each thread's share of
holding it and of waiting for it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
    new_axes,
    number,
)

HOLDING_COLOR = FAIL_COLOR
WAITING_COLOR = CANDIDATE_COLOR
STARVED_COLOR = UNDECIDED_COLOR
MIN_BAR_S = 0.004  # a window shorter than this would vanish on a seconds axis


def timeline(view: VerdictView) -> Plot:
    """Per thread, over the observation: the starved windows (the heartbeat woke up late),
    the thread holding the GIL in each and the threads waiting for it."""
    starvation = view.require("starvation")
    windows = [w for w in starvation.get("windows") or [] if isinstance(w, Mapping)]
    if not windows:
        p99 = number(starvation.get("p99_ms"))
        threshold = number(starvation.get("threshold_ms"))
        detail = f" (heartbeat p99 {p99:g} ms, threshold {threshold:g} ms)" if p99 is not None and threshold is not None else ""
        raise NoData(f"no starved window to draw{detail}")
    canary = str(starvation.get("canary") or "heartbeat")
    holders: list[str] = []
    waiters: list[str] = []
    for window in windows:
        holder = window.get("holder")
        if isinstance(holder, str) and holder not in holders:
            holders.append(holder)
        for thread in window.get("waiting_threads") or []:
            if thread not in waiters and thread not in holders:
                waiters.append(str(thread))
    waiters = [w for w in waiters if w not in holders]
    rows = [*holders, *waiters, f"{canary} (canary)"]
    index = {name: i for i, name in enumerate(rows)}
    bars: dict[str, list[tuple[float, float]]] = {"holding": [], "waiting": [], "starved": []}
    lanes: dict[str, list[int]] = {"holding": [], "waiting": [], "starved": []}
    end_s = 0.0
    for window in windows:
        start = number(window.get("start_s"))
        duration_ms = number(window.get("duration_ms"))
        if start is None or duration_ms is None:
            continue
        width = max(duration_ms / 1000, MIN_BAR_S)
        end_s = max(end_s, start + width)
        holder = window.get("holder")
        if isinstance(holder, str):
            bars["holding"].append((start, width))
            lanes["holding"].append(index[holder])
        for thread in window.get("waiting_threads") or []:
            if thread in index and thread != holder:
                bars["waiting"].append((start, width))
                lanes["waiting"].append(index[thread])
        bars["starved"].append((start, width))
        lanes["starved"].append(index[f"{canary} (canary)"])
    figure, axes = new_axes(6.8, max(2.2, 1.2 + 0.45 * len(rows)))
    labels = {"holding": "holding the GIL", "waiting": "waiting for the GIL", "starved": "starved: wake-up late"}
    colors = {"holding": HOLDING_COLOR, "waiting": WAITING_COLOR, "starved": STARVED_COLOR}
    for state, spans in bars.items():
        by_lane: dict[int, list[tuple[float, float]]] = {}
        for span, lane in zip(spans, lanes[state], strict=False):
            by_lane.setdefault(lane, []).append(span)
        for n, (lane, lane_spans) in enumerate(sorted(by_lane.items())):
            axes.broken_barh(lane_spans, (lane - 0.32, 0.64), facecolors=colors[state],
                             label=labels[state] if n == 0 else None, gid=element_id(state, rows[lane]))
    axes.set_yticks(range(len(rows)), rows)
    axes.set_ylim(len(rows) - 0.4, -0.6)
    # The heartbeat's ticks bound the observation from below when it was not starved.
    ticks, period_ms = number(starvation.get("ticks")), number(starvation.get("period_ms"))
    observed_s = ticks * period_ms / 1000 if ticks is not None and period_ms is not None else 0.0
    axes.set_xlim(0, max(end_s * 1.03, observed_s, 0.1))
    axes.set_xlabel("seconds since sampling started")
    axes.set_title("GIL timeline: starved windows")
    axes.grid(axis="y", visible=False)
    figure.legend(loc="outside lower center", ncol=3)
    total = starvation.get("windows_total")
    starved_ms = number(starvation.get("starved_ms_total"))
    shown = len(windows)
    caption = f"The {shown} longest" + (f" of {total}" if isinstance(total, int) else "") + " starved windows"
    caption += f" ({starved_ms:,.0f} ms starved in all)." if starved_ms is not None else "."
    if holders:
        caption += f" Holding the GIL in them: {', '.join(holders)}."
    p99, threshold = number(starvation.get("p99_ms")), number(starvation.get("threshold_ms"))
    if p99 is not None and threshold is not None:
        verdict = "starved" if p99 > threshold else "within the threshold"
        caption += f" Heartbeat p99 wake-up lateness {p99:.3g} ms against {threshold:g} ms: {verdict}."
    return Plot(figure, caption)


def wait_shares(view: VerdictView) -> Plot:
    """Per thread: the share of samples in which it held the GIL and in which it waited."""
    starvation = view.first("starvation")
    threads = view.first("gil_threads")
    holding: dict[str, float] = {}
    waiting: dict[str, float] = {}
    for row in (threads.get("threads") if threads is not None else None) or []:
        share = number(row.get("share"))
        if share is not None and not row.get("excluded"):
            holding[str(row.get("thread"))] = share
    for row in (starvation.get("waiting_for_gil") if starvation is not None else None) or []:
        share = number(row.get("waiting_share"))
        if share is not None:
            waiting[str(row.get("thread"))] = share
    names = list(dict.fromkeys([*holding, *waiting]))
    if not names:
        instants = threads.get("sample_instants") if threads is not None else None
        if instants:
            rows = (threads.get("threads") if threads is not None else None) or []
            own = [str(row.get("thread")) for row in rows if row.get("excluded")]
            aside = f" ({', '.join(own)}, glmfb's own, aside)" if own else ""
            raise NoData(f"no thread{aside} held or waited for the GIL in any of {instants} sampled instants")
        raise NoData("the verdict has neither gil_threads nor waiting_for_gil evidence")
    names.sort(key=lambda n: -(max(holding.get(n, 0.0), waiting.get(n, 0.0))))
    starved = {str(t) for t in (starvation.get("threads") if starvation is not None else None) or []}
    figure, axes = new_axes(6.4, max(2.0, 1.0 + 0.42 * len(names)))
    ys = list(range(len(names)))
    bar = 0.38
    hold = [holding.get(n, 0.0) * 100 for n in names]
    wait = [waiting.get(n, 0.0) * 100 for n in names]
    for state, values, shift, color in (("holding", hold, -bar / 2, FAIL_COLOR), ("waiting", wait, bar / 2, BASELINE_COLOR)):
        drawn = axes.barh([y + shift for y in ys], values, height=bar, color=color,
                          label=f"{state} {'the' if state == 'holding' else 'for the'} GIL")
        for patch, name in zip(drawn, names, strict=False):
            patch.set_gid(element_id(state, name))
    for y, h, w in zip(ys, hold, wait, strict=False):
        axes.annotate(f"{h:.0f}%", xy=(h, y - bar / 2), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
        axes.annotate(f"{w:.0f}%", xy=(w, y + bar / 2), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    axes.set_yticks(ys, names)
    for tick, name in zip(axes.get_yticklabels(), names, strict=False):
        if name in starved:
            tick.set_color(FAIL_COLOR)
            tick.set_fontweight("bold")
    axes.invert_yaxis()
    axes.set_xlim(0, 110)
    axes.set_xlabel("share of the sampled window (%)")
    axes.set_title("GIL holding and waiting per thread")
    axes.legend(loc="lower right")
    caption = ("Holding: the share of py-spy's sample instants in which each thread held the GIL. Waiting: the share "
               "of wall time it was blocked on the GIL (kernel counters, see the thread-times plot).")
    if starved:
        caption += f" Starved threads (red): {', '.join(sorted(starved))}."
    return Plot(figure, caption)


def lateness(view: VerdictView) -> Plot:
    """The heartbeat's wake-up lateness (p50, p99, max) against the starvation threshold: a
    thread that needs the GIL every period waits this long for it."""
    starvation = view.require("starvation")
    threshold = number(starvation.get("threshold_ms"))
    rows = [(label, number(starvation.get(key))) for label, key in
            (("p50", "p50_ms"), ("p99", "p99_ms"), ("max", "max_ms"))]
    shown = [(label, value) for label, value in rows if value is not None]
    if not shown:
        raise NoData("the heartbeat recorded no usable wake-ups")
    figure, axes = new_axes(6.4, 2.2)
    ys = list(range(len(shown)))
    colors = [FAIL_COLOR if threshold is not None and value > threshold else BASELINE_COLOR for _, value in shown]
    values = [max(value, 1e-3) for _, value in shown]
    for patch, (label, _) in zip(axes.barh(ys, values, color=colors, height=0.55), shown, strict=False):
        patch.set_gid(element_id("lateness", label))
    for y, (_, value) in zip(ys, shown, strict=False):
        axes.annotate(f"{value:.3g} ms", xy=(max(value, 1e-3), y), xytext=(4, 0), textcoords="offset points",
                      va="center", fontsize=8)
    if threshold is not None:
        axes.axvline(threshold, color=FAIL_COLOR, linestyle="--", linewidth=1.3, label=f"threshold {threshold:g} ms (p99)",
                     gid="threshold")
        axes.legend(loc="lower right")
    axes.set_xscale("log")
    high = max([*values, threshold or 0.0])
    axes.set_xlim(min(values) / 3, high * 8)
    axes.set_yticks(ys, [label for label, _ in shown])
    axes.invert_yaxis()
    axes.set_xlabel("heartbeat wake-up lateness (ms, log scale)")
    axes.set_title("Starvation: heartbeat wake-up lateness")
    ticks = starvation.get("ticks")
    caption = f"The {starvation.get('canary', 'heartbeat')} thread asks for the GIL every {starvation.get('period_ms')} ms"
    caption += f"; {ticks} wake-ups recorded." if ticks is not None else "."
    p99 = number(starvation.get("p99_ms"))
    if p99 is not None and threshold is not None:
        caption += f" p99 {p99:.3g} ms {'>' if p99 > threshold else '<='} {threshold:g} ms: {'starved' if p99 > threshold else 'not starved'}."
    return Plot(figure, caption)


RUNNING_COLOR = "#9bbbd4"
STATE_COLORS = {"holding": HOLDING_COLOR, "waiting": WAITING_COLOR, "running": RUNNING_COLOR}
STATE_LABELS = {"holding": "holding the GIL", "waiting": "waiting for the GIL", "running": "running (no GIL wait)"}


def verdict_timeline(view: VerdictView) -> Plot:
    """A gil verdict's GIL timeline: per thread when it holds one (evidence ``gil_timeline``),
    else the holders' timeline (what ``glmfb gap`` draws of its attribution run)."""
    return thread_timeline(view) if view.first("gil_timeline") else timeline(view)


def thread_timeline(view: VerdictView) -> Plot:
    """Per thread, over the sampled window: when it held the GIL, waited for it or ran (the
    ``gil_timeline`` evidence, from /proc ticks), with the heartbeat's longest stall marked."""
    item = view.require("gil_timeline")
    threads = [t for t in item.get("threads") or [] if isinstance(t, Mapping) and t.get("spans")]
    if not threads:
        raise NoData("no thread held, waited for or ran with the GIL in the sampled window")
    rows = [str(t.get("thread")) for t in threads]
    figure, axes = new_axes(6.8, max(2.2, 1.2 + 0.42 * len(rows)))
    labelled: set[str] = set()
    for lane, thread in enumerate(threads):
        by_state: dict[str, list[tuple[float, float]]] = {}
        for span in thread.get("spans") or []:
            if not isinstance(span, Sequence) or len(span) != 3:
                continue
            start, end, state = number(span[0]), number(span[1]), str(span[2])
            if start is None or end is None or state not in STATE_COLORS:
                continue
            by_state.setdefault(state, []).append((start, max(end - start, MIN_BAR_S)))
        for state, spans in by_state.items():
            axes.broken_barh(spans, (lane - 0.32, 0.64), facecolors=STATE_COLORS[state],
                             label=STATE_LABELS[state] if state not in labelled else None,
                             gid=element_id(state, rows[lane]))
            labelled.add(state)
    starvation = view.first("starvation")
    stall_ms = number(starvation.get("stall_ms")) if starvation else None
    stall_start = number(starvation.get("stall_start_s")) if starvation else None
    if stall_ms is not None and stall_start is not None and stall_ms >= 10:
        axes.axvspan(stall_start, stall_start + stall_ms / 1000, color=STARVED_COLOR, alpha=0.12,
                     label="heartbeat's longest stall", gid="stall")
    observed = number(item.get("observed_s")) or 0.0
    axes.set_yticks(range(len(rows)), rows)
    axes.set_ylim(len(rows) - 0.4, -0.6)
    axes.set_xlim(0, max(observed, 0.1))
    axes.set_xlabel("seconds since sampling started")
    axes.set_title("GIL timeline per thread")
    axes.grid(axis="y", visible=False)
    figure.legend(loc="outside lower center", ncol=4)
    caption = (f"Over the {observed:.1f} s sampled: each thread's state at the /proc ticks (holding: the thread py-spy "
               "saw holding the GIL most, at ticks where another thread waited for it).")
    if stall_ms is not None and starvation is not None:
        share = number(starvation.get("stall_gil_share"))
        caption += f" The heartbeat's longest stretch without a wake-up: {stall_ms / 1000:.2f} s"
        caption += f", blocked on the GIL {share:.0%} of it." if share is not None else "."
    return Plot(figure, caption)


def lateness_series(view: VerdictView) -> Plot:
    """The heartbeat's wake-up lateness over the sampled window (net of CPU waits), against
    the threshold: short holds show as a band under it, long holds as spikes far above."""
    starvation = view.require("starvation")
    points = [p for p in starvation.get("lateness_series") or [] if isinstance(p, Sequence) and len(p) == 2]
    if not points:
        raise NoData("the heartbeat recorded no wake-up in the sampled window")
    threshold = number(starvation.get("threshold_ms"))
    xs = [number(p[0]) or 0.0 for p in points]
    ys = [max(number(p[1]) or 0.0, 1e-3) for p in points]
    figure, axes = new_axes(6.8, 2.6)
    colors = [FAIL_COLOR if threshold is not None and y > threshold else BASELINE_COLOR for y in ys]
    axes.scatter(xs, ys, s=6, c=colors, gid="lateness-points")
    if threshold is not None:
        axes.axhline(threshold, color=FAIL_COLOR, linestyle="--", linewidth=1.2, label=f"threshold {threshold:g} ms",
                     gid="threshold")
        axes.legend(loc="upper right")
    axes.set_yscale("log")
    observed = number(starvation.get("observed_s"))
    axes.set_xlim(0, max(observed or 0.0, max(xs), 0.1))
    axes.set_xlabel("seconds since sampling started")
    axes.set_ylabel("lateness (ms, log)")
    axes.set_title("Heartbeat wake-up lateness over time")
    expected = starvation.get("expected_ticks")
    caption = f"{starvation.get('ticks')} wake-ups recorded"
    caption += f" of {expected} a heartbeat never held back would make" if isinstance(expected, int) else ""
    caption += f"; the latest of each of {len(points)} bins shown, net of CPU waits."
    stall = number(starvation.get("stall_ms"))
    if stall is not None:
        caption += f" Longest stretch without a wake-up: {stall:,.0f} ms."
    return Plot(figure, caption)


def thread_times(view: VerdictView) -> Plot:
    """Where each thread's time went over the sampled window: on a CPU, waiting for one, blocked
    on the GIL (with its 95% interval), blocked on anything else (kernel counters)."""
    item = view.require("thread_times")
    rows = [t for t in item.get("threads") or [] if isinstance(t, Mapping)
            and (number(t.get("cpu_share")) or 0) + (number(t.get("gil_wait_share")) or 0) >= 0.01]
    if not rows:
        raise NoData("no thread ran or waited for the GIL in the sampled window")
    names = [str(r.get("thread")) + (" (glmfb)" if r.get("glmfb") else "") for r in rows]
    parts = (("cpu_share", "on a CPU", PASS_COLOR), ("runqueue_share", "waiting for a CPU", MUTED_COLOR),
             ("gil_wait_share", "waiting for the GIL", WAITING_COLOR), ("other_wait_share", "sleeping, I/O, locks", BAND_COLOR))
    figure, axes = new_axes(6.8, max(2.2, 1.1 + 0.4 * len(rows)))
    ys = list(range(len(rows)))
    lefts = [0.0] * len(rows)
    for key, label, color in parts:
        values = [100 * (number(r.get(key)) or 0.0) for r in rows]
        drawn = axes.barh(ys, values, left=lefts, height=0.55, color=color, label=label)
        for patch, name in zip(drawn, names, strict=False):
            patch.set_gid(element_id(key, name))
        if key == "gil_wait_share":
            for y, row, left in zip(ys, rows, lefts, strict=False):
                ci = row.get("gil_wait_ci") or []
                if len(ci) == 2 and number(ci[0]) is not None and number(ci[1]) is not None:
                    axes.plot([left + 100 * float(ci[0]), left + 100 * float(ci[1])], [y, y], color="#222222",
                              linewidth=1.0, gid=element_id("gil-ci", names[y]))
        lefts = [a + b for a, b in zip(lefts, values, strict=False)]
    for y, row in zip(ys, rows, strict=False):
        c_function = row.get("c_function")
        if c_function:
            axes.annotate(f"in {c_function}", xy=(101, y), va="center", fontsize=7)
    axes.set_yticks(ys, names)
    axes.invert_yaxis()
    axes.set_xlim(0, 135)
    axes.set_xlabel("share of the sampled window (%)")
    axes.set_title("Where each thread's time went")
    figure.legend(loc="outside lower center", ncol=4)
    caption = (f"Over {number(item.get('observed_s')) or 0:.1f} s, from /proc/PID/task/TID/schedstat (CPU and run-queue "
               "time, exact) and the states seen at each tick (what a blocked thread waited on); the GIL wait with "
               "its 95% interval. Right: the C function a thread ran in its native snapshots.")
    return Plot(figure, caption)


PLOTS = (
    PlotSpec("gil-lateness", "heartbeat lateness against the threshold", ("starvation",), lateness),
    PlotSpec("gil-lateness-series", "heartbeat lateness over time", ("starvation",), lateness_series, optional=True),
    PlotSpec("gil-thread-times", "where the time of each thread went", ("thread_times",), thread_times, optional=True),
    PlotSpec("gil-thread-timeline", "GIL timeline per thread", ("gil_timeline",), thread_timeline, optional=True),
    PlotSpec("gil-timeline", "per-thread GIL timeline", ("starvation",), timeline),
    PlotSpec("gil-wait-shares", "GIL holding and waiting per thread", ("starvation", "gil_threads"), wait_shares),
)
