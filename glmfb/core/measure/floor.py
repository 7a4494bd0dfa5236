"""The between-process floor of this machine: how much one run's median time per call moves
from one fresh process to the next when nothing changed.

A saved comparison with one run a side (``glmfb bench a.json b.json``) carries no estimate
of that variance: each file is one process, whose code layout, allocations and the host's
load while it ran are all luck the other process did not share. glmfb measures it once per
machine: :func:`measure_floor` starts ``processes`` fresh Python processes one after another;
each imports torch (1 thread), allocates reference kernels (a softmax-like and a gated RMS
norm kernel on 8x4096 / 16x4096 float32, the sizes of a typical kernel microbenchmark here)
and reports the median per-call time of each over ``seconds``. The floor is the pooled
standard deviation of the log medians across processes (per kernel, then pooled), with its
degrees of freedom. It is cached in ``$GLMFB_CACHE_DIR/process-floor.json`` (default
``~/.cache/glmfb``), keyed by the machine (cpu, cpu count, python, torch); the cache records
when and at what load it was measured, and a comparison states both. Measure it again with
``python -m glmfb.core.measure.floor``.

Importing this module imports neither torch nor numpy (only the worker does).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from glmfb.contract.errors import HarnessError
from glmfb.core.io import write_json_atomic

FLOOR_SCHEMA = "glmfb.process-floor/1"
DEFAULT_PROCESSES = 8
DEFAULT_SECONDS = 1.0
REFERENCE = "softmax-like 8x4096 and gated RMS norm 16x4096 (torch, float32, 1 thread)"


def cache_dir() -> Path:
    """``$GLMFB_CACHE_DIR``, else ``$XDG_CACHE_HOME/glmfb``, else ``~/.cache/glmfb``."""
    if os.environ.get("GLMFB_CACHE_DIR"):
        return Path(os.environ["GLMFB_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "glmfb"


def floor_path() -> Path:
    return cache_dir() / "process-floor.json"


def machine_key() -> dict[str, Any]:
    """What the floor belongs to: a floor measured elsewhere does not apply here."""
    from glmfb.core.env import _cpu_model, _version

    return {"cpu": _cpu_model(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "torch": _version("torch"), "node": platform.node()}


@dataclass(frozen=True)
class ProcessFloor:
    """Between-process standard deviation of a run's log median time per call."""

    sd: float  # log scale (about a fraction)
    df: float
    processes: int
    seconds_per_process: float
    created: str
    load_1m: float | None  # the 1-minute load average when it was measured
    reference: str
    machine: dict[str, Any]
    medians_s: dict[str, list[float]]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": FLOOR_SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessFloor:
        return cls(float(data["sd"]), float(data["df"]), int(data["processes"]),
                   float(data["seconds_per_process"]), str(data["created"]),
                   None if data.get("load_1m") is None else float(data["load_1m"]),
                   str(data["reference"]), dict(data["machine"]),
                   {str(k): [float(x) for x in v] for k, v in dict(data["medians_s"]).items()})

    def evidence(self, source: str) -> dict[str, Any]:
        """The ``process_floor`` evidence item of a verdict that used it."""
        return {
            "kind": "process_floor", "sd": self.sd, "df": self.df, "processes": self.processes,
            "seconds_per_process": self.seconds_per_process, "measured": self.created,
            "load_1m_then": self.load_1m, "load_1m_now": _load_1m(), "reference": self.reference,
            "source": source, "path": str(floor_path()),
        }


def _load_1m() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def pooled_floor(medians_s: dict[str, list[float]]) -> tuple[float, float]:
    """Pooled sd of log medians across processes (per kernel, pooled) and its df."""
    squares, df = 0.0, 0
    for values in medians_s.values():
        logs = [math.log(v) for v in values]
        if len(logs) >= 2:
            mean = statistics.fmean(logs)
            squares += sum((x - mean) ** 2 for x in logs)
            df += len(logs) - 1
    if df == 0:
        raise ValueError("a floor needs at least 2 processes")
    return math.sqrt(squares / df), float(df)


def load_floor() -> ProcessFloor | None:
    """The cached floor of this machine, or None (absent, unreadable, or another machine's)."""
    path = floor_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != FLOOR_SCHEMA:
            return None
        floor = ProcessFloor.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return floor if floor.machine == machine_key() else None


def save_floor(floor: ProcessFloor) -> Path:
    path = floor_path()
    write_json_atomic(path, floor.to_dict())
    return path


def measure_floor(
    processes: int = DEFAULT_PROCESSES, seconds: float = DEFAULT_SECONDS,
    progress: Callable[[str], None] | None = None,
) -> ProcessFloor:
    """Start ``processes`` fresh workers one after another and pool their spread."""
    if processes < 2:
        raise ValueError("a floor needs at least 2 processes")
    load = _load_1m()
    medians: dict[str, list[float]] = {}
    for index in range(processes):
        if progress is not None:
            progress(f"between-process floor: process {index + 1} of {processes}")
        done = subprocess.run(
            [sys.executable, "-m", "glmfb.core.measure.floor", "--worker", "--seconds", str(seconds)],
            capture_output=True, text=True, timeout=120 + 10 * seconds,
        )
        try:
            result = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise HarnessError(f"the floor worker failed (exit {done.returncode}): {tail}") from None
        for name, value in result.items():
            medians.setdefault(name, []).append(float(value))
    sd, df = pooled_floor(medians)
    return ProcessFloor(sd, df, processes, seconds, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        load, REFERENCE, machine_key(), medians)


def get_floor(progress: Callable[[str], None] | None = None) -> tuple[ProcessFloor, str]:
    """The cached floor, else one measured now and cached; and which of the two it is."""
    cached = load_floor()
    if cached is not None:
        return cached, "cache"
    floor = measure_floor(progress=progress)
    save_floor(floor)
    return floor, "measured now"


def _worker(seconds: float) -> dict[str, float]:
    """One process's medians per reference kernel (runs inside a fresh process)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)

    def softmax(seed: int) -> Callable[[], Any]:
        x = torch.randn(8, 4096, generator=torch.Generator().manual_seed(seed))
        out = torch.empty_like(x)

        def kernel() -> Any:
            torch.sub(x, x.amax(-1, keepdim=True), out=out)
            out.exp_()
            return out.div_(out.sum(-1, keepdim=True))

        return kernel

    def rmsnorm(seed: int) -> Callable[[], Any]:
        generator = torch.Generator().manual_seed(seed)
        x, gate = torch.randn(16, 4096, generator=generator), torch.randn(16, 4096, generator=generator)
        weight, out = torch.ones(4096), torch.empty(16, 4096)

        def kernel() -> Any:
            torch.mul(x, torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), out=out)
            return out.mul_(weight).mul_(F.silu(gate))

        return kernel

    kernels = {"softmax": [softmax(s) for s in range(4)], "rmsnorm": [rmsnorm(s) for s in range(4)]}
    calls: dict[str, int] = {}
    for name, group in kernels.items():
        for kernel in group * 5:
            kernel()
        begin = time.perf_counter()
        for kernel in group * 10:
            kernel()
        calls[name] = max(1, round(1e-3 / ((time.perf_counter() - begin) / (10 * len(group)))))
    samples: dict[str, list[float]] = {name: [] for name in kernels}
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for name, group in kernels.items():
            order = [group[i % len(group)] for i in range(calls[name])]
            begin = time.perf_counter()
            for kernel in order:
                kernel()
            samples[name].append((time.perf_counter() - begin) / calls[name])
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure this machine's between-process floor.")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=DEFAULT_PROCESSES)
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.seconds)))
        return 0
    floor = measure_floor(args.processes, args.seconds, progress=lambda m: print(m, file=sys.stderr))
    path = save_floor(floor)
    print(f"between-process floor: sd {floor.sd:.2%} of a run's median ({floor.processes} processes, "
          f"df {floor.df:g}, load {floor.load_1m}); saved to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
