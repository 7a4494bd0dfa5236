"""Plots for report.html: per probe, the figures that answer its question, drawn with
matplotlib from a verdict's evidence and inlined as SVG.

The plots are the probe's own (its :class:`~glmfb.probe.ReportSection` names them,
``"glmfb.bench.plots:PLOTS"``, a sequence of :class:`~glmfb.plotting.PlotSpec`), so a probe
installed by another package gets its plots on the page with no code here. Each plot has a
stable name (``data-plot`` on the page). :func:`draw` never raises: a plot whose evidence is
absent comes back as ``missing`` with the reason, one that failed as ``error``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from glmfb.plotting import NoData, Plot, PlotSpec, VerdictView, figure_to_svg, style
from glmfb.probe import import_ref, report_section


@dataclass(frozen=True)
class Drawn:
    """One plot's outcome: ``drawn`` (with its SVG), ``missing`` or ``error`` (with a reason)."""

    spec: PlotSpec
    state: str
    svg: str = ""
    caption: str = ""
    reason: str = ""


def specs_for(probe: str) -> tuple[PlotSpec, ...]:
    """The plots a probe's verdicts get, in page order: those its report section names; none
    for a kind this installation does not know (or whose plots do not import)."""
    section = report_section(probe)
    if section is None or not section.plots:
        return ()
    try:
        return tuple(import_ref(section.plots))
    except Exception as exc:  # a probe's broken plot module must not break the page: said in its place
        return (PlotSpec(f"{probe}-plots", f"the plots of {probe} ({section.plots})", (), _unloadable(exc)),)


def _unloadable(exc: Exception) -> Callable[[VerdictView], Plot]:
    def build(view: VerdictView) -> Plot:
        raise exc

    return build


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


__all__ = ["Drawn", "NoData", "Plot", "PlotSpec", "VerdictView", "draw", "specs_for"]
