"""``glmfb bisect``: the commit of a git history where a probe definition starts to fail.

:mod:`glmfb.workflows.bisect.git` walks the repository (the first-parent chain, one worktree per commit),
:mod:`glmfb.workflows.bisect.search` picks the next commit to test, and :mod:`glmfb.workflows.bisect.engine` runs
the definition at each one (through the suite and the host boundary) and answers with one
verdict. No probe engine is imported here: the bisection orchestrates whichever probe the
definition names (docs/bisect.md).
"""

from glmfb.workflows.bisect.engine import BisectRequest, BisectResult, bisect, choose_definition

__all__ = ["BisectRequest", "BisectResult", "bisect", "choose_definition"]
