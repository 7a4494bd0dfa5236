"""The evidence kinds of ``glmfb bench``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from glmfb.contract.evidence import Evidence, Record, evidence_kind


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


QUANTILES = (0, 5, 25, 50, 75, 95, 100)  # the percentiles of ShapeChange.quantiles_s


def quantiles_of(samples: Sequence[float]) -> tuple[float, ...]:
    """The :data:`QUANTILES` of per-call seconds (linear interpolation; NaN left out; empty
    when no sample is finite)."""
    ordered = sorted(v for v in samples if v == v)
    if not ordered:
        return ()
    result = []
    for q in QUANTILES:
        position = q / 100 * (len(ordered) - 1)
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        result.append(ordered[low] + (ordered[high] - ordered[low]) * (position - low))
    return tuple(result)


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
    calls_per_sample: int | None = None  # the baseline's (and the A/A pairs')
    candidate_calls_per_sample: int | None = None  # each side's sample lasts about --sample-ms
    baseline_median_s: float | None = None
    candidate_median_s: float | None = None
    ratio_of_medians_change: float | None = None
    noise_floor: float | None = None
    measuring_s: float | None = None
    aa_change: float | None = None
    aa_ci: tuple[float, ...] | None = None
    aa_blocks: int | None = None
    # Per-call seconds at the QUANTILES of each side's samples ({"baseline": [...], "candidate":
    # [...]}, from quantiles_of), so a report can draw the distribution without the samples file.
    quantiles_s: Mapping[str, tuple[float, ...]] | None = None
    # Each side's own time per call with its 95% interval, (value, low, high) seconds: the
    # batch-means statistic of its samples in the order they were taken (one run's own time, as
    # the history's series of that side read it: baseline_time[SHAPE], candidate_time[SHAPE]).
    side_time_s: Mapping[str, tuple[float, ...]] | None = None
    # How it was measured: independent allocation pairs (A/B and A/A), rounds, the looks'
    # levels, the interval's degrees of freedom and its spread between and within allocations.
    allocations_per_side: int | None = None
    aa_pairs: int | None = None
    pairs_limited_by: str | None = None  # "budget", "memory", "setup" or "maximum"
    input_sets_per_allocation: int | None = None
    bytes_per_allocation: int | None = None
    rounds: int | None = None
    stopped_by: str | None = None  # "decided" | "budget"
    look_levels: tuple[float, ...] = ()
    setup_s: float | None = None
    df: float | None = None
    between_allocation_sd: float | None = None
    within_allocation_sd: float | None = None
    aa_between_allocation_sd: float | None = None
    allocation_pairs_needed: int | None = None  # when undecided: pairs that would decide it
    method: str | None = None  # saved comparisons: "runs", "allocations", "one process", "one run a side + process floor"
    units: int | None = None  # the interval's independent units (allocation pairs or runs)

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        row = self.to_dict()
        row.pop("quantiles_s", None)
        return {"shapes": [row]}


@dataclass(frozen=True, kw_only=True)
class CallerRow(Record):
    """One operator's calls from one caller (the operator it runs inside; None: the kernel
    itself), per kernel call on both sides, and the self time they added."""

    called_from: str | None
    baseline_calls: float
    candidate_calls: float
    added_us: float


@dataclass(frozen=True, kw_only=True)
class OpSite(Record):
    """A line of the user's code that calls an operator of the diff, on one side: the innermost
    frame outside torch, glmfb and the standard library while the operator was dispatched, in
    one call of that side's kernel. ``via``: the operator the call was seen as, where the
    diff's operator runs inside it (``aten::copy_`` inside ``aten::clone``: the line calls
    ``clone``)."""

    op: str
    side: str  # "baseline" or "candidate"
    file: str
    line: int
    function: str
    code: str  # the line, stripped
    calls: float  # the operator's calls from this line per kernel call
    via: str | None = None


@dataclass(frozen=True, kw_only=True)
class OpRow(Record):
    """One operator in the profile diff: calls and self time per kernel call, both sides, and
    what the profile recorded about its inputs (``record_shapes``)."""

    op: str
    baseline_calls: float
    candidate_calls: float
    baseline_self_us: float
    candidate_self_us: float
    added_us: float
    share: float  # of the added time (the saved time when the candidate is faster)
    reduction: bool
    input_shapes: tuple[str, ...] = ()  # the candidate's distinct inputs, most calls first: "float32[64, 4096]"
    baseline_input_shapes: tuple[str, ...] = ()  # the same on the baseline side
    only_in: str | None = None  # "baseline" or "candidate": the operator runs on that side only
    # The operator it runs inside (None: the kernel calls it directly); with more than one caller,
    # the one whose calls (first) or self time changed in the direction of the change.
    called_from: str | None = None
    # What differs between the two sides' inputs when both call it: "none", "arguments", "strides",
    # "shapes" or "dtype" (the last that applies in that order wins).
    inputs_change: str | None = None
    baseline_read_bytes: float | None = None  # bytes of its tensor inputs per kernel call (a stride-0 dim once)
    candidate_read_bytes: float | None = None
    baseline_written_bytes: float = 0.0  # bytes a copy (copy_, cat) writes per kernel call
    candidate_written_bytes: float = 0.0
    copied_from: str | None = None  # a copy's source: "broadcast", "strided", "dtype" or "contiguous"
    movement: bool = False  # a copy, allocation, layout or view operator: it computes nothing
    view: bool = False  # a view or metadata operator (slice, transpose, reshape): it moves no data either
    callers: tuple[CallerRow, ...] = ()  # its calls by caller, when it has more than one on either side


@dataclass(frozen=True, kw_only=True)
class InputRow(Record):
    """One operator on one set of inputs (shapes, strides, dtypes and scalar arguments): the
    diff keyed by operator and inputs, where a repeat of the same call shows."""

    op: str
    inputs: str
    baseline_calls: float
    candidate_calls: float
    baseline_self_us: float
    candidate_self_us: float
    added_us: float
    share: float
    read_bytes: float | None = None  # per call of the operator


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class OpDiff(Evidence):
    """torch.profiler of both sides on the shape that decided the verdict: operators ranked by
    their part of the change in self time, the operators only one side runs and the share of
    the added time they carry, and the diff by operator and input shapes."""

    kind: ClassVar[str] = "op_diff"
    title: ClassVar[str] = "operator diff"
    shape: str
    profiled_calls: int
    ops: tuple[OpRow, ...]
    rule: str | None = None
    repeated_reductions: tuple[str, ...] = ()
    device: str = "cpu"
    inputs: tuple[InputRow, ...] = ()
    only_in_candidate: tuple[str, ...] = ()
    only_in_baseline: tuple[str, ...] = ()
    only_in_candidate_share: float = 0.0  # of the added time
    only_in_baseline_share: float = 0.0  # negative when slower: the time the baseline's own operators took
    repeated_inputs: tuple[str, ...] = ()  # operators called >= 1.5x as often on the same inputs
    repeated_inputs_share: float = 0.0  # the share of the added time those repeats carry
    # where the user's code calls the operators that carry most of the change (empty: not found,
    # such as a kernel torch's dispatch cannot watch)
    sites: tuple[OpSite, ...] = ()

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        tables = {"op_diff": [{"shape": self.shape, **row.to_dict()} for row in self.ops],
                  "op_diff_inputs": [{"shape": self.shape, **row.to_dict()} for row in self.inputs]}
        if self.sites:
            tables["op_sites"] = [{"shape": self.shape, **row.to_dict()} for row in self.sites]
        return tables

    def lead_sites(self) -> tuple[str, tuple[OpSite, ...], float] | None:
        """The operator with the largest share of the change (the first row), the candidate's
        lines that call it (most calls first) and that share; None when no line was found."""
        if not self.ops:
            return None
        op = self.ops[0].op
        found = tuple(s for s in self.sites if s.op == op and s.side == "candidate")
        return (op, found, self.ops[0].share) if found else None

    def summary_rows(self) -> list[tuple[str, str]]:
        rows = [("shape", self.shape), ("profiled calls", str(self.profiled_calls))]
        if self.only_in_candidate:
            rows.append(("only in the candidate", f"{', '.join(self.only_in_candidate[:5])} "
                                                  f"({self.only_in_candidate_share:+.0%} of the change)"))
        if self.only_in_baseline:
            rows.append(("only in the baseline", f"{', '.join(self.only_in_baseline[:5])} "
                                                 f"({self.only_in_baseline_share:+.0%} of the change)"))
        for op in self.ops[:5]:
            rows.append((op.op, f"calls {op.baseline_calls:.3g} -> {op.candidate_calls:.3g}, "
                                f"self {op.baseline_self_us:.3g} -> {op.candidate_self_us:.3g} µs ({op.share:+.0%})"))
        for site in self.sites[:6]:
            via = f" (as {site.via})" if site.via else ""
            rows.append((f"{site.op}, {site.side}", f"{site.file}:{site.line} in {site.function}{via}, "
                                                    f"{site.calls:.3g} a call: {site.code}"))
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
    heap: str | None = None  # the C heap during a CPU comparison (glmfb.bench.heap)


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Measurement(Evidence):
    """One target measured alone: its time per call on a shape (the median of its samples, and
    the batch-means statistic with its 95% interval, which its history series records) and, over
    fresh processes, the same in units of a reference workload timed beside it."""

    kind: ClassVar[str] = "measurement"
    shape: str
    samples: int
    calls_per_sample: int
    median_s: float
    time_s: float | None = None
    ci_s: tuple[float, ...] | None = None
    processes: int = 1  # fresh processes the budget was spread over (the interval's units when 2+)
    # Over 2+ processes with a reference (glmfb.bench.reference): the time per call in the
    # reference's units with its interval over the processes, the reference's version, and
    # each process's own time and reference time per call (seconds) and the statistic of its
    # paired ratios (each kernel sample over the reference's right after it), in the order they ran.
    normalized_time: float | None = None
    normalized_ci: tuple[float, ...] | None = None
    reference_version: int | None = None
    process_times_s: tuple[float, ...] = ()
    process_reference_s: tuple[float, ...] = ()
    process_ratios: tuple[float, ...] = ()


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
    runs: tuple[int, ...] = (1, 1)  # saved runs (processes) of each side


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ProcessFloorEvidence(Evidence):
    """The between-process floor a saved comparison with one run a side carried: how much a
    run's median moves between fresh processes on this machine when nothing changed."""

    kind: ClassVar[str] = "process_floor"
    title: ClassVar[str] = "between-process floor"
    sd: float  # of a run's log median (about a fraction)
    df: float
    processes: int
    seconds_per_process: float
    measured: str  # when (UTC)
    load_1m_then: float | None
    load_1m_now: float | None
    reference: str  # the kernels it was measured on
    source: str  # "cache" or "measured now"
    path: str


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class CacheRegime(Evidence):
    """Which cache regime a shape was measured in: its input sets (rotated; 1: reused) and their
    bytes against the last-level cache (:mod:`glmfb.core.measure.cache`). On a pair's focus shape,
    also the hot check: both sides timed briefly on one input set reused, interleaved like the
    main measurement, and whether that change differs from the main one (the verdict's status
    and metric stay the main measurement's)."""

    kind: ClassVar[str] = "cache_regime"
    title: ClassVar[str] = "cache regime"
    shape: str
    regime: str  # "cold", "warm", "hot" or "unknown"
    summary: str  # in words, as the why says it
    input_sets: int
    set_bytes: int | None = None  # the largest input set (of the side whose sets hold more)
    total_bytes: int | None = None  # all the input sets a sample rotates over, each storage once
    bytes_source: str | None = None  # "tensors the kernel holds" or "resident-memory growth" (glmfb.bench.footprint)
    cache_bytes: int | None = None
    cache_level: str | None = None  # "L3"; on CUDA the device's "L2"
    cache_source: str | None = None  # where the size was read: a sysfs path, "lscpu", the device's properties
    # The hot check (a pair's focus shape only): "measured", "off" (hot_check = false), or why it
    # was not needed or not run.
    hot_check: str | None = None
    hot_change: float | None = None
    hot_ci: tuple[float, ...] | None = None
    hot_confidence: float | None = None
    hot_blocks: int | None = None
    hot_pairs: int | None = None
    hot_calls_per_sample: int | None = None
    hot_measuring_s: float | None = None
    # Whether the hot change differs from the main one: their 95% intervals apart and the
    # changes further apart than the threshold (as ratios); the why then gives both.
    hot_differs: bool | None = None
    main_ci: tuple[float, ...] | None = None  # the main change's interval at hot_confidence, compared with hot_ci


EVIDENCE_TYPES: tuple[type[Evidence], ...] = (
    BenchSummary, ShapeChange, OpDiff, Roofline, BenchHarness, Measurement, SavedComparison,
    ProcessFloorEvidence, CacheRegime,
)
