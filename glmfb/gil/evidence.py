"""The evidence kinds of ``glmfb gil``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from glmfb.evidence import Evidence, Record, evidence_kind


@dataclass(frozen=True, kw_only=True)
class WaitingThread(Record):
    """A thread of the program seen blocked on the GIL's futex, and in what share of ticks."""

    thread: str
    tid: int
    waiting_share: float


@dataclass(frozen=True, kw_only=True)
class StarvedWindow(Record):
    """A window where the heartbeat woke more than the threshold late, and who did what in it."""

    start_s: float
    duration_ms: float
    max_lateness_ms: float
    waiting_threads: tuple[str, ...] = ()
    heartbeat_states: dict[str, int] | None = None
    holder: str | None = None
    holder_states: dict[str, int] | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Starvation(Evidence):
    """The heartbeat (a canary thread that wants the GIL every period) and the threads seen
    waiting for the GIL: lateness percentiles net of CPU waits, starved windows."""

    kind: ClassVar[str] = "starvation"
    threads: tuple[str, ...]
    canary: str
    threshold_ms: float
    starved: bool
    ticks: int
    period_ms: float
    p50_ms: float
    p99_ms: float
    wall_p99_ms: float
    cpu_wait_total_ms: float
    dropped_records: int = 0
    max_ms: float | None = None
    waiting_for_gil: tuple[WaitingThread, ...] = ()
    windows_total: int | None = None
    starved_ms_total: float | None = None
    windows: tuple[StarvedWindow, ...] = ()

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"gil_waiting": [w.to_dict() for w in self.waiting_for_gil],
                "gil_windows": [w.to_dict() for w in self.windows]}


@dataclass(frozen=True, kw_only=True)
class HeldSite(Evidence):
    """A call site where a thread held the GIL: function, file, line, shares of the samples."""

    thread: str
    tid: int
    function: str
    qualname: str
    file: str
    line: int
    samples: int
    share_of_time: float | None = None
    active_share: float | None = None
    idle_share: float | None = None
    native_frame: str | None = None
    native_samples: int = 0
    caller: str | None = None
    stack: tuple[str, ...] = ()

    @classmethod
    def _legacy_keys(cls) -> frozenset[str]:
        return frozenset({"share_of_samples"})  # a copy of share_of_time written before typed evidence


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GilHolder(HeldSite):
    """The thread that held the GIL most (the heartbeat excluded) and its top call site."""

    kind: ClassVar[str] = "gil_holder"
    title: ClassVar[str] = "GIL holder"


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GilSite(HeldSite):
    """A further call site that held the GIL (the runners-up of the holder)."""

    kind: ClassVar[str] = "site"


@dataclass(frozen=True, kw_only=True)
class HolderThread(Record):
    """Per thread: samples in which it held the GIL, their share, active and idle split."""

    thread: str
    tid: int
    samples: int
    share: float
    excluded: bool
    active: int | None = None
    idle: int | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class GilThreads(Evidence):
    """Every thread seen holding the GIL, and the next call sites after the top one."""

    kind: ClassVar[str] = "gil_threads"
    samples: int
    sample_instants: int
    native: bool
    threads: tuple[HolderThread, ...]
    sites: tuple[GilSite, ...] = ()

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"gil_threads": [t.to_dict() for t in self.threads]}


@dataclass(frozen=True, kw_only=True)
class OverlapRow(Record):
    thread: str
    function: str
    overlap_ms: float
    slices: int
    share_of_starved_time: float | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class TraceOverlap(Evidence):
    """From a viztracer trace: functions on other threads ranked by their overlap with the
    starved thread's waits."""

    kind: ClassVar[str] = "trace_overlap"
    functions: tuple[OverlapRow, ...]


EVIDENCE_TYPES: tuple[type[Evidence], ...] = (Starvation, GilHolder, GilSite, GilThreads, TraceOverlap)
