"""``glmfb bench``: kernel microbenchmarks, baseline against candidate, with honest statistics
and an explanation of a slowdown (which operators got more or slower).

``baseline`` and ``candidate`` are factories ``f(shape, **args)`` returning a zero-argument
callable that runs the kernel once, or both saved result files (``.json`` from ``--save`` or
pytest-benchmark, a ``#side`` suffix allowed), which are then compared across processes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

from glmfb.errors import UsageError
from glmfb.probe import BaseProbe, ProbeContext, ProbeForm, ProbeSpec, ReportSection, imported
from glmfb.targets import Target
from glmfb.verdict import Layer, Verdict

if TYPE_CHECKING:
    from glmfb.bench.config import BenchConfig


class BenchProbe(BaseProbe):
    kind: ClassVar[str] = "bench"
    layer: ClassVar[Layer] = Layer.KERNEL
    summary: ClassVar[str] = (
        "Compare two kernels in one process (interleaved ABBA blocks): how much slower or faster the "
        "candidate is, with a confidence interval, and why (operator diff)."
    )
    form: ClassVar[ProbeForm] = ProbeForm.PAIR
    config_type: ClassVar[type] = imported("glmfb.bench.config:BenchConfig")  # imported on first use
    evidence_types = imported("glmfb.bench.evidence:EVIDENCE_TYPES")
    candidate_optional: ClassVar[bool] = True  # with --save, one target is measured alone
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

    def run(self, config: BenchConfig, ctx: ProbeContext) -> Verdict:
        from glmfb.bench.engine import compare_saved, run_bench

        if config.saved:
            return compare_saved(config, ctx)
        return run_bench(config, ctx)


PROBE = BenchProbe()
