"""What tools answer with, besides their structured content: references to a run and its
artifacts as resource URIs, and a few lines of text for the model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from glmfb.contract.verdict import Run, Verdict
from glmfb.core.commandline import shell_line
from glmfb.workflows.mcp.tools.base import ARTIFACT_URI, RUN_URI

if TYPE_CHECKING:
    from glmfb.workflows.invocation import Finished
    from glmfb.workflows.mcp.boundary import Boundary


def finished_notes(finished: Finished) -> tuple[str, ...]:
    """What an invocation's writing has to say to the model: its warnings (a history store that
    failed), and the files a signal left unwritten."""
    notes = list(finished.warnings)
    if finished.not_written:
        notes.append(f"interrupted ({finished.stopped_by}) while writing: {', '.join(finished.not_written)} "
                     "not written")
    return tuple(notes)


def run_ref(boundary: Boundary, run_id: str) -> dict[str, Any]:
    """A run in reports/: its id, its run.json resource, its folder relative to the root."""
    return {"id": run_id, "uri": RUN_URI.format(run_id=run_id),
            "folder": boundary.relative(boundary.reports / run_id)}


def artifact_uris(boundary: Boundary, verdict: Verdict, run_id: str) -> dict[str, str]:
    """The verdict's artifacts that lie in its run folder, as resource URIs."""
    run_dir = (boundary.reports / run_id).resolve()
    uris: dict[str, str] = {}
    for label, raw in verdict.artifacts.items():
        path = boundary.inside(raw)
        if path is not None and path.is_file() and path.is_relative_to(run_dir):
            uris[label] = ARTIFACT_URI.format(run_id=run_id, path=path.relative_to(run_dir).as_posix())
    return uris


def _where(verdict: Verdict) -> str:
    return ", ".join(f"{k}={v}" for k, v in verdict.where.items())


def summarize(verdict: Verdict, calls: Sequence[Mapping[str, Any]], run_uri: str | None,
              notes: Sequence[str] = ()) -> str:
    """A few lines for the model: status and layer, where, why, the next steps."""
    head = f"glmfb {verdict.probe} {verdict.name!r}: {verdict.status.value.upper()} ({verdict.layer.value})"
    if verdict.expect_met is not None:
        head += f"; expectation {'met' if verdict.expect_met else 'NOT met'}"
    lines = [head]
    if verdict.where:
        lines.append(f"where: {_where(verdict)}")
    lines.append(f"why: {verdict.why}")
    by_index = {call["index"]: call for call in calls}
    for index, step in enumerate(verdict.next):
        call = by_index.get(index)
        suffix = ""
        if call is not None and "arguments" in call:
            suffix = f"  [next_calls[{calls.index(call)}]: tool {call['tool']}]"
        lines.append(f"next {index + 1}: {shell_line(step)}{suffix}")
    if verdict.chain:  # followed (follow argument): the line, in the same answer
        from glmfb.workflows.report.text import cause_text, chain_lines

        lines.append(f"deepest cause: {cause_text(verdict)}")
        lines += ["chain:", *chain_lines(verdict)]
    lines += [f"note: {note}" for note in notes]
    if run_uri:
        lines.append(f"run: {run_uri}")
    return "\n".join(lines)


def summarize_run(run: Run, run_uri: str, notes: Sequence[str] = ()) -> str:
    """A line for the run, one per verdict."""
    counts = {k: v for k, v in run.summary.items() if v and k != "total"}
    lines = [f"glmfb run {run.id}: {len(run.verdicts)} verdict(s), "
             + ", ".join(f"{v} {k}" for k, v in counts.items()) + (" (interrupted)" if run.interrupted else "")]
    for verdict in run.verdicts:
        mark = "" if verdict.expect_met is None else (" expectation met" if verdict.expect_met else
                                                      " expectation NOT met")
        lines.append(f"- {verdict.outcome.value}: {verdict.probe} {verdict.name} "
                     f"({verdict.status.value}{mark}): {verdict.why}")
    lines += [f"note: {note}" for note in notes]
    lines.append(f"run: {run_uri}")
    return "\n".join(lines)
