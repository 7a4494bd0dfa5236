"""The ``bisect`` tool: ``glmfb bisect GOOD BAD DEFINITION`` for an agent, written to
``reports/<run-id>/`` with report.html and junit.xml, answered with the bisection's verdict,
its run and its next steps as tool calls.

A bisection runs many probes one after another, and sets up worktrees between them: it holds
the server's probe slot from its first evaluation to its last, so nothing else is timed while
it runs (another probe call waits its turn, within its own budget). ``timeout`` is the whole
call's budget: no evaluation or set-up runs past it; cancelling the call stops the running
probe, removes the worktrees and answers with what was evaluated so far."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import InputError, UsageError
from glmfb.contract.verdict import Verdict
from glmfb.workflows.mcp.boundary import strings
from glmfb.workflows.mcp.tools.answers import finished_notes, run_ref, summarize
from glmfb.workflows.mcp.tools.base import (
    ARTIFACT_URI,
    NEXT_CALL,
    NOTES,
    RUN_REF,
    Answer,
    CallContext,
    Prepared,
    ToolDef,
    duration_schema,
    refuse_unknown,
    with_defs,
)

if TYPE_CHECKING:
    from glmfb.workflows.bisect import BisectRequest
    from glmfb.workflows.mcp.tools import Toolbox

LABEL = "glmfb bisect"


@dataclass
class BisectTool:
    """``bisect``: the commit between GOOD and BAD where a probe definition starts to fail."""

    box: Toolbox

    @cached_property
    def definition(self) -> ToolDef:
        from glmfb.workflows.bisect.engine import DEFAULT_MAX_EVALUATIONS

        output = with_defs({
            "type": "object",
            "required": ["verdict", "run", "next_calls", "evaluations"],
            "properties": {
                "verdict": {"$ref": "#/$defs/verdict"},
                "run": RUN_REF,
                "report": {"type": "string", "description": "report.html of the run, as a resource URI"},
                "evaluations": {"type": "integer", "minimum": 0, "description": "probe runs made, retries included"},
                "next_calls": {"type": "array", "items": NEXT_CALL},
                "notes": NOTES,
            },
        }, self.box.defs)
        return ToolDef(
            "bisect", "glmfb bisect",
            "Find the commit between GOOD and BAD where a probe definition starts to fail, like glmfb bisect, over "
            "the git repository that holds the definition file: each commit in a worktree of its own, its "
            "candidate against GOOD's baseline. First confirms that BAD fails against GOOD (else: a pass, no "
            "culprit). Answers with a glmfb.verdict/2 verdict: fail with where.commit and the last good and first "
            "bad commits' own verdicts in its evidence, or inconclusive naming the range that could not be split; "
            "the run it was written to; its next steps as tool calls. Long: reports progress, honours cancellation; "
            "holds the probe slot for the whole bisection.",
            {"type": "object", "additionalProperties": False, "required": ["good", "bad", "definition"],
             "properties": {
                 "good": {"type": "string", "description": "A revision where the definition passes."},
                 "bad": {"type": "string", "description": "A later revision where it fails."},
                 "definition": {"type": "string", "description": "The probe definition file (.toml) under the root, "
                                "in the git repository to bisect."},
                 "select": {"type": ["string", "array"], "items": {"type": "string"},
                            "description": "The definition to follow when the file holds several (glob or "
                                           "substring); must select exactly one."},
                 "setup": {"type": "string", "description": "Shell command run in each commit's worktree before it "
                           "is evaluated; failing skips the commit. "
                           + ("Allowed on this server." if self.box.boundary.allow_commands
                              else "Refused unless the server runs with --allow-commands.")},
                 "max_evaluations": {"type": "integer", "minimum": 1, "description": "Most probe runs in all, "
                                     f"retries included (default {DEFAULT_MAX_EVALUATIONS})."},
                 "timeout": duration_schema(self.box.boundary),
             }}, output)

    def prepare(self, arguments: dict[str, Any]) -> Prepared:
        from glmfb.workflows.bisect import BisectRequest, choose_definition
        from glmfb.workflows.bisect.engine import DEFAULT_MAX_EVALUATIONS

        boundary = self.box.boundary
        refuse_unknown(LABEL, arguments, self.definition.input_schema["properties"])
        good, bad = (_revision(arguments, key) for key in ("good", "bad"))
        if "definition" not in arguments:
            raise InputError(f"{LABEL}: argument 'definition' is required", "give the probe definition file (.toml)")
        path = boundary.path(arguments["definition"], "definition", must_exist=True, what="definition file")
        if not path.is_file():
            raise InputError(f"{LABEL}: argument 'definition': {boundary.relative(path)} is not a file",
                             "give the probe definition file (.toml)")
        select = tuple(strings(arguments.get("select", []), "select"))
        setup = arguments.get("setup")
        if setup is not None:
            if not isinstance(setup, str) or not setup.strip():
                raise InputError(f"{LABEL}: argument 'setup': expected a shell command as a non-empty string")
            if not boundary.allow_commands:
                raise InputError(f"{LABEL}: argument 'setup': this server does not run command lines",
                                 "start glmfb mcp with --allow-commands, or bisect without a set-up")
        max_evaluations = arguments.get("max_evaluations", DEFAULT_MAX_EVALUATIONS)
        if isinstance(max_evaluations, bool) or not isinstance(max_evaluations, int) or max_evaluations < 1:
            raise InputError(f"{LABEL}: argument 'max_evaluations': expected a whole number of 1 or more, got "
                             f"{max_evaluations!r:.80}")
        try:
            chosen = choose_definition(path, select)
        except UsageError as exc:
            raise InputError(f"{LABEL}: {exc.message}", exc.hint) from None
        try:
            boundary.definition(chosen)  # every path it names stays under the root, as a probe tool's
        except InputError as exc:
            raise InputError(f"{LABEL}: {exc.message}", exc.hint) from None
        commands = boundary.commands_of(chosen)
        if commands and not boundary.allow_commands:
            raise InputError(f"{LABEL}: definition {chosen.name!r} runs a command line ({', '.join(commands)}), "
                             "which this server runs only with --allow-commands")
        timeout_s, note = boundary.timeout(arguments.get("timeout"))
        notes = (note,) if note else ()
        request = BisectRequest(good=good, bad=bad, definition=path, select=select, setup=setup,
                                max_evaluations=max_evaluations)

        def work(ctx: CallContext) -> Answer:
            return self._bisect(request, (chosen.probe, chosen.name), ctx, notes)

        return Prepared("bisect", timeout_s, work, runs_probes=True, notes=notes,
                        label=f"bisection of {chosen.name!r} between {good} and {bad}")

    def _bisect(self, request: BisectRequest, followed: tuple[str, str], ctx: CallContext,
                notes: tuple[str, ...]) -> Answer:
        """Run the bisection (once the slot is free) and write its run folder as glmfb bisect
        does; ``followed`` is the definition's probe kind and name."""
        from glmfb.core.runs import REPORT_FILE
        from glmfb.workflows.bisect import bisect
        from glmfb.workflows.invocation import begin

        boundary = self.box.boundary
        invocation = begin(boundary.reports, run_id=ctx.run_id)  # the gate's pointer, before anything can fail
        report_dir = invocation.report_dir
        evaluations, interrupted = 0, False
        refused = ctx.take_slot()
        if refused is not None:
            verdict = Verdict.harness_error(*followed, f"{LABEL}: not run: {refused}")
            interrupted = ctx.cancel.is_set()
        else:
            try:
                result = bisect(request, ctx.run_id, report_dir, progress=ctx.progress, cancel=ctx.cancel,
                                deadline=ctx.deadline)
            finally:
                ctx.slot.release()
            verdict, evaluations, interrupted = result.verdict, result.evaluations, result.interrupted
        finished = invocation.finish([verdict], interrupted=interrupted)  # a bisection records no history
        notes = (*notes, *finished_notes(finished))
        structured: dict[str, Any] = {
            "verdict": verdict.to_dict(), "run": run_ref(boundary, ctx.run_id),
            "report": ARTIFACT_URI.format(run_id=ctx.run_id, path=REPORT_FILE),
            "evaluations": evaluations, "next_calls": self.box.next_calls(verdict.next),
        }
        if notes:
            structured["notes"] = list(notes)
        return Answer(summarize(verdict, structured["next_calls"], structured["run"]["uri"], notes), structured)


def _revision(arguments: dict[str, Any], key: str) -> str:
    value = arguments.get(key)
    if value is None:
        raise InputError(f"{LABEL}: argument {key!r} is required", "give a git revision (a commit, a tag, HEAD~3)")
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{LABEL}: argument {key!r}: expected a git revision as a non-empty string, got "
                         f"{value!r:.80}")
    return value.strip()
