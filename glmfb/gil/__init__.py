"""``glmfb gil``: which thread cannot get the GIL, which thread holds it, where, and whether it
holds it inside a native call that never lets it go (bug 2 of docs/background.md).

Public API (used by ``glmfb gap``)::

    from glmfb.gil import GilConfig, trace_gil
    verdict = trace_gil(GilConfig(name="x", command=("python", "prog.py")), artifact_dir=Path(...))
"""

from __future__ import annotations

from glmfb.gil.config import GilConfig
from glmfb.gil.engine import trace_gil

__all__ = ["GilConfig", "trace_gil"]
