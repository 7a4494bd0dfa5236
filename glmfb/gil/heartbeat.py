"""Reading the heartbeat the injected ``sitecustomize`` writes: lateness statistics and windows."""

from __future__ import annotations

import itertools
import json
import math
import os
from array import array
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

SITE_DIR = Path(__file__).resolve().parent / "_site"
ENV_PREFIX = "GLMFB_GIL_HEARTBEAT"
MAX_PLAUSIBLE_LATENESS_S = 3600.0
MAX_RUN_S = 7 * 24 * 3600.0
MIN_INTERVAL_TICKS = 200  # a p99's interval needs a tail of a few wake-ups in each stretch
INTERVAL_RESAMPLES = 500


@dataclass(frozen=True)
class Window:
    """A stretch of time in which the heartbeat could not wake up on time (monotonic seconds)."""

    start_s: float
    end_s: float
    max_lateness_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Heartbeat:
    """What one traced process's heartbeat recorded."""

    pid: int
    thread_id: int
    period_s: float
    thread_names: dict[int, str]
    wake_s: tuple[float, ...]
    lateness_s: tuple[float, ...]  # wall-clock lateness of each wake-up
    cpu_wait_s: tuple[float, ...] = ()  # the part of it spent runnable without a CPU
    dropped_records: int = 0  # records of a damaged file that could not be real, left out

    def __post_init__(self) -> None:
        if not self.cpu_wait_s:
            object.__setattr__(self, "cpu_wait_s", (0.0,) * len(self.lateness_s))

    @property
    def ticks(self) -> int:
        return len(self.lateness_s)

    @property
    def gil_lateness_s(self) -> tuple[float, ...]:
        """Lateness not explained by waiting for a CPU: what the GIL (or the process) cost."""
        return tuple(
            max(0.0, late - cpu) for late, cpu in zip(self.lateness_s, self.cpu_wait_s, strict=True)
        )

    def percentile_ms(self, q: float, *, wall: bool = False) -> float:
        """Nearest-rank percentile of the lateness net of CPU waits (``wall``: as measured),
        in milliseconds (q in [0, 100])."""
        values = self.lateness_s if wall else self.gil_lateness_s
        if not values:
            return float("nan")
        ordered = sorted(values)
        index = min(len(ordered) - 1, max(0, math.ceil(q / 100.0 * len(ordered)) - 1))
        return 1e3 * max(0.0, ordered[index])

    def percentile_interval_ms(self, q: float) -> tuple[float, float] | None:
        """A 95% interval of :meth:`percentile_ms` (net of CPU waits) from a block bootstrap over
        stretches of the run (see :func:`glmfb.core.measure.stats.block_quantile`); None with under
        :data:`MIN_INTERVAL_TICKS` wake-ups, too few for a tail's interval."""
        if self.ticks < MIN_INTERVAL_TICKS:
            return None
        from glmfb.core.measure.stats import block_quantile

        estimate = block_quantile(self.gil_lateness_s, q / 100.0, resamples=INTERVAL_RESAMPLES)
        return (1e3 * max(0.0, estimate.low), 1e3 * max(0.0, estimate.high))

    def summary(self) -> dict[str, Any]:
        return {
            "ticks": self.ticks,
            "period_ms": 1e3 * self.period_s,
            "p50_ms": round(self.percentile_ms(50), 3),
            "p99_ms": round(self.percentile_ms(99), 3),
            "max_ms": round(1e3 * max(self.gil_lateness_s), 3) if self.lateness_s else None,
            "wall_p99_ms": round(self.percentile_ms(99, wall=True), 3),
            "cpu_wait_total_ms": round(1e3 * sum(self.cpu_wait_s), 3),
            "dropped_records": self.dropped_records,
        }

    def windows(self, threshold_s: float) -> list[Window]:
        """Merged windows where a wake-up came more than ``threshold_s`` late.

        A wake-up at ``t`` that was ``late`` seconds late (net of CPU waits) means the thread
        was waiting, not for a CPU, from about ``t - late`` to ``t``.
        """
        spans = sorted(
            (wake - late, wake, late)
            for wake, late in zip(self.wake_s, self.gil_lateness_s, strict=True)
            if late > threshold_s
        )
        merged: list[Window] = []
        for start, end, late in spans:
            if merged and start <= merged[-1].end_s + self.period_s:
                last = merged[-1]
                merged[-1] = Window(
                    last.start_s, max(last.end_s, end), max(last.max_lateness_s, late)
                )
            else:
                merged.append(Window(start, end, late))
        return merged


def between(beat: Heartbeat, start_s: float, end_s: float) -> Heartbeat:
    """Only the wake-ups in ``[start_s, end_s]`` (monotonic seconds): the sampled window."""
    kept = [i for i, wake in enumerate(beat.wake_s) if start_s <= wake <= end_s]
    return replace(
        beat,
        wake_s=tuple(beat.wake_s[i] for i in kept),
        lateness_s=tuple(beat.lateness_s[i] for i in kept),
        cpu_wait_s=tuple(beat.cpu_wait_s[i] for i in kept),
    )


def gaps(beat: Heartbeat, start_s: float, end_s: float) -> list[tuple[float, float]]:
    """The stretches of ``[start_s, end_s]`` between the heartbeat's wake-ups (its first
    and last stretch open on the window's edges), longest first: a heartbeat held back
    ``N`` seconds leaves a stretch of ``N`` seconds without a wake-up."""
    points = [start_s, *sorted(w for w in beat.wake_s if start_s <= w <= end_s), end_s]
    stretches = [(a, b) for a, b in itertools.pairwise(points) if b > a]
    return sorted(stretches, key=lambda s: s[0] - s[1])


def lateness_series(beat: Heartbeat, start_s: float, end_s: float, points: int = 2000) -> list[list[float]]:
    """``[t_s, lateness_ms]`` pairs over the window (net of CPU waits), at most ``points``:
    the window cut into that many bins, each showing its latest-woken-up record (spikes kept)."""
    span = max(end_s - start_s, 1e-9)
    bins: dict[int, tuple[float, float]] = {}
    for wake, late in zip(beat.wake_s, beat.gil_lateness_s, strict=True):
        if not start_s <= wake <= end_s:
            continue
        index = min(points - 1, int((wake - start_s) / span * points))
        if index not in bins or late > bins[index][1]:
            bins[index] = (wake, late)
    return [[round(wake - start_s, 4), round(1e3 * late, 3)] for wake, late in (bins[i] for i in sorted(bins))]


def since(beat: Heartbeat, start_s: float) -> Heartbeat:
    """Only the wake-ups at or after ``start_s`` (monotonic seconds): the steady state."""
    kept = [i for i, wake in enumerate(beat.wake_s) if wake >= start_s]
    return replace(
        beat,
        wake_s=tuple(beat.wake_s[i] for i in kept),
        lateness_s=tuple(beat.lateness_s[i] for i in kept),
        cpu_wait_s=tuple(beat.cpu_wait_s[i] for i in kept),
    )


def read_heartbeat(prefix: Path) -> Heartbeat | None:
    """The heartbeat written under ``prefix`` (``.json`` + ``.bin``), or None if it never started."""
    header_path = prefix.with_name(prefix.name + ".json")
    data_path = prefix.with_name(prefix.name + ".bin")
    try:
        header = json.loads(header_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    samples = array("d")
    width = len(header.get("fields", ("wake_s", "lateness_s")))
    try:
        raw = data_path.read_bytes()
    except OSError:
        raw = b""
    whole = len(raw) - len(raw) % (width * samples.itemsize)  # a write cut short by a kill
    samples.frombytes(raw[:whole])
    names = _started_thread_names(prefix.with_name(prefix.name + ".threads"))
    names.update({int(k): str(v) for k, v in dict(header.get("threads", {})).items()})
    wake, lateness = samples[0::width], samples[1::width]
    cpu_wait = samples[2::width] if width >= 3 else array("d", bytes(8 * len(wake)))
    kept = _plausible(wake, lateness, cpu_wait, header.get("started_s"))
    return Heartbeat(
        pid=int(header["pid"]),
        thread_id=int(header["heartbeat_tid"]),
        period_s=float(header.get("period_s", 0.001)),
        thread_names=names,
        wake_s=tuple(wake[i] for i in kept),
        lateness_s=tuple(lateness[i] for i in kept),
        cpu_wait_s=tuple(cpu_wait[i] for i in kept),
        dropped_records=len(wake) - len(kept),
    )


def _plausible(
    wake: array[float], lateness: array[float], cpu_wait: array[float], started_s: Any
) -> list[int]:
    """Indices of records that can be real: finite; woken after the heartbeat started and
    late by no more than the time since then; a CPU wait within the lateness. A record
    shifted by a stray write (a wake time read as a lateness) fails these: it is a damaged
    file, not a measurement."""
    start = float(started_s) if isinstance(started_s, (int, float)) else None
    kept: list[int] = []
    for index, (at, late, cpu) in enumerate(zip(wake, lateness, cpu_wait, strict=True)):
        if not (math.isfinite(at) and math.isfinite(late) and math.isfinite(cpu)):
            continue
        if not (-1.0 <= late <= MAX_PLAUSIBLE_LATENESS_S and 0.0 <= cpu <= max(late, 0.0) + 1e-6):
            continue
        if start is not None and not (
            start <= at <= start + MAX_RUN_S and late <= at - start + 1.0
        ):
            continue
        kept.append(index)
    return kept


def _started_thread_names(path: Path) -> dict[int, str]:
    """Names the threads recorded as they started (``native_id<TAB>name`` lines)."""
    names: dict[int, str] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return names
    for line in text.splitlines():
        tid, sep, name = line.partition("\t")
        if sep and tid.isdigit():
            names[int(tid)] = name
    return names


def read_header(prefix: Path) -> dict[str, Any] | None:
    """The header alone (written once the heartbeat thread runs), or None."""
    try:
        data: dict[str, Any] = json.loads(
            prefix.with_name(prefix.name + ".json").read_text("utf-8")
        )
    except (OSError, ValueError):
        return None
    return data


def injection_env(prefix: Path, base: dict[str, str]) -> dict[str, str]:
    """``base`` with the heartbeat's sitecustomize first on PYTHONPATH and its output prefix."""
    env = dict(base)
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(SITE_DIR) + (os.pathsep + existing if existing else "")
    env[ENV_PREFIX] = str(prefix)
    return env
