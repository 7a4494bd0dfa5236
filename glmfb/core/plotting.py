"""Plots of a probe's verdicts, for report.html: what every plot builder shares (the verdict
view it reads, the result it returns, the figure style, the palette) and the SVG export
(matplotlib's SVG backend, glyphs as paths, no fonts needed).

A probe lists its plots as a sequence of :class:`PlotSpec` (``glmfb.bench.plots:PLOTS``) and
names it in its :class:`~glmfb.core.probe.ReportSection`; the report imports it only when it draws
a page. Part of the probe API, below the engines: a probe's package uses it without importing
the report layer. matplotlib is imported only when a figure is drawn.

Builders read evidence as the JSON dicts of a ``glmfb.verdict/2`` document, so they keep
working whatever model the verdict has in memory.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# One palette for every plot: the baseline is blue, the candidate orange, a failure red.
BASELINE_COLOR = "#4c72b0"
CANDIDATE_COLOR = "#dd8452"
FAIL_COLOR = "#c0392b"
PASS_COLOR = "#2e8b57"
WARN_COLOR = "#b7950b"
UNDECIDED_COLOR = "#7d3c98"
MUTED_COLOR = "#8c8c8c"
BAND_COLOR = "#e8e8e8"

STYLE: dict[str, Any] = {
    "svg.fonttype": "path",  # glyphs as outlines: the page needs no font
    "svg.hashsalt": "glmfb",  # stable ids from run to run
    "font.family": "DejaVu Sans",  # ships with matplotlib
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "legend.fontsize": 8.0,
    "legend.frameon": False,
    "xtick.labelsize": 8.0,
    "ytick.labelsize": 8.0,
    "figure.dpi": 100.0,
}


class NoData(Exception):
    """The verdict holds no evidence this plot can be drawn from (not a failure: said so)."""


@dataclass
class Plot:
    """A drawn figure and the sentence under it."""

    figure: Figure
    caption: str = ""


@dataclass(frozen=True)
class PlotSpec:
    """One kind of plot: its stable DOM name, the evidence kinds it reads, its builder."""

    plot_id: str
    title: str
    reads: tuple[str, ...]
    build: Callable[[VerdictView], Plot]
    optional: bool = False  # left out silently when its evidence is absent (not yet emitted)


@dataclass
class VerdictView:
    """A verdict as JSON data, with its artifacts resolved to files on this machine.

    ``run_dir`` is the run's folder (``reports/<run-id>/``): artifact paths written relative
    to the working directory of the run are found under it even after the folder moved.
    """

    data: Mapping[str, Any]
    run_dir: Path | None = None
    run_id: str | None = None
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.data.get("name", ""))

    @property
    def status(self) -> str:
        return str(self.data.get("status", ""))

    @property
    def where(self) -> Mapping[str, Any]:
        where = self.data.get("where")
        return where if isinstance(where, Mapping) else {}

    @property
    def metric(self) -> Mapping[str, Any]:
        metric = self.data.get("metric")
        return metric if isinstance(metric, Mapping) else {}

    def evidence(self, kind: str) -> list[Mapping[str, Any]]:
        """Every evidence item of one kind, in order."""
        items = self.data.get("evidence") or []
        return [e for e in items if isinstance(e, Mapping) and e.get("kind") == kind]

    def first(self, kind: str) -> Mapping[str, Any] | None:
        found = self.evidence(kind)
        return found[0] if found else None

    def require(self, kind: str) -> Mapping[str, Any]:
        item = self.first(kind)
        if item is None:
            raise NoData(f"the verdict has no {kind} evidence")
        return item

    def artifact(self, name: str) -> Path | None:
        """The file behind an artifact name, or None when it is not listed or not there."""
        artifacts = self.data.get("artifacts") or {}
        raw = artifacts.get(name) if isinstance(artifacts, Mapping) else None
        if not isinstance(raw, str):
            return None
        return resolve_artifact(raw, self.run_dir, self.run_id)


def resolve_artifact(raw: str, run_dir: Path | None, run_id: str | None) -> Path | None:
    """Find an artifact written as ``reports/<run-id>/probe/file`` (relative to where the run
    was started, or absolute), or relative to the run folder. A path through the run's own
    folder is looked up under ``run_dir`` first, so a copied or moved run links to its own files."""
    path = Path(raw)
    candidates: list[Path] = []
    if run_dir is not None:
        parts = path.parts
        name = run_id or run_dir.name
        if name in parts:
            candidates.append(run_dir.joinpath(*parts[parts.index(name) + 1 :]))
        if not path.is_absolute():
            candidates.append(run_dir / path)
    candidates.append(path if path.is_absolute() else Path.cwd() / path)
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    return None


def relative_href(target: Path, page_dir: Path) -> str:
    """A link from a page in ``page_dir`` to ``target``, percent-encoded, with ``/``."""
    from urllib.parse import quote

    relative = os.path.relpath(target.resolve(), page_dir.resolve())
    return quote(Path(relative).as_posix())


# --------------------------------------------------------------------------------------------
# Numbers
# --------------------------------------------------------------------------------------------


def number(value: Any) -> float | None:
    """A finite float from evidence (which spells non-finite numbers "nan", "inf"), or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value)
        except ValueError:
            return None
    else:
        return None
    return result if math.isfinite(result) else None


def numbers(values: Any) -> list[float | None]:
    return [number(v) for v in values] if isinstance(values, Sequence) and not isinstance(values, str) else []


def interval(value: Any) -> tuple[float, float] | None:
    """A ``[low, high]`` pair of finite numbers, or None."""
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        return None
    low, high = number(value[0]), number(value[1])
    return None if low is None or high is None else (low, high)


def percent(fraction: float, digits: int = 1) -> str:
    return f"{fraction * 100:+.{digits}f}%"


def element_id(*parts: object) -> str:
    """A stable id for a plot element (matplotlib writes an artist's gid as its SVG id)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(str(p) for p in parts)).strip("-")


def short(text: str, width: int = 34) -> str:
    """A label that fits beside a bar: the end of a dotted module path is what identifies it."""
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1) :]


# --------------------------------------------------------------------------------------------
# Figures and SVG
# --------------------------------------------------------------------------------------------


@contextmanager
def style() -> Iterator[None]:
    import matplotlib

    with matplotlib.rc_context(STYLE):  # type: ignore[arg-type]
        yield


def new_figure(width_in: float = 6.4, height_in: float = 3.2) -> Figure:
    """A figure not tied to pyplot (no global state, no display)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width_in, height_in), layout="constrained")


def new_axes(width_in: float = 6.4, height_in: float = 3.2) -> tuple[Figure, Axes]:
    figure = new_figure(width_in, height_in)
    return figure, figure.add_subplot()


_ID = re.compile(r'\bid="([^"]+)"')


def figure_to_svg(figure: Figure, prefix: str, label: str) -> str:
    """The figure as an inline ``<svg>``: no XML prologue, sized by CSS through its viewBox,
    every id prefixed so several plots can share one page."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    start = text.find("<svg")
    if start < 0:
        raise ValueError("matplotlib wrote no <svg> element")
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text[start:], flags=re.S)
    ids = set(_ID.findall(text))
    if ids:
        names = "|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True))
        text = re.sub(rf'\bid="({names})"', lambda m: f'id="{prefix}-{m.group(1)}"', text)
        text = re.sub(rf"#({names})\b(?=[)\"'])", lambda m: f"#{prefix}-{m.group(1)}", text)
    # width/height in pt would fix the size; the viewBox keeps the aspect ratio.
    text = re.sub(r'^<svg([^>]*?) width="[^"]*" height="[^"]*"', r"<svg\1", text, count=1)
    from html import escape

    return text.replace("<svg", f'<svg role="img" aria-label="{escape(label)}"', 1)


MIN_LOG_SPAN = 10.0  # a log axis spans at least a decade, so a flat curve looks flat


def at_least_a_decade(axes: Axes, values: Sequence[float]) -> None:
    """Widen a log y axis around its positive values to at least :data:`MIN_LOG_SPAN`: zoomed
    in further, a few percent of noise reads as a trend."""
    positive = [v for v in values if v > 0]
    if not positive:
        return
    low, high = min(positive), max(positive)
    if high / low < MIN_LOG_SPAN:
        centre = math.sqrt(low * high)
        half = math.sqrt(MIN_LOG_SPAN)
        axes.set_ylim(centre / half, centre * half)


def threshold_band(axes: Axes, low: float, high: float, *, vertical: bool = True, label: str = "") -> None:
    """The band inside which a change does not count."""
    if vertical:
        axes.axvspan(low, high, color=BAND_COLOR, zorder=0, label=label or None)
    else:
        axes.axhspan(low, high, color=BAND_COLOR, zorder=0, label=label or None)
