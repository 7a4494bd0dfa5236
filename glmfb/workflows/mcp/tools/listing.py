"""The ``list_probes`` and ``cancel`` tools: what this project defines, and stopping a call."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import InputError
from glmfb.contract.options import options_of
from glmfb.workflows.mcp.tools.base import Answer, CallContext, Prepared, ToolDef, refuse_unknown
from glmfb.workflows.mcp.tools.suite import PATHS_SCHEMA, definitions

if TYPE_CHECKING:
    from glmfb.workflows.mcp.tools import Toolbox


@dataclass
class ListProbesTool:
    """``list_probes``: the probe definitions under the root, each with the run call that runs it."""

    box: Toolbox

    @cached_property
    def definition(self) -> ToolDef:
        output = {"type": "object", "required": ["definitions"],
                  "properties": {"definitions": {"type": "array", "items": {"type": "object"}}}}
        return ToolDef("list_probes", "glmfb probe definitions", "List the probe definitions found under the root "
                       "(name, probe kind, targets, options, expectation), each with the run call that runs it.",
                       {"type": "object", "additionalProperties": False, "properties": {
                           "paths": PATHS_SCHEMA,
                           "select": {"type": ["string", "array"], "items": {"type": "string"},
                                      "description": "Only definitions whose name matches (glob or substring)."},
                       }}, output, read_only=True)

    def prepare(self, arguments: dict[str, Any]) -> Prepared:
        label = "glmfb list_probes"
        refuse_unknown(label, arguments, self.definition.input_schema["properties"])
        found = definitions(self.box.boundary, label, arguments)
        timeout_s, _ = self.box.boundary.timeout(None)

        def work(ctx: CallContext) -> Answer:
            items = [self._item(definition) for definition in found]
            lines = [f"{len(items)} probe definition(s):"]
            lines += [f"- {i['name']} ({i['probe']})" + (f": {i['description']}" if "description" in i else "")
                      for i in items]
            return Answer("\n".join(lines), {"definitions": items})

        return Prepared("list_probes", timeout_s, work)

    def _item(self, definition: Any) -> dict[str, Any]:
        """One definition as listed: as its TOML table says it, plus the call that runs it."""
        from glmfb.contract.verdict import to_json_value

        boundary = self.box.boundary
        spec = definition.spec
        keys = {option.attr: option.key for option in options_of(self.box.probes[spec.kind].config_type)}
        item: dict[str, Any] = {"name": spec.name, "probe": spec.kind,
                                "source": boundary.relative(definition.source)
                                if boundary.inside(definition.source) else str(definition.source)}
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
        return item


@dataclass
class CancelTool:
    """``cancel``: stop an in-flight call by its run id."""

    box: Toolbox

    @cached_property
    def definition(self) -> ToolDef:
        return ToolDef("cancel", "cancel a running call", "Cancel a running probe, capture or run call by its run "
                       "id (its first progress message names it): the probe and every process it started are "
                       "stopped, and that call answers with an error verdict that says it was cancelled. (A "
                       "client's own cancellation of the call does the same; the run folder keeps the verdict.)",
                       {"type": "object", "additionalProperties": False, "required": ["run_id"],
                        "properties": {"run_id": {"type": "string"}}},
                       {"type": "object", "required": ["run_id", "cancelled"],
                        "properties": {"run_id": {"type": "string"}, "cancelled": {"type": "boolean"}}})

    def prepare(self, arguments: dict[str, Any]) -> Prepared:
        label = "glmfb cancel"
        refuse_unknown(label, arguments, self.definition.input_schema["properties"])
        run_id = arguments.get("run_id")
        if not isinstance(run_id, str) or not run_id:
            raise InputError(f"{label}: argument 'run_id' is required (a string)")
        timeout_s, _ = self.box.boundary.timeout(None)

        def work(ctx: CallContext) -> Answer:
            cancelled = self.box.cancel_run(run_id)
            text = (f"cancelled run {run_id}: its call answers with the cancelled verdict" if cancelled
                    else f"no call of run {run_id} is running")
            return Answer(text, {"run_id": run_id, "cancelled": cancelled})

        return Prepared("cancel", timeout_s, work)
