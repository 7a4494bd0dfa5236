"""The evidence kinds of ``glmfb gap``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from glmfb.contract.evidence import Evidence, evidence_kind


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GapMeasurement(Evidence):
    """The gap (candidate / baseline - 1; ``statistic`` says of what), its interval, how it
    was measured (builds a side, rounds, the levels of the looks, the interval's degrees of
    freedom and its spread between and within builds) and the interleaved samples."""

    kind: ClassVar[str] = "gap"
    gap: float
    ci: tuple[float, ...]
    confidence: float
    threshold: float
    baseline_median_s: float
    candidate_median_s: float
    iterations_per_side: int
    stopped_by: str
    elapsed_s: float
    statistic: str = ""
    allocations_per_side: int = 1
    rounds: int = 0
    look_levels: tuple[float, ...] = ()
    df: float | None = None
    between_allocation_sd: float | None = None
    within_allocation_sd: float | None = None
    baseline_samples_s: tuple[float, ...] = ()
    candidate_samples_s: tuple[float, ...] = ()

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        rows = [{"side": "baseline", "iteration": i, "seconds": t} for i, t in enumerate(self.baseline_samples_s)]
        rows += [{"side": "candidate", "iteration": i, "seconds": t} for i, t in enumerate(self.candidate_samples_s)]
        return {"gap_samples": rows}


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Phase(Evidence):
    """One timing phase an iteration reported, on both sides (medians in seconds)."""

    kind: ClassVar[str] = "phase"
    phase: str
    delta_s: float
    concurrent: bool
    baseline_s: float | None = None
    candidate_s: float | None = None
    change: float | None = None
    ci: tuple[float, ...] | None = None
    order: int | None = None  # its place in the iteration (the order the target reports phases in)
    within: str | None = None  # for a concurrent activity (*_busy_s): what it overlaps ("iteration")

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"phases": [self.to_dict()]}


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class TransferInfo(Evidence):
    """What a side says about its transfer (its ``describe()``): path, fallback, sizes. Keys
    beyond the common ones are the target's own and kept as they are."""

    kind: ClassVar[str] = "transfer"
    side: str
    transfer_path: str | None = None
    fallback_reason: str | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Bandwidth(Evidence):
    """Achieved transfer bandwidth against the path's ceiling measured here, and against the
    page rate the sender reaches alone."""

    kind: ClassVar[str] = "bandwidth"
    bytes_per_iteration: float
    bandwidth_bound: bool
    transfer_path: str | None = None
    fallback_reason: str | None = None
    achieved_bytes_per_s: float | None = None
    ceiling_bytes_per_s: float | None = None
    ceiling_share: float | None = None
    page_rate_bytes_per_s: float | None = None
    page_rate_share: float | None = None
    error: str | None = None
    timed_by: tuple[str, ...] = ()  # the phases the bytes moved in (X_busy_s beside, X_s on the critical path)
    ceiling_samples: tuple[float, ...] = ()  # each measure_ceiling() call; the ceiling is their median
    page_rate_samples: tuple[float, ...] = ()  # each measure_page_rate() call


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GilAttribution(Evidence):
    """What the gil probe, run on the candidate, found: the holder and the starved thread."""

    kind: ClassVar[str] = "gil_attribution"
    available: bool
    status: str | None = None
    reason: str | None = None
    holder_thread: str | None = None
    holder_thread_count: int = 1  # short-lived threads of one name the holder stands for (2+)
    holder_function: str | None = None
    holder_file: str | None = None
    holder_line: int | None = None
    holder_share: float | None = None
    holder_idle_share: float | None = None
    native_frame: str | None = None
    holder_source: str | None = None
    starved_thread: str | None = None
    starved_waiting_share: float | None = None
    starved_waiting_ci: tuple[float, ...] = ()
    starved_of_runnable: float | None = None
    starved_of_runnable_ci: tuple[float, ...] = ()
    holder_c_function: str | None = None
    holder_c_source: str | None = None
    cpu_victim: str | None = None
    cpu_victim_runqueue_share: float | None = None
    cpu_victim_cpu_share: float | None = None
    cpu_victim_gil_of_runnable: float | None = None
    cpu_victim_gil_share: float | None = None
    cpu_victim_gil_of_runnable_ci: tuple[float, ...] = ()
    competitor_thread: str | None = None
    competitor_thread_count: int = 1
    competitor_function: str | None = None
    competitor_cpu_share: float | None = None
    competitor_cpu_fraction: float | None = None
    shared_cpus: str | None = None
    baseline_compared: bool = False
    baseline_reason: str | None = None
    cpu_victim_baseline_runqueue_share: float | None = None
    competitor_baseline_cpu_share: float | None = None
    cpu_victim_in_baseline: bool | None = None
    competitor_in_baseline: bool | None = None
    canary_p50_ms: float | None = None
    canary_p99_ms: float | None = None
    canary_max_ms: float | None = None
    gil_why: str | None = None
    gil_missing: tuple[str, ...] = ()  # signals the gil probe could not collect, and why


EVIDENCE_TYPES: tuple[type[Evidence], ...] = (GapMeasurement, Phase, TransferInfo, Bandwidth, GilAttribution)
