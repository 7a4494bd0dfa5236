"""``glmfb gap``: prefill alone against prefill + KV transfer, interleaved in one process, with an
attribution of what ate the time (phases, transfer bandwidth against its ceiling, the GIL).

Public API::

    from glmfb.gap import GapConfig, run_gap
    verdict = run_gap(GapConfig(name="x", baseline=Target(...), candidate=Target(...)))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from glmfb.gap.config import GapConfig

__all__ = ["GapConfig", "run_gap"]


def __getattr__(name: str) -> object:
    """The config and the engine are imported on first use: the CLI's start-up loads neither."""
    if name == "GapConfig":
        from glmfb.gap.config import GapConfig

        return GapConfig
    if name == "run_gap":
        from glmfb.gap.engine import run_gap

        return run_gap
    raise AttributeError(name)
