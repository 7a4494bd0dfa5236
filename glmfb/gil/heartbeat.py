"""Reading the heartbeat the injected ``sitecustomize`` writes: lateness statistics and windows."""

from __future__ import annotations

import json
import math
import os
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SITE_DIR = Path(__file__).resolve().parent / "_site"
ENV_PREFIX = "GLMFB_GIL_HEARTBEAT"


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
    lateness_s: tuple[float, ...]

    @property
    def ticks(self) -> int:
        return len(self.lateness_s)

    def percentile_ms(self, q: float) -> float:
        """Nearest-rank percentile of the lateness, in milliseconds (q in [0, 100])."""
        if not self.lateness_s:
            return float("nan")
        ordered = sorted(self.lateness_s)
        index = min(len(ordered) - 1, max(0, math.ceil(q / 100.0 * len(ordered)) - 1))
        return 1e3 * max(0.0, ordered[index])

    def summary(self) -> dict[str, Any]:
        return {
            "ticks": self.ticks,
            "period_ms": 1e3 * self.period_s,
            "p50_ms": round(self.percentile_ms(50), 3),
            "p99_ms": round(self.percentile_ms(99), 3),
            "max_ms": round(1e3 * max(self.lateness_s), 3) if self.lateness_s else None,
        }

    def windows(self, threshold_s: float) -> list[Window]:
        """Merged windows where a wake-up came more than ``threshold_s`` late.

        A wake-up at ``t`` that was ``late`` seconds late means the thread was runnable but
        not running from ``t - late`` to ``t``.
        """
        spans = sorted(
            (wake - late, wake, late)
            for wake, late in zip(self.wake_s, self.lateness_s, strict=True)
            if late > threshold_s
        )
        merged: list[Window] = []
        for start, end, late in spans:
            if merged and start <= merged[-1].end_s + self.period_s:
                last = merged[-1]
                merged[-1] = Window(last.start_s, max(last.end_s, end), max(last.max_lateness_s, late))
            else:
                merged.append(Window(start, end, late))
        return merged


def read_heartbeat(prefix: Path) -> Heartbeat | None:
    """The heartbeat written under ``prefix`` (``.json`` + ``.bin``), or None if it never started."""
    header_path = prefix.with_name(prefix.name + ".json")
    data_path = prefix.with_name(prefix.name + ".bin")
    try:
        header = json.loads(header_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    samples = array("d")
    try:
        raw = data_path.read_bytes()
    except OSError:
        raw = b""
    whole = len(raw) - len(raw) % (2 * samples.itemsize)  # a write cut short by a kill
    samples.frombytes(raw[:whole])
    return Heartbeat(
        pid=int(header["pid"]),
        thread_id=int(header["heartbeat_tid"]),
        period_s=float(header.get("period_s", 0.001)),
        thread_names={int(k): str(v) for k, v in dict(header.get("threads", {})).items()},
        wake_s=tuple(samples[0::2]),
        lateness_s=tuple(samples[1::2]),
    )


def read_header(prefix: Path) -> dict[str, Any] | None:
    """The header alone (written once the heartbeat thread runs), or None."""
    try:
        data: dict[str, Any] = json.loads(prefix.with_name(prefix.name + ".json").read_text("utf-8"))
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
