"""The tools of ``glmfb mcp``: one per probe kind of the registry, one per command a probe
brings (diff's ``capture``), plus ``run``, ``gate``, ``list_probes``, ``explain``, ``history``,
``bisect`` and ``cancel``.

Each tool is a small object with its :class:`ToolDef` (name, description, input and output
schemas) and its ``prepare``, one module per family:

- :mod:`.probes`: a probe's tool, its input schema derived like the CLI command from the
  probe (its form, its declared options); it answers with the verdict, the run it was written
  to, and the verdict's next steps as tool calls;
- :mod:`.commands`: the tool of a command a probe brings, derived from its
  :class:`~glmfb.core.probe.ProbeCommand`;
- :mod:`.suite`: ``run``; :mod:`.saved`: ``gate`` and ``explain``; :mod:`.listing`:
  ``list_probes`` and ``cancel``; :mod:`.history`: ``history`` (the recorded verdicts as series
  with their change points); :mod:`.bisection`: ``bisect`` (the commit where a definition
  starts to fail);
- :mod:`.base`: what a call gets and gives, shared schema pieces and checks;
  :mod:`.answers`: run references and the text for the model.

Each call is first *prepared* (arguments checked against the :class:`Boundary`, the config
built: a bad argument is an :class:`~glmfb.contract.errors.InputError` naming it, before anything
runs), then its blocking *work* runs in a worker thread with a :class:`CallContext` (the run
id, a progress callback, the cancellation event, the deadline). Probes run one at a time,
each in a supervised child process (:func:`glmfb.core.host.run_probe`), so one probe's timing is
never disturbed by another's and a cancelled probe leaves no process behind.

:class:`Toolbox` assembles the tools from the registry and dispatches a call to its tool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from glmfb.contract.errors import GlmfbError, InputError
from glmfb.contract.step import Step
from glmfb.core.commandline import shell_line
from glmfb.core.probe import Probe, all_probes, probe_commands
from glmfb.workflows.mcp.boundary import Boundary
from glmfb.workflows.mcp.tools.answers import summarize, summarize_run
from glmfb.workflows.mcp.tools.base import (
    ARTIFACT_URI,
    LATEST_URI,
    RUN_URI,
    SCHEMA_URI,
    Answer,
    CallContext,
    Prepared,
    Tool,
    ToolDef,
    compact_defs,
)


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
    def handlers(self) -> dict[str, Tool]:
        """Each tool by name: the probes' first, then the commands they bring, then the rest."""
        from glmfb.workflows.mcp.tools.bisection import BisectTool
        from glmfb.workflows.mcp.tools.commands import CommandTool
        from glmfb.workflows.mcp.tools.history import HistoryTool
        from glmfb.workflows.mcp.tools.listing import CancelTool, ListProbesTool
        from glmfb.workflows.mcp.tools.probes import ProbeTool
        from glmfb.workflows.mcp.tools.saved import ExplainTool, GateTool
        from glmfb.workflows.mcp.tools.suite import RunTool

        handlers: dict[str, Tool] = {kind: ProbeTool(probe, self) for kind, probe in self.probes.items()}
        others: list[Tool] = [CommandTool(command, self) for command in probe_commands().values()]
        others += [RunTool(self), GateTool(self), ListProbesTool(self), ExplainTool(self), HistoryTool(self),
                   BisectTool(self), CancelTool(self)]
        for tool in others:
            handlers.setdefault(tool.definition.name, tool)
        return handlers

    @cached_property
    def tools(self) -> dict[str, ToolDef]:
        """Every tool as listed, by name."""
        return {name: tool.definition for name, tool in self.handlers.items()}

    def input_schema(self, name: str) -> dict[str, Any] | None:
        tool = self.tools.get(name)
        return tool.input_schema if tool is not None else None

    def prepare(self, name: str, arguments: Mapping[str, Any] | None) -> Prepared:
        """Check a call (raises :class:`InputError` naming the argument) and return its work."""
        if name not in self.handlers:
            raise InputError(f"unknown tool {name!r}", f"the tools: {', '.join(self.tools)}")
        try:
            return self.handlers[name].prepare(dict(arguments or {}))
        except InputError as exc:
            if exc.message.startswith("glmfb "):
                raise
            raise InputError(f"glmfb {name}: {exc.message}", exc.hint) from None

    def check(self, name: str, arguments: Mapping[str, Any]) -> None:
        """Raise what :meth:`prepare` would raise; run nothing."""
        self.prepare(name, arguments)

    def next_calls(self, steps: Sequence[Step]) -> list[dict[str, Any]]:
        """The steps that are glmfb commands, as tool calls: ``{"index", "text", "why", "intent",
        "tool", "arguments"}``, or with ``error`` instead of ``arguments`` when the call would be refused
        now (a path outside the root, no such tool). Plain steps stay text only."""
        calls: list[dict[str, Any]] = []
        for index, step in enumerate(steps):
            if step.command is None:
                continue
            entry: dict[str, Any] = {"index": index, "text": shell_line(step), "why": step.why,
                                     "intent": step.intent.value, "tool": step.command}
            try:
                self.check(step.command, step.arguments)
            except GlmfbError as exc:
                entry["error"] = str(exc)
            else:
                entry["arguments"] = dict(step.arguments)
            calls.append(entry)
        return calls


__all__ = ["ARTIFACT_URI", "LATEST_URI", "RUN_URI", "SCHEMA_URI", "Answer", "CallContext", "Prepared", "Tool",
           "ToolDef", "Toolbox", "compact_defs", "summarize", "summarize_run"]
