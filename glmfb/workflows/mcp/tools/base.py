"""What every tool shares: what a call gets (:class:`CallContext`) and gives (:class:`Answer`),
a checked call (:class:`Prepared`), a tool as listed (:class:`ToolDef`), the resource URIs,
and the schema pieces and argument checks several tools use."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from glmfb.contract.errors import InputError

if TYPE_CHECKING:
    from glmfb.workflows.mcp.boundary import Boundary

RUN_URI = "glmfb://runs/{run_id}"
ARTIFACT_URI = "glmfb://runs/{run_id}/artifacts/{path}"
LATEST_URI = "glmfb://runs/latest"
SCHEMA_URI = "glmfb://schema"
SLOT_POLL_S = 0.2


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


class Tool(Protocol):
    """One tool: how it is listed, and how a call of it is checked into work."""

    @property
    def definition(self) -> ToolDef: ...

    def prepare(self, arguments: dict[str, Any]) -> Prepared: ...


# --------------------------------------------------------------------------------------------
# Schema pieces
# --------------------------------------------------------------------------------------------


def compact_defs() -> dict[str, Any]:
    """The verdict and run schemas of ``glmfb schema`` with evidence items checked only for
    their ``kind`` (the full schema, a schema per evidence kind, is ``glmfb://schema``)."""
    from glmfb.core.documents import json_schema

    defs = copy.deepcopy(json_schema()["$defs"])
    verdict = defs["verdict"]
    verdict["properties"]["evidence"]["items"] = {
        "type": "object", "required": ["kind"], "properties": {"kind": {"type": "string"}},
        "description": "typed evidence; the schema of each kind is in glmfb://schema",
    }
    return {"verdict": verdict, "run": defs["run"]}


NEXT_CALL: dict[str, Any] = {
    "type": "object",
    "required": ["index", "text"],
    "properties": {
        "index": {"type": "integer", "description": "the position of the step in the verdict's next"},
        "text": {"type": "string", "description": "the step as a command line, for people"},
        "why": {"type": "string", "description": "what the step is for"},
        "intent": {"enum": ["deeper", "confirm", "after_fix", "reproduce", "other"],
                   "description": "what kind of step: deeper (one layer down), confirm, after_fix, reproduce, other"},
        "tool": {"type": "string", "description": "the tool to call"},
        "arguments": {"type": "object", "description": "the arguments to call it with, as they are"},
        "error": {"type": "string", "description": "why this step cannot be called now (then no arguments)"},
    },
}
RUN_REF = {
    "type": "object",
    "required": ["id", "uri"],
    "properties": {
        "id": {"type": "string"},
        "uri": {"type": "string", "description": "the run.json resource"},
        "folder": {"type": "string", "description": "the run folder, relative to the root"},
    },
}
NOTES = {"type": "array", "items": {"type": "string"}}
KWARGS = {"type": "object", "description": "Keyword arguments for the target factory (both sides)."}


def with_defs(schema: dict[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    return {**schema, "$defs": dict(defs)}


def duration_schema(boundary: Boundary) -> dict[str, Any]:
    return {"type": ["string", "number"],
            "description": f"Time budget of this call, e.g. 30s or 10min (a bare number is seconds); what runs is "
                           f"stopped, with everything it started, when it is spent. At most "
                           f"{boundary.max_call_s:g} s (the default)."}


FOLLOW_SCHEMA: dict[str, Any] = {
    "type": ["boolean", "object"],
    "properties": {"depth": {"type": "integer", "minimum": 0}, "budget": {"type": ["string", "number"]}},
    "additionalProperties": False,
    "description": "After a failing verdict, run its deeper steps (then theirs) under this server's boundary, "
                   "to a depth (default 3) within a time budget for the whole chain (default 10 min, and "
                   "within the call's timeout); each follow-up is a whole verdict in the verdict's chain."}


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def follow_argument(label: str, arguments: Mapping[str, Any], boundary: Boundary) -> Any:
    """A call's ``follow`` argument (true, or an object with ``depth`` and ``budget``) as
    :class:`~glmfb.core.commandline.FollowOptions` under ``boundary`` (command lines as it
    allows them), or None when the call does not follow."""
    from glmfb.core.commandline import FollowOptions

    value = arguments.get("follow")
    if value is None or value is False:
        return None
    if value is True:
        return FollowOptions(allow_commands=boundary.allow_commands)
    if not isinstance(value, dict):
        raise InputError(f"{label}: argument 'follow': expected true or an object {{depth, budget}}")
    return FollowOptions.parse(value.get("depth"), value.get("budget"), "argument 'follow'",
                               allow_commands=boundary.allow_commands)


def refuse_unknown(label: str, arguments: Mapping[str, Any], properties: Mapping[str, Any]) -> None:
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        raise InputError(f"{label}: unknown argument {unknown[0]!r}", f"known: {', '.join(sorted(properties))}")


def kwargs_argument(arguments: Mapping[str, Any], key: str) -> dict[str, Any]:
    """An object of keyword arguments (``args``, ``baseline_args``, ...); ``{}`` when not given."""
    value = arguments.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise InputError(f"argument {key!r}: expected an object of keyword arguments, got {value!r:.80}")
    return dict(value)
