"""``glmfb gil``: which thread cannot get the GIL, which thread holds it, where, and whether it
holds it inside a native call that never lets it go (bug 2 of docs/background.md).

Public API, what another probe may use (``glmfb gap`` does; its evidence kinds, in
:mod:`glmfb.gil.evidence`, are read through their types)::

    from glmfb.gil import GilConfig, trace_gil
    ctx = ProbeContext(run_id="x", artifact_dir=Path("reports/x/gil"))  # from glmfb.core.probe
    verdict = trace_gil(GilConfig(name="x", command=("python", "prog.py")), ctx)

- ``describe_threads(name, count)``: how a holder that stands for ``count`` short-lived
  threads of one name is written ("226 short-lived threads Thread-N (_send_layer)");
- ``SOURCE_LINE``: the ``holder_c_source`` that says a C function was named from the holder's
  source line, not from a native frame;
- ``timeline_plot(view)``: the GIL timeline of a gil verdict (per thread when it has one).

Everything is imported on first use: the CLI's start-up loads none of it, and
``tests/test_architecture.py`` checks that another engine imports nothing else of this one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from glmfb.gil.config import GilConfig
    from glmfb.gil.engine import trace_gil
    from glmfb.gil.groups import describe as describe_threads
    from glmfb.gil.holders import SOURCE_LINE
    from glmfb.gil.plots import verdict_timeline as timeline_plot

__all__ = ["SOURCE_LINE", "GilConfig", "describe_threads", "timeline_plot", "trace_gil"]

_API = {
    "GilConfig": "glmfb.gil.config:GilConfig",
    "trace_gil": "glmfb.gil.engine:trace_gil",
    "describe_threads": "glmfb.gil.groups:describe",
    "SOURCE_LINE": "glmfb.gil.holders:SOURCE_LINE",
    "timeline_plot": "glmfb.gil.plots:verdict_timeline",
}


def __getattr__(name: str) -> object:
    """The API's names, each imported on first use."""
    if name not in _API:
        raise AttributeError(name)
    module, _, attr = _API[name].partition(":")
    return getattr(importlib.import_module(module), attr)


# What `glmfb --help` lists about this probe, read without importing it (glmfb.core.registry).
SUMMARY = "Trace GIL contention: name the thread that holds the GIL (and where), and the starved one."
COMMANDS: dict[str, str] = {}  # the commands it brings besides its own: none
