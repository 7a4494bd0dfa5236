"""Plots for report.html: per probe, the figures that answer its question, drawn with
matplotlib from a verdict's evidence and inlined as SVG.

Each plot has a stable name (``data-plot`` on the page). :func:`draw` never raises: a plot whose
evidence is absent comes back as ``missing`` with the reason, one that failed as ``error``.
"""

from __future__ import annotations

from dataclasses import dataclass

from glmfb.report.plots import bench, diff, gap, gil
from glmfb.report.plots._base import NoData, Plot, PlotSpec, VerdictView, figure_to_svg, style

PLOTS: dict[str, tuple[PlotSpec, ...]] = {
    "diff": diff.PLOTS,
    "bench": bench.PLOTS,
    "gil": gil.PLOTS,
    "gap": gap.PLOTS,
}


@dataclass(frozen=True)
class Drawn:
    """One plot's outcome: ``drawn`` (with its SVG), ``missing`` or ``error`` (with a reason)."""

    spec: PlotSpec
    state: str
    svg: str = ""
    caption: str = ""
    reason: str = ""


def specs_for(probe: str) -> tuple[PlotSpec, ...]:
    """The plots a probe's verdicts get, in page order."""
    return PLOTS.get(probe, ())


def draw(spec: PlotSpec, view: VerdictView, prefix: str) -> Drawn:
    """Build one plot; its failure is reported in the result, never raised."""
    figure = None
    try:
        with style():
            plot = spec.build(view)
            figure = plot.figure
            svg = figure_to_svg(figure, prefix, f"{spec.title}: {view.name}")
        return Drawn(spec, "drawn", svg=svg, caption=plot.caption)
    except NoData as exc:
        return Drawn(spec, "missing", reason=str(exc))
    except Exception as exc:  # a broken plot must not break the page
        return Drawn(spec, "error", reason=f"{type(exc).__name__}: {exc}")
    finally:
        if figure is not None:
            figure.clear()


__all__ = ["PLOTS", "Drawn", "NoData", "Plot", "PlotSpec", "VerdictView", "draw", "specs_for"]
