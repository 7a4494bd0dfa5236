"""``glmfb bench``: kernel microbenchmarks, baseline against candidate, with honest statistics
and an explanation of a slowdown (which operators got more or slower).

``baseline`` and ``candidate`` are factories ``f(shape, **args)`` returning a zero-argument
callable that runs the kernel once, or both saved result files (``.json`` from ``--save`` or
pytest-benchmark, a ``#side`` suffix allowed), which are then compared across processes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from glmfb.bench import SUMMARY
from glmfb.contract.errors import UsageError
from glmfb.contract.verdict import Layer, Metric, Verdict
from glmfb.core.probe import (
    BaseProbe,
    MetricSpec,
    ProbeContext,
    ProbeForm,
    ProbeSpec,
    ReportSection,
    evidence_data,
    imported,
    measured_on_busy_host,
)
from glmfb.core.targets import Target

if TYPE_CHECKING:
    from glmfb.bench.config import BenchConfig


class BenchProbe(BaseProbe):
    kind: ClassVar[str] = "bench"
    layer: ClassVar[Layer] = Layer.KERNEL
    summary: ClassVar[str] = SUMMARY
    form: ClassVar[ProbeForm] = ProbeForm.PAIR
    config_type: ClassVar[type] = imported("glmfb.bench.config:BenchConfig")  # imported on first use
    evidence_types = imported("glmfb.bench.evidence:EVIDENCE_TYPES")
    candidate_optional: ClassVar[bool] = True  # one target alone: its own time per call
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("time_change", relative=True, unit="fraction", about="candidate / baseline - 1, one shape"),
        MetricSpec("geomean_time_change", relative=True, unit="fraction", about="over the shapes"),
        MetricSpec("median_time", unit="s", about="one target alone: its time per call (the first shape; "
                                                  "median_time[SHAPE] per shape)"),
        MetricSpec("normalized_time", unit="ref", about="one target over 2+ processes: its time per call in units "
                                                      "of a fixed reference workload timed beside it (per shape "
                                                      "when several)"),
        MetricSpec("baseline_time", unit="s", about="a pair's baseline: its own time per call, per shape"),
        MetricSpec("candidate_time", unit="s", about="a pair's candidate: its own time per call, per shape"),
    )
    builtin_rules = imported("glmfb.bench.rules:RULES")
    report: ClassVar[ReportSection] = ReportSection(
        order=20, question="kernels: which shape got slower, by how much, and why?",
        plots="glmfb.bench.plots:PLOTS",
    )
    agent_hint: ClassVar[str] = (
        "a kernel or op may have got slower: times baseline and candidate per shape, says which shape "
        "regressed, by how much (with an interval), and which ops account for it"
    )

    def default_name(self, spec: ProbeSpec) -> str:
        from glmfb.bench.config import is_saved_ref, kernel_name

        if spec.candidate is None:
            return kernel_name(spec.baseline or "bench")
        if is_saved_ref(spec.baseline or "") and is_saved_ref(spec.candidate):
            return "bench-saved"
        return f"{kernel_name(spec.candidate)}-vs-{kernel_name(spec.baseline or '')}"

    def build(self, spec: ProbeSpec) -> Any:
        from glmfb.bench.config import BenchConfig, is_saved_ref

        if not spec.baseline:
            raise UsageError(f"{spec.label}: a bench probe needs a baseline")
        saved = [is_saved_ref(ref) for ref in (spec.baseline, spec.candidate) if ref]
        if any(saved) and not (len(saved) == 2 and all(saved)):
            raise UsageError(f"{spec.label}: comparing saved results needs two .json files",
                             "glmfb bench OLD.json NEW.json")
        if all(saved) and len(saved) == 2:
            def resolved(ref: str) -> Target:
                """Each run of a side (``FILE[#side][,FILE...]``, globs allowed) beside the definition."""
                parts = []
                for part in (p.strip() for p in ref.split(",") if p.strip()):
                    path, sep, side = part.partition("#")
                    parts.append(str(spec.resolve_path(path)) + (f"#{side}" if sep else ""))
                return Target(",".join(parts))

            assert spec.candidate is not None
            return BenchConfig(name=spec.name, baseline=resolved(spec.baseline), candidate=resolved(spec.candidate),
                               **spec.options)
        config = super().build(spec)
        if config.save is not None and spec.base_dir is not None:
            config = dataclasses.replace(config, save=spec.resolve_path(config.save))
        return config

    def series(self, verdict: Verdict) -> tuple[Metric, ...]:
        """The series a kernel's own time is followed by across commits, whichever way the
        definition was written: in a pair, each side's time per call per shape
        (``baseline_time[8x4096]``, ``candidate_time[8x4096]``); one target alone, its time per
        shape when it measured several (the headline ``median_time`` is the first shape's) and,
        over fresh processes, its time in a reference's units (``normalized_time``, per shape
        when several).
        None from a run on a busy host: the interleaving cancels others' load out of the change,
        not out of either side's own time."""
        if measured_on_busy_host(verdict):
            return ()  # the interleaving cancels others' load out of the change, not out of a side's time
        items = evidence_data(verdict)
        found: list[Metric] = []
        measured = [e for e in items if e.get("kind") == "measurement" and e.get("time_s") and e.get("ci_s")]
        if len(measured) > 1:
            found += [Metric(f"median_time[{e['shape']}]", e["time_s"], "s", ci=tuple(e["ci_s"])) for e in measured]
        shapes = sum(1 for e in items if e.get("kind") == "measurement")  # the name never flips with one missing
        found += [Metric(f"normalized_time[{e['shape']}]" if shapes > 1 else "normalized_time",
                         e["normalized_time"], "ref", ci=tuple(e["normalized_ci"]))
                  for e in items if e.get("kind") == "measurement" and e.get("normalized_time") and e.get("normalized_ci")]
        for item in items:
            if item.get("kind") != "shape" or not item.get("side_time_s"):
                continue
            for side, (value, low, high) in sorted(item["side_time_s"].items()):
                found.append(Metric(f"{side}_time[{item['shape']}]", value, "s", ci=(low, high)))
        return tuple(found)

    def run(self, config: BenchConfig, ctx: ProbeContext) -> Verdict:
        from glmfb.bench.engine import compare_saved, run_bench

        if config.saved:
            return compare_saved(config, ctx)
        return run_bench(config, ctx)


PROBE = BenchProbe()
