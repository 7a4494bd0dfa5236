"""Time as probes see it: a monotonic clock for durations and UTC wall time for records.

Engines take the clock from their :class:`~glmfb.core.probe.ProbeContext`, so a test can script
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


_last_run_id = ""


def new_run_id(now: datetime | None = None) -> str:
    """``20261201-083800-f3a2``: ordered by time as text (the suffix counts 16 µs steps within
    the second, so the gate can tell which of two run folders is newer), and never the same
    twice in one process (a second id in the same step takes the next one)."""
    global _last_run_id
    moment = now or datetime.now(timezone.utc)
    stamp, tick = moment.strftime("%Y%m%d-%H%M%S"), moment.microsecond // 16  # at most 0xf423
    run_id = f"{stamp}-{tick:04x}"
    if run_id <= _last_run_id and _last_run_id.startswith(stamp):
        run_id = f"{stamp}-{int(_last_run_id.rpartition('-')[2], 16) + 1:04x}"
    _last_run_id = run_id
    return run_id
