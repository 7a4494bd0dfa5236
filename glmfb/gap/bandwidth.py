"""The transfer bandwidth an iteration achieved, against what the path moves alone on this host.

A target may offer (docs/gap.md): ``measure_ceiling() -> bytes/s`` (one big write, nothing
else running: the engine's own ceiling), ``measure_page_rate() -> bytes/s`` (the same bytes in
the iteration's page-sized writes, alone), and ``transfer_path`` (which path ran). The
achieved bandwidth is the iteration's ``*_bytes`` over its ``*_busy_s`` (time the transfer
thread spent sending, stalls included).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from glmfb.gap.phases import BUSY_SUFFIX, BYTES_SUFFIX

BANDWIDTH_BOUND_SHARE = 0.8  # at or above this share of the ceiling the link is the limit
STARVED_SHARE = 0.5  # below this share of the page rate alone, the sender was held back


@dataclass(frozen=True)
class BandwidthCheck:
    transfer_path: str | None
    bytes_per_iteration: float
    achieved_bytes_per_s: float | None
    ceiling_bytes_per_s: float | None
    page_rate_bytes_per_s: float | None
    fallback_reason: str | None = None
    error: str | None = None

    @property
    def ceiling_share(self) -> float | None:
        if self.achieved_bytes_per_s is None or not self.ceiling_bytes_per_s:
            return None
        return self.achieved_bytes_per_s / self.ceiling_bytes_per_s

    @property
    def page_rate_share(self) -> float | None:
        if self.achieved_bytes_per_s is None or not self.page_rate_bytes_per_s:
            return None
        return self.achieved_bytes_per_s / self.page_rate_bytes_per_s

    @property
    def bandwidth_bound(self) -> bool:
        share = self.ceiling_share
        return share is not None and share >= BANDWIDTH_BOUND_SHARE

    @property
    def starved(self) -> bool:
        share = self.page_rate_share
        return share is not None and share < STARVED_SHARE

    def summary(self) -> str:
        """One phrase: achieved against the ceilings."""
        if self.achieved_bytes_per_s is None:
            return "no transfer bandwidth reported"
        parts = [f"the transfer moved {_rate(self.achieved_bytes_per_s)} while busy"]
        if self.ceiling_share is not None and self.ceiling_bytes_per_s is not None:
            parts.append(f"{self.ceiling_share:.0%} of the {self.transfer_path or 'engine'} ceiling "
                         f"of {_rate(self.ceiling_bytes_per_s)} on this host")
        if self.page_rate_share is not None and self.page_rate_bytes_per_s is not None:
            parts.append(f"{self.page_rate_share:.0%} of its page-by-page rate alone "
                         f"({_rate(self.page_rate_bytes_per_s)})")
        return ", ".join(parts)

    def to_evidence(self) -> dict[str, Any]:
        return {
            "kind": "bandwidth",
            "transfer_path": self.transfer_path,
            "fallback_reason": self.fallback_reason,
            "bytes_per_iteration": self.bytes_per_iteration,
            "achieved_bytes_per_s": self.achieved_bytes_per_s,
            "ceiling_bytes_per_s": self.ceiling_bytes_per_s,
            "ceiling_share": self.ceiling_share,
            "page_rate_bytes_per_s": self.page_rate_bytes_per_s,
            "page_rate_share": self.page_rate_share,
            "bandwidth_bound": self.bandwidth_bound,
            "error": self.error,
        }


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e6:.0f} MB/s" if bytes_per_s < 1e9 else f"{bytes_per_s / 1e9:.2f} GB/s"


def achieved_bytes_per_s(samples: Sequence[Mapping[str, float]]) -> tuple[float, float | None]:
    """Median bytes per iteration, and the median of bytes / busy seconds (None without both)."""
    moved: list[float] = []
    rates: list[float] = []
    for sample in samples:
        count = sum(v for k, v in sample.items() if k.endswith(BYTES_SUFFIX))
        busy = sum(v for k, v in sample.items() if k.endswith(BUSY_SUFFIX))
        moved.append(count)
        if count > 0 and busy > 0:
            rates.append(count / busy)
    return (statistics.median(moved) if moved else 0.0), (statistics.median(rates) if rates else None)


def _optional_rate(target: object, method: str) -> float | None:
    measure = getattr(target, method, None)
    if not callable(measure):
        return None
    value = float(measure())
    return value if value > 0 else None


def check_bandwidth(target: Callable[[], Any], samples: Sequence[Mapping[str, float]]) -> BandwidthCheck | None:
    """Achieved against ceiling for a side that transfers; None when it reports no bytes."""
    bytes_per_iteration, achieved = achieved_bytes_per_s(samples)
    path = getattr(target, "transfer_path", None)
    if bytes_per_iteration <= 0 and path is None:
        return None
    describe = getattr(target, "describe", None)
    fallback = describe().get("fallback_reason") if callable(describe) else None
    try:
        ceiling = _optional_rate(target, "measure_ceiling")
        page_rate = _optional_rate(target, "measure_page_rate")
    except Exception as exc:  # the attribution degrades; the gap itself stands
        return BandwidthCheck(path, bytes_per_iteration, achieved, None, None, fallback,
                              error=f"measuring the ceiling failed: {type(exc).__name__}: {exc}")
    return BandwidthCheck(path, bytes_per_iteration, achieved, ceiling, page_rate, fallback)
