"""The tools of ``glmfb mcp``: one per probe kind of the registry, plus ``capture``, ``run``,
``gate``, ``list_probes``, ``explain`` and ``cancel``.

A probe tool's input schema is derived, like the CLI command, from the probe: its form gives
the targets (``baseline``/``candidate``, or ``target``/``command``), its declared options
(:func:`glmfb.options.options_schema`) give the rest, keyed as in a probe definition and
parsed by the same function (:func:`glmfb.options.parse_table`: ``"5%"``, ``"2s"``). Its
result is the verdict (``glmfb.verdict/1``) beside the run it was written to and the verdict's
next steps as tool calls (a step's command and arguments, checked as the tool would check them).

Each call is first *prepared* (arguments checked against the :class:`Boundary`, the config
built: a bad argument is an :class:`~glmfb.errors.InputError` naming it, before anything
runs), then its blocking *work* runs in a worker thread with a :class:`CallContext` (the run
id, a progress callback, the cancellation event, the deadline). Probes run one at a time,
each in a supervised child process (:func:`glmfb.host.run_probe`), so one probe's timing is
never disturbed by another's and a cancelled probe leaves no process behind.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from glmfb.commandline import run_step, shell_line
from glmfb.errors import GlmfbError, InputError, UsageError
from glmfb.mcp.boundary import Boundary, strings
from glmfb.options import options_of, options_schema, parse_table
from glmfb.probe import Probe, ProbeForm, ProbeSpec, all_probes, safe_component
from glmfb.step import STEP_SCHEMA, Step
from glmfb.verdict import Run, Verdict

RUN_URI = "glmfb://runs/{run_id}"
ARTIFACT_URI = "glmfb://runs/{run_id}/artifacts/{path}"
LATEST_URI = "glmfb://runs/latest"
SCHEMA_URI = "glmfb://schema"
SLOT_POLL_S = 0.2


# --------------------------------------------------------------------------------------------
# What a call gets and gives
# --------------------------------------------------------------------------------------------


@dataclass
class CallContext:
    """What a call's work gets: its run id, a progress callback, the cancellation event, the
    deadline (``time.monotonic()``) and the slot that lets one probe run at a time."""

    run_id: str
    progress: Callable[[str], None]
    cancel: threading.Event
    deadline: float
    slot: threading.Lock

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()

    def take_slot(self) -> str | None:
        """Wait for the probe slot; None once held, else why not (cancelled, out of time)."""
        waited = False
        while True:
            if self.cancel.is_set():
                return "cancelled while it waited for another probe to finish"
            remaining = self.remaining_s()
            if remaining <= 0:
                return "its time budget ran out while it waited for another probe to finish"
            if self.slot.acquire(timeout=min(SLOT_POLL_S, remaining)):
                return None
            if not waited:
                waited = True
                self.progress("waiting for another probe to finish (probes run one at a time)")


@dataclass(frozen=True)
class Answer:
    """A tool's result: a short text for the model, structured content for the agent."""

    text: str
    structured: dict[str, Any]


@dataclass(frozen=True)
class Prepared:
    """A checked call, ready to run: ``work`` does the blocking part."""

    tool: str
    timeout_s: float
    work: Callable[[CallContext], Answer]
    runs_probes: bool = False  # has a run id, reports progress, can be cancelled
    notes: tuple[str, ...] = ()
    label: str = ""  # what runs, for the first progress message


@dataclass(frozen=True)
class ToolDef:
    """A tool as listed: name, description, schemas, hints."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    read_only: bool = False


# --------------------------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------------------------


def compact_defs() -> dict[str, Any]:
    """The verdict and run schemas of ``glmfb schema`` with evidence items checked only for
    their ``kind`` (the full schema, a schema per evidence kind, is ``glmfb://schema``)."""
    from glmfb.verdict import json_schema

    defs = copy.deepcopy(json_schema()["$defs"])
    verdict = defs["verdict"]
    verdict["properties"]["evidence"]["items"] = {
        "type": "object", "required": ["kind"], "properties": {"kind": {"type": "string"}},
        "description": "typed evidence; the schema of each kind is in glmfb://schema",
    }
    return {"verdict": verdict, "run": defs["run"]}


_NEXT_CALL: dict[str, Any] = {
    "type": "object",
    "required": ["index", "text"],
    "properties": {
        "index": {"type": "integer", "description": "the position of the step in the verdict's next"},
        "text": {"type": "string", "description": "the step as a command line, for people"},
        "why": {"type": "string", "description": "what the step is for"},
        "tool": {"type": "string", "description": "the tool to call"},
        "arguments": {"type": "object", "description": "the arguments to call it with, as they are"},
        "error": {"type": "string", "description": "why this step cannot be called now (then no arguments)"},
    },
}
_RUN_REF = {
    "type": "object",
    "required": ["id", "uri"],
    "properties": {
        "id": {"type": "string"},
        "uri": {"type": "string", "description": "the run.json resource"},
        "folder": {"type": "string", "description": "the run folder, relative to the root"},
    },
}
_NOTES = {"type": "array", "items": {"type": "string"}}


def _with_defs(schema: dict[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    return {**schema, "$defs": dict(defs)}


def _duration_schema(boundary: Boundary) -> dict[str, Any]:
    return {"type": ["string", "number"],
            "description": f"Time budget of this call, e.g. 30s or 10min (a bare number is seconds); what runs is "
                           f"stopped, with everything it started, when it is spent. At most "
                           f"{boundary.max_call_s:g} s (the default)."}


_KWARGS = {"type": "object", "description": "Keyword arguments for the target factory (both sides)."}


# --------------------------------------------------------------------------------------------
# The toolbox
# --------------------------------------------------------------------------------------------


@dataclass
class Toolbox:
    """Every tool of the server, for one :class:`Boundary`. ``cancel_run`` cancels an
    in-flight call by run id (the server holds those)."""

    boundary: Boundary
    cancel_run: Callable[[str], bool] = field(default=lambda run_id: False)

    @cached_property
    def probes(self) -> dict[str, Probe]:
        return {probe.kind: probe for probe in all_probes()}

    @cached_property
    def defs(self) -> dict[str, Any]:
        return compact_defs()

    @cached_property
    def tools(self) -> dict[str, ToolDef]:
        tools = {kind: self._probe_tool(probe) for kind, probe in self.probes.items()}
        for tool in (self._capture_tool(), self._run_tool(), self._gate_tool(), self._list_tool(),
                     self._explain_tool(), self._cancel_tool()):
            tools.setdefault(tool.name, tool)
        return tools

    def input_schema(self, name: str) -> dict[str, Any] | None:
        tool = self.tools.get(name)
        return tool.input_schema if tool is not None else None

    def prepare(self, name: str, arguments: Mapping[str, Any] | None) -> Prepared:
        """Check a call (raises :class:`InputError` naming the argument) and return its work."""
        if name not in self.tools:
            raise InputError(f"unknown tool {name!r}", f"the tools: {', '.join(self.tools)}")
        args = dict(arguments or {})
        try:
            if name in self.probes:
                return self._prepare_probe(self.probes[name], args)
            preparer: dict[str, Callable[[dict[str, Any]], Prepared]] = {
                "capture": self._prepare_capture, "run": self._prepare_run, "gate": self._prepare_gate,
                "list_probes": self._prepare_list, "explain": self._prepare_explain, "cancel": self._prepare_cancel,
            }
            return preparer[name](args)
        except InputError as exc:
            if exc.message.startswith("glmfb "):
                raise
            raise InputError(f"glmfb {name}: {exc.message}", exc.hint) from None

    def check(self, name: str, arguments: Mapping[str, Any]) -> None:
        """Raise what :meth:`prepare` would raise; run nothing."""
        self.prepare(name, arguments)

    def next_calls(self, steps: Sequence[Step]) -> list[dict[str, Any]]:
        """The steps that are glmfb commands, as tool calls: ``{"index", "text", "why", "tool",
        "arguments"}``, or with ``error`` instead of ``arguments`` when the call would be refused
        now (a path outside the root, no such tool). Plain steps stay text only."""
        calls: list[dict[str, Any]] = []
        for index, step in enumerate(steps):
            if step.command is None:
                continue
            entry: dict[str, Any] = {"index": index, "text": shell_line(step), "why": step.why, "tool": step.command}
            try:
                self.check(step.command, step.arguments)
            except GlmfbError as exc:
                entry["error"] = str(exc)
            else:
                entry["arguments"] = dict(step.arguments)
            calls.append(entry)
        return calls

    # ---- probes --------------------------------------------------------------------------

    def _probe_tool(self, probe: Probe) -> ToolDef:
        properties: dict[str, Any] = {}
        required: list[str] = []
        if probe.form is ProbeForm.PAIR:
            properties["baseline"] = {"type": "string", "description": "Baseline: a target (path/to/file.py:factory "
                                      "or package.module:factory) or a saved result, under the root."}
            properties["candidate"] = {"type": "string", "description": "Candidate: a target or a saved result."
                                       + (" May be left out (see the probe's docs)." if probe.candidate_optional else "")}
            required.append("baseline")
            if not probe.candidate_optional:
                required.append("candidate")
            properties["args"] = _KWARGS
            properties["baseline_args"] = {"type": "object", "description": "Keyword arguments for the baseline only."}
            properties["candidate_args"] = {"type": "object", "description": "Keyword arguments for the candidate only."}
        else:
            properties["target"] = {"type": "string", "description": "A Python target under the root "
                                    "(path/to/file.py:factory or package.module:factory)."}
            if probe.accepts_command:
                properties["command"] = {"type": "array", "items": {"type": "string"},
                                         "description": "A command line to run instead of a target, e.g. "
                                         '["python", "serve.py"] ("python" is the interpreter running glmfb). '
                                         + ("Allowed on this server." if self.boundary.allow_commands
                                            else "Refused unless the server runs with --allow-commands.")}
            properties["args"] = {"type": "object", "description": "Keyword arguments for the target factory."}
        properties["name"] = {"type": "string", "description": "Name of the verdict (also its artifact folder)."}
        properties["rules"] = {"type": ["string", "array"], "items": {"type": "string"},
                               "description": "Python files defining RULES, tried before the built-in rules."}
        properties["timeout"] = _duration_schema(self.boundary)
        for key, schema in options_schema(probe.config_type)["properties"].items():
            properties.setdefault(key, schema)
        input_schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            input_schema["required"] = required
        output = _with_defs({
            "type": "object",
            "required": ["verdict", "run", "next_calls"],
            "properties": {
                "verdict": {"$ref": "#/$defs/verdict"},
                "run": _RUN_REF,
                "next_calls": {"type": "array", "items": _NEXT_CALL},
                "artifacts": {"type": "object", "additionalProperties": {"type": "string"},
                              "description": "artifact name -> resource URI of the file in the run folder"},
                "notes": _NOTES,
            },
        }, self.defs)
        form = ("BASELINE and CANDIDATE" if probe.form is ProbeForm.PAIR
                else "a target" + (" or a command line" if probe.accepts_command else ""))
        description = (f"{probe.summary} Runs on {form}; answers with a glmfb.verdict/1 verdict (status, layer, "
                       "where, why, metric, evidence, next), the run it was written to, and its next steps as "
                       "tool calls (next_calls). Long: reports progress, honours cancellation.")
        return ToolDef(probe.kind, f"glmfb {probe.kind}", description, input_schema, output)

    def _prepare_probe(self, probe: Probe, arguments: dict[str, Any]) -> Prepared:
        boundary = self.boundary
        label = f"glmfb {probe.kind}"
        fixed = set(self.tools[probe.kind].input_schema["properties"]) - {
            spec.key for spec in options_of(probe.config_type)}
        _refuse_unknown(label, arguments, self.tools[probe.kind].input_schema["properties"])
        option_keys = {spec.key for spec in options_of(probe.config_type) if spec.toml} - fixed
        options = parse_table(probe.config_type, {k: v for k, v in arguments.items() if k in option_keys}, label)
        for option in options_of(probe.config_type):
            if option.type.name == "path" and options.get(option.attr) is not None:
                options[option.attr] = boundary.path(str(options[option.attr]), option.key)
        baseline = candidate = target = None
        command: tuple[str, ...] = ()
        if probe.form is ProbeForm.PAIR:
            if "baseline" not in arguments:
                raise InputError(f"{label}: argument 'baseline' is required")
            baseline = boundary.side(arguments["baseline"], "baseline")
            if "candidate" in arguments:
                candidate = boundary.side(arguments["candidate"], "candidate")
            elif not probe.candidate_optional:
                raise InputError(f"{label}: argument 'candidate' is required")
        else:
            if "target" in arguments and "command" in arguments:
                raise InputError(f"{label}: give 'target' or 'command', not both")
            if "target" in arguments:
                target = boundary.side(arguments["target"], "target")
            elif "command" in arguments:
                command = boundary.command(arguments["command"])
        args = _kwargs(arguments, "args")
        if command and args:
            raise InputError(f"{label}: argument 'args' goes with 'target'", "pass arguments in the command line")
        rules = tuple(boundary.paths(arguments["rules"], "rules", must_exist=True)) if "rules" in arguments else ()
        for file in rules:
            if not file.is_file():
                raise InputError(f"{label}: argument 'rules': {boundary.relative(file)} is not a file",
                                 "give a .py file that defines RULES")
        timeout_s, note = boundary.timeout(arguments.get("timeout"))
        spec = ProbeSpec(
            kind=probe.kind, name="", label=label, baseline=baseline, candidate=candidate, target=target,
            command=command, args=args, baseline_args=_kwargs(arguments, "baseline_args"),
            candidate_args=_kwargs(arguments, "candidate_args"), options=options, base_dir=boundary.root,
        )
        name = arguments.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise InputError(f"{label}: argument 'name': expected a non-empty string")
        spec = dataclasses.replace(spec, name=name or _default_name(probe, spec))
        try:
            config = probe.build(spec)
        except UsageError as exc:
            message = exc.message if exc.message.startswith(label) else f"{label}: {exc.message}"
            hint = exc.hint
            if probe.form is ProbeForm.SINGLE and target is None and not command:
                hint = "give 'target' (path/to/file.py:factory)" + (" or 'command'" if probe.accepts_command else "")
            raise InputError(message, hint) from None

        def work(ctx: CallContext) -> Answer:
            return self._run_probe(probe, spec, config, rules, ctx, (note,) if note else ())

        return Prepared(probe.kind, timeout_s, work, runs_probes=True, notes=(note,) if note else (),
                        label=f"{probe.kind} {spec.name!r}")

    def _run_probe(self, probe: Probe, spec: ProbeSpec, config: Any, rules: tuple[Path, ...], ctx: CallContext,
                   notes: tuple[str, ...]) -> Answer:
        from glmfb.clock import utc_now
        from glmfb.host import run_probe
        from glmfb.io import write_json_atomic
        from glmfb.probe import ProbeContext
        from glmfb.runs import RUN_FILE, start_run

        report_dir = start_run(self.boundary.reports, ctx.run_id)  # the gate's pointer, before anything can fail
        started = utc_now()
        refused = ctx.take_slot()
        if refused is not None:
            verdict = Verdict.harness_error(probe.kind, spec.name, f"glmfb {probe.kind}: not run: {refused}")
        else:
            try:
                probe_ctx = ProbeContext(run_id=ctx.run_id, artifact_dir=report_dir / safe_component(spec.name),
                                         progress=ctx.progress, rules_files=rules)
                verdict = run_probe(probe, config, probe_ctx, isolate=True, timeout_s=max(ctx.remaining_s(), 0.1),
                                    cancel=ctx.cancel)
            finally:
                ctx.slot.release()
        run = Run(id=ctx.run_id, started=started, finished=utc_now(), verdicts=(verdict,),
                  interrupted=ctx.cancel.is_set())
        write_json_atomic(report_dir / RUN_FILE, run.to_dict())
        return self.verdict_answer(verdict, ctx.run_id, notes)

    def verdict_answer(self, verdict: Verdict, run_id: str, notes: Sequence[str] = ()) -> Answer:
        """A probe tool's result for one verdict."""
        structured: dict[str, Any] = {
            "verdict": verdict.to_dict(),
            "run": self.run_ref(run_id),
            "next_calls": self.next_calls(verdict.next),
            "artifacts": self.artifact_uris(verdict, run_id),
        }
        if notes:
            structured["notes"] = list(notes)
        return Answer(summarize(verdict, structured["next_calls"], structured["run"]["uri"], notes), structured)

    def run_ref(self, run_id: str) -> dict[str, Any]:
        return {"id": run_id, "uri": RUN_URI.format(run_id=run_id),
                "folder": self.boundary.relative(self.boundary.reports / run_id)}

    def artifact_uris(self, verdict: Verdict, run_id: str) -> dict[str, str]:
        """The verdict's artifacts that lie in its run folder, as resource URIs."""
        run_dir = (self.boundary.reports / run_id).resolve()
        uris: dict[str, str] = {}
        for label, raw in verdict.artifacts.items():
            path = self.boundary.inside(raw)
            if path is not None and path.is_file() and path.is_relative_to(run_dir):
                uris[label] = ARTIFACT_URI.format(run_id=run_id, path=path.relative_to(run_dir).as_posix())
        return uris

    # ---- capture -------------------------------------------------------------------------

    def _capture_tool(self) -> ToolDef:
        from glmfb.diff.config import CaptureConfig

        properties: dict[str, Any] = {
            "target": {"type": "string", "description": "Diff target under the root: path/to/file.py:factory "
                                                        "(a torch.nn.Module factory or a callable on the request)."},
            "out": {"type": "string", "description": "Capture directory to write, under the root."},
            "args": {"type": "object", "description": "Keyword arguments for the target factory."},
            "force": {"type": "boolean", "description": "Replace an existing capture directory at out (whole).",
                      "default": False},
            "timeout": _duration_schema(self.boundary),
        }
        for key, schema in options_schema(CaptureConfig)["properties"].items():
            properties.setdefault(key, schema)
        output = {
            "type": "object",
            "required": ["out", "requests", "tensors"],
            "properties": {
                "out": {"type": "string", "description": "the capture directory, relative to the root"},
                "requests": {"type": "integer"}, "tensors": {"type": "integer"}, "notes": _NOTES,
            },
        }
        return ToolDef("capture", "glmfb capture", "Run a diff target over a request set and store every tapped "
                       "module output (safetensors) and a manifest, for a later diff (give the capture directory "
                       "as a diff side). Long: reports progress, honours cancellation.",
                       {"type": "object", "properties": properties, "required": ["target", "out", "requests"],
                        "additionalProperties": False}, output)

    def _prepare_capture(self, arguments: dict[str, Any]) -> Prepared:
        from glmfb.diff.config import CaptureConfig

        label = "glmfb capture"
        boundary = self.boundary
        _refuse_unknown(label, arguments, self.tools["capture"].input_schema["properties"])
        for key in ("target", "out", "requests"):
            if key not in arguments:
                raise InputError(f"{label}: argument {key!r} is required")
        option_keys = {spec.key for spec in options_of(CaptureConfig) if spec.toml}
        options = parse_table(CaptureConfig, {k: v for k, v in arguments.items() if k in option_keys}, label)
        requests = boundary.path(str(options["requests"]), "requests", must_exist=True)
        if not requests.is_file():
            raise InputError(f"{label}: argument 'requests': {arguments['requests']} is not a file")
        options["requests"] = requests
        force = arguments.get("force", False)
        if not isinstance(force, bool):
            raise InputError(f"{label}: argument 'force': expected true or false, got {force!r:.40}")
        target = boundary.side(arguments["target"], "target")
        if ":" not in target:
            raise InputError(f"{label}: argument 'target': expected a target (path/to/file.py:factory), got {target!r}")
        out = boundary.path(arguments["out"], "out")
        timeout_s, note = boundary.timeout(arguments.get("timeout"))
        try:
            config = CaptureConfig(target=target, out=out, args=_kwargs(arguments, "args"), force=force, **options)
        except UsageError as exc:
            raise InputError(f"{label}: {exc.message}", exc.hint) from None
        notes = (note,) if note else ()

        def work(ctx: CallContext) -> Answer:
            import tempfile

            from glmfb.supervise import call_isolated

            refused = ctx.take_slot()
            if refused is not None:
                raise InputError(f"{label}: not run: {refused}")
            try:
                logs = Path(tempfile.mkdtemp(prefix="glmfb-capture-"))  # the child's stdout and stderr
                result = call_isolated("glmfb.diff.engine:capture_job", config, artifact_dir=logs,
                                       progress=ctx.progress, timeout_s=max(ctx.remaining_s(), 0.1),
                                       cancel=ctx.cancel)
            finally:
                ctx.slot.release()
            structured = {"out": boundary.relative(out), "requests": int(result["requests"]),
                          "tensors": int(result["tensors"])}
            if notes:
                structured["notes"] = list(notes)
            text = (f"captured {structured['requests']} requests, {structured['tensors']} tensors into "
                    f"{structured['out']}; give it as a side of the diff tool")
            return Answer(text, structured)

        return Prepared("capture", timeout_s, work, runs_probes=True, notes=notes, label=f"capture {target}")

    # ---- run -----------------------------------------------------------------------------

    def _run_tool(self) -> ToolDef:
        output = _with_defs({
            "type": "object",
            "required": ["run", "ref", "next_calls"],
            "properties": {
                "run": {"$ref": "#/$defs/run"},
                "ref": _RUN_REF,
                "report": {"type": "string", "description": "report.html of the run, as a resource URI"},
                "next_calls": {"type": "array", "items": {**_NEXT_CALL, "properties": {
                    **_NEXT_CALL["properties"], "verdict": {"type": "string", "description": "the verdict's name"}}}},
                "notes": _NOTES,
            },
        }, self.defs)
        return ToolDef(
            "run", "glmfb run",
            "Run the probe definitions (TOML [[probe]] tables) under the root, like glmfb run: each probe in a "
            "supervised child, each verdict judged against its definition's expectation. Answers with the "
            "glmfb.run/1 document (also written to reports/<run-id>/run.json with report.html and junit.xml), "
            "and every verdict's next steps as tool calls. Long: reports progress, honours cancellation.",
            {"type": "object", "additionalProperties": False, "properties": {
                "paths": {"type": ["string", "array"], "items": {"type": "string"},
                          "description": "Definition files or folders under the root (default: probes)."},
                "select": {"type": ["string", "array"], "items": {"type": "string"},
                           "description": "Run only definitions whose name matches (glob or substring)."},
                "timeout": _duration_schema(self.boundary),
            }}, output)

    def _definitions(self, label: str, arguments: Mapping[str, Any]) -> list[Any]:
        from glmfb import suite

        paths = self.boundary.paths(arguments.get("paths", "probes"), "paths", must_exist=True,
                                    what="file or folder")
        select = strings(arguments.get("select", []), "select")
        try:
            definitions = suite.selected(suite.load_definitions(suite.discover(paths)), select,
                                         [self.boundary.relative(p) for p in paths])
        except UsageError as exc:
            raise InputError(f"{label}: {exc.message}", exc.hint) from None
        return definitions

    def _prepare_run(self, arguments: dict[str, Any]) -> Prepared:
        label = "glmfb run"
        _refuse_unknown(label, arguments, self.tools["run"].input_schema["properties"])
        definitions = self._definitions(label, arguments)
        timeout_s, note = self.boundary.timeout(arguments.get("timeout"))
        notes = (note,) if note else ()

        def work(ctx: CallContext) -> Answer:
            return self._run_suite(definitions, ctx, notes)

        return Prepared("run", timeout_s, work, runs_probes=True, notes=notes,
                        label=f"run of {len(definitions)} definition(s)")

    def _run_suite(self, definitions: Sequence[Any], ctx: CallContext, notes: tuple[str, ...]) -> Answer:
        from glmfb import suite
        from glmfb.clock import utc_now
        from glmfb.env import fingerprint
        from glmfb.gate import evaluate
        from glmfb.io import write_json_atomic, write_text_atomic
        from glmfb.report.html import REPORT_NAME, write_html
        from glmfb.report.junit import render_junit
        from glmfb.runs import RUN_FILE, start_run

        report_dir = start_run(self.boundary.reports, ctx.run_id)
        started = utc_now()
        context = suite.SuiteContext(ctx.run_id, report_dir, on_progress=ctx.progress, isolate=True,
                                     cancel=ctx.cancel)
        verdicts: list[Verdict] = []
        for index, definition in enumerate(definitions):
            refused: str | None = None
            if ctx.cancel.is_set():
                refused = "the call was cancelled"
            elif ctx.remaining_s() <= 0:
                refused = "the call's time budget ran out"
            elif definition.spec.command and not self.boundary.allow_commands:
                refused = "it runs a command line, which this server runs only with --allow-commands"
            if refused is None:
                refused = ctx.take_slot()
                if refused is None:
                    ctx.progress(f"{index + 1}/{len(definitions)} {definition.probe} {definition.name}")
                    limit = ctx.remaining_s()
                    if definition.timeout_s is not None:
                        limit = min(limit, definition.timeout_s)
                    try:
                        verdict = suite.run_definition(dataclasses.replace(definition, timeout_s=max(limit, 0.1)),
                                                       context)
                    finally:
                        ctx.slot.release()
                    verdicts.append(verdict)
                    continue
            verdict = Verdict.harness_error(definition.probe, definition.name, f"not run: {refused}",
                                            next=[run_step([definition.name])])
            if definition.expect is not None:  # a probe that did not run never meets its expectation
                verdict = dataclasses.replace(verdict, expect=definition.expect, expect_met=False)
            verdicts.append(verdict)
        run = Run(id=ctx.run_id, started=started, finished=utc_now(), verdicts=tuple(verdicts), env=fingerprint(),
                  interrupted=ctx.cancel.is_set())
        write_json_atomic(report_dir / RUN_FILE, run.to_dict())
        write_html(run, report_dir)
        write_text_atomic(report_dir / "junit.xml", render_junit(evaluate(run)))
        calls: list[dict[str, Any]] = []
        for verdict in run.verdicts:
            calls.extend({"verdict": verdict.name, **call} for call in self.next_calls(verdict.next))
        structured: dict[str, Any] = {
            "run": run.to_dict(), "ref": self.run_ref(ctx.run_id), "next_calls": calls,
            "report": ARTIFACT_URI.format(run_id=ctx.run_id, path=REPORT_NAME),
        }
        if notes:
            structured["notes"] = list(notes)
        return Answer(summarize_run(run, structured["ref"]["uri"], notes), structured)

    # ---- gate, explain, list_probes ------------------------------------------------------

    def _source_schema(self) -> dict[str, Any]:
        return {"type": "string", "description": "A run id, or a run.json / verdict JSON file or a run folder under "
                                                 "the root (default: the latest run in reports/)."}

    def _gate_tool(self) -> ToolDef:
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
                "problems": _NOTES,
                "warnings": _NOTES,
            },
        }
        return ToolDef("gate", "glmfb gate", "Turn a run (or one verdict) into the CI decision, like glmfb gate: the "
                       "exit code (0 pass, 1 regression, 3 could not run, 4 inconclusive) and each verdict's "
                       "decision under a policy.",
                       {"type": "object", "additionalProperties": False, "properties": {
                           "source": self._source_schema(),
                           "policy": {"type": "string", "description": "A TOML policy file under the root."},
                       }}, output, read_only=True)

    def _source_path(self, label: str, source: Any) -> Path:
        """The run or verdict file a source argument names (checked when the call is prepared)."""
        from glmfb.runs import RUN_FILE, latest_run, run_file_of

        reports = self.boundary.reports
        try:
            if source is None:
                return latest_run(reports)
            if isinstance(source, str) and source and safe_component(source) == source \
                    and (reports / source / RUN_FILE).is_file():
                return reports / source / RUN_FILE
            path = Path(run_file_of(str(self.boundary.path(source, "source", must_exist=True))))
            return self.boundary.path(str(path), "source", must_exist=True)
        except GlmfbError as exc:
            message = exc.message if "argument 'source'" in exc.message else f"argument 'source': {exc.message}"
            raise InputError(f"{label}: {message}", exc.hint) from None

    def _read_source(self, label: str, path: Path) -> tuple[Run, str | None]:
        """A run from a source file; with its id when it lies in reports/."""
        from glmfb.io import read_json
        from glmfb.verdict import SchemaError, load_document

        try:
            run = load_document(read_json(path))
        except SchemaError as exc:
            raise InputError(f"{label}: argument 'source': {self.boundary.relative(path)} is not a glmfb run or "
                             f"verdict: {exc}") from None
        except GlmfbError as exc:
            raise InputError(f"{label}: argument 'source': {exc.message}", exc.hint) from None
        run_id = run.id if path.parent == self.boundary.reports / run.id else None
        return run, run_id

    def _prepare_gate(self, arguments: dict[str, Any]) -> Prepared:
        from glmfb.gate import GateDecision, evaluate, load_policy

        label = "glmfb gate"
        _refuse_unknown(label, arguments, self.tools["gate"].input_schema["properties"])
        policy = None
        if "policy" in arguments:
            policy_path = self.boundary.path(arguments["policy"], "policy", must_exist=True, what="policy file")
            try:
                policy = load_policy(policy_path)
            except UsageError as exc:
                raise InputError(f"{label}: argument 'policy': {exc.message}", exc.hint) from None
        source = self._source_path(label, arguments.get("source"))
        timeout_s, _ = self.boundary.timeout(None)

        def work(ctx: CallContext) -> Answer:
            run, run_id = self._read_source(label, source)
            result = evaluate(run, policy)
            rows = [{"name": row.verdict.name, "probe": row.verdict.probe, "status": row.verdict.status.value,
                     "outcome": row.verdict.outcome.value, "decision": row.decision.value,
                     **({"reason": row.reason} if row.reason else {}), "why": row.verdict.why}
                    for row in result.rows]
            structured: dict[str, Any] = {
                "exit_code": int(result.exit_code), "passed": result.passed,
                "run": self.run_ref(run_id) if run_id else {"id": run.id},
                "counts": {decision.value: result.count(decision) for decision in GateDecision},
                "rows": rows, "problems": list(result.problems), "warnings": list(result.warnings),
            }
            failing = [row for row in rows if row["decision"] not in ("ok", "allowed")]
            lines = [f"glmfb gate: {'passed' if result.passed else 'failed'} (exit code {int(result.exit_code)}), "
                     f"{len(rows)} verdict(s) of run {run.id}"]
            lines += [f"- {row['decision']}: {row['probe']} {row['name']}: {row['why']}" for row in failing]
            lines += [f"- {problem}" for problem in result.problems]
            return Answer("\n".join(lines), structured)

        return Prepared("gate", timeout_s, work)

    def _explain_tool(self) -> ToolDef:
        item = {
            "type": "object",
            "required": ["name", "probe", "status", "layer", "why", "next", "next_calls"],
            "properties": {
                "name": {"type": "string"}, "probe": {"type": "string"}, "status": {"type": "string"},
                "outcome": {"type": "string"}, "layer": {"type": "string"}, "where": {"type": "object"},
                "why": {"type": "string"}, "metric": {"type": ["object", "null"]},
                "next": {"type": "array", "items": STEP_SCHEMA},
                "next_calls": {"type": "array", "items": _NEXT_CALL},
                "artifacts": {"type": "object"},
            },
        }
        output = {"type": "object", "required": ["run", "verdicts"],
                  "properties": {"run": {"type": "object"}, "verdicts": {"type": "array", "items": item}}}
        return ToolDef("explain", "glmfb explain", "Explain a saved verdict or run: for each verdict its status, "
                       "layer, where, why, metric and next steps (also as tool calls).",
                       {"type": "object", "additionalProperties": False, "properties": {
                           "source": self._source_schema(),
                           "name": {"type": "string", "description": "Only the verdicts whose name matches (glob)."},
                       }}, output, read_only=True)

    def _prepare_explain(self, arguments: dict[str, Any]) -> Prepared:
        import fnmatch

        label = "glmfb explain"
        _refuse_unknown(label, arguments, self.tools["explain"].input_schema["properties"])
        pattern = arguments.get("name")
        if pattern is not None and not isinstance(pattern, str):
            raise InputError(f"{label}: argument 'name': expected a string (a glob)")
        source = self._source_path(label, arguments.get("source"))
        timeout_s, _ = self.boundary.timeout(None)

        def work(ctx: CallContext) -> Answer:
            run, run_id = self._read_source(label, source)
            chosen = [v for v in run.verdicts if pattern is None or fnmatch.fnmatchcase(v.name, pattern)]
            if pattern is not None and not chosen:
                raise InputError(f"{label}: argument 'name': no verdict named {pattern!r} in run {run.id}",
                                 f"its verdicts: {', '.join(v.name for v in run.verdicts) or 'none'}")
            items: list[dict[str, Any]] = []
            for verdict in chosen:
                calls = self.next_calls(verdict.next)
                items.append({
                    "name": verdict.name, "probe": verdict.probe, "status": verdict.status.value,
                    "outcome": verdict.outcome.value, "layer": verdict.layer.value, "where": dict(verdict.where),
                    "why": verdict.why, "metric": verdict.metric.to_dict() if verdict.metric else None,
                    "next": [step.to_dict() for step in verdict.next], "next_calls": calls,
                    "artifacts": self.artifact_uris(verdict, run_id) if run_id else dict(verdict.artifacts),
                })
            ref = self.run_ref(run_id) if run_id else {"id": run.id}
            text = "\n\n".join(summarize(v, item["next_calls"], ref.get("uri")) for v, item in zip(chosen, items,
                                                                                                   strict=True))
            return Answer(text or f"run {run.id} has no verdicts", {"run": ref, "verdicts": items})

        return Prepared("explain", timeout_s, work)

    def _list_tool(self) -> ToolDef:
        output = {"type": "object", "required": ["definitions"],
                  "properties": {"definitions": {"type": "array", "items": {"type": "object"}}}}
        return ToolDef("list_probes", "glmfb probe definitions", "List the probe definitions found under the root "
                       "(name, probe kind, targets, options, expectation), each with the run call that runs it.",
                       {"type": "object", "additionalProperties": False, "properties": {
                           "paths": {"type": ["string", "array"], "items": {"type": "string"},
                                     "description": "Definition files or folders under the root (default: probes)."},
                           "select": {"type": ["string", "array"], "items": {"type": "string"},
                                      "description": "Only definitions whose name matches (glob or substring)."},
                       }}, output, read_only=True)

    def _prepare_list(self, arguments: dict[str, Any]) -> Prepared:
        from glmfb.verdict import to_json_value

        label = "glmfb list_probes"
        _refuse_unknown(label, arguments, self.tools["list_probes"].input_schema["properties"])
        definitions = self._definitions(label, arguments)
        timeout_s, _ = self.boundary.timeout(None)

        def work(ctx: CallContext) -> Answer:
            items = []
            for definition in definitions:
                spec = definition.spec
                keys = {option.attr: option.key for option in options_of(self.probes[spec.kind].config_type)}
                item: dict[str, Any] = {"name": spec.name, "probe": spec.kind,
                                        "source": self.boundary.relative(definition.source)
                                        if self.boundary.inside(definition.source) else str(definition.source)}
                if definition.description:
                    item["description"] = definition.description
                for which in ("baseline", "candidate", "target"):
                    if getattr(spec, which):
                        item[which] = getattr(spec, which)
                if spec.command:
                    item["command"] = list(spec.command)
                    item["runs_command"] = True
                for which in ("args", "baseline_args", "candidate_args"):
                    if getattr(spec, which):
                        item[which] = to_json_value(dict(getattr(spec, which)))
                item["options"] = {keys.get(attr, attr): to_json_value(value) for attr, value in spec.options.items()}
                if definition.expect is not None:
                    item["expect"] = definition.expect.to_dict()
                if definition.timeout_s is not None:
                    item["timeout_s"] = definition.timeout_s
                item["call"] = {"tool": "run", "arguments": {"paths": [item["source"]], "select": [spec.name]}}
                items.append(item)
            lines = [f"{len(items)} probe definition(s):"]
            lines += [f"- {i['name']} ({i['probe']})" + (f": {i['description']}" if "description" in i else "")
                      for i in items]
            return Answer("\n".join(lines), {"definitions": items})

        return Prepared("list_probes", timeout_s, work)

    # ---- cancel --------------------------------------------------------------------------

    def _cancel_tool(self) -> ToolDef:
        return ToolDef("cancel", "cancel a running call", "Cancel a running probe, capture or run call by its run "
                       "id (its first progress message names it): the probe and every process it started are "
                       "stopped, and that call answers with an error verdict that says it was cancelled. (A "
                       "client's own cancellation of the call does the same; the run folder keeps the verdict.)",
                       {"type": "object", "additionalProperties": False, "required": ["run_id"],
                        "properties": {"run_id": {"type": "string"}}},
                       {"type": "object", "required": ["run_id", "cancelled"],
                        "properties": {"run_id": {"type": "string"}, "cancelled": {"type": "boolean"}}})

    def _prepare_cancel(self, arguments: dict[str, Any]) -> Prepared:
        label = "glmfb cancel"
        _refuse_unknown(label, arguments, self.tools["cancel"].input_schema["properties"])
        run_id = arguments.get("run_id")
        if not isinstance(run_id, str) or not run_id:
            raise InputError(f"{label}: argument 'run_id' is required (a string)")
        timeout_s, _ = self.boundary.timeout(None)

        def work(ctx: CallContext) -> Answer:
            cancelled = self.cancel_run(run_id)
            text = (f"cancelled run {run_id}: its call answers with the cancelled verdict" if cancelled
                    else f"no call of run {run_id} is running")
            return Answer(text, {"run_id": run_id, "cancelled": cancelled})

        return Prepared("cancel", timeout_s, work)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _refuse_unknown(label: str, arguments: Mapping[str, Any], properties: Mapping[str, Any]) -> None:
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        raise InputError(f"{label}: unknown argument {unknown[0]!r}", f"known: {', '.join(sorted(properties))}")


def _kwargs(arguments: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = arguments.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InputError(f"argument {key!r}: expected an object of keyword arguments, got {value!r:.80}")
    return dict(value)


def _default_name(probe: Probe, spec: ProbeSpec) -> str:
    default_name = getattr(probe, "default_name", None)
    return str(default_name(spec)) if callable(default_name) else probe.kind


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
    lines += [f"note: {note}" for note in notes]
    if run_uri:
        lines.append(f"run: {run_uri}")
    return "\n".join(lines)


def summarize_run(run: Run, run_uri: str, notes: Sequence[str] = ()) -> str:
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
