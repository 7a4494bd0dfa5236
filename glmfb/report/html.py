"""A self-contained HTML page for a run: the summary table, then each verdict with its
where, why, metric, next steps, artifacts and evidence. No scripts, no external assets."""

from __future__ import annotations

import json
from html import escape

from glmfb.report.text import (
    expectation_text,
    expected_label,
    format_metric,
    format_where,
    status_label,
)
from glmfb.verdict import Run, Verdict

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.pass{color:#17702a}.warn{color:#9a6a00}.fail{color:#b00020}
.inconclusive{color:#7a2ea0}.error{color:#fff;background:#b00020;padding:0 4px}
section{border-left:4px solid #ccc;padding:0 1em;margin:1.5em 0}section.fail,section.error{border-color:#b00020}
pre{background:#f7f7f7;padding:8px;overflow:auto;max-height:30em}code{background:#f3f3f3}
"""


def _verdict_section(verdict: Verdict) -> str:
    outcome = verdict.outcome.value
    rows = [
        ("status", f'<span class="{verdict.status.value}">{escape(status_label(verdict))}</span>'),
        ("layer", escape(verdict.layer.value)),
    ]
    if verdict.where:
        rows.append(("where", escape(format_where(verdict.where))))
    rows.append(("why", escape(verdict.why)))
    if verdict.metric is not None:
        rows.append(("metric", escape(format_metric(verdict.metric))))
    if verdict.expect is not None:
        rows.append(("expect", escape(expectation_text(verdict))))
    for step in verdict.next:
        rows.append(("next", f"<code>{escape(step)}</code>"))
    for name, path in verdict.artifacts.items():
        rows.append((escape(name), f'<a href="{escape(path)}">{escape(path)}</a>'))
    rows.append(("took", f"{verdict.duration_s:.2f} s"))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    evidence = json.dumps([e.to_dict() for e in verdict.evidence], indent=2)
    anchor = escape(verdict.name)
    return (
        f'<section class="{outcome}" id="{anchor}"><h2>{escape(verdict.probe)}: {anchor}</h2>'
        f"<table>{body}</table><details><summary>evidence ({len(verdict.evidence)})</summary>"
        f"<pre>{escape(evidence)}</pre></details></section>"
    )


def render_html(run: Run) -> str:
    summary = run.summary
    counts = ", ".join(
        f"{summary[k]} {k}" for k in ("pass", "warn", "fail", "inconclusive", "error") if summary[k]
    )
    head = "<tr><th>probe</th><th>name</th><th>status</th><th>expected</th><th>layer</th><th>metric</th><th>where</th></tr>"
    rows = "".join(
        f'<tr><td>{escape(v.probe)}</td><td><a href="#{escape(v.name)}">{escape(v.name)}</a></td>'
        f'<td class="{v.outcome.value}">{escape(status_label(v))}</td><td>{escape(expected_label(v))}</td>'
        f"<td>{escape(v.layer.value)}</td><td>{escape(format_metric(v.metric))}</td>"
        f"<td>{escape(format_where(v.where))}</td></tr>"
        for v in run.verdicts
    )
    sections = "".join(_verdict_section(v) for v in run.verdicts)
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>glmfb run {escape(run.id)}</title>'
        f"<style>{_CSS}</style></head><body><h1>glmfb run {escape(run.id)}</h1>"
        f"<p>started {escape(run.started)}, exit code {int(run.exit_code)}: {escape(counts or 'no verdicts')}"
        f"{' (interrupted)' if run.interrupted else ''}</p><table>{head}{rows}</table>{sections}</body></html>\n"
    )
