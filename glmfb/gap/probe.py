"""``glmfb gap``: prefill alone against prefill + KV transfer (or any two iteration loops),
interleaved in one process, against a threshold such as 5%; when the gap is too large, what ate
it: the phases that grew, the transfer's bandwidth against its ceiling, the GIL.

``baseline`` and ``candidate`` are factories returning a zero-argument callable that runs one
iteration and may return a dict of phase timings in seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from glmfb.contract.verdict import Layer, Metric, Verdict
from glmfb.core.probe import (
    BaseProbe,
    MetricSpec,
    ProbeContext,
    ProbeForm,
    ProbeSpec,
    ReportSection,
    imported,
    side_times,
)
from glmfb.gap import SUMMARY

if TYPE_CHECKING:
    from glmfb.gap.config import GapConfig


class GapProbe(BaseProbe):
    kind: ClassVar[str] = "gap"
    layer: ClassVar[Layer] = Layer.TRANSFER
    summary: ClassVar[str] = SUMMARY
    form: ClassVar[ProbeForm] = ProbeForm.PAIR
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("gap", relative=True, unit="ratio", about="the fraction the candidate's path adds"),
        MetricSpec("baseline_time", unit="s", about="the baseline's own time per iteration"),
        MetricSpec("candidate_time", unit="s", about="the candidate's own time per iteration (prefill + transfer)"),
    )

    config_type: ClassVar[type] = imported("glmfb.gap.config:GapConfig")  # imported on first use
    evidence_types = imported("glmfb.gap.evidence:EVIDENCE_TYPES")
    builtin_rules = imported("glmfb.gap.rules:RULES")
    report: ClassVar[ReportSection] = ReportSection(
        order=40, question="transfer: what does the KV transfer cost on top of prefill, and why?",
        plots="glmfb.gap.plots:PLOTS",
    )
    agent_hint: ClassVar[str] = (
        "prefill plus KV transfer is slower than prefill alone: measures the gap against a threshold and what"
        " ate the time (GIL, CPU, bandwidth)"
    )

    def default_name(self, spec: ProbeSpec) -> str:
        return "gap"

    def run(self, config: GapConfig, ctx: ProbeContext) -> Verdict:
        from glmfb.gap.engine import run_gap

        return run_gap(config, ctx)


    def series(self, verdict: Verdict) -> tuple[Metric, ...]:
        """Each side's own time per iteration with its interval, beside the gap: the
        candidate's path getting slower is seen even when the baseline got slower with it."""
        return side_times(verdict, "gap", "{side}_samples_s", "{side}_time")

PROBE = GapProbe()
