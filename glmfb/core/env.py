"""Environment fingerprint: what a measurement depends on, recorded beside it.

Cheap by design: versions come from package metadata, so fingerprinting never imports torch.
Torch-specific facts (device, threads) are read only when torch is already imported.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from functools import lru_cache
from importlib import metadata
from typing import Any

# Keys that make two measurements incomparable when they differ.
COMPARABLE_KEYS = ("python", "torch", "machine", "cpu", "cpu_count", "device", "threads")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@lru_cache(maxsize=8)
def git_revision(directory: str | None = None) -> str | None:
    """The commit checked out in ``directory`` (cwd by default), with ``+dirty`` if modified."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def fingerprint() -> dict[str, Any]:
    """The environment of this process, as plain JSON data."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "glmfb": _version("glmfb"),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "device": "cpu",
        "git": git_revision(),
    }
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES"):
        if var in os.environ:
            info[var.lower()] = os.environ[var]
    torch = sys.modules.get("torch")
    if torch is not None:
        info["threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["device"] = f"cuda:{torch.cuda.get_device_name(0)}"
            info["cuda"] = torch.version.cuda
    return info


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The comparable keys on which two fingerprints disagree (keys missing on a side skipped)."""
    return {
        key: (a[key], b[key])
        for key in COMPARABLE_KEYS
        if key in a and key in b and a[key] != b[key]
    }
