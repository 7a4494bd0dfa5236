"""The evidence kinds of ``glmfb bench``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from glmfb.evidence import Evidence, Record, evidence_kind


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class BenchSummary(Evidence):
    """All shapes together: how many got slower or faster, the geometric-mean change."""

    kind: ClassVar[str] = "summary"
    title: ClassVar[str] = "bench summary"
    shapes: int
    slower: int
    faster: int
    undecided: int
    geomean_change: float
    geomean_ci: tuple[float, ...]
    confidence: float
    threshold: float
    statistic: str
    fdr: str


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ShapeChange(Evidence):
    """One shape (or one saved benchmark): the change of the candidate's time per call, its
    interval, the decision, and how it was measured."""

    kind: ClassVar[str] = "shape"
    title: ClassVar[str] = "shape"
    shape: str
    decision: str
    change: float | None = None
    ci: tuple[float, ...] | None = None
    confidence: float | None = None
    pvalue: float | None = None
    fdr_significant: bool | None = None
    blocks: int | None = None
    looks: int | None = None
    calls_per_sample: int | None = None
    baseline_median_s: float | None = None
    candidate_median_s: float | None = None
    ratio_of_medians_change: float | None = None
    noise_floor: float | None = None
    measuring_s: float | None = None
    aa_change: float | None = None
    aa_ci: tuple[float, ...] | None = None
    aa_blocks: int | None = None

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"shapes": [self.to_dict()]}


@dataclass(frozen=True, kw_only=True)
class OpRow(Record):
    """One operator in the profile diff: calls and self time per kernel call, both sides."""

    op: str
    baseline_calls: float
    candidate_calls: float
    baseline_self_us: float
    candidate_self_us: float
    added_us: float
    share: float
    reduction: bool
    input_shapes: tuple[str, ...] = ()  # the shapes the operator was called with (candidate side)


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class OpDiff(Evidence):
    """torch.profiler of both sides on the shape that decided the verdict: operators ranked by
    their part of the change in self time."""

    kind: ClassVar[str] = "op_diff"
    title: ClassVar[str] = "operator diff"
    shape: str
    profiled_calls: int
    ops: tuple[OpRow, ...]
    rule: str | None = None
    repeated_reductions: tuple[str, ...] = ()
    device: str = "cpu"

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"op_diff": [{"shape": self.shape, **row.to_dict()} for row in self.ops]}

    def summary_rows(self) -> list[tuple[str, str]]:
        rows = [("shape", self.shape), ("profiled calls", str(self.profiled_calls))]
        for op in self.ops[:5]:
            rows.append((op.op, f"calls {op.baseline_calls:.3g} -> {op.candidate_calls:.3g}, "
                                f"self {op.baseline_self_us:.3g} -> {op.candidate_self_us:.3g} µs ({op.share:+.0%})"))
        return rows


@dataclass(frozen=True, kw_only=True)
class Placement(Record):
    shape: str
    side: str
    flops_per_s: float | None = None
    bytes_per_s: float | None = None
    compute_fraction: float | None = None
    memory_fraction: float | None = None
    bound: str | None = None
    summary: str | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Roofline(Evidence):
    """Achieved FLOP/s and bytes/s against ceilings measured on this machine."""

    kind: ClassVar[str] = "roofline"
    ceilings: dict[str, Any]
    placements: tuple[Placement, ...]


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class BenchHarness(Evidence):
    """How the timing was done: the timer, threads, input sets, sample length, order, budget."""

    kind: ClassVar[str] = "harness"
    timer: str
    order: str
    budget_s: float
    input_sets: int
    sample_s: float
    threads: int | None = None
    resolution_s: float | None = None
    device_name: str | None = None
    l2_flush_bytes: int | None = None
    cuda_graph: bool | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Measurement(Evidence):
    """One target measured alone (for ``--save``): its median time per call on a shape."""

    kind: ClassVar[str] = "measurement"
    shape: str
    samples: int
    calls_per_sample: int
    median_s: float


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class SavedComparison(Evidence):
    """A comparison of two saved result files, measured in separate processes."""

    kind: ClassVar[str] = "saved_comparison"
    baseline: str
    candidate: str
    formats: tuple[str, ...]
    in_process: bool
    statistic: str
    geomean_change: float
    geomean_ci: tuple[float, ...]
    approximate: tuple[str, ...] = ()


EVIDENCE_TYPES: tuple[type[Evidence], ...] = (
    BenchSummary, ShapeChange, OpDiff, Roofline, BenchHarness, Measurement, SavedComparison,
)
