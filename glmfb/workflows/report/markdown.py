"""A Markdown summary of a gate result, for a CI step summary (GitHub's $GITHUB_STEP_SUMMARY)."""

from __future__ import annotations

from glmfb.core.commandline import shell_line
from glmfb.workflows.gate import GateDecision, GateResult
from glmfb.workflows.report.text import (
    cause_text,
    chain_lines,
    expectation_text,
    format_metric,
    format_where,
    printable,
    status_label,
)

_ICON = {
    GateDecision.OK: "✅",
    GateDecision.FAILED: "❌",
    GateDecision.ERRORED: "💥",
    GateDecision.INCONCLUSIVE: "❔",
    GateDecision.ALLOWED: "⚠️",
}


def _cell(text: str) -> str:
    return printable(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(result: GateResult) -> str:
    verdict_word = "passed" if result.passed else f"failed (exit {int(result.exit_code)})"
    lines = [
        f"## glmfb gate {verdict_word}",
        "",
        f"Run `{result.run.id}`: "
        + ", ".join(f"{result.count(d)} {d.value}" for d in GateDecision if result.count(d)),
        "",
        "| | probe | name | status | layer | metric | where |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result.rows:
        v = row.verdict
        lines.append(
            f"| {_ICON[row.decision]} | {v.probe} | {_cell(v.name)} | {_cell(status_label(v))} "
            f"| {v.layer.value} | {_cell(format_metric(v.metric))} | {_cell(format_where(v.where))} |"
        )
    if result.problems:
        lines += ["", *(f"💥 {problem}" for problem in result.problems)]
    details = [row for row in result.rows if row.decision is not GateDecision.OK]
    if details:
        lines += ["", "### What needs a look", ""]
        for row in details:
            v = row.verdict
            lines.append(f"**{_cell(v.name)}** ({row.decision.value}): {printable(v.why)}")
            if v.expect is not None:
                lines.append(f"- {expectation_text(v)}")
            if row.reason:
                lines.append(f"- allowed: {row.reason}")
            lines.extend(f"- next: `{shell_line(step)}`" for step in v.next)
            if v.chain:  # glmfb --follow
                lines.append(f"- deepest cause: {printable(cause_text(v) or '')}")
                lines.extend(f"  {printable(line)}" for line in chain_lines(v))
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
