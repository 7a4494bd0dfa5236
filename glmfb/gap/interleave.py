"""Interleaved A/B measurement of two iteration callables in one process, on the shared
measurement core (:mod:`glmfb.core.measure`).

Each side is built several times (``repeats / 8``, 6 to 12; independent instances: a
build's own weights, buffers, threads), so the interval sees the variance between builds
instead of mistaking one build's luck for a gap. The pairs (baseline build ``j``, candidate build ``j``) run in
rounds: every round runs one ``AB`` or ``BA`` block on every pair (alternating per pair), so
drift and bursts of host load fall on both sides alike. The gap is the mean over pairs of
each pair's median ``log(candidate / baseline)`` iteration time, as ``exp(.) - 1``, with a t
interval over pairs (a random-effects interval; see :mod:`glmfb.core.measure.intervals`). The
interval is looked at on a fixed schedule at levels that spend the overall error (5%) over
the looks (:mod:`glmfb.core.measure.sequential`), so stopping early does not inflate it; the loop
stops once the gap is settled (fail, or the whole interval below the threshold) or when the
budget or ``repeats`` (iterations a side) runs out.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from glmfb.contract.errors import TargetFailed
from glmfb.core.measure import Arm, Comparison, Look, Pair, Settings, compare
from glmfb.core.measure.hostload import HostLoad, HostLoadMeter
from glmfb.core.measure.stats import Decision, Estimate, decide
from glmfb.gap.config import GapConfig

BYTES_SUFFIX = "_bytes"
MIN_ALLOCATIONS, MAX_ALLOCATIONS = 6, 12  # builds per side
ROUNDS_PER_BUILD = 8  # builds per side = repeats / this, within the bounds above
STATISTIC = ("mean over independent build pairs of the median log ratio of interleaved "
             "iteration times, t interval over pairs (random effects), alpha spent over looks")

Timer = Callable[[Callable[[], Any]], tuple[float, Any]]


@dataclass
class SideSamples:
    """Wall times and per-iteration phase dicts of one side (all builds, in the order run),
    and which build each iteration ran on."""

    label: str
    times_s: list[float] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)
    builds: list[int] = field(default_factory=list)

    def record(self, elapsed_s: float, result: Any, build: int = 0) -> None:
        self.times_s.append(elapsed_s)
        self.phases.append(phase_dict(result))
        self.builds.append(build)


@dataclass(frozen=True)
class Measurement:
    baseline: SideSamples
    candidate: SideSamples
    estimate: Estimate
    decision: Decision
    stopped_by: str  # "decided" | "repeats" | "budget"
    elapsed_s: float
    allocations: int = 1
    looks: tuple[Look, ...] = ()
    rounds: int = 0
    host_load: HostLoad | None = None  # the rest of the host over the interleaved iterations

    def evidence(self) -> dict[str, Any]:
        """What the measurement adds to the verdict's ``gap`` evidence."""
        final = self.looks[-1] if self.looks else None
        return {
            "statistic": STATISTIC,
            "allocations_per_side": self.allocations,
            "rounds": self.rounds,
            "look_levels": tuple(round(look.confidence, 5) for look in self.looks),
            "df": final.interval.df if final is not None else None,
            "between_allocation_sd": final.interval.between_sd if final is not None else None,
            "within_allocation_sd": final.interval.within_sd if final is not None else None,
        }


def phase_dict(result: Any) -> dict[str, float]:
    """The numeric entries of what an iteration returned (anything else is ignored)."""
    if not isinstance(result, Mapping):
        return {}
    phases: dict[str, float] = {}
    for key, value in result.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            phases[str(key)] = float(value)
    return phases


def gap_passes(estimate: Estimate, threshold: float) -> bool:
    """A gap passes when its whole interval lies below the threshold (faster is fine too)."""
    return estimate.high < threshold


def settled(estimate: Estimate, threshold: float) -> bool:
    return decide(estimate, threshold) is Decision.REGRESSION or gap_passes(estimate, threshold)


def wall_timer(function: Callable[[], Any]) -> tuple[float, Any]:
    """Wall time of one call (``time.perf_counter``) and its result."""
    started = time.perf_counter()
    result = function()
    return time.perf_counter() - started, result


def call_side(side: str, function: Callable[[], Any], stage: str, timer: Timer = wall_timer) -> tuple[float, Any]:
    try:
        return timer(function)
    except (Exception, SystemExit) as exc:  # a target that exits is a failed target
        raise TargetFailed(side, stage, exc) from exc


def _close(side: Any) -> None:
    close = getattr(side, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):  # closing must not hide the verdict
            close()


def close_all(instances: Sequence[Any]) -> None:
    """Close every build (its ``close()``, when it has one) at once, each in a thread of its
    own, and wait for all: a build's close waits for what it started to end (the bundled
    scenario's receiver process exits), so closing 12 builds one after another adds up those
    waits (5.3 s measured), and at once they overlap. After the measurement, so no timing
    sees it; a close that fails is ignored, as one at a time."""
    if len(instances) <= 1:
        for instance in instances:
            _close(instance)
        return
    threads = [threading.Thread(target=_close, args=(instance,), name="glmfb-gap-close", daemon=True)
               for instance in instances]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure(
    config: GapConfig,
    baseline: Callable[[], Any],
    candidate: Callable[[], Any],
    progress: Callable[[str], None] = lambda message: None,
    *,
    build: tuple[Callable[[], Callable[[], Any]], Callable[[], Callable[[], Any]]] | None = None,
    allocations: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    timer: Timer = wall_timer,
) -> Measurement:
    """Run both sides interleaved until the gap settles or the limits are reached.

    ``baseline`` and ``candidate`` are the first builds; ``build`` makes the further ones
    (``allocations`` per side in all, by default ``repeats / 8`` within 6 to 12, so every
    build pair gets about 8 rounds; they are closed here, the first ones by the caller).
    Without ``build`` the first builds are used for every pair, and the interval can then not
    see the variance between builds (the evidence says 1 allocation per side).
    """
    started = clock()
    functions: dict[str, list[Callable[[], Any]]] = {"baseline": [baseline], "candidate": [candidate]}
    extra: list[Any] = []
    if allocations is None:
        allocations = min(MAX_ALLOCATIONS, max(MIN_ALLOCATIONS, config.repeats // ROUNDS_PER_BUILD))
    count = max(2, allocations)
    try:
        for index in range(config.warmup):
            progress(f"warm-up {index + 1}/{config.warmup}")
            call_side("baseline", baseline, f"in warm-up iteration {index + 1}", timer)
            call_side("candidate", candidate, f"in warm-up iteration {index + 1}", timer)
        if build is not None:
            for j in range(1, count):
                progress(f"building allocation {j + 1} of {count} a side")
                order = (0, 1) if j % 2 == 0 else (1, 0)  # which side is built first alternates
                for side_index in order:
                    label = ("baseline", "candidate")[side_index]
                    instance = build[side_index]()
                    extra.append(instance)
                    functions[label].append(instance)
                    if config.warmup:
                        call_side(label, instance, f"in the warm-up of build {j + 1}", timer)
        return _measure(config, functions, progress, started, clock, timer, build is not None)
    finally:
        close_all(extra)


def _measure(
    config: GapConfig, functions: Mapping[str, list[Callable[[], Any]]],
    progress: Callable[[str], None], started: float, clock: Callable[[], float], timer: Timer,
    distinct: bool,
) -> Measurement:
    sides = {"baseline": SideSamples("baseline"), "candidate": SideSamples("candidate")}
    builds = len(functions["baseline"])
    pairs_count = max(builds, 2)

    def arm(label: str, pair: int) -> Arm:
        instances = functions[label]
        build = pair % len(instances)
        function = instances[build]
        done = [0]
        where = f" of build {build + 1} of {builds}" if builds > 1 else ""

        def sample() -> float:
            done[0] += 1
            elapsed_s, result = call_side(label, function, f"in iteration {done[0]}{where}", timer)
            sides[label].record(elapsed_s, result, build)
            return elapsed_s

        return Arm(label, pair, sample)

    pairs = [Pair("ab", j, arm("baseline", j), arm("candidate", j)) for j in range(pairs_count)]
    remaining = max(config.budget_s - (clock() - started), 0.1 * config.budget_s)
    settings = Settings(
        threshold=config.threshold, budget_s=remaining, pattern="AB", reduce="mean",
        min_blocks_per_pair=1, max_rounds=max(1, config.repeats // pairs_count), min_rounds=1,
        stop=lambda estimate, _decision: settled(estimate, config.threshold),
        first_look_rounds=max(1, math.ceil(config.min_repeats / pairs_count)),
    )
    meter = HostLoadMeter()
    comparison = compare(pairs, settings, clock, progress)
    return _result(config, comparison, sides, clock() - started, len(functions["baseline"]) if distinct else 1,
                   meter.stop())


def _result(
    config: GapConfig, comparison: Comparison, sides: Mapping[str, SideSamples], elapsed_s: float,
    allocations: int, host_load: HostLoad | None = None,
) -> Measurement:
    final = comparison.final
    if final is not None:
        estimate = final.interval.estimate
    else:  # not even one round: no interval; an uninformative one keeps the verdict inconclusive
        estimate = Estimate(0.0, -1.0, 1e6, 0.95)
    return Measurement(
        baseline=sides["baseline"], candidate=sides["candidate"], estimate=estimate,
        decision=decide(estimate, config.threshold), stopped_by=comparison.stopped_by,
        elapsed_s=elapsed_s, allocations=allocations, looks=tuple(comparison.looks),
        rounds=comparison.rounds, host_load=host_load,
    )
