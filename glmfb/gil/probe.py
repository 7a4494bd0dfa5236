"""``glmfb gil``: GIL-contention tracing. Which thread starves, which thread holds the GIL, in
which function, and whether it holds it inside a native call that never releases it.

It runs a command line (``-- python prog.py``; in a definition ``command = [...]``, where
``"python"`` means the interpreter running glmfb and arguments naming files beside the
definition are resolved there), a Python target whose factory returns a zero-argument callable
(called in a loop in a child process), or attaches to a running process (``--pid``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from glmfb.contract.verdict import Layer, Verdict
from glmfb.core.probe import (
    BaseProbe,
    MetricSpec,
    ProbeContext,
    ProbeForm,
    ProbeSpec,
    ReportSection,
    imported,
)
from glmfb.gil import SUMMARY

if TYPE_CHECKING:
    from glmfb.gil.config import GilConfig


def resolve_command(spec: ProbeSpec) -> tuple[str, ...]:
    """A definition's command with ``python`` and files beside the definition resolved."""
    return resolve_words(tuple(spec.command), spec.base_dir)


def resolve_words(words: tuple[str, ...], base_dir: Path | None) -> tuple[str, ...]:
    """A command line of a definition (its ``command``, its ``load`` option) with ``python`` and
    files beside the definition resolved."""
    if base_dir is None:
        return words
    resolved: list[str] = []
    for index, part in enumerate(words):
        if index == 0 and part in ("python", "python3"):
            resolved.append(sys.executable)
        elif not part.startswith("-") and "/" in part and (base_dir / part).exists():
            resolved.append(str((base_dir / part).resolve()))
        else:
            resolved.append(part)
    return tuple(resolved)


class GilProbe(BaseProbe):
    kind: ClassVar[str] = "gil"
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("starvation_p99", unit="ms", about="how late the most starved thread woke, p99"),)
    layer: ClassVar[Layer] = Layer.RUNTIME
    summary: ClassVar[str] = SUMMARY
    form: ClassVar[ProbeForm] = ProbeForm.SINGLE
    config_type: ClassVar[type] = imported("glmfb.gil.config:GilConfig")  # imported on first use
    evidence_types = imported("glmfb.gil.evidence:EVIDENCE_TYPES")
    accepts_command: ClassVar[bool] = True
    builtin_rules = imported("glmfb.gil.rules:RULES")
    report: ClassVar[ReportSection] = ReportSection(
        order=30, question="runtime: who holds the GIL, and who starves?",
        plots="glmfb.gil.plots:PLOTS",
    )
    agent_hint: ClassVar[str] = (
        "a Python process (a server, a data loader) stalls or has latency spikes: finds which threads starve "
        "for the GIL and which code holds it"
    )

    def build(self, spec: ProbeSpec) -> Any:
        from dataclasses import replace

        config = super().build(spec)
        if spec.command:
            config = replace(config, command=resolve_command(spec))
        if config.load:
            config = replace(config, load=resolve_words(config.load, spec.base_dir))
        return config

    def run(self, config: GilConfig, ctx: ProbeContext) -> Verdict:
        from glmfb.gil.engine import trace_gil

        return trace_gil(config, ctx)


PROBE = GilProbe()
