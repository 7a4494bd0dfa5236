"""Timers: run a prepared loop of kernel calls and say how long it took.

A timer first *prepares* a loop (``calls`` calls rotating over the pre-allocated input sets,
each loop going on where the last one stopped, so every set is used even when a sample is one
call) and then *measures* it. On CPU that is ``time.perf_counter`` around a plain Python loop. On
CUDA (:class:`CudaTimer`) the loop runs between two CUDA events after an L2 flush (a write
to a buffer larger than the L2 cache), and may be captured once into a CUDA graph and
replayed, which removes the launch overhead from the measurement.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Kernel = Callable[[], Any]


@dataclass(frozen=True)
class Loop:
    """``calls`` kernel calls, ready to run; ``run()`` returns the last call's result.
    ``warm``: untimed calls right before each timed run, on the input set the run starts with,
    so that its inputs are in cache (the hot check; the CUDA timer then skips its L2 flush);
    None: the run is timed on inputs as the calls before it left them."""

    calls: int
    run: Callable[[], Any]
    warm: Callable[[], Any] | None = None


class Timer(Protocol):
    device: str

    def prepare(self, kernels: Sequence[Kernel], calls: int, *, warm: int = 0) -> Loop:
        """``calls`` calls rotating over ``kernels``; ``warm``: untimed calls before each
        timed run (:attr:`Loop.warm`)."""
        ...

    def measure(self, loop: Loop) -> tuple[float, Any]:
        """Seconds the loop took, and the last call's result."""
        ...

    def describe(self) -> dict[str, Any]: ...


# Below this many calls per input set, a loop goes on with the set after the one the last loop
# ended on: with 1 call per sample, restarting at set 0 would time set 0 only (hot in cache,
# or cold, depending on what ran before it) and never rotate at all.
ROTATE_ACROSS_LOOPS = 64


class _Rotation:
    """``calls`` calls rotating over ``kernels``; each run starts with the set after the one
    the previous run ended on (orders precomputed per start, so the timed loop is a plain
    ``for``). With many calls per set, or a whole number of rotations per run, every run
    starts at set 0: the partial rotation then weighs at most 1/64."""

    def __init__(self, kernels: Sequence[Kernel], calls: int) -> None:
        n = len(kernels)
        self.kernels = list(kernels)
        self.step = calls % n if calls < ROTATE_ACROSS_LOOPS * n else 0
        starts = {(k * self.step) % n for k in range(n)} if self.step else {0}
        self.orders = {s: [kernels[(s + i) % n] for i in range(calls)] for s in starts}
        self.start = 0

    def __call__(self) -> Any:
        order = self.orders[self.start]
        if self.step:
            self.start = (self.start + self.step) % len(self.kernels)
        result = None
        for kernel in order:
            result = kernel()
        return result

    def warmer(self, calls: int) -> Callable[[], Any] | None:
        """``calls`` untimed calls of the set the next run starts with (None for none)."""
        if calls <= 0:
            return None

        def warm() -> None:
            kernel = self.kernels[self.start]
            for _ in range(calls):
                kernel()

        return warm


def _rotation(kernels: Sequence[Kernel], calls: int) -> _Rotation:
    return _Rotation(kernels, calls)


class CpuTimer:
    """Wall time of a Python loop, from ``time.perf_counter`` (resolution below a microsecond)."""

    device = "cpu"

    def prepare(self, kernels: Sequence[Kernel], calls: int, *, warm: int = 0) -> Loop:
        rotation = _rotation(kernels, calls)
        return Loop(calls, rotation, rotation.warmer(warm))

    def measure(self, loop: Loop) -> tuple[float, Any]:
        run = loop.run
        if loop.warm is not None:
            loop.warm()
        start = time.perf_counter()
        result = run()
        elapsed = time.perf_counter() - start
        return elapsed, result

    def describe(self) -> dict[str, Any]:
        info = time.get_clock_info("perf_counter")
        return {"timer": "perf_counter", "resolution_s": info.resolution}


class CudaTimer:
    """CUDA events around the loop, an L2 flush before it, optional CUDA-graph replay."""

    device = "cuda"

    def __init__(self, *, use_graph: bool = False, flush_bytes: int | None = None) -> None:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("CudaTimer needs a CUDA device")
        self._torch = torch
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2_bytes = int(getattr(properties, "L2_cache_size", 0) or 64 * 2**20)
        # The device's last-level cache, what the inputs' cache regime is read against (None: not reported).
        self.l2_bytes: int | None = int(getattr(properties, "L2_cache_size", 0) or 0) or None
        self.flush_bytes = flush_bytes or max(2 * l2_bytes, 32 * 2**20)
        self._flush = torch.empty(self.flush_bytes // 4, dtype=torch.float32, device="cuda")
        self.use_graph = use_graph
        self.device_name = torch.cuda.get_device_name()
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def prepare(self, kernels: Sequence[Kernel], calls: int, *, warm: int = 0) -> Loop:
        torch = self._torch
        run = _rotation(kernels, calls)
        if not self.use_graph:
            return Loop(calls, run, run.warmer(warm))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on a side stream, as capture requires
            for _ in range(2):
                run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = run()

        def replay() -> Any:
            graph.replay()
            return captured

        return Loop(calls, replay, replay if warm > 0 else None)

    def measure(self, loop: Loop) -> tuple[float, Any]:
        torch = self._torch
        if loop.warm is None:
            self._flush.zero_()  # evict the inputs from L2 so every sample starts cold
        else:
            loop.warm()  # the hot check: the inputs in L2 when the sample starts
        self._start.record()
        result = loop.run()
        self._end.record()
        self._end.synchronize()
        torch.cuda.synchronize()
        return self._start.elapsed_time(self._end) / 1e3, result

    def describe(self) -> dict[str, Any]:
        return {
            "timer": "cuda-events",
            "device_name": self.device_name,
            "l2_flush_bytes": self.flush_bytes,
            "cuda_graph": self.use_graph,
        }


def make_timer(device: str, *, cuda_graph: bool = False) -> Timer:
    """``device`` "auto" picks CUDA when torch sees a device, else the CPU timer."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device {device!r}: use auto, cpu or cuda")
    if device == "cpu":
        return CpuTimer()
    import torch

    if torch.cuda.is_available():
        return CudaTimer(use_graph=cuda_graph)
    if device == "cuda":
        raise RuntimeError("--device cuda, but torch sees no CUDA device")
    return CpuTimer()


def first_nonfinite(result: Any, path: str = "result") -> str | None:
    """Where a kernel's result holds NaN or Inf (``"result[1]"``), or None when it is clean.

    Tensors, numbers and nested tuples/lists/dicts of them are checked; other values pass.
    """
    if result is None or isinstance(result, (bool, str, bytes)):
        return None
    if isinstance(result, (int, float)):
        return None if math.isfinite(result) else path
    if isinstance(result, Mapping):
        for key, value in result.items():
            found = first_nonfinite(value, f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(result, (tuple, list)):
        for index, value in enumerate(result):
            found = first_nonfinite(value, f"{path}[{index}]")
            if found:
                return found
        return None
    is_floating = getattr(result, "is_floating_point", None)
    if callable(is_floating):
        import torch

        if (is_floating() or result.is_complex()) and not bool(torch.isfinite(result).all()):
            return path
    return None


def result_device(result: Any) -> str | None:
    """"cuda" if the result holds a CUDA tensor, "cpu" if it holds only CPU tensors, None if it
    holds no tensor (a kernel that writes into a preallocated output and returns nothing)."""
    found: str | None = None
    stack = [result]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        elif hasattr(item, "is_cuda") and hasattr(item, "device"):
            if item.is_cuda:
                return "cuda"
            found = "cpu"
    return found
