"""``glmfb gil``: which thread cannot get the GIL, which thread holds it, where, and whether it
holds it inside a native call that never lets it go (bug 2 of docs/background.md).

Public API (used by ``glmfb gap``)::

    from glmfb.gil import GilConfig, trace_gil
    ctx = ProbeContext(run_id="x", artifact_dir=Path("reports/x/gil"))  # from glmfb.probe
    verdict = trace_gil(GilConfig(name="x", command=("python", "prog.py")), ctx)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from glmfb.gil.config import GilConfig

__all__ = ["GilConfig", "trace_gil"]


def __getattr__(name: str) -> object:
    """The config and the engine are imported on first use: the CLI's start-up loads neither."""
    if name == "GilConfig":
        from glmfb.gil.config import GilConfig

        return GilConfig
    if name == "trace_gil":
        from glmfb.gil.engine import trace_gil

        return trace_gil
    raise AttributeError(name)
