"""Shared test helpers: a probe context in a temporary folder, a probe run through the host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from glmfb.contract.verdict import Verdict
from glmfb.core.host import run_probe
from glmfb.core.probe import ProbeContext, get_probe


def context(folder: Path, name: str = "t") -> ProbeContext:
    """A probe context whose artifacts go to ``folder/name``."""
    return ProbeContext(run_id="test", artifact_dir=Path(folder) / name)


def run(kind: str, config: Any, folder: Path) -> Verdict:
    """Run a config of probe ``kind`` through the host boundary (as the CLI and suite do)."""
    return run_probe(get_probe(kind), config, context(folder, getattr(config, "name", kind).replace("/", "_")))
