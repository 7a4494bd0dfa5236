"""The toy probe's plot: what it read against its threshold. Named by the probe's report
section (``toy_plots:PLOTS``), imported only when a page is drawn, and drawn with
:mod:`glmfb.plotting` like the built-in probes' plots. ``$TOY_PLOT_SLEEP_S`` makes drawing it
take that long (a test interrupts glmfb while report.html is drawn)."""

from __future__ import annotations

import os
import time

from glmfb.plotting import FAIL_COLOR, PASS_COLOR, Plot, PlotSpec, VerdictView, new_axes, number


def reading(view: VerdictView) -> Plot:
    # A test that interrupts glmfb while report.html is drawn makes the drawing last this long.
    time.sleep(float(os.environ.get("TOY_PLOT_SLEEP_S", "0")))
    item = view.require("toy_reading")
    value = number(item.get("value")) or 0.0
    threshold = number(view.metric.get("threshold")) or 0.0
    figure, axes = new_axes(5.0, 1.6)
    color = FAIL_COLOR if item.get("outcome") == "fail" else PASS_COLOR
    axes.plot([0, value], [0, 0], color=color, linewidth=8, gid="toy-reading-bar")
    axes.axvline(threshold, color="#444444", linestyle="--", label=f"threshold {threshold:g}")
    axes.set_xlabel("value")
    axes.legend(loc="lower right")
    return Plot(figure, f"the toy read {value:g} (threshold {threshold:g}) and said {item.get('outcome')}")


PLOTS = (PlotSpec("toy-reading", "the toy's reading against its threshold", ("toy_reading",), reading),)
