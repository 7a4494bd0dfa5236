"""The host's last-level cache, and which cache regime a timing's inputs were in.

A kernel timed on inputs that stay in cache (one input set reused, as ``timeit`` and
``torch.utils.benchmark`` do) and the same kernel timed on inputs that come from memory
(several input sets rotated, whose bytes together exceed the last-level cache: glmfb bench's
default) answer different questions, and a change between two kernels can differ a lot between
them. A candidate doing ``x.sum(0)`` twice against a baseline doing it once, on 1024x4096
float32 inputs (16 MiB a set) on the 2-core development VM (32 MiB L3): +60% to +79% with 4
rotated sets (64 MiB: the first pass waits on memory, the second finds part of the data in
cache), +87% to +98% with one set reused; issue 37 reported +49% against torch.utils.benchmark's
+96-102% on another host. So a timing says which regime it measured: :func:`regime_of` names it
from the input sets, their bytes and :func:`last_level_cache`, read from
``/sys/devices/system/cpu/cpu0/cache/index*/size``, or from ``lscpu`` where sysfs has nothing.
"""

from __future__ import annotations

import functools
import math
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")

COLD = "cold"  # the inputs together exceed the cache: each call reads them from memory
WARM = "warm"  # the rotated input sets together fit in the cache
HOT = "hot"  # one input set, reused, fits in the cache
UNKNOWN = "unknown"  # the inputs' bytes or the cache size could not be read


@dataclass(frozen=True)
class CacheSize:
    """The last-level cache: its size in bytes, its level (``L3``) and where it was read."""

    bytes: int
    level: str
    source: str


def _parse_size(text: str) -> int | None:
    """``32768K``, ``32 MiB``, ``1M`` -> bytes."""
    found = re.fullmatch(r"\s*([0-9.]+)\s*([KMG]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    if found is None:
        return None
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[found.group(2).upper()]
    value = float(found.group(1)) * scale
    return int(value) if math.isfinite(value) and value > 0 else None


def _from_sysfs(root: Path) -> CacheSize | None:
    best: tuple[int, int, Path] | None = None
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text().strip())
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if size is None or kind == "Instruction":
            continue
        if best is None or level > best[0]:
            best = (level, size, index)
    if best is None:
        return None
    return CacheSize(best[1], f"L{best[0]}", str(best[2] / "size"))


def _from_lscpu(text: str) -> CacheSize | None:
    """The highest data or unified level of ``lscpu``'s ``L3 cache: 32 MiB (1 instance)``
    lines; the size of one instance (lscpu gives the sum over instances)."""
    best: tuple[int, int] | None = None
    for line in text.splitlines():
        found = re.match(r"\s*L(\d)[du]?\s+cache:\s*(.+?)\s*(?:\((\d+)\s+instances?\))?\s*$", line)
        if found is None:  # L1i (instructions) does not match
            continue
        size = _parse_size(found.group(2))
        if size is None:
            continue
        size //= max(1, int(found.group(3) or 1))
        level = int(found.group(1))
        if best is None or level > best[0]:
            best = (level, size)
    return CacheSize(best[1], f"L{best[0]}", "lscpu") if best is not None else None


@functools.lru_cache(maxsize=1)
def last_level_cache() -> CacheSize | None:
    """This host's last-level cache (the highest level sysfs lists for CPU 0, else lscpu's),
    or None when neither says."""
    found = _from_sysfs(SYSFS_CACHE)
    if found is not None:
        return found
    try:
        done = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False,
                              env={"LC_ALL": "C", "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"})
    except (OSError, subprocess.SubprocessError):
        return None
    return _from_lscpu(done.stdout) if done.returncode == 0 else None


def size_text(value: float) -> str:
    """Bytes for a reader: ``64 MiB``, ``256 KiB``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


@dataclass(frozen=True)
class Regime:
    """Which cache regime a timing's inputs were in: ``input_sets`` rotated (1: reused),
    ``total_bytes`` together and ``set_bytes`` the largest, against the last-level ``cache``."""

    name: str  # COLD, WARM, HOT or UNKNOWN
    input_sets: int
    set_bytes: int | None
    total_bytes: int | None
    cache: CacheSize | None
    bytes_source: str | None = None  # how the bytes were read ("tensors the kernel holds", ...)

    def clause(self) -> str:
        """In words: ``inputs cold in cache (4 rotated input sets, 64 MiB in all, beyond the
        32 MiB last-level cache)``."""
        sets = self.input_sets
        cache = f"the {size_text(self.cache.bytes)} last-level cache" if self.cache is not None else None
        if self.set_bytes is None or self.total_bytes is None:
            what = f"{sets} rotated input sets" if sets > 1 else "one input set, reused"
            return f"{what} of a size not measured (the cache regime is unknown)"
        total = size_text(self.total_bytes)
        if cache is None:
            what = f"{sets} rotated input sets, {total} in all" if sets > 1 else f"one input set of {total}, reused"
            return f"{what}; the last-level cache size could not be read, so the cache regime is unknown"
        if sets == 1:
            if self.name == HOT:
                return f"inputs hot in cache (one input set of {total}, reused, fits in {cache})"
            return f"inputs cold in cache (one input set of {total}, beyond {cache})"
        if self.name == COLD:
            return f"inputs cold in cache ({sets} rotated input sets, {total} in all, beyond {cache})"
        return f"inputs warm in cache (the {sets} rotated input sets, {total} in all, fit in {cache})"

    @property
    def hot_differs_by_construction(self) -> bool:
        """Whether one input set reused would be in another regime than this timing: not when
        it already reused one set, nor when one set alone exceeds the cache (it comes from
        memory either way)."""
        if self.input_sets <= 1:
            return False
        return not (self.set_bytes is not None and self.cache is not None and self.set_bytes > self.cache.bytes)


def regime_of(input_sets: int, set_bytes: int | None, total_bytes: int | None, cache: CacheSize | None,
              bytes_source: str | None = None) -> Regime:
    """The regime of ``input_sets`` rotated input sets, ``total_bytes`` together and
    ``set_bytes`` the largest (None: not measured), against ``cache``: cold when their bytes
    together exceed it, warm when several fit in it, hot when one set reused fits."""
    if set_bytes is None or total_bytes is None or cache is None:
        name = UNKNOWN
    elif total_bytes > cache.bytes:
        name = COLD
    else:
        name = HOT if input_sets == 1 else WARM
    return Regime(name, input_sets, set_bytes, total_bytes, cache, bytes_source)


__all__ = ["COLD", "HOT", "UNKNOWN", "WARM", "CacheSize", "Regime", "last_level_cache", "regime_of", "size_text"]
