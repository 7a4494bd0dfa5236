"""Ceilings measured once per process (a large matmul, a large copy) and where a kernel sits.

A target declares its work by setting attributes on the callable its factory returns:
``kernel.flops_per_call`` (floating-point operations) and ``kernel.bytes_per_call`` (bytes
read plus written). Achieved FLOP/s and bytes/s are compared with the measured ceilings; the
larger fraction names the bound ("memory-bound: 41% of the copy bandwidth").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glmfb.bench.allocations import measure_callable

_CEILINGS: dict[tuple[str, int], Ceilings] = {}


@dataclass(frozen=True)
class Ceilings:
    flops_per_s: float
    bytes_per_s: float
    device: str
    threads: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops_per_s": self.flops_per_s,
            "bytes_per_s": self.bytes_per_s,
            "device": self.device,
            "threads": self.threads,
        }


def measure_ceilings(device: str) -> Ceilings:
    """Peak matmul FLOP/s and copy bytes/s here, measured on first use and cached per process
    (keyed by device and torch thread count)."""
    import torch

    key = (device, torch.get_num_threads())
    if key in _CEILINGS:
        return _CEILINGS[key]
    if device == "cuda":
        n, copy_elements = 8192, 256 * 2**20  # 1 GiB float32
        sync = torch.cuda.synchronize
    else:
        n, copy_elements = 1024, 16 * 2**20  # 64 MiB float32
        sync = None
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    out = torch.empty(n, n, device=device)
    src = torch.ones(copy_elements, device=device)
    dst = torch.empty_like(src)

    def matmul() -> None:
        torch.mm(a, b, out=out)
        if sync:
            sync()

    def copy() -> None:
        dst.copy_(src)
        if sync:
            sync()

    matmul()
    copy()
    matmul_s = measure_callable(matmul, 3)
    copy_s = measure_callable(copy, 5)
    ceilings = Ceilings(
        flops_per_s=2.0 * n**3 / matmul_s,
        bytes_per_s=2.0 * copy_elements * 4 / copy_s,
        device=device,
        threads=key[1],
    )
    _CEILINGS[key] = ceilings
    return ceilings


@dataclass(frozen=True)
class Placement:
    """One kernel against the ceilings."""

    flops_per_s: float | None
    bytes_per_s: float | None
    compute_fraction: float | None
    memory_fraction: float | None

    @property
    def bound(self) -> str | None:
        if self.compute_fraction is None and self.memory_fraction is None:
            return None
        compute = self.compute_fraction or 0.0
        memory = self.memory_fraction or 0.0
        return "compute-bound" if compute >= memory else "memory-bound"

    def describe(self) -> str:
        if self.bound == "compute-bound" and self.compute_fraction is not None:
            return f"compute-bound: {self.compute_fraction:.0%} of the matmul FLOP/s"
        if self.memory_fraction is not None:
            return f"memory-bound: {self.memory_fraction:.0%} of the copy bandwidth"
        return "no declared work"

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops_per_s": self.flops_per_s,
            "bytes_per_s": self.bytes_per_s,
            "compute_fraction": self.compute_fraction,
            "memory_fraction": self.memory_fraction,
            "bound": self.bound,
        }


def place(
    per_call_s: float, flops_per_call: float | None, bytes_per_call: float | None, ceilings: Ceilings
) -> Placement:
    flops = flops_per_call / per_call_s if flops_per_call else None
    moved = bytes_per_call / per_call_s if bytes_per_call else None
    return Placement(
        flops_per_s=flops,
        bytes_per_s=moved,
        compute_fraction=flops / ceilings.flops_per_s if flops is not None else None,
        memory_fraction=moved / ceilings.bytes_per_s if moved is not None else None,
    )
