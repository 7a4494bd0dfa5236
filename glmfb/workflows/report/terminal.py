"""Rich renderables for verdicts, runs and gate results. They return what to show; the CLI
decides where it goes. Styles are semantic names (``status.fail``), set in :data:`THEME`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from glmfb.contract.text import visible_text
from glmfb.contract.verdict import Run, Status, Verdict
from glmfb.core.commandline import shell_line
from glmfb.workflows.report.text import (
    cause_text,
    chain_lines,
    expectation_text,
    expected_label,
    format_metric,
    format_where,
    status_label,
)

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.theme import Theme

    from glmfb.workflows.gate import GateResult

STYLES = {
    "status.pass": "bold green",
    "status.warn": "bold yellow",
    "status.fail": "bold red",
    "status.inconclusive": "bold magenta",
    "status.error": "bold white on red",
    "verdict.label": "dim",
    "verdict.why": "",
    "verdict.next": "cyan",
    "verdict.unexpected": "bold red",
    "table.header": "bold",
    "evidence.key": "dim",
}


def theme() -> Theme:
    from rich.theme import Theme

    return Theme(STYLES)


def _status_text(verdict: Verdict) -> RenderableType:
    from rich.text import Text

    style = f"status.{verdict.outcome.value}"
    if verdict.expect_met is None:
        style = f"status.{verdict.status.value}"
    return Text(status_label(verdict), style=style)


def render_verdict(verdict: Verdict) -> RenderableType:
    """A panel: status and layer, where, why, metric, expectation, next, the chain and its
    deepest cause (``--follow``), artifacts."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="verdict.label", no_wrap=True)
    grid.add_column()
    grid.add_row("status", _status_text(verdict))
    grid.add_row("layer", verdict.layer.value)
    if verdict.where:
        grid.add_row("where", visible_text(format_where(verdict.where)))
    grid.add_row("why", Text(visible_text(verdict.why), style="verdict.why"))
    if verdict.metric is not None:
        grid.add_row("metric", format_metric(verdict.metric))
    if verdict.expect is not None:
        style = "" if verdict.expect_met else "verdict.unexpected"
        grid.add_row("expect", Text(expectation_text(verdict), style=style))
    for index, step in enumerate(verdict.next):
        grid.add_row("next" if index == 0 else "", Text(visible_text(shell_line(step)), style="verdict.next"))
    if verdict.chain:  # glmfb --follow: the follow-ups, then where they end
        for index, line in enumerate(chain_lines(verdict)):
            grid.add_row("chain" if index == 0 else "", visible_text(line))
        grid.add_row("cause", Text(visible_text(cause_text(verdict) or ""), style="verdict.unexpected"))
    for name, path in verdict.artifacts.items():
        grid.add_row(visible_text(name), visible_text(path))
    grid.add_row("took", f"{verdict.duration_s:.2f} s")
    title = visible_text(f"glmfb {verdict.probe}: {verdict.name}")
    border = f"status.{verdict.outcome.value}"
    panel = Panel(Group(grid), title=title, title_align="left", border_style=border)
    shown = [item for item in verdict.evidence if item.show_in_terminal]
    return Group(*shown, panel) if shown else panel


def _needs_a_look(verdict: Verdict) -> bool:
    """Not what it should be: an unmet expectation, or (without one) anything but a pass."""
    if verdict.expect_met is not None:
        return not verdict.expect_met
    return verdict.status is not Status.PASS


def render_run(run: Run, *, verbose: bool = False, folder_size: str | None = None) -> RenderableType:
    """A run as a terminal shows it: a panel for each verdict that did not go as expected (every
    verdict with ``verbose``), then the summary table, one line per definition, last."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[RenderableType] = [render_verdict(v) for v in run.verdicts if verbose or _needs_a_look(v)]
    table = Table(title=f"glmfb run {run.id}", header_style="table.header", expand=False)
    with_expectations = any(v.expect is not None for v in run.verdicts)
    columns = ["probe", "name", "status", "layer", "metric", "where"]
    if with_expectations:
        columns.insert(3, "expected")
    for column in columns:
        table.add_column(column, overflow="fold")
    for verdict in run.verdicts:
        cells: list[RenderableType] = [
            verdict.probe,
            visible_text(verdict.name),
            _status_text(verdict),
            verdict.layer.value,
            format_metric(verdict.metric),
            visible_text(format_where(verdict.where)),
        ]
        if with_expectations:
            cells.insert(3, expected_label(verdict))
        table.add_row(*cells)
    parts.append(table)
    summary = run.summary
    counts = ", ".join(f"{summary[s.value]} {s.value}" for s in Status if summary[s.value]) or "no verdicts"
    if run.shard is not None:
        counts += f" in shard {run.shard.label} ({len(run.shard.names)} of the suite's {run.shard.total} definitions)"
    if summary["expect_met"] or summary["expect_unmet"]:
        counts += f"; expectations: {summary['expect_met']} met, {summary['expect_unmet']} unmet"
    if folder_size:
        counts += f"; run folder {folder_size}"
    parts.append(Text(counts))
    if run.interrupted:
        parts.append(Text("interrupted: the probe that was running and those not run are marked error",
                          style="status.error"))
    return Group(*parts)


def gate_lines(result: GateResult) -> list[tuple[str, str | None]]:
    """The gate's summary, each line with its style (None: plain): what
    :func:`render_gate` draws in a terminal and what a log gets as plain lines."""
    from glmfb.workflows.gate import GateDecision

    word = "passed" if result.passed else f"failed (exit {int(result.exit_code)})"
    counts = ", ".join(f"{result.count(d)} {d.value}" for d in GateDecision if result.count(d))
    lines: list[tuple[str, str | None]] = [
        (f"glmfb gate {word}: {counts or 'no verdicts'}", "status.pass" if result.passed else "status.fail")
    ]
    lines.extend((f"  {problem}", "status.error") for problem in result.problems)
    for row in result.rows:
        if row.decision is not GateDecision.OK:
            suffix = f" (allowed: {row.reason})" if row.reason else ""
            lines.append((visible_text(f"  {row.decision.value}: {row.verdict.name}: {row.verdict.why}{suffix}"), None))
            cause = cause_text(row.verdict)
            if cause is not None:  # glmfb --follow: where the chain ends, in one line
                lines.append((visible_text(f"    deepest cause: {cause}"), None))
    return lines


def render_gate(result: GateResult) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    return Group(*(Text(text, style=style or "") for text, style in gate_lines(result)))
