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


# What `glmfb --help` lists about this probe, read without importing it (glmfb.core.registry).
SUMMARY = "Is the candidate more than THRESHOLD slower than the baseline? If so, what ate the time."
COMMANDS: dict[str, str] = {}  # the commands it brings besides its own: none
