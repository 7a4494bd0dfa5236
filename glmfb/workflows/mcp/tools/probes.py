"""A probe's tool: one per probe kind of the registry, derived like the CLI command from the
probe (its form gives the targets, its declared options the rest, keyed as in a probe
definition and parsed by :func:`glmfb.contract.options.parse_table`). Its answer is the verdict beside
the run it was written to and its next steps as tool calls."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import InputError, UsageError
from glmfb.contract.options import options_of, options_schema, parse_table
from glmfb.contract.verdict import Verdict
from glmfb.core.probe import Probe, ProbeForm, ProbeSpec, safe_component
from glmfb.workflows.mcp.tools.answers import artifact_uris, finished_notes, run_ref, summarize
from glmfb.workflows.mcp.tools.base import (
    FOLLOW_SCHEMA,
    KWARGS,
    NEXT_CALL,
    NOTES,
    RUN_REF,
    Answer,
    CallContext,
    Prepared,
    ToolDef,
    duration_schema,
    follow_argument,
    kwargs_argument,
    refuse_unknown,
    with_defs,
)

if TYPE_CHECKING:
    from glmfb.workflows.history.record import Origin
    from glmfb.workflows.mcp.tools import Toolbox

_SIDES = ("baseline", "candidate", "target", "command")


@dataclass(frozen=True)
class ProbeCall:
    """A probe call checked and built: what runs, and the call's time budget."""

    spec: ProbeSpec
    config: Any
    rules: tuple[Path, ...]
    timeout_s: float
    notes: tuple[str, ...] = ()


@dataclass
class ProbeTool:
    """The tool of one probe kind."""

    probe: Probe
    box: Toolbox

    @property
    def label(self) -> str:
        return f"glmfb {self.probe.kind}"

    @cached_property
    def definition(self) -> ToolDef:
        probe = self.probe
        form = ("BASELINE and CANDIDATE" if probe.form is ProbeForm.PAIR
                else "a target" + (" or a command line" if probe.accepts_command else ""))
        description = (f"{probe.summary} Runs on {form}; answers with a glmfb.verdict/2 verdict (status, layer, "
                       "where, why, metric, evidence, next), the run it was written to, and its next steps as "
                       "tool calls (next_calls). Long: reports progress, honours cancellation.")
        return ToolDef(probe.kind, self.label, description, self._input_schema(), self._output_schema())

    def _target_properties(self) -> tuple[dict[str, Any], list[str]]:
        """The properties of what the probe runs against, and those required."""
        probe = self.probe
        properties: dict[str, Any]
        if probe.form is ProbeForm.PAIR:
            properties = {
                "baseline": {"type": "string", "description": "Baseline: a target (path/to/file.py:factory or "
                             "package.module:factory) or a saved result, under the root."},
                "candidate": {"type": "string", "description": "Candidate: a target or a saved result."
                              + (" May be left out (see the probe's docs)." if probe.candidate_optional else "")},
                "args": KWARGS,
                "baseline_args": {"type": "object", "description": "Keyword arguments for the baseline only."},
                "candidate_args": {"type": "object", "description": "Keyword arguments for the candidate only."},
            }
            return properties, ["baseline"] if probe.candidate_optional else ["baseline", "candidate"]
        properties = {"target": {"type": "string", "description": "A Python target under the root "
                                 "(path/to/file.py:factory or package.module:factory)."}}
        if probe.accepts_command:
            properties["command"] = {
                "type": "array", "items": {"type": "string"},
                "description": 'A command line to run instead of a target, e.g. ["python", "serve.py"] ("python" '
                               "is the interpreter running glmfb). "
                               + ("Allowed on this server." if self.box.boundary.allow_commands
                                  else "Refused unless the server runs with --allow-commands.")}
        properties["args"] = {"type": "object", "description": "Keyword arguments for the target factory."}
        return properties, []

    def _input_schema(self) -> dict[str, Any]:
        properties, required = self._target_properties()
        properties["name"] = {"type": "string", "description": "Name of the verdict (also its artifact folder)."}
        properties["rules"] = {"type": ["string", "array"], "items": {"type": "string"},
                               "description": "Python files defining RULES, tried before the built-in rules."}
        properties["timeout"] = duration_schema(self.box.boundary)
        properties["follow"] = FOLLOW_SCHEMA
        for key, schema in options_schema(self.probe.config_type)["properties"].items():
            properties.setdefault(key, schema)
        input_schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            input_schema["required"] = required
        return input_schema

    def _output_schema(self) -> dict[str, Any]:
        return with_defs({
            "type": "object",
            "required": ["verdict", "run", "next_calls"],
            "properties": {
                "verdict": {"$ref": "#/$defs/verdict"},
                "run": RUN_REF,
                "next_calls": {"type": "array", "items": NEXT_CALL},
                "artifacts": {"type": "object", "additionalProperties": {"type": "string"},
                              "description": "artifact name -> resource URI of the file in the run folder"},
                "notes": NOTES,
            },
        }, self.box.defs)

    # ---- a call --------------------------------------------------------------------------

    def prepare(self, arguments: dict[str, Any]) -> Prepared:
        call = self.checked(arguments)
        follow = self._follow(arguments)

        def work(ctx: CallContext) -> Answer:
            return self._run(call.spec, call.config, call.rules, ctx, call.notes, follow)

        return Prepared(self.probe.kind, call.timeout_s, work, runs_probes=True, notes=call.notes,
                        label=f"{self.probe.kind} {call.spec.name!r}")

    def _follow(self, arguments: dict[str, Any]) -> Any:
        """The call's ``follow`` argument (:func:`follow_argument`)."""
        return follow_argument(self.label, arguments, self.box.boundary)

    def checked(self, arguments: Mapping[str, Any]) -> ProbeCall:
        """A call's arguments checked against the boundary and built into the probe's config
        (raises :class:`InputError` naming the argument); nothing runs. ``glmfb --follow``
        takes a step through here too."""
        arguments = dict(arguments)
        arguments.pop("follow", None)
        probe, label, boundary = self.probe, self.label, self.box.boundary
        properties = self.definition.input_schema["properties"]
        refuse_unknown(label, arguments, properties)
        options = self._options(arguments)
        sides = self._sides(arguments)
        args = kwargs_argument(arguments, "args")
        if sides["command"] and args:
            raise InputError(f"{label}: argument 'args' goes with 'target'", "pass arguments in the command line")
        rules = self._rules(arguments)
        timeout_s, note = boundary.timeout(arguments.get("timeout"))
        for which, key in (("baseline", "baseline_args"), ("candidate", "candidate_args"), ("target", "args")):
            if sides.get(which):
                boundary.builtin_args(sides[which], arguments.get(key), key)
        spec = ProbeSpec(
            kind=probe.kind, name="", label=label, **sides, args=args,
            baseline_args=kwargs_argument(arguments, "baseline_args"),
            candidate_args=kwargs_argument(arguments, "candidate_args"), options=options,
            base_dir=boundary.root,
        )
        name = arguments.get("name")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise InputError(f"{label}: argument 'name': expected a non-empty string")
        spec = dataclasses.replace(spec, name=name or probe.default_name(spec))
        config = self._build(spec)
        return ProbeCall(spec, config, rules, timeout_s, (note,) if note else ())

    def _options(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The declared options given, parsed; a path option confined under the root."""
        config_type = self.probe.config_type
        fixed = set(self.definition.input_schema["properties"]) - {spec.key for spec in options_of(config_type)}
        option_keys = {spec.key for spec in options_of(config_type) if spec.toml} - fixed
        options = parse_table(config_type, {k: v for k, v in arguments.items() if k in option_keys}, self.label)
        boundary = self.box.boundary
        for option in options_of(config_type):
            value = options.get(option.attr)
            if value is None or value == ():
                continue
            if option.type.name == "path":
                options[option.attr] = boundary.path(str(value), option.key)
            elif option.type.name == "command":  # a command line to run (a server): only where commands are allowed
                options[option.attr] = boundary.command(list(value), option.key)
            elif option.type.name == "target":  # a target an option names: under the root, as a side
                options[option.attr] = boundary.side(value, option.key, self.probe.kind)
        return options

    def _sides(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """``baseline``/``candidate`` (a pair) or ``target``/``command`` (one), checked."""
        probe, label, boundary = self.probe, self.label, self.box.boundary
        sides: dict[str, Any] = dict.fromkeys(_SIDES[:3])
        sides["command"] = ()
        if probe.form is ProbeForm.PAIR:
            if "baseline" not in arguments:
                raise InputError(f"{label}: argument 'baseline' is required")
            sides["baseline"] = boundary.side(arguments["baseline"], "baseline", probe.kind)
            if "candidate" in arguments:
                sides["candidate"] = boundary.side(arguments["candidate"], "candidate", probe.kind)
            elif not probe.candidate_optional:
                raise InputError(f"{label}: argument 'candidate' is required")
            return sides
        if "target" in arguments and "command" in arguments:
            raise InputError(f"{label}: give 'target' or 'command', not both")
        if "target" in arguments:
            sides["target"] = boundary.side(arguments["target"], "target", probe.kind)
        elif "command" in arguments:
            sides["command"] = boundary.command(arguments["command"])
        return sides

    def _rules(self, arguments: dict[str, Any]) -> tuple[Path, ...]:
        boundary = self.box.boundary
        rules = tuple(boundary.paths(arguments["rules"], "rules", must_exist=True)) if "rules" in arguments else ()
        for file in rules:
            if not file.is_file():
                raise InputError(f"{self.label}: argument 'rules': {boundary.relative(file)} is not a file",
                                 "give a .py file that defines RULES")
        return rules

    def _build(self, spec: ProbeSpec) -> Any:
        """The probe's config; its refusal named as this tool's."""
        probe, label = self.probe, self.label
        try:
            return probe.build(spec)
        except UsageError as exc:
            message = exc.message if exc.message.startswith(label) else f"{label}: {exc.message}"
            hint = exc.hint
            if probe.form is ProbeForm.SINGLE and spec.target is None and not spec.command:
                hint = "give 'target' (path/to/file.py:factory)" + (" or 'command'" if probe.accepts_command else "")
            raise InputError(message, hint) from None

    def _run(self, spec: ProbeSpec, config: Any, rules: tuple[Path, ...], ctx: CallContext,
             notes: tuple[str, ...], follow: Any = None) -> Answer:
        """Run the probe in a supervised child (when the slot is free) and write its run."""
        from glmfb.core.host import run_probe
        from glmfb.core.probe import ProbeContext
        from glmfb.workflows.invocation import begin

        probe = self.probe
        invocation = begin(self.box.boundary.reports, run_id=ctx.run_id)  # the gate's pointer, before anything can fail
        report_dir = invocation.report_dir
        refused = ctx.take_slot()
        if refused is not None:
            verdict = Verdict.harness_error(probe.kind, spec.name, f"glmfb {probe.kind}: not run: {refused}")
        else:
            try:
                probe_ctx = ProbeContext(run_id=ctx.run_id, artifact_dir=report_dir / safe_component(spec.name),
                                         progress=ctx.progress, rules_files=rules)
                verdict = run_probe(probe, config, probe_ctx, isolate=True, timeout_s=max(ctx.remaining_s(), 0.1),
                                    cancel=ctx.cancel)
                if follow is not None:
                    from glmfb.workflows.mcp.follow import follow_verdict

                    options = dataclasses.replace(follow, budget_s=min(follow.budget_s, max(ctx.remaining_s(), 0.0)))
                    verdict = follow_verdict(verdict, options, self.box, artifact_dir=probe_ctx.artifact_dir,
                                             run_id=ctx.run_id, progress=ctx.progress, cancel=ctx.cancel)
            finally:
                ctx.slot.release()
        finished = invocation.finish([verdict], interrupted=ctx.cancel.is_set(), history=self.box.boundary.history,
                                     origins=lambda: self._origins(spec))
        return self.answer(finished.run.verdicts[0], ctx.run_id, (*notes, *finished_notes(finished)))

    def _origins(self, spec: ProbeSpec) -> dict[str, Origin]:
        """The verdict's origin in the history, as the probe's command records it: the spec's
        hash, the root's repository."""
        from glmfb.workflows.history.record import command_origin

        return {spec.name: command_origin(spec, self.probe.config_type, self.box.boundary.root)}

    def answer(self, verdict: Verdict, run_id: str, notes: Sequence[str] = ()) -> Answer:
        """The tool's result for one verdict."""
        boundary = self.box.boundary
        structured: dict[str, Any] = {
            "verdict": verdict.to_dict(),
            "run": run_ref(boundary, run_id),
            "next_calls": self.box.next_calls(verdict.next),
            "artifacts": artifact_uris(boundary, verdict, run_id),
        }
        if notes:
            structured["notes"] = list(notes)
        return Answer(summarize(verdict, structured["next_calls"], structured["run"]["uri"], notes), structured)
