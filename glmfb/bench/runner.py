"""Loading kernels from factories and timing them: warm-up, calibration, ABBA blocks.

Factory contract: ``factory(shape, **args)`` returns a zero-argument callable that
runs the kernel once on inputs it has already allocated. The runner calls the factory once per
*input set* (``input_sets``, default 4) and rotates over the callables, so a small shape is not
flattered by inputs that stay hot in cache. If the factory has a parameter named ``seed`` that
the user did not set, input set ``i`` gets ``seed=i`` (distinct data); otherwise each call is
expected to allocate fresh inputs.

A kernel's result is checked for NaN/Inf on every warm-up call and on the last call of every
timed sample; a kernel that raises or returns a non-finite value stops the measurement with
:class:`~glmfb.errors.TargetFailed`, which the host turns into an error verdict (never a pass).
"""

from __future__ import annotations

import inspect
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from glmfb.bench.timers import Kernel, Loop, Timer, first_nonfinite
from glmfb.errors import TargetFailed
from glmfb.targets import Target
from glmfb.units import format_shape


@dataclass
class Side:
    """One side of a comparison for one shape: its kernels (one per input set) and labels."""

    label: str  # "baseline" / "candidate"
    ref: str
    kernel_name: str
    kernels: list[Kernel]
    flops_per_call: float | None = None
    bytes_per_call: float | None = None
    calls_checked: int = 0


def kernel_name(ref: str) -> str:
    """The attribute part of a target reference: ``a/b.py:gated_norm_tiled`` -> ``gated_norm_tiled``."""
    return ref.rpartition(":")[2] or ref


def _declared(kernel: Kernel, *names: str) -> float | None:
    for name in names:
        value = getattr(kernel, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def load_side(label: str, target: Target, shape: tuple[int, ...], input_sets: int) -> Side:
    """Resolve the target, call its factory once per input set, check what comes back."""
    factory = target.load()
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}  # type: ignore[assignment]
    pass_seed = "seed" in parameters and "seed" not in target.args
    kernels: list[Kernel] = []
    shape_text = format_shape(shape)
    for index in range(input_sets):
        args: dict[str, Any] = dict(target.args)
        if pass_seed:
            args["seed"] = index
        try:
            kernel = factory(shape, **args)
        except (Exception, SystemExit) as exc:  # a target that exits is a failed target
            raise TargetFailed(label, f"in its factory {target.ref} for shape {shape_text}", exc) from exc
        if not callable(kernel):
            raise TargetFailed(label, f"in its factory {target.ref}", TypeError(
                f"it returned a {type(kernel).__name__}, not a zero-argument callable that runs the "
                "kernel once on inputs allocated in the factory"))
        kernels.append(kernel)
    first = kernels[0]
    return Side(
        label=label,
        ref=target.ref,
        kernel_name=kernel_name(target.ref),
        kernels=kernels,
        flops_per_call=_declared(first, "flops_per_call", "flops"),
        bytes_per_call=_declared(first, "bytes_per_call", "bytes_moved"),
    )


def check_result(side: Side, result: Any, call: str) -> None:
    where = first_nonfinite(result)
    if where is not None:
        raise TargetFailed(side.label, f"on {call}", ValueError(
            f"the kernel {side.kernel_name} returned NaN or Inf in {where}; a kernel that returns "
            "non-finite values cannot be benchmarked"))


def call_checked(side: Side, kernel: Kernel, call: str) -> Any:
    try:
        result = kernel()
    except (Exception, SystemExit) as exc:
        raise TargetFailed(side.label, f"in the kernel {side.kernel_name} on {call}", exc) from exc
    check_result(side, result, call)
    side.calls_checked += 1
    return result


def warm_up(side: Side, *, min_calls: int = 3, min_s: float = 0.05, max_s: float = 2.0) -> float:
    """Call every input set at least ``min_calls`` times and for at least ``min_s`` seconds,
    checking each result. Returns the fastest single call seen, in seconds."""
    fastest = math.inf
    started = time.perf_counter()
    rounds = 0
    while True:
        for index, kernel in enumerate(side.kernels):
            begin = time.perf_counter()
            call_checked(side, kernel, f"warm-up call {rounds + 1} of input set {index}")
            fastest = min(fastest, time.perf_counter() - begin)
        rounds += 1
        elapsed = time.perf_counter() - started
        if (rounds >= min_calls and elapsed >= min_s) or elapsed >= max_s:
            return fastest


def calls_per_sample(per_call_s: float, sample_s: float, max_calls: int = 1_000_000) -> int:
    """Calls per timed sample so one sample lasts about ``sample_s``."""
    if per_call_s <= 0 or not math.isfinite(per_call_s):
        return max_calls
    return max(1, min(max_calls, math.ceil(sample_s / per_call_s)))


def calibrate(timer: Timer, sides: list[Side], sample_s: float) -> int:
    """Calls per sample, the same for every side, chosen so that the *fastest* side's sample
    lasts at least ``sample_s`` (far above timer resolution)."""
    per_call = math.inf
    for side in sides:
        calls = 1
        while True:
            elapsed, result = timer.measure(timer.prepare(side.kernels, calls))
            check_result(side, result, f"calibration ({calls} calls)")
            if elapsed >= sample_s / 8 or calls >= 1 << 20:
                per_call = min(per_call, elapsed / calls)
                break
            calls *= 4
    return calls_per_sample(per_call, sample_s)


@dataclass
class Blocks:
    """Per-call seconds of each side, one value per ABBA block (the faster of its two
    samples), plus every raw sample in the order it was taken."""

    baseline: list[float] = field(default_factory=list)
    candidate: list[float] = field(default_factory=list)
    raw: list[tuple[str, float]] = field(default_factory=list)
    elapsed_s: float = 0.0

    def __len__(self) -> int:
        return len(self.baseline)

    @property
    def blocks_per_s(self) -> float:
        return len(self) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def samples_of(self, label: str) -> list[float]:
        return [value for side, value in self.raw if side == label]


class InterleavedRunner:
    """Both sides in one process, in randomized balanced ABBA / BAAB blocks."""

    def __init__(
        self, timer: Timer, loops: Mapping[str, Loop], sides: Mapping[str, Side], seed: int = 0
    ) -> None:
        self.timer = timer
        self.loops = loops
        self.sides = sides
        self._random = random.Random(seed)
        self._pending: list[str] = []

    def _next_pattern(self) -> str:
        if not self._pending:  # each pair of blocks holds one ABBA and one BAAB, order random
            self._pending = ["ABBA", "BAAB"]
            self._random.shuffle(self._pending)
        return self._pending.pop()

    def _sample(self, label: str) -> float:
        loop = self.loops[label]
        elapsed, result = self.timer.measure(loop)
        check_result(self.sides[label], result, "a timed call")
        return elapsed / loop.calls

    def run(
        self, blocks: Blocks, until_blocks: int, deadline: float,
        names: tuple[str, str] = ("baseline", "candidate"),
    ) -> None:
        """Add blocks until there are ``until_blocks`` or ``deadline`` (perf_counter) passes."""
        first, second = names
        started = time.perf_counter()
        while len(blocks) < until_blocks and time.perf_counter() < deadline:
            times: dict[str, list[float]] = {first: [], second: []}
            for letter in self._next_pattern():
                label = first if letter == "A" else second
                value = self._sample(label)
                times[label].append(value)
                blocks.raw.append((label, value))
            # The faster of each side's two samples: on a shared host noise only ever adds
            # time (preemption, a neighbour's burst), and it rarely hits both samples.
            blocks.baseline.append(min(times[first]))
            blocks.candidate.append(min(times[second]))
        blocks.elapsed_s += time.perf_counter() - started


def run_single(timer: Timer, loop: Loop, side: Side, samples: int, deadline: float) -> list[float]:
    """Samples of one side alone (``--save`` of a single target)."""
    values: list[float] = []
    while len(values) < samples and time.perf_counter() < deadline:
        elapsed, result = timer.measure(loop)
        check_result(side, result, "a timed call")
        values.append(elapsed / loop.calls)
    return values


def measure_callable(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of ``repeats`` calls (for ceilings)."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
