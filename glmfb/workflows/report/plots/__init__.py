"""Plots for report.html: per probe, the figures that answer its question, drawn with
matplotlib from a verdict's evidence and inlined as SVG.

The plots are the probe's own (its :class:`~glmfb.core.probe.ReportSection` names them,
``"glmfb.bench.plots:PLOTS"``, a sequence of :class:`~glmfb.core.plotting.PlotSpec`), so a probe
installed by another package gets its plots on the page with no code here. Each plot has a
stable name (``data-plot`` on the page). :func:`draw` never raises: a plot whose evidence is
absent comes back as ``missing`` with the reason, one that failed as ``error``.

A page's plots are drawn by :func:`draw_plots`: a run's page holds dozens of them (55 for the
bundled suite, 14.8 s drawn one after another on the 2-core development machine), so worker
processes draw some verdicts' plots while this process draws the others. Each verdict's plots
are one :class:`PlotJob` (plain data, so it crosses to a worker as it is), drawn whole by one
process; every figure's SVG depends only on its job (its element ids on the verdict's place
on the page, the style's fixed hash salt), so the page is the same byte for byte however
many processes drew it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmfb.core.plotting import NoData, Plot, PlotSpec, VerdictView, figure_to_svg, style
from glmfb.core.probe import machine_cores, report_section
from glmfb.core.registry import import_ref

WORKERS_ENV = "GLMFB_REPORT_WORKERS"  # processes that draw beside the page's (0: none)
MIN_PARALLEL_JOBS = 6  # fewer verdicts: a worker's start-up (interpreter, matplotlib) costs more than it saves


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


@dataclass(frozen=True)
class PlotJob:
    """One verdict's plots to draw: its place on the page (``index``: its element ids), its
    probe kind, its JSON, the run folder and id it is read with, and the history series it
    belongs to."""

    index: int
    probe: str
    data: Mapping[str, Any]
    run_dir: str | None = None
    run_id: str | None = None
    series: tuple[Mapping[str, Any], ...] = field(default=())

    def specs(self) -> list[PlotSpec]:
        """Its plots, in page order: the probe's, then one per history series."""
        specs = list(specs_for(self.probe))
        if self.series and self.run_id:
            from glmfb.workflows.report.plots.history import history_spec

            specs += [history_spec(series, self.run_id) for series in self.series]
        return specs


Outcome = tuple[str, str, str, str]  # a Drawn less its spec: state, svg, caption, reason


def draw_job(job: PlotJob) -> list[Outcome]:
    """Draw one verdict's plots (in a worker or here): each one's outcome, in spec order."""
    view = VerdictView(job.data, run_dir=Path(job.run_dir) if job.run_dir else None, run_id=job.run_id)
    outcomes = []
    for n, spec in enumerate(job.specs()):
        drawn = draw(spec, view, prefix=f"v{job.index}p{n}")
        outcomes.append((drawn.state, drawn.svg, drawn.caption, drawn.reason))
    return outcomes


def default_workers() -> int:
    """Worker processes for a page: ``$GLMFB_REPORT_WORKERS``, else one per core that is idle
    now (:func:`idle_cores`) but the one this process draws on. A worker costs a few CPU
    seconds of its own before it draws (an interpreter, matplotlib, its font and text caches:
    9.9 CPU s drawn here alone against 14 here and in one worker, for the bundled suite's page),
    so on a machine whose cores are busy it only slows the page down (13.7 s alone, 16-28 s
    with a worker at load 5 on 2 cores); on idle cores it overlaps the drawing."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if raw.isdigit():
        return int(raw)
    return max(0, min(machine_cores() - 1, int(idle_cores() + 0.25) - 1))


def idle_cores(window_s: float = 0.25) -> float:
    """How many of the machine's cores were idle over the next ``window_s`` (``/proc/stat``);
    0 where that cannot be read (then the page is drawn here alone)."""
    import time

    from glmfb.core.measure.hostload import cpu_ticks

    def sample() -> tuple[int, int]:
        fields = cpu_ticks()
        if fields is None:
            raise OSError("/proc/stat")
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)  # all, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(window_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    if total1 <= total0:
        return 0.0
    return (os.cpu_count() or 1) * (idle1 - idle0) / (total1 - total0)


def draw_plots(jobs: Sequence[PlotJob], workers: int | None = None) -> list[list[Drawn]]:
    """Every job's plots, in job order. With ``workers`` (default :func:`default_workers`:
    as many as there are idle cores, but one) and enough jobs, worker processes (spawned: a fresh interpreter, no state forked from
    this one) take jobs from the front while this process takes them from the back, so
    neither waits while the other has work; a worker that fails leaves its jobs to this
    process. The outcomes are the same either way."""
    if len(jobs) >= MIN_PARALLEL_JOBS and workers is None:
        workers = default_workers()
    if not workers or len(jobs) < MIN_PARALLEL_JOBS:
        outcomes = [draw_job(job) for job in jobs]
    else:
        outcomes = _draw_beside_workers(jobs, workers)
    return [[Drawn(spec, *outcome) for spec, outcome in zip(job.specs(), found, strict=True)]
            for job, found in zip(jobs, outcomes, strict=True)]


def _draw_beside_workers(jobs: Sequence[PlotJob], workers: int) -> list[list[Outcome]]:
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor

    outcomes: list[list[Outcome] | None] = [None] * len(jobs)
    try:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    except (OSError, ValueError):  # no processes to be had: draw them all here
        return [draw_job(job) for job in jobs]
    with pool:
        futures: list[Future[list[Outcome]]] = [pool.submit(draw_job, job) for job in jobs]
        for index in reversed(range(len(jobs))):
            if not futures[index].cancel():
                break  # a worker has it (and every job before it)
            outcomes[index] = draw_job(jobs[index])
        for index, future in enumerate(futures):
            if outcomes[index] is None:
                try:
                    outcomes[index] = future.result()
                except Exception:  # a worker died or could not take the job: drawn here instead
                    outcomes[index] = draw_job(jobs[index])
    return [found for found in outcomes if found is not None]


__all__ = ["Drawn", "NoData", "Plot", "PlotJob", "PlotSpec", "VerdictView", "draw", "draw_plots", "specs_for"]
