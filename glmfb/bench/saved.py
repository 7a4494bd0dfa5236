"""Results across processes: glmfb's ``--save`` files and pytest-benchmark JSON.

File format ``glmfb.bench/1`` (history: ``glmfb.bench/1`` first version)::

    {"schema": "glmfb.bench/1", "created": "...", "env": {fingerprint},
     "device": "cpu", "threads": 1, "timer": {...},
     "sides": {"baseline": {"ref": "...", "kernel": "...", "args": {...}},
               "candidate": {...}},                       # or only "baseline" for one target
     "shapes": {"8x4096": {"calls_per_sample": 12,
                           "baseline": [per-call seconds of each sample, ...],
                           "baseline_allocations": [allocation of each sample, ...],
                           "candidate": [...], "candidate_allocations": [...]}}}

(``*_allocations`` is optional: which independent allocation each sample came from; added
within ``glmfb.bench/1``, older files simply lack it.) Several runs of one side can be given
as ``FILE,FILE`` or a glob (:func:`load_runs`).

A pytest-benchmark file (``--benchmark-json`` or ``--benchmark-save``) is read as one side
whose keys are benchmark names: raw round times when it was saved with
``--benchmark-save-data``, else its median and IQR (an approximate interval, flagged).
"""

from __future__ import annotations

import glob
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmfb.contract.errors import InputError
from glmfb.core.io import read_json, write_json_atomic

SAVED_SCHEMA = "glmfb.bench/1"
SIDE_NAMES = ("baseline", "candidate")


@dataclass(frozen=True)
class Summary:
    """A result known only by its median and spread (pytest-benchmark without raw data)."""

    median_s: float
    relative_se: float
    rounds: int


@dataclass(frozen=True)
class SavedSide:
    """One side read from a file: per-key samples (per-call seconds) or summaries."""

    source: str
    format: str  # "glmfb.bench/1" or "pytest-benchmark"
    kernel: str
    env: Mapping[str, Any] = field(default_factory=dict)
    samples: Mapping[str, list[float]] = field(default_factory=dict)
    summaries: Mapping[str, Summary] = field(default_factory=dict)
    allocations: Mapping[str, list[int]] = field(default_factory=dict)  # per sample, when saved
    path: str = ""  # the file it came from (two sides of one file ran in one process)

    @property
    def keys(self) -> list[str]:
        return list(dict.fromkeys([*self.samples, *self.summaries]))


def write_saved(
    path: Path,
    *,
    env: Mapping[str, Any],
    created: str,
    device: str,
    threads: int,
    timer: Mapping[str, Any],
    sides: Mapping[str, Mapping[str, Any]],
    shapes: Mapping[str, Mapping[str, Any]],
) -> None:
    """Write a ``glmfb.bench/1`` file atomically."""
    write_json_atomic(
        path,
        {
            "schema": SAVED_SCHEMA,
            "created": created,
            "env": dict(env),
            "device": device,
            "threads": threads,
            "timer": dict(timer),
            "sides": {k: dict(v) for k, v in sides.items()},
            "shapes": {k: dict(v) for k, v in shapes.items()},
        },
    )


def _positive_floats(values: Any, where: str) -> list[float]:
    if not isinstance(values, list) or not values:
        raise InputError(f"{where}: expected a non-empty list of seconds")
    out: list[float] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InputError(f"{where}: {value!r} is not a positive number of seconds")
        out.append(float(value))
    return out


def load_runs(spec: str) -> list[SavedSide]:
    """Several runs of one side: ``FILE[,FILE...]``, each may be a glob (``runs/base-*.json``)
    and end in ``#baseline`` / ``#candidate``. Each file is one run (one process)."""
    runs: list[SavedSide] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        path_text, sep, selector = part.partition("#")
        if any(ch in path_text for ch in "*?["):
            matches = sorted(glob.glob(path_text))
            if not matches:
                raise InputError(f"{path_text}: no file matches", "check the pattern, or quote it for the shell")
            runs.extend(load_side(m + (f"#{selector}" if sep else "")) for m in matches)
        else:
            runs.append(load_side(part))
    if not runs:
        raise InputError(f"{spec!r} names no file", "give a saved .json file")
    return runs


def load_side(spec: str) -> SavedSide:
    """Read ``FILE`` or ``FILE#baseline`` / ``FILE#candidate``."""
    path_text, _, selector = spec.partition("#")
    data = read_json(path_text)
    if not isinstance(data, dict):
        raise InputError(f"{path_text}: not a glmfb bench file or pytest-benchmark JSON")
    if data.get("schema") == SAVED_SCHEMA:
        return _load_glmfb(path_text, data, selector, spec)
    if isinstance(data.get("benchmarks"), list):
        if selector:
            raise InputError(f"{spec}: a pytest-benchmark file has no sides", f"drop '#{selector}'")
        return _load_pytest_benchmark(path_text, data)
    raise InputError(
        f"{path_text}: not a glmfb bench file ({SAVED_SCHEMA}) nor pytest-benchmark JSON",
        "write one with glmfb bench ... --save FILE or pytest --benchmark-json FILE",
    )


def _load_glmfb(path_text: str, data: dict[str, Any], selector: str, spec: str) -> SavedSide:
    sides = data.get("sides")
    shapes = data.get("shapes")
    if not isinstance(sides, dict) or not sides or not isinstance(shapes, dict) or not shapes:
        raise InputError(f"{path_text}: 'sides' and 'shapes' must be non-empty objects")
    if selector:
        if selector not in sides:
            raise InputError(f"{spec}: no side {selector!r} in the file", f"it holds {', '.join(sides)}")
        label = selector
    elif len(sides) == 1:
        label = next(iter(sides))
    else:
        raise InputError(
            f"{path_text} holds two sides ({', '.join(sides)})",
            f"pick one: {path_text}#baseline or {path_text}#candidate",
        )
    side = sides[label]
    samples = {
        str(shape): _positive_floats(entry.get(label) if isinstance(entry, dict) else None,
                                     f"{path_text}: shapes.{shape}.{label}")
        for shape, entry in shapes.items()
    }
    allocations: dict[str, list[int]] = {}
    for shape, entry in shapes.items():
        owners = entry.get(f"{label}_allocations") if isinstance(entry, dict) else None
        if (isinstance(owners, list) and len(owners) == len(samples[str(shape)])
                and all(isinstance(a, int) and not isinstance(a, bool) for a in owners)):
            allocations[str(shape)] = list(owners)
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    kernel = str(side.get("kernel") or side.get("ref") or label) if isinstance(side, dict) else label
    return SavedSide(f"{path_text}#{label}", SAVED_SCHEMA, kernel, env or {}, samples,
                     allocations=allocations, path=str(Path(path_text).resolve()))


def _pytest_benchmark_env(data: Mapping[str, Any]) -> dict[str, Any]:
    machine = data.get("machine_info") or {}
    commit = data.get("commit_info") or {}
    env: dict[str, Any] = {}
    if machine.get("python_version"):
        env["python"] = machine["python_version"]
    if machine.get("machine"):
        env["machine"] = machine["machine"]
    cpu = machine.get("cpu")
    if isinstance(cpu, dict) and cpu.get("brand_raw"):
        env["cpu"] = cpu["brand_raw"]
    if commit.get("id"):
        env["git"] = str(commit["id"]) + ("+dirty" if commit.get("dirty") else "")
    return env


def _load_pytest_benchmark(path_text: str, data: Mapping[str, Any]) -> SavedSide:
    samples: dict[str, list[float]] = {}
    summaries: dict[str, Summary] = {}
    for index, bench in enumerate(data["benchmarks"]):
        if not isinstance(bench, dict) or not isinstance(bench.get("stats"), dict):
            raise InputError(f"{path_text}: benchmarks[{index}] has no 'stats'")
        key = str(bench.get("name") or bench.get("fullname") or index)
        stats = bench["stats"]
        raw = stats.get("data")
        if isinstance(raw, list) and len(raw) >= 2:
            samples[key] = _positive_floats(raw, f"{path_text}: {key}.stats.data")
            continue
        try:
            median = float(stats["median"])
            iqr = float(stats.get("iqr", 0.0))
            rounds = int(stats.get("rounds", 1))
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path_text}: {key}.stats lacks median/iqr/rounds") from None
        if not median > 0 or rounds < 1:
            raise InputError(f"{path_text}: {key}: median {median} with {rounds} rounds is unusable")
        # Standard error of a median for normal-ish data: 1.2533 sigma / sqrt(n), sigma ~ IQR/1.349.
        relative_se = 1.2533 * (iqr / 1.349) / math.sqrt(rounds) / median
        summaries[key] = Summary(median, max(relative_se, 1e-6), rounds)
    if not samples and not summaries:
        raise InputError(f"{path_text}: the pytest-benchmark file lists no benchmarks")
    return SavedSide(path_text, "pytest-benchmark", Path(path_text).name,
                     _pytest_benchmark_env(data), samples, summaries, path=str(Path(path_text).resolve()))
