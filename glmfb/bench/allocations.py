"""Loading kernels from factories and timing them: allocations, warm-up, calibration, and the
allocation pairs that :func:`glmfb.core.measure.compare` runs in interleaved ABBA blocks.

Factory contract: ``factory(shape, **args)`` returns a zero-argument callable that runs the
kernel once on inputs it has already allocated. One *allocation* of a side is ``input_sets``
factory calls (default 4) whose callables the timed samples rotate over (a sample goes on with
the set after the one the last sample ended on, :mod:`glmfb.bench.timers`), so a small shape is
not flattered by inputs that stay hot in cache. A comparison uses several independent
allocations per side (:func:`prepare_pairs`): where a side's buffers land (alignment, cache
sets, pages) changes its speed, and only several allocations per side let the interval see
that variance instead of mistaking one allocation's luck for an effect. If the factory has a
parameter named ``seed`` that the user did not set, input set ``i`` of allocation ``j`` gets
``seed = j * input_sets + i``, the same on both sides of a pair (distinct data, paired);
otherwise each call is expected to allocate fresh inputs.

A kernel's result is checked for NaN/Inf on every warm-up call and on the last call of every
timed sample; a kernel that raises or returns a non-finite value stops the measurement with
:class:`~glmfb.contract.errors.TargetFailed`, which the host turns into an error verdict (never a pass).
"""

from __future__ import annotations

import inspect
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from glmfb.bench.config import kernel_name
from glmfb.bench.timers import Kernel, Loop, Timer, first_nonfinite
from glmfb.contract.errors import TargetFailed
from glmfb.contract.units import format_shape
from glmfb.core.measure.loop import Arm, Comparison, Pair
from glmfb.core.targets import Target

if TYPE_CHECKING:
    from glmfb.bench.reference import Reference


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


def _declared(kernel: Kernel, *names: str) -> float | None:
    for name in names:
        value = getattr(kernel, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def load_side(
    label: str, target: Target, shape: tuple[int, ...], input_sets: int, seed_base: int = 0
) -> Side:
    """Resolve the target, call its factory once per input set (seeds from ``seed_base``),
    check what comes back."""
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
            args["seed"] = seed_base + index
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


def per_call_s(run: Callable[[int], float], sample_s: float) -> float:
    """Seconds per call from ``run(calls)`` (the seconds that many calls took), with calls x4
    until a run lasts an eighth of ``sample_s`` (or 2^20 calls)."""
    calls = 1
    while True:
        elapsed = run(calls)
        if elapsed >= sample_s / 8 or calls >= 1 << 20:
            return elapsed / calls
        calls *= 4


def calibrate(timer: Timer, sides: list[Side], sample_s: float) -> int:
    """Calls per sample, the same for every side, chosen so that the *fastest* side's sample
    lasts at least ``sample_s`` (far above timer resolution). One target alone."""
    return calls_per_sample(min(_per_call(timer, side, sample_s) for side in sides), sample_s)


def calibrate_each(timer: Timer, sides: list[Side], sample_s: float) -> dict[str, int]:
    """Calls per sample of each side: whole rotations over its input sets, as many as make its
    sample last about as long as the other side's, and at least ``sample_s``.

    A pair's sides get the same sample length, not the same calls: with equal calls a candidate
    doing k times the work takes samples k times as long, so a burst of host load (on a shared
    host, milliseconds long) covers both of its adjacent samples in an ABBA block (``BB``) far
    more often than the baseline's, and the block's faster-of-two no longer removes it. And each
    sample is whole rotations, so that it times every input set alike: a sample of one call
    times one set, and the faster of two such samples picks the luckier set (where its buffers
    landed), which flattered the side with fewer calls. Each block's effect is a ratio of
    per-call times, so the calls may differ."""
    per_call = {side.label: math.inf for side in sides}
    for _ in range(2):  # the sides in turn, twice: the first pass after warm-up read 2-4x slow at times
        for side in sides:
            per_call[side.label] = min(per_call[side.label], _per_call(timer, side, sample_s, repeats=3))
    sets = {side.label: max(1, len(side.kernels)) for side in sides}
    lasts = max(sample_s, *(sets[label] * per_call[label] for label in per_call))
    return {label: sets[label] * max(1, round(calls_per_sample(per_call[label], lasts) / sets[label]))
            for label in per_call}


def _per_call(timer: Timer, side: Side, sample_s: float, repeats: int = 1) -> float:
    """Seconds per call of ``side`` (:func:`per_call_s`); with ``repeats``, the fastest of that
    many runs of the calls it settled on (noise on a shared host only adds time, and one run
    that a burst hit gave a side 4x the other's calls per sample)."""
    def run(calls: int) -> float:
        return timed(timer, side, timer.prepare(side.kernels, calls), f"calibration ({calls} calls)")[0]

    first = per_call_s(run, sample_s)
    calls = calls_per_sample(first, sample_s / 8)
    return min([first, *(run(calls) / calls for _ in range(repeats - 1))])


@dataclass
class Blocks:
    """What a comparison measured, flattened: per-call seconds of each side per block (A/B
    pairs only, pair after pair), every raw sample in the order it was taken with the
    allocation it came from, and the measuring time."""

    baseline: list[float] = field(default_factory=list)
    candidate: list[float] = field(default_factory=list)
    raw: list[tuple[str, float]] = field(default_factory=list)
    elapsed_s: float = 0.0
    allocations: list[int] = field(default_factory=list)  # parallel to ``raw``

    def __len__(self) -> int:
        return len(self.baseline)

    @property
    def blocks_per_s(self) -> float:
        return len(self) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def samples_of(self, label: str) -> list[float]:
        return [value for side, value in self.raw if side == label]

    def allocations_of(self, label: str) -> list[int]:
        if len(self.allocations) != len(self.raw):
            return []
        return [a for (side, _), a in zip(self.raw, self.allocations, strict=True) if side == label]

    @classmethod
    def of(cls, comparison: Comparison, extra_s: float = 0.0) -> Blocks:
        """The A/B part of a comparison (A/A pairs are reported apart)."""
        blocks = cls(elapsed_s=comparison.elapsed_s + extra_s)
        for pair in comparison.ab:
            blocks.baseline.extend(pair.a_blocks)
            blocks.candidate.extend(pair.b_blocks)
        for sample in comparison.samples:
            if sample.kind == "ab":
                blocks.raw.append((sample.label, sample.value_s))
                blocks.allocations.append(sample.allocation)
        return blocks


# Allocation pairs per comparison: at least MIN_PAIRS (the t interval over pairs has K-1
# degrees of freedom, and below 6 its quantiles at corrected levels grow fast), at most
# MAX_PAIRS (beyond that the interval narrows slowly and loading costs more).
MIN_PAIRS = 6
MAX_PAIRS = 24
TARGET_ROUNDS = 16  # rounds (one block on every pair) that a full budget should allow
MEMORY_SHARE = 0.25  # of the memory available, at most, for all allocations together
SETUP_SHARE = 0.3  # of the budget, at most, for loading and warming the extra allocations


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _memory_probe(device: str) -> tuple[Callable[[], int | None], int | None]:
    """A reading of the memory allocations live in (bytes in use) and what is still free."""
    if device == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info()
        return (lambda: int(torch.cuda.memory_allocated())), int(free)
    return _resident_bytes, _available_bytes()


@dataclass(frozen=True)
class PairPlan:
    """How many allocation pairs a comparison runs, and what limited it."""

    ab_pairs: int
    aa_pairs: int
    limited_by: str  # "budget", "memory", "setup" or "maximum"


def plan_pairs(
    budget_s: float, block_s: float, *, setup_s_per_pair: float = 0.0,
    bytes_per_pair: int | None = None, available_bytes: int | None = None,
    min_pairs: int = MIN_PAIRS, max_pairs: int = MAX_PAIRS, target_rounds: int = TARGET_ROUNDS,
    with_aa: bool = True, limit_setup: bool = True,
) -> PairPlan:
    """A/B pairs (and A/A pairs beside them, a quarter as many, at least 2; none without
    ``with_aa``) such that a full budget allows about ``target_rounds`` blocks on every pair,
    within memory and (with ``limit_setup``) the share of the budget loading may take."""

    def aa(ab: int) -> int:
        return max(2, ab // 4) if with_aa else 0

    fits = budget_s / (target_rounds * block_s) if block_s > 0 else math.inf
    ab = int(fits * 0.8)
    limited_by = "budget"
    if ab >= max_pairs:
        ab, limited_by = max_pairs, "maximum"
    ab = max(ab, min_pairs)
    if setup_s_per_pair > 0 and limit_setup:
        by_setup = int(SETUP_SHARE * budget_s / setup_s_per_pair * 0.8)
        if by_setup < ab:
            ab, limited_by = max(2, by_setup), "setup"
    if bytes_per_pair and available_bytes:
        by_memory = int(MEMORY_SHARE * available_bytes / bytes_per_pair * 0.8)
        if by_memory < ab:
            ab, limited_by = max(2, by_memory), "memory"
    return PairPlan(ab, aa(ab), limited_by)


@dataclass
class PairSetup:
    """The pairs of one shape's comparison, ready to run, and how they were set up."""

    pairs: list[Pair]
    calls_per_sample: int  # the baseline's (and the A/A pairs')
    baseline: Side  # the first allocation of each side: declared work, names
    candidate: Side
    plan: PairPlan
    input_sets: int
    setup_s: float  # loading and warming the allocations after the first pair
    bytes_per_allocation: int | None
    block_s: float  # one ABBA block, as calibrated
    candidate_calls_per_sample: int = 0  # the candidate's: each side's sample lasts about sample_s


def timed(timer: Timer, side: Side, loop: Loop, call: str) -> tuple[float, Any]:
    """One timed sample of ``loop``, its result checked; a kernel that raises (or exits) in it
    is the side's failure."""
    try:
        elapsed, result = timer.measure(loop)
    except (Exception, SystemExit) as exc:
        raise TargetFailed(side.label, f"in the kernel {side.kernel_name} on {call}", exc) from exc
    check_result(side, result, call)
    return elapsed, result


def _arm(timer: Timer, side: Side, loop: Loop, allocation: int) -> Arm:
    def sample() -> float:
        elapsed, _ = timed(timer, side, loop, "a timed call")
        return elapsed / loop.calls

    return Arm(side.label, allocation, sample)


def prepare_pairs(
    timer: Timer, baseline: Target, candidate: Target, shape: tuple[int, ...], *,
    input_sets: int, sample_s: float, budget_s: float, clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[str], None] | None = None, min_pairs: int = MIN_PAIRS, max_pairs: int = MAX_PAIRS,
    with_aa: bool = True, warm_calls: int = 0, limit_setup: bool = True,
) -> PairSetup:
    """Load, warm up and calibrate the first allocation of each side, plan the pairs
    (:func:`plan_pairs`), then load the other allocations: A/B pair ``j`` gets baseline and
    candidate allocations with the same seeds (which side is allocated first alternates, so
    allocation order is no systematic effect); each A/A pair gets two baseline allocations
    (none without ``with_aa``: a check that decides nothing needs no floor). ``limit_setup``:
    fewer pairs when loading them would take much of the budget (off: ``min_pairs`` at least,
    memory allowing). ``warm_calls``:
    untimed calls on its input set before every timed sample, so each sample starts with its
    inputs in cache (the hot check); without, a sample finds the cache as the samples before it
    left it."""
    read_memory, available = _memory_probe(timer.device)
    before = read_memory()
    began = clock()
    first = {"baseline": load_side("baseline", baseline, shape, input_sets, 0),
             "candidate": load_side("candidate", candidate, shape, input_sets, 0)}
    load_s = clock() - began
    after = read_memory()
    bytes_per_allocation = (
        max(1, (after - before) // 2) if before is not None and after is not None and after > before else None
    )
    for side in first.values():
        warm_up(side)
    calls = calibrate_each(timer, list(first.values()), sample_s)

    def prepare(label: str, kernels: list[Kernel]) -> Loop:
        if warm_calls:
            return timer.prepare(kernels, calls[label], warm=warm_calls)
        return timer.prepare(kernels, calls[label])

    loops = {label: prepare(label, side.kernels) for label, side in first.items()}
    sample_times = {label: timed(timer, first[label], loop, "a timed call")[0] for label, loop in loops.items()}
    block_s = 2.0 * sum(sample_times.values())
    per_call_s = max(sample_times[label] / calls[label] for label in sample_times)
    setup_per_pair = load_s + 4 * input_sets * per_call_s  # load, and two warm-up calls a set a side
    plan = plan_pairs(
        budget_s, block_s, setup_s_per_pair=setup_per_pair,
        bytes_per_pair=2 * bytes_per_allocation if bytes_per_allocation else None,
        available_bytes=available, min_pairs=min_pairs, max_pairs=max_pairs, with_aa=with_aa,
        limit_setup=limit_setup,
    )
    if progress is not None:
        progress(f"{plan.ab_pairs} allocation pairs and {plan.aa_pairs} A/A pairs ({plan.limited_by}), "
                 f"{calls['baseline']} and {calls['candidate']} calls per sample (baseline, candidate)")
    started_setup = clock()
    targets = {"baseline": baseline, "candidate": candidate}

    def allocate(label: str, seed_slot: int) -> Side:
        side = load_side(label, targets[label], shape, input_sets, seed_slot * input_sets)
        warm_up(side, min_calls=2, min_s=0.0)
        return side

    pairs: list[Pair] = [Pair("ab", 0, _arm(timer, first["baseline"], loops["baseline"], 0),
                              _arm(timer, first["candidate"], loops["candidate"], 0))]
    for j in range(1, plan.ab_pairs):
        order = ("baseline", "candidate") if j % 2 == 0 else ("candidate", "baseline")
        sides = {label: allocate(label, j) for label in order}
        pairs.append(Pair("ab", j, *(_arm(timer, sides[label], prepare(label, sides[label].kernels), j)
                                     for label in ("baseline", "candidate"))))
    for m in range(plan.aa_pairs):
        slot = plan.ab_pairs + m
        a, b = allocate("baseline", slot), allocate("baseline", slot)
        allocation = plan.ab_pairs + 2 * m
        pairs.append(Pair("aa", plan.ab_pairs + m,
                          _arm(timer, a, prepare("baseline", a.kernels), allocation),
                          _arm(timer, b, prepare("baseline", b.kernels), allocation + 1)))
    return PairSetup(pairs, calls["baseline"], first["baseline"], first["candidate"], plan, input_sets,
                     clock() - started_setup, bytes_per_allocation, block_s, calls["candidate"])


@dataclass
class SingleMeasurement:
    """One target measured alone (``--save``): samples in order, with their allocation."""

    side: Side
    calls_per_sample: int
    values: list[float]
    allocations: list[int]
    elapsed_s: float
    bytes_per_allocation: int | None = None  # resident-memory growth of the first allocation
    reference: list[float] = field(default_factory=list)  # the reference's seconds per call, after each sample


def measure_single(
    timer: Timer, target: Target, shape: tuple[int, ...], *, input_sets: int, sample_s: float,
    budget_s: float, allocations: int = MIN_PAIRS, clock: Callable[[], float] = time.perf_counter,
    reference: Reference | None = None,
) -> SingleMeasurement:
    """Samples of one side alone, rotating over ``allocations`` independent allocations, so
    the saved run's median averages over where the buffers landed. With ``reference``, a
    sample of it right after each of the kernel's, as a pair's two sides alternate
    (:mod:`glmfb.bench.reference`)."""
    read_memory, _available = _memory_probe(timer.device)
    before = read_memory()
    first = load_side("baseline", target, shape, input_sets, 0)
    after = read_memory()
    warm_up(first)
    calls = calibrate(timer, [first], sample_s)
    sides = [first]
    for j in range(1, allocations):
        side = load_side("baseline", target, shape, input_sets, j * input_sets)
        warm_up(side, min_calls=2, min_s=0.0)
        sides.append(side)
    loops = [timer.prepare(side.kernels, calls) for side in sides]
    values: list[float] = []
    owners: list[int] = []
    references: list[float] = []
    began = clock()
    deadline = began + budget_s
    while clock() < deadline:
        for index, (side, loop) in enumerate(zip(sides, loops, strict=True)):
            elapsed, _ = timed(timer, side, loop, "a timed call")
            values.append(elapsed / loop.calls)
            owners.append(index)
            if reference is not None:
                references.append(reference.sample())
    grown = after - before if before is not None and after is not None and after > before else None
    return SingleMeasurement(first, calls, values, owners, clock() - began, grown, references)


def measure_callable(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of ``repeats`` calls (for ceilings)."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
