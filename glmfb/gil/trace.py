"""Trace mode: a viztracer trace (Perfetto-compatible, thread names) and overlap blame.

For each slice of a starved thread that took far longer than its own work (at least the
starvation threshold, with children covering less than half of it: it was waiting), the
functions running on other threads at the same time are credited with the overlapping time
they spent in their own code (not in their children), then ranked by total overlap. Builtins
known to wait with the GIL released (``lock.acquire``, ``time.sleep``...) get no credit.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmfb.gil.groups import unnamed


@dataclass
class Slice:
    tid: int
    name: str
    start_us: float
    end_us: float
    children: list[Slice] = field(default_factory=list)

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


# Builtins that wait with the GIL released: overlapping a starved slice, they are not the cause.
RELEASING_WAITS = (
    "_thread.lock.acquire",
    "_thread.RLock.acquire",
    "time.sleep",
    "select.select",
    "select.poll",
    "select.epoll.poll",
    "posix.waitpid",
    "posix.read",
    "_socket.socket.recv",
    "_socket.socket.accept",
    "_queue.SimpleQueue.get",
    "_io.FileIO.read",
    "_io.BufferedReader.read",
)


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def load_trace(path: Path) -> tuple[dict[int, list[Slice]], dict[int, str]]:
    """Complete slices per thread (sorted by start, nesting filled in) and thread names."""
    data = json.loads(path.read_text(encoding="utf-8"))
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    names: dict[int, str] = {}
    per_thread: dict[int, list[Slice]] = defaultdict(list)
    for event in events:
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            names[int(event["tid"])] = str(event.get("args", {}).get("name", ""))
        elif event.get("ph") == "X" and "dur" in event:
            start = float(event["ts"])
            per_thread[int(event["tid"])].append(
                Slice(
                    int(event["tid"]),
                    str(event.get("name", "?")),
                    start,
                    start + float(event["dur"]),
                )
            )
    for slices in per_thread.values():
        slices.sort(key=lambda s: (s.start_us, -s.end_us))
        stack: list[Slice] = []
        for item in slices:
            while stack and stack[-1].end_us <= item.start_us:
                stack.pop()
            if stack and item.end_us <= stack[-1].end_us + 1e-3:
                stack[-1].children.append(item)
            stack.append(item)
    return dict(per_thread), names


def waiting_slices(slices: list[Slice], min_duration_us: float) -> list[Slice]:
    """Slices at least ``min_duration_us`` long whose children cover less than half of them."""
    found = []
    for item in slices:
        if item.duration_us < min_duration_us:
            continue
        covered = sum(child.duration_us for child in item.children)
        if covered < 0.5 * item.duration_us:
            found.append(item)
    return found


def overlap_blame(
    path: Path,
    starved_threads: set[str],
    threshold_s: float,
    *,
    extra_windows_s: Sequence[tuple[float, float]] = (),
    limit: int = 10,
) -> list[dict[str, Any]]:
    """Functions on other threads ranked by their own time overlapping the starved slices.

    ``extra_windows_s`` are starvation windows measured elsewhere (the heartbeat's), in
    monotonic seconds: viztracer's timestamps are monotonic microseconds on Linux.
    """
    per_thread, names = load_trace(path)
    starved_tids = {tid for tid, name in names.items() if name in starved_threads}
    windows: list[tuple[int, Slice]] = []
    for tid in starved_tids:
        for item in waiting_slices(per_thread.get(tid, []), threshold_s * 1e6):
            windows.append((tid, item))
    for start_s, end_s in extra_windows_s:
        windows.append((-1, Slice(-1, "heartbeat", start_s * 1e6, end_s * 1e6)))
    windows.sort(key=lambda w: -w[1].duration_us)
    windows = windows[:300]
    credit: dict[tuple[int, str], float] = defaultdict(float)
    hits: dict[tuple[int, str], int] = defaultdict(int)
    for starved_tid, window in windows:
        for tid, slices in per_thread.items():
            if tid == starved_tid:
                continue
            starts = [s.start_us for s in slices] if len(slices) < 50_000 else None
            stop = bisect_left(starts, window.end_us) if starts is not None else len(slices)
            for item in slices[:stop]:
                if item.end_us <= window.start_us or item.name in RELEASING_WAITS:
                    continue
                own = _overlap(item.start_us, item.end_us, window.start_us, window.end_us)
                own -= sum(
                    _overlap(c.start_us, c.end_us, window.start_us, window.end_us)
                    for c in item.children
                )
                if own > 0:
                    credit[(tid, item.name)] += own
                    hits[(tid, item.name)] += 1
    total_waiting_us = sum(w.duration_us for _, w in windows)
    ranked = sorted(credit.items(), key=lambda kv: -kv[1])[:limit]
    return [
        {
            "thread": names.get(tid, unnamed(tid)),
            "function": name,
            "overlap_ms": round(us / 1e3, 3),
            "share_of_starved_time": round(us / total_waiting_us, 4) if total_waiting_us else None,
            "slices": hits[(tid, name)],
        }
        for (tid, name), us in ranked
    ]
