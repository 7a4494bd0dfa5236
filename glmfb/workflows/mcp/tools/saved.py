"""The tools that read saved runs: ``gate`` (the CI decision) and ``explain`` (each verdict
with its next steps as tool calls), and the ``source`` argument both take."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import GlmfbError, InputError, UsageError
from glmfb.contract.step import STEP_SCHEMA
from glmfb.contract.verdict import Run
from glmfb.core.probe import safe_component
from glmfb.workflows.mcp.boundary import Boundary
from glmfb.workflows.mcp.tools.answers import artifact_uris, run_ref, summarize
from glmfb.workflows.mcp.tools.base import (
    NEXT_CALL,
    NOTES,
    Answer,
    CallContext,
    Prepared,
    ToolDef,
    refuse_unknown,
)

if TYPE_CHECKING:
    from glmfb.workflows.mcp.tools import Toolbox

SOURCE_SCHEMA = {"type": "string", "description": "A run id, or a run.json / verdict JSON file or a run folder under "
                                                  "the root (default: the latest run in reports/)."}


def source_path(boundary: Boundary, label: str, source: Any) -> Path:
    """The run or verdict file a source argument names (checked when the call is prepared)."""
    from glmfb.core.runs import RUN_FILE, latest_run, run_file_of

    reports = boundary.reports
    try:
        if source is None:
            return latest_run(reports)
        if isinstance(source, str) and source and safe_component(source) == source \
                and (reports / source / RUN_FILE).is_file():
            return reports / source / RUN_FILE
        path = Path(run_file_of(str(boundary.path(source, "source", must_exist=True))))
        return boundary.path(str(path), "source", must_exist=True)
    except GlmfbError as exc:
        message = exc.message if "argument 'source'" in exc.message else f"argument 'source': {exc.message}"
        raise InputError(f"{label}: {message}", exc.hint) from None


def read_source(boundary: Boundary, label: str, path: Path) -> tuple[Run, str | None]:
    """A run from a source file; with its id when it lies in reports/."""
    from glmfb.contract.verdict import SchemaError
    from glmfb.core.documents import load_document
    from glmfb.core.io import read_json

    try:
        run = load_document(read_json(path))
    except SchemaError as exc:
        raise InputError(f"{label}: argument 'source': {boundary.relative(path)} is not a glmfb run or "
                         f"verdict: {exc}") from None
    except GlmfbError as exc:
        raise InputError(f"{label}: argument 'source': {exc.message}", exc.hint) from None
    run_id = run.id if path.parent == boundary.reports / run.id else None
    return run, run_id


@dataclass
class GateTool:
    """``gate``: a run (or one verdict) turned into the CI decision."""

    box: Toolbox

    @cached_property
    def definition(self) -> ToolDef:
        output = {
            "type": "object",
            "required": ["exit_code", "passed", "counts", "rows"],
            "properties": {
                "exit_code": {"type": "integer", "description": "0 pass, 1 regression, 2 bad input, 3 a probe could "
                                                                "not run, 4 inconclusive"},
                "passed": {"type": "boolean"},
                "run": {"type": "object"},
                "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                "rows": {"type": "array", "items": {"type": "object"}},
                "problems": NOTES,
                "warnings": NOTES,
            },
        }
        return ToolDef("gate", "glmfb gate", "Turn a run (or one verdict) into the CI decision, like glmfb gate: the "
                       "exit code (0 pass, 1 regression, 3 could not run, 4 inconclusive) and each verdict's "
                       "decision under a policy.",
                       {"type": "object", "additionalProperties": False, "properties": {
                           "source": SOURCE_SCHEMA,
                           "policy": {"type": "string", "description": "A TOML policy file under the root."},
                       }}, output, read_only=True)

    def prepare(self, arguments: dict[str, Any]) -> Prepared:
        from glmfb.workflows.gate import load_policy

        label, boundary = "glmfb gate", self.box.boundary
        refuse_unknown(label, arguments, self.definition.input_schema["properties"])
        policy = None
        if "policy" in arguments:
            policy_path = boundary.path(arguments["policy"], "policy", must_exist=True, what="policy file")
            try:
                policy = load_policy(policy_path)
            except UsageError as exc:
                raise InputError(f"{label}: argument 'policy': {exc.message}", exc.hint) from None
        source = source_path(boundary, label, arguments.get("source"))
        timeout_s, _ = boundary.timeout(None)

        def work(ctx: CallContext) -> Answer:
            return self._gate(*read_source(boundary, label, source), policy)

        return Prepared("gate", timeout_s, work)

    def _gate(self, run: Run, run_id: str | None, policy: Any) -> Answer:
        from glmfb.workflows.gate import GateDecision, evaluate

        result = evaluate(run, policy)
        rows = [{"name": row.verdict.name, "probe": row.verdict.probe, "status": row.verdict.status.value,
                 "outcome": row.verdict.outcome.value, "decision": row.decision.value,
                 **({"reason": row.reason} if row.reason else {}), "why": row.verdict.why}
                for row in result.rows]
        structured: dict[str, Any] = {
            "exit_code": int(result.exit_code), "passed": result.passed,
            "run": run_ref(self.box.boundary, run_id) if run_id else {"id": run.id},
            "counts": {decision.value: result.count(decision) for decision in GateDecision},
            "rows": rows, "problems": list(result.problems), "warnings": list(result.warnings),
        }
        failing = [row for row in rows if row["decision"] not in ("ok", "allowed")]
        lines = [f"glmfb gate: {'passed' if result.passed else 'failed'} (exit code {int(result.exit_code)}), "
                 f"{len(rows)} verdict(s) of run {run.id}"]
        lines += [f"- {row['decision']}: {row['probe']} {row['name']}: {row['why']}" for row in failing]
        lines += [f"- {problem}" for problem in result.problems]
        return Answer("\n".join(lines), structured)


@dataclass
class ExplainTool:
    """``explain``: a saved run's verdicts, each with its next steps as tool calls."""

    box: Toolbox

    @cached_property
    def definition(self) -> ToolDef:
        item = {
            "type": "object",
            "required": ["name", "probe", "status", "layer", "why", "next", "next_calls"],
            "properties": {
                "name": {"type": "string"}, "probe": {"type": "string"}, "status": {"type": "string"},
                "outcome": {"type": "string"}, "layer": {"type": "string"}, "where": {"type": "object"},
                "why": {"type": "string"}, "metric": {"type": ["object", "null"]},
                "next": {"type": "array", "items": STEP_SCHEMA},
                "next_calls": {"type": "array", "items": NEXT_CALL},
                "artifacts": {"type": "object"},
            },
        }
        output = {"type": "object", "required": ["run", "verdicts"],
                  "properties": {"run": {"type": "object"}, "verdicts": {"type": "array", "items": item}}}
        return ToolDef("explain", "glmfb explain", "Explain a saved verdict or run: for each verdict its status, "
                       "layer, where, why, metric and next steps (also as tool calls).",
                       {"type": "object", "additionalProperties": False, "properties": {
                           "source": SOURCE_SCHEMA,
                           "name": {"type": "string", "description": "Only the verdicts whose name matches (glob)."},
                       }}, output, read_only=True)

    def prepare(self, arguments: dict[str, Any]) -> Prepared:
        label, boundary = "glmfb explain", self.box.boundary
        refuse_unknown(label, arguments, self.definition.input_schema["properties"])
        pattern = arguments.get("name")
        if pattern is not None and not isinstance(pattern, str):
            raise InputError(f"{label}: argument 'name': expected a string (a glob)")
        source = source_path(boundary, label, arguments.get("source"))
        timeout_s, _ = boundary.timeout(None)

        def work(ctx: CallContext) -> Answer:
            return self._explain(*read_source(boundary, label, source), pattern, label)

        return Prepared("explain", timeout_s, work)

    def _explain(self, run: Run, run_id: str | None, pattern: str | None, label: str) -> Answer:
        import fnmatch

        boundary = self.box.boundary
        chosen = [v for v in run.verdicts if pattern is None or fnmatch.fnmatchcase(v.name, pattern)]
        if pattern is not None and not chosen:
            raise InputError(f"{label}: argument 'name': no verdict named {pattern!r} in run {run.id}",
                             f"its verdicts: {', '.join(v.name for v in run.verdicts) or 'none'}")
        items: list[dict[str, Any]] = []
        for verdict in chosen:
            items.append({
                "name": verdict.name, "probe": verdict.probe, "status": verdict.status.value,
                "outcome": verdict.outcome.value, "layer": verdict.layer.value, "where": dict(verdict.where),
                "why": verdict.why, "metric": verdict.metric.to_dict() if verdict.metric else None,
                "next": [step.to_dict() for step in verdict.next], "next_calls": self.box.next_calls(verdict.next),
                "artifacts": artifact_uris(boundary, verdict, run_id) if run_id else dict(verdict.artifacts),
            })
        ref = run_ref(boundary, run_id) if run_id else {"id": run.id}
        text = "\n\n".join(summarize(v, item["next_calls"], ref.get("uri")) for v, item in zip(chosen, items,
                                                                                               strict=True))
        return Answer(text or f"run {run.id} has no verdicts", {"run": ref, "verdicts": items})
