"""The follow engine (``--follow``): after a failing verdict, glmfb takes its ``deeper`` steps
itself, then theirs. The CLI and the suite reach it through :mod:`glmfb.workflows.follow`,
which builds the :class:`~glmfb.workflows.mcp.tools.Toolbox` for the working folder; the
probe tools call it with the server's own.

A step declares what it is for (:class:`~glmfb.contract.step.Intent`); a ``deeper`` one asks a
narrower question one layer down (the module diff of the served folder, gil on the
candidate). :func:`follow_verdict` takes each deeper step of a failing verdict as the agent
server would take the tool call: its arguments checked against the same
:class:`~glmfb.workflows.mcp.boundary.Boundary` (paths under the root; no command line unless
allowed), built into the probe's config by the probe's tool, run in the same supervised
child a probe command uses. Each follow-up is a whole verdict, with its own evidence and
artifacts (under the asking verdict's artifact folder, ``follow/``), and is followed in turn
while it fails, to ``depth`` levels, within ``budget_s`` for the whole chain.

The result is the verdict with its ``chain`` (:class:`~glmfb.contract.verdict.Link`): a link
per deeper step, holding the verdict it gave, or, when the step was not taken, why
(``stopped``): the boundary refused it (a command line, a path outside the root), it is not
a probe's step, the depth was reached, the budget was spent, the run was cancelled. A chain
never stops silently. A verdict that did not fail, or has no deeper step, is returned as it
is: nothing is followed, nothing is spent.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import GlmfbError
from glmfb.contract.step import Intent, Step
from glmfb.contract.verdict import Link, Status, Verdict
from glmfb.core.commandline import FollowOptions
from glmfb.core.probe import safe_component

if TYPE_CHECKING:
    from glmfb.workflows.mcp.tools import Toolbox

MIN_LINK_S = 1.0  # a follow-up with less time than this left is not started


def follows(verdict: Verdict) -> bool:
    """Whether ``--follow`` takes anything after this verdict: it failed and has a deeper step."""
    return verdict.status is Status.FAIL and any(_deeper(verdict))


def _deeper(verdict: Verdict) -> list[Step]:
    return [step for step in verdict.next if step.intent is Intent.DEEPER and step.is_call]


def follow_verdict(verdict: Verdict, options: FollowOptions, toolbox: Toolbox, *, artifact_dir: Path, run_id: str,
                   progress: Callable[[str], None] | None = None, cancel: threading.Event | None = None) -> Verdict:
    """``verdict`` with the chain of its deeper steps followed (see the module docstring);
    ``verdict`` itself when it did not fail or has no deeper step. Each step is checked and
    built by ``toolbox``'s probe tool, under its boundary."""
    if not follows(verdict):
        return verdict
    walker = _Walker(options, toolbox, run_id, progress or (lambda message: None), cancel or threading.Event(),
                     time.monotonic() + options.budget_s)
    return walker.follow(verdict, artifact_dir, 1)


@dataclass
class _Walker:
    options: FollowOptions
    toolbox: Toolbox
    run_id: str
    progress: Callable[[str], None]
    cancel: threading.Event
    deadline: float

    def follow(self, verdict: Verdict, artifact_dir: Path, level: int) -> Verdict:
        steps = _deeper(verdict) if verdict.status is Status.FAIL else []
        if not steps:
            return verdict
        links: list[Link] = []
        for index, step in enumerate(steps, 1):
            links.append(self.link(step, artifact_dir / "follow" / f"{level}.{index}", level))
        return dataclasses.replace(verdict, chain=tuple(links))

    def link(self, step: Step, folder: Path, level: int) -> Link:
        depth, budget = self.options.depth, self.options.budget_s
        if level > depth:
            return Link(step, stopped=f"not followed: the follow depth of {depth} is reached (--follow-depth)")
        if self.cancel.is_set():
            return Link(step, stopped="not followed: the run was cancelled")
        remaining = self.deadline - time.monotonic()
        if remaining < MIN_LINK_S:
            return Link(step, stopped=f"not followed: the follow budget of {budget:g} s is spent (--follow-budget)")
        tool = self.toolbox.handlers.get(step.command or "")
        if tool is None or not hasattr(tool, "checked"):  # a probe's tool (ProbeTool) checks a call so
            return Link(step, stopped=f"not followed: glmfb {step.command} is not a probe; --follow takes probe "
                                      "steps only (take it by hand)")
        try:
            call = tool.checked(step.arguments)
        except GlmfbError as exc:
            hint = f" ({exc.hint})" if getattr(exc, "hint", None) else ""
            return Link(step, stopped=f"not followed: the boundary refuses it: {exc.message}{hint}")
        return Link(step, verdict=self.run(tool, call, folder, level, remaining))

    def run(self, tool: Any, call: Any, folder: Path, level: int, remaining: float) -> Verdict:
        from glmfb.core.host import run_probe
        from glmfb.core.probe import ProbeContext

        probe, spec = tool.probe, call.spec
        self.progress(f"follow (level {level}): glmfb {probe.kind} {spec.name!r}")
        artifact_dir = folder / safe_component(spec.name)
        ctx = ProbeContext(run_id=self.run_id, artifact_dir=artifact_dir, progress=self.progress,
                           rules_files=call.rules)
        isolate = os.environ.get("GLMFB_ISOLATE", "1") != "0"  # as the probe command: 0 only in tests
        verdict = run_probe(probe, call.config, ctx, isolate=isolate,
                            timeout_s=max(min(remaining, call.timeout_s), 0.1),
                            cancel=self.cancel)
        return self.follow(verdict, artifact_dir, level + 1)
