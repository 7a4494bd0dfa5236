"""Time as probes see it: a monotonic clock for durations and UTC wall time for records.

Engines take the clock from their :class:`~glmfb.probe.ProbeContext`, so a test can script
time; run ids come from here too (not from the suite).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    """What a probe may ask of time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for durations)."""
        ...

    def utc_now(self) -> str:
        """The wall time, ISO 8601 in UTC to the second (for records)."""
        ...


@dataclass(frozen=True)
class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.perf_counter()

    def utc_now(self) -> str:
        return utc_now()


SYSTEM_CLOCK = SystemClock()


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id(now: datetime | None = None) -> str:
    """``20261201-083800-1a2b``: sortable by time, unique within a second."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{time.monotonic_ns() % 0xFFFF:04x}"
