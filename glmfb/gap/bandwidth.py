"""The transfer bandwidth an iteration achieved, against what the path moves alone on this host.

A target may offer (docs/gap.md): ``measure_ceiling() -> bytes/s`` (one big write, nothing
else running: the engine's own ceiling), ``measure_pagerate_text() -> bytes/s`` (the same bytes in
the iteration's page-sized writes, alone), and ``transfer_path`` (which path ran).

The achieved bandwidth is the bytes an iteration moved over the time it took to move them. A
count of bytes pairs with a time by name: ``X_bytes`` with ``X_busy_s`` (a background
transfer thread's busy time, stalls included), else with ``X_s`` (a synchronous phase on the
critical path: send, then wait for the acknowledgement). Bytes whose name pairs with no time
go with the busy times no name claimed (``kv_bytes`` beside ``transfer_busy_s``). A transfer
is bandwidth-bound by the same test whether it ran beside the prefill or after it.

A target's ceiling is measured several times (:data:`CEILING_CALLS`, or as many as fit in
:data:`CEILING_BUDGET_S` beyond the first :data:`MIN_CEILING_CALLS`) and its median taken, as
the achieved rate is a median over iterations: one write of 128 MiB measured 877 MB/s and
1.10 GB/s in two calls a second apart on a loaded host here, either side of the 80% line for an
iteration that moved 888 MB/s. When the share against the median is under 80% but the lowest
ceiling measured puts it over, whether the link was the limit is not settled, and the why says
so instead of "the link was not the limit".
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from glmfb.gap.evidence import Bandwidth
from glmfb.gap.phases import BUSY_SUFFIX, BYTES_SUFFIX

BANDWIDTH_BOUND_SHARE = 0.8  # at or above this share of the ceiling the link is the limit
STARVED_SHARE = 0.5  # below this share of the page rate alone, the sender was held back
CEILING_CALLS = 5  # calls of measure_ceiling() / measure_pagerate_text() at most, median taken
MIN_CEILING_CALLS = 3  # calls made whatever they take
CEILING_BUDGET_S = 3.0  # beyond the first calls, further calls while this much time is not spent


@dataclass(frozen=True)
class BandwidthCheck:
    transfer_path: str | None
    bytes_per_iteration: float
    achieved_bytes_per_s: float | None
    ceiling_bytes_per_s: float | None
    page_rate_bytes_per_s: float | None
    fallback_reason: str | None = None
    error: str | None = None
    timed_by: tuple[str, ...] = ()  # the phases whose time the bytes were divided by
    ceiling_samples: tuple[float, ...] = ()  # each measure_ceiling() call (the ceiling is their median)
    page_rate_samples: tuple[float, ...] = ()

    @property
    def synchronous(self) -> bool:
        """Whether the bytes moved in a phase on the critical path (``X_s``), not beside it."""
        return bool(self.timed_by) and not any(key.endswith(BUSY_SUFFIX) for key in self.timed_by)

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
    def bound_unsettled(self) -> bool:
        """Under the bound against the median ceiling, over it against the lowest one measured:
        the ceiling's own spread decides, so neither answer is backed."""
        if self.bandwidth_bound or self.achieved_bytes_per_s is None or not self.ceiling_samples:
            return False
        return self.achieved_bytes_per_s / min(self.ceiling_samples) >= BANDWIDTH_BOUND_SHARE

    @property
    def fastest_ceiling(self) -> float | None:
        """The fastest ceiling measured (the median where no single call was kept)."""
        return max(self.ceiling_samples) if self.ceiling_samples else self.ceiling_bytes_per_s

    @property
    def seconds_at_ceiling(self) -> float | None:
        """What an iteration's bytes take at :attr:`fastest_ceiling`."""
        fastest = self.fastest_ceiling
        return self.bytes_per_iteration / fastest if fastest and self.bytes_per_iteration > 0 else None

    @property
    def starved(self) -> bool:
        share = self.page_rate_share
        return share is not None and share < STARVED_SHARE

    def summary(self) -> str:
        """One phrase: achieved against the ceilings."""
        if self.achieved_bytes_per_s is None:
            return "no transfer bandwidth reported"
        if self.synchronous:
            while_ = f"during {' and '.join(self.timed_by)}, on the critical path"
        else:
            while_ = "while busy"
        parts = [f"the transfer moved {rate_text(self.achieved_bytes_per_s)} {while_}"]
        if self.ceiling_share is not None and self.ceiling_bytes_per_s is not None:
            spread = ""
            if len(self.ceiling_samples) > 1:
                spread = (f" (median of {len(self.ceiling_samples)} measurements, "
                          f"{rate_text(min(self.ceiling_samples))} to {rate_text(max(self.ceiling_samples))})")
            parts.append(f"{self.ceiling_share:.0%} of the {self.transfer_path or 'engine'} ceiling "
                         f"of {rate_text(self.ceiling_bytes_per_s)} on this host{spread}")
        if self.page_rate_share is not None and self.page_rate_bytes_per_s is not None:
            parts.append(f"{self.page_rate_share:.0%} of its page-by-page rate alone "
                         f"({rate_text(self.page_rate_bytes_per_s)})")
        return ", ".join(parts)

    def evidence(self) -> Bandwidth:
        """This check as typed evidence: the evidence kind's fields are this check's own."""
        return Bandwidth.of(self)


def rate_text(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e6:.0f} MB/s" if bytes_per_s < 1e9 else f"{bytes_per_s / 1e9:.2f} GB/s"


def paired_times(sample: Mapping[str, float]) -> dict[str, tuple[str, ...]]:
    """Each ``*_bytes`` key of an iteration and the time keys its bytes moved in (see the
    module docstring); a key with no time has none."""
    claimed: set[str] = set()
    pairs: dict[str, tuple[str, ...]] = {}
    for key in sample:
        if not key.endswith(BYTES_SUFFIX):
            continue
        stem = key.removesuffix(BYTES_SUFFIX)
        timed = next((t for t in (stem + BUSY_SUFFIX, stem + "_s") if t in sample), None)
        pairs[key] = (timed,) if timed is not None else ()
        claimed.update(pairs[key])
    unclaimed = tuple(k for k in sample if k.endswith(BUSY_SUFFIX) and k not in claimed)
    return {key: timed or unclaimed for key, timed in pairs.items()}


def achieved_bytes_per_s(samples: Sequence[Mapping[str, float]]) -> tuple[float, float | None]:
    """Median bytes per iteration, and the median of bytes / the seconds they moved in (None
    when no iteration has both)."""
    moved: list[float] = []
    rates: list[float] = []
    for sample in samples:
        count = sum(v for k, v in sample.items() if k.endswith(BYTES_SUFFIX))
        timed = {t for keys in paired_times(sample).values() for t in keys}
        seconds = sum(sample[t] for t in timed)
        moved.append(count)
        if count > 0 and seconds > 0:
            rates.append(count / seconds)
    return (statistics.median(moved) if moved else 0.0), (statistics.median(rates) if rates else None)


def _timed_by(samples: Sequence[Mapping[str, float]]) -> tuple[str, ...]:
    keys: list[str] = []
    for sample in samples:
        for timed in paired_times(sample).values():
            keys.extend(t for t in timed if t not in keys)
    return tuple(keys)


def _optional_rates(target: object, method: str, clock: Callable[[], float] = time.monotonic) -> tuple[float, ...]:
    """The target's ``method()`` rates (bytes/s), called :data:`MIN_CEILING_CALLS` times and
    then while :data:`CEILING_BUDGET_S` is not spent, :data:`CEILING_CALLS` at most; none when
    the target has no such method or answers 0 (it does not transfer)."""
    measure = getattr(target, method, None)
    if not callable(measure):
        return ()
    rates: list[float] = []
    started = clock()
    while len(rates) < CEILING_CALLS and (len(rates) < MIN_CEILING_CALLS or clock() - started < CEILING_BUDGET_S):
        value = float(measure())
        if not value > 0:
            return ()
        rates.append(value)
    return tuple(rates)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def check_bandwidth(target: Callable[[], Any], samples: Sequence[Mapping[str, float]]) -> BandwidthCheck | None:
    """Achieved against ceiling for a side that transfers; None when it reports no bytes."""
    bytes_per_iteration, achieved = achieved_bytes_per_s(samples)
    path = getattr(target, "transfer_path", None)
    if bytes_per_iteration <= 0 and path is None:
        return None
    describe = getattr(target, "describe", None)
    fallback = describe().get("fallback_reason") if callable(describe) else None
    try:
        ceilings = _optional_rates(target, "measure_ceiling")
        page_rates = _optional_rates(target, "measure_page_rate")
    except Exception as exc:  # the attribution degrades; the gap itself stands
        return BandwidthCheck(path, bytes_per_iteration, achieved, None, None, fallback,
                              error=f"measuring the ceiling failed: {type(exc).__name__}: {exc}",
                              timed_by=_timed_by(samples))
    return BandwidthCheck(path, bytes_per_iteration, achieved, _median(ceilings), _median(page_rates), fallback,
                          timed_by=_timed_by(samples), ceiling_samples=ceilings, page_rate_samples=page_rates)
