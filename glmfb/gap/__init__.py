"""``glmfb gap``: prefill alone against prefill + KV transfer, interleaved in one process, with an
attribution of what ate the time (phases, transfer bandwidth against its ceiling, the GIL).

Public API::

    from glmfb.gap import GapConfig, run_gap
    verdict = run_gap(GapConfig(name="x", baseline=Target(...), candidate=Target(...)))
"""

from __future__ import annotations

from glmfb.gap.config import GapConfig
from glmfb.gap.engine import run_gap

__all__ = ["GapConfig", "run_gap"]
