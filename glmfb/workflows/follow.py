"""``--follow`` for the CLI and ``glmfb run``: the follow engine
(:mod:`glmfb.workflows.mcp.follow`) under the boundary the agent server applies, rooted at the
working folder (paths under it; no command line unless allowed).

The one module outside the agent server that imports it: following a step is taking its tool
call, checked as the server checks it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from glmfb.contract.verdict import Verdict
from glmfb.core.commandline import DEFAULT_BUDGET_S, DEFAULT_DEPTH, FollowOptions
from glmfb.workflows.mcp.follow import follows


def follow_verdict(verdict: Verdict, options: FollowOptions, *, root: Path, artifact_dir: Path, run_id: str,
                   progress: Callable[[str], None] | None = None, cancel: threading.Event | None = None,
                   run_dir: Path | None = None) -> Verdict:
    """``verdict`` with its chain (:func:`glmfb.workflows.mcp.follow.follow_verdict`), its steps
    checked under a boundary rooted at ``root``, which also reads the run's own folder
    ``run_dir`` (default: ``artifact_dir``'s parent) wherever ``--out`` put it: a step names
    files its probe wrote there. ``verdict`` itself when nothing is followed (and then no tool
    is built)."""
    if not follows(verdict):
        return verdict
    from glmfb.workflows.mcp import follow
    from glmfb.workflows.mcp.boundary import Boundary
    from glmfb.workflows.mcp.tools import Toolbox

    toolbox = Toolbox(Boundary(root, allow_commands=options.allow_commands, max_call_s=options.budget_s,
                               who="glmfb --follow", readable=(run_dir or artifact_dir.parent,),
                               commands_hint="--follow-commands lets a follow-up run it: a command line you gave, "
                               "such as gil's trace of your program"))
    return follow.follow_verdict(verdict, options, toolbox, artifact_dir=artifact_dir, run_id=run_id,
                                 progress=progress, cancel=cancel)


def follower(root: Path, run_id: str, progress: Callable[[str], None] | None = None,
             cancel: threading.Event | None = None) -> Callable[[Verdict, FollowOptions, Path], Verdict]:
    """The follow engine for a suite (:attr:`glmfb.workflows.suite.SuiteContext.follower`): a
    verdict, how far, and its artifact folder in; the verdict with its chain out."""

    def follow(verdict: Verdict, options: FollowOptions, artifact_dir: Path) -> Verdict:
        return follow_verdict(verdict, options, root=root, artifact_dir=artifact_dir, run_id=run_id,
                              progress=progress, cancel=cancel)

    return follow


__all__ = ["DEFAULT_BUDGET_S", "DEFAULT_DEPTH", "FollowOptions", "follow_verdict", "follower", "follows"]
