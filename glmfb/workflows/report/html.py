"""report.html: one self-contained page for a run.

The summary table, then per probe each verdict as a card (why, where, metric, next steps,
artifacts), the plots that answer the probe's question (matplotlib, inlined as SVG with its
glyphs as paths: no script, no font, no external asset), and the evidence not plotted in a
collapsed block. Where each probe's section goes, the question under its title and its plots
come from the probe's :class:`~glmfb.core.probe.ReportSection`; a verdict of a kind this
installation does not know still gets a section, after the known ones, without plots. Artifact links are relative to the page, which sits in the run folder.

Given the history of the run's verdicts (the ``glmfb.history/1`` series the run belongs to,
which the commands that record it pass in), each verdict with a series of two runs or more
also gets its history plot (:mod:`glmfb.workflows.report.plots.history`): every run with its interval,
the change points with their size, this run marked. Without it, no such plot.

The page is built from the run's JSON (a ``glmfb.run/2`` document), so it reads a saved run
exactly as it reads a fresh one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from glmfb.contract.text import visible_text
from glmfb.contract.verdict import Run, Verdict
from glmfb.core.commandline import shell_line
from glmfb.core.documents import load_document
from glmfb.core.probe import report_order, report_section
from glmfb.core.runs import JUNIT_FILE, REPORT_FILE, RUN_FILE
from glmfb.workflows.report.plots import Drawn, PlotJob, draw_plots
from glmfb.workflows.report.text import (
    cause_text,
    chain_lines,
    expectation_text,
    expected_label,
    format_metric,
    format_where,
    status_label,
)

REPORT_NAME = REPORT_FILE

_CSS = """
:root{--fail:#b00020;--pass:#17702a;--warn:#9a6a00;--inc:#7a2ea0;--line:#d8d8d8;--soft:#f6f6f6}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header.page{background:#fff;border-bottom:1px solid var(--line);padding:1.2em 2em}
header.page h1{margin:0 0 .2em;font-size:1.5em}
main{padding:0 2em 3em;max-width:1500px}
nav a{margin-right:1em}
table{border-collapse:collapse;margin:1em 0;background:#fff}
td,th{border:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
th{background:var(--soft);font-weight:600}
.st-pass{color:var(--pass)}.st-warn{color:var(--warn)}.st-fail{color:var(--fail)}.st-inconclusive{color:var(--inc)}
.st-error{color:#fff;background:var(--fail);padding:0 4px;border-radius:2px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:.8em;font-weight:600;border:1px solid currentColor;vertical-align:middle}
h2.probe{margin:1.8em 0 .2em;font-size:1.3em}
p.question{margin:0 0 .8em;color:#555}
section.verdict{background:#fff;border:1px solid var(--line);border-left:5px solid #bbb;border-radius:4px;padding:.6em 1.2em 1em;margin:1em 0}
section.verdict.fail,section.verdict.error{border-left-color:var(--fail)}
section.verdict.pass{border-left-color:var(--pass)}
section.verdict.warn{border-left-color:var(--warn)}
section.verdict.inconclusive{border-left-color:var(--inc)}
section.verdict h3{margin:.3em 0 .5em;font-size:1.1em}
table.card{width:100%;margin:.4em 0}
table.card th{width:7em;white-space:nowrap}
.why{font-size:1.02em}
code{background:var(--soft);padding:0 3px;border-radius:2px;word-break:break-all}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));gap:1em;margin:1em 0}
figure.plot{margin:0;border:1px solid #eee;border-radius:4px;padding:.4em;background:#fff}
figure.plot svg{display:block;width:100%;height:auto}
figcaption{font-size:.88em;color:#444;padding:.2em .4em}
.plot-note{font-size:.88em;color:#666;margin:.2em 0}
.plot-error{font-size:.9em;color:var(--fail);border:1px dashed var(--fail);padding:.5em;border-radius:4px}
details{margin:.5em 0}
summary{cursor:pointer;color:#444}
pre{background:var(--soft);padding:8px;overflow:auto;max-height:32em;font-size:12px}
.missing-artifact{color:#888}
"""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "verdict"


def _as_run(run: Run | Verdict | Mapping[str, Any]) -> tuple[Run, dict[str, Any]]:
    """The run as objects (for the shared text helpers) and as its JSON document."""
    if isinstance(run, Verdict):
        run = Run(id=f"verdict-{run.name}", started="", verdicts=(run,))
    if isinstance(run, Run):
        return run, run.to_dict()
    loaded = load_document(run)
    return loaded, loaded.to_dict()


class _Links:
    """Links from the page to files, relative to the page's folder."""

    def __init__(self, page_dir: Path, run_dir: Path | None, run_id: str | None,
                 folders: Mapping[str, tuple[Path, str]] | None = None) -> None:
        self.page_dir = page_dir
        self.run_dir = run_dir
        self.run_id = run_id
        self.folders = folders or {}

    def of(self, verdict_name: str) -> _Links:
        """The links of one verdict: from the folder of the run that holds it, when the page
        shows several runs (the shards of a suite)."""
        if verdict_name not in self.folders:
            return self
        run_dir, run_id = self.folders[verdict_name]
        return _Links(self.page_dir, run_dir, run_id)

    def artifact(self, name: str, raw: str) -> str:
        from glmfb.core.plotting import relative_href, resolve_artifact

        found = resolve_artifact(raw, self.run_dir, self.run_id)
        if found is None:
            return f'<span class="missing-artifact" data-artifact="{escape(name)}">{escape(raw)} (not found)</span>'
        href = relative_href(found, self.page_dir)
        return f'<a href="{escape(href)}" data-artifact="{escape(name)}">{escape(href)}</a>'

    def beside(self, file_name: str) -> str | None:
        from glmfb.core.plotting import relative_href

        if self.run_dir is None or not (self.run_dir / file_name).is_file():
            return None
        return relative_href(self.run_dir / file_name, self.page_dir)


def _card(verdict: Verdict, data: Mapping[str, Any], links: _Links) -> str:
    rows: list[tuple[str, str]] = [("why", f'<span class="why">{escape(verdict.why)}</span>')]
    if verdict.where:
        rows.append(("where", f"<code>{escape(format_where(verdict.where))}</code>"))
    if verdict.metric is not None:
        rows.append(("metric", escape(format_metric(verdict.metric))))
    for step in verdict.next:
        rows.append(("next", f"<code>{escape(shell_line(step))}</code>"))
    if verdict.chain:  # glmfb --follow: the follow-ups, down to the deepest cause
        items = "".join(f"<li>{escape(line.strip())}</li>" for line in chain_lines(verdict))
        rows.append(("chain", f'<span class="why">{escape(cause_text(verdict) or "")}</span>'
                              f'<ul class="chain">{items}</ul>'))
    rows.append(("layer", escape(verdict.layer.value)))
    if verdict.expect is not None:
        rows.append(("expect", f"{escape(expected_label(verdict))}: {escape(expectation_text(verdict))}"))
    artifacts = data.get("artifacts") or {}
    for name, raw in artifacts.items():
        rows.append((escape(name), links.artifact(name, str(raw))))
    rows.append(("took", f"{verdict.duration_s:.2f} s"))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="card">{body}</table>'


def _figure(drawn: Drawn, verdict_name: str) -> str:
    plot_id = escape(drawn.spec.plot_id)
    title = escape(drawn.spec.title)
    if drawn.state == "drawn":
        return (
            f'<figure class="plot" data-plot="{plot_id}" data-state="drawn" data-verdict="{escape(verdict_name)}">'
            f"{drawn.svg}<figcaption>{escape(drawn.caption)}</figcaption></figure>"
        )
    if drawn.state == "missing":
        return (
            f'<p class="plot-note" data-plot="{plot_id}" data-state="missing">'
            f"Not drawn, {title}: {escape(drawn.reason)}.</p>"
        )
    return (
        f'<div class="plot-error" data-plot="{plot_id}" data-state="error">'
        f"The plot {title} could not be drawn ({escape(drawn.reason)}); the evidence is below.</div>"
    )


def _evidence_block(label: str, items: list[Any]) -> str:
    if not items:
        return ""
    kinds = ", ".join(dict.fromkeys(str(e.get("kind")) for e in items if isinstance(e, Mapping)))
    text = json.dumps(items, indent=2)
    return (
        f"<details><summary>{escape(label)} ({len(items)}: {escape(kinds)})</summary>"
        f"<pre>{escape(text)}</pre></details>"
    )


def _section(index: int, verdict: Verdict, data: Mapping[str, Any], links: _Links, drawn: Sequence[Drawn]) -> str:
    shown = [d for d in drawn if not (d.state == "missing" and d.spec.optional)]
    figures = "".join(_figure(d, verdict.name) for d in shown if d.state != "missing")
    notes = "".join(_figure(d, verdict.name) for d in shown if d.state == "missing")
    plotted = {kind for d in drawn if d.state == "drawn" for kind in d.spec.reads}
    evidence = list(data.get("evidence") or [])
    in_plots = [e for e in evidence if isinstance(e, Mapping) and e.get("kind") in plotted]
    others = [e for e in evidence if not (isinstance(e, Mapping) and e.get("kind") in plotted)]
    outcome = verdict.outcome.value
    anchor = f"v-{_slug(verdict.name)}"
    return (
        f'<section class="verdict {outcome}" id="{anchor}" data-probe="{escape(verdict.probe)}" '
        f'data-verdict="{escape(verdict.name)}" data-status="{escape(verdict.status.value)}">'
        f'<h3>{escape(verdict.name)} <span class="badge st-{escape(verdict.status.value)}">'
        f"{escape(status_label(verdict))}</span></h3>"
        f"{_card(verdict, data, links)}"
        + (f'<div class="plots">{figures}</div>' if figures else "")
        + notes
        + _evidence_block("evidence not plotted", others)
        + _evidence_block("evidence shown in the plots, as data", in_plots)
        + "</section>"
    )


def _plot_job(index: int, probe: str, data: Mapping[str, Any], links: _Links,
              history: Sequence[Mapping[str, Any]]) -> PlotJob:
    """What drawing one verdict's plots takes, as plain data (it may cross to a worker)."""
    series: list[Mapping[str, Any]] = []
    if history and links.run_id:
        from glmfb.workflows.report.plots.history import series_for

        series = series_for(history, data, links.run_id)
    run_dir = str(links.run_dir) if links.run_dir is not None else None
    return PlotJob(index, probe, data, run_dir, links.run_id, tuple(series))


def render_html(
    run: Run | Verdict | Mapping[str, Any],
    report_dir: Path | None = None,
    page_path: Path | None = None,
    folders: Mapping[str, tuple[Path, str]] | None = None,
    history: Sequence[Mapping[str, Any]] = (),
    workers: int | None = None,
) -> str:
    """The page for a run: a :class:`Run`, one :class:`Verdict` (a probe given ``--out``), or
    their ``glmfb.run/2`` / ``glmfb.verdict/2`` JSON.

    ``report_dir`` is the run's folder, where its artifacts are looked up; ``page_path`` is where
    the page will be written (default ``report_dir/report.html``): links are relative to it.
    ``folders`` gives, by verdict name, the folder and id of the run that holds it, for a page
    of several runs (the shards of a suite, made one run). ``history`` is the series
    (``glmfb.history/1`` series documents) the runs' verdicts belong to, each drawn in its
    verdict's section with its run marked. ``workers``: processes that draw the plots beside
    this one (:func:`glmfb.workflows.report.plots.draw_plots`; default one per core but this one, 0:
    all here); the page is the same byte for byte however many draw it. A document that is
    not a run or verdict raises :class:`~glmfb.contract.verdict.SchemaError`.
    """
    run_obj, document = _as_run(run)
    page_dir = (page_path.parent if page_path is not None else report_dir) or Path.cwd()
    links = _Links(page_dir, report_dir, run_obj.id, folders)
    summary = run_obj.summary
    counts = ", ".join(
        f"{summary[k]} {k}" for k in ("pass", "warn", "fail", "inconclusive", "error") if summary[k]
    )
    head = (
        "<tr><th>probe</th><th>name</th><th>status</th><th>expected</th><th>layer</th>"
        "<th>metric</th><th>where</th></tr>"
    )
    rows = "".join(
        f'<tr data-verdict="{escape(v.name)}"><td>{escape(v.probe)}</td>'
        f'<td><a href="#v-{_slug(v.name)}">{escape(v.name)}</a></td>'
        f'<td class="st-{v.outcome.value}">{escape(status_label(v))}</td><td>{escape(expected_label(v))}</td>'
        f"<td>{escape(v.layer.value)}</td><td>{escape(format_metric(v.metric))}</td>"
        f"<td>{escape(format_where(v.where))}</td></tr>"
        for v in run_obj.verdicts
    )
    pairs = list(zip(run_obj.verdicts, document["verdicts"], strict=True))
    probes = report_order(v.probe for v, _ in pairs)
    placed = [(verdict, data, links.of(verdict.name)) for probe in probes for verdict, data in pairs
              if verdict.probe == probe]  # page order: each probe's section, its verdicts in run order
    drawn = draw_plots([_plot_job(index, verdict.probe, data, where, history)
                        for index, (verdict, data, where) in enumerate(placed)], workers)
    groups = []
    index = 0
    for probe in probes:
        sections = []
        for verdict, data, where in placed[index:]:
            if verdict.probe != probe:
                break
            sections.append(_section(index, verdict, data, where, drawn[index]))
            index += 1
        section = report_section(probe)
        question = section.question if section is not None else ""
        groups.append(
            f'<h2 class="probe" id="probe-{escape(probe)}">{escape(probe)}</h2>'
            + (f'<p class="question">{escape(question)}</p>' if question else "")
            + "".join(sections)
        )
    nav = "".join(f'<a href="#probe-{escape(p)}">{escape(p)}</a>' for p in probes)
    files = []
    for name in (RUN_FILE, JUNIT_FILE):
        href = links.beside(name)
        if href is not None:
            files.append(f'<a href="{escape(href)}" data-artifact="{escape(name)}">{escape(name)}</a>')
    started = f"started {escape(run_obj.started)}" if run_obj.started else ""
    meta = ", ".join(x for x in (started, f"exit code {int(run_obj.exit_code)}", escape(counts or "no verdicts")) if x)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>glmfb run {escape(run_obj.id)}</title><style>{_CSS}</style></head><body>"
        f'<header class="page"><h1>glmfb run {escape(run_obj.id)}</h1>'
        f"<p>{meta}{' (interrupted)' if run_obj.interrupted else ''}"
        + (f" · {' · '.join(files)}" if files else "")
        + f"</p><nav>{nav}</nav></header><main><table class=\"summary\">{head}{rows}</table>"
        + "".join(groups)
        + "</main></body></html>\n"
    )


def write_html(
    run: Run | Verdict | Mapping[str, Any], report_dir: Path | None, out: Path | None = None, *,
    folders: Mapping[str, tuple[Path, str]] | None = None, history: Sequence[Mapping[str, Any]] = (),
    workers: int | None = None,
) -> Path:
    """Render the run's page and write it atomically (default ``report_dir/report.html``;
    ``report_dir`` None: a page of several runs, ``out`` and ``folders`` given); ``history`` as
    for :func:`render_html`."""
    from glmfb.core.io import write_text_atomic

    if out is not None:
        path = out
    elif report_dir is not None:
        path = report_dir / REPORT_NAME
    else:
        raise ValueError("write_html needs the run's folder or the page's path")
    # The page is glmfb's own markup: a control sequence anywhere in it (a plot's label from a
    # target's text too) came from a target, so the whole page goes through visible_text.
    write_text_atomic(path, visible_text(render_html(run, report_dir, path, folders, history, workers)))
    return path
