"""The ``run`` tool: the probe definitions under the root, run like ``glmfb run`` (each probe
in a supervised child, one at a time), written to ``reports/<run-id>/`` with report.html and
junit.xml, answered with the run and every verdict's next steps as tool calls."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import InputError, UsageError
from glmfb.contract.verdict import Verdict
from glmfb.core.commandline import run_step
from glmfb.workflows.mcp.boundary import Boundary, strings
from glmfb.workflows.mcp.tools.answers import finished_notes, run_ref, summarize_run
from glmfb.workflows.mcp.tools.base import (
    ARTIFACT_URI,
    FOLLOW_SCHEMA,
    NEXT_CALL,
    NOTES,
    RUN_REF,
    Answer,
    CallContext,
    Prepared,
    ToolDef,
    duration_schema,
    follow_argument,
    refuse_unknown,
    with_defs,
)

if TYPE_CHECKING:
    from glmfb.workflows.mcp.tools import Toolbox

PATHS_SCHEMA = {"type": ["string", "array"], "items": {"type": "string"},
                "description": "Definition files or folders under the root (default: probes)."}


def definitions(boundary: Boundary, label: str, arguments: Mapping[str, Any]) -> list[Any]:
    """The probe definitions that ``paths`` and ``select`` name (checked now)."""
    from glmfb.workflows import suite

    paths = boundary.paths(arguments.get("paths", "probes"), "paths", must_exist=True, what="file or folder")
    select = strings(arguments.get("select", []), "select")
    try:
        chosen = suite.selected(suite.load_definitions(suite.discover(paths)), select,
                                [boundary.relative(p) for p in paths])
    except UsageError as exc:
        raise InputError(f"{label}: {exc.message}", exc.hint) from None
    for definition in chosen:  # every path each names stays under the root, as a probe tool's
        try:
            boundary.definition(definition)
        except InputError as exc:
            raise InputError(f"{label}: {exc.message}", exc.hint) from None
    return chosen


@dataclass
class RunTool:
    """``run``: the probe definitions, run."""

    box: Toolbox

    @cached_property
    def definition(self) -> ToolDef:
        output = with_defs({
            "type": "object",
            "required": ["run", "ref", "next_calls"],
            "properties": {
                "run": {"$ref": "#/$defs/run"},
                "ref": RUN_REF,
                "report": {"type": "string", "description": "report.html of the run, as a resource URI"},
                "next_calls": {"type": "array", "items": {**NEXT_CALL, "properties": {
                    **NEXT_CALL["properties"], "verdict": {"type": "string", "description": "the verdict's name"}}}},
                "notes": NOTES,
            },
        }, self.box.defs)
        return ToolDef(
            "run", "glmfb run",
            "Run the probe definitions (TOML [[probe]] tables) under the root, like glmfb run: each probe in a "
            "supervised child, each verdict judged against its definition's expectation. Answers with the "
            "glmfb.run/2 document (also written to reports/<run-id>/run.json with report.html and junit.xml), "
            "and every verdict's next steps as tool calls. Long: reports progress, honours cancellation.",
            {"type": "object", "additionalProperties": False, "properties": {
                "paths": PATHS_SCHEMA,
                "select": {"type": ["string", "array"], "items": {"type": "string"},
                           "description": "Run only definitions whose name matches (glob or substring)."},
                "timeout": duration_schema(self.box.boundary),
                "follow": {**FOLLOW_SCHEMA, "description": FOLLOW_SCHEMA["description"]
                           + " Applies to every definition (a definition's own follow key still applies without it)."},
            }}, output)

    def prepare(self, arguments: dict[str, Any]) -> Prepared:
        label = "glmfb run"
        refuse_unknown(label, arguments, self.definition.input_schema["properties"])
        chosen = definitions(self.box.boundary, label, arguments)
        timeout_s, note = self.box.boundary.timeout(arguments.get("timeout"))
        follow = follow_argument(label, arguments, self.box.boundary)
        notes = (note,) if note else ()

        def work(ctx: CallContext) -> Answer:
            return self._run_suite(chosen, ctx, notes, follow)

        return Prepared("run", timeout_s, work, runs_probes=True, notes=notes,
                        label=f"run of {len(chosen)} definition(s)")

    def _refused(self, definition: Any, ctx: CallContext) -> str | None:
        """Why a definition is not run now (None: it may run, once the slot is free)."""
        if ctx.cancel.is_set():
            return "the call was cancelled"
        if ctx.remaining_s() <= 0:
            return "the call's time budget ran out"
        commands = self.box.boundary.commands_of(definition)
        if commands and not self.box.boundary.allow_commands:
            return (f"it runs a command line ({', '.join(commands)}), which this server runs only with "
                    "--allow-commands")
        return None

    def _run_one(self, definition: Any, context: Any, ctx: CallContext, label: str) -> Verdict:
        """One definition's verdict: run in its turn, or an error verdict that says why not."""
        from glmfb.workflows import suite

        refused = self._refused(definition, ctx) or ctx.take_slot()
        if refused is None:
            ctx.progress(label)
            limit = ctx.remaining_s()
            if definition.timeout_s is not None:
                limit = min(limit, definition.timeout_s)
            try:
                verdict = suite.run_definition(dataclasses.replace(definition, timeout_s=max(limit, 0.1)), context)
                return suite.follow_definition(definition, verdict, context)  # follow: the call's or the definition's
            finally:
                ctx.slot.release()
        verdict = Verdict.harness_error(definition.probe, definition.name, f"not run: {refused}",
                                        next=[run_step([definition.name])])
        if definition.expect is not None:  # a probe that did not run never meets its expectation
            verdict = dataclasses.replace(verdict, expect=definition.expect, expect_met=False)
        return verdict

    def _follower(self, ctx: CallContext) -> Any:
        """The follow engine under this server's boundary, within the call's time budget."""
        from glmfb.workflows.mcp.follow import follow_verdict

        def follow(verdict: Verdict, options: Any, artifact_dir: Any) -> Verdict:
            options = dataclasses.replace(options, budget_s=min(options.budget_s, max(ctx.remaining_s(), 0.0)),
                                          allow_commands=self.box.boundary.allow_commands)
            return follow_verdict(verdict, options, self.box, artifact_dir=artifact_dir, run_id=ctx.run_id,
                                  progress=ctx.progress, cancel=ctx.cancel)

        return follow

    def _run_suite(self, chosen: Sequence[Any], ctx: CallContext, notes: tuple[str, ...],
                   follow: Any = None) -> Answer:
        from glmfb.core.runs import REPORT_FILE
        from glmfb.workflows import suite
        from glmfb.workflows.history.record import suite_origins
        from glmfb.workflows.invocation import begin

        invocation = begin(self.box.boundary.reports, run_id=ctx.run_id)  # the gate's pointer, first
        context = suite.SuiteContext(ctx.run_id, invocation.report_dir, on_progress=ctx.progress, isolate=True,
                                     cancel=ctx.cancel, follow=follow, follower=self._follower(ctx))
        verdicts = [self._run_one(definition, context, ctx, f"{index + 1}/{len(chosen)} {definition.probe} "
                                                            f"{definition.name}")
                    for index, definition in enumerate(chosen)]
        finished = invocation.finish(verdicts, interrupted=ctx.cancel.is_set(), history=self.box.boundary.history,
                                     origins=lambda: suite_origins(chosen))
        run = finished.run
        notes = (*notes, *finished_notes(finished))
        structured: dict[str, Any] = {
            "run": run.to_dict(), "ref": run_ref(self.box.boundary, ctx.run_id),
            "next_calls": self._next_calls(run.verdicts),
            "report": ARTIFACT_URI.format(run_id=ctx.run_id, path=REPORT_FILE),
        }
        if notes:
            structured["notes"] = list(notes)
        return Answer(summarize_run(run, structured["ref"]["uri"], notes), structured)

    def _next_calls(self, verdicts: Sequence[Verdict]) -> list[dict[str, Any]]:
        """Every verdict's next steps as tool calls, each naming its verdict."""
        calls: list[dict[str, Any]] = []
        for verdict in verdicts:
            calls.extend({"verdict": verdict.name, **call} for call in self.box.next_calls(verdict.next))
        return calls
