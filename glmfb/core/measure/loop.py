"""The measurement loop shared by bench and gap: interleaved blocks over allocation pairs.

A comparison is run on **pairs**: pair ``j`` holds one allocation of the baseline (A) and one
of the candidate (B), each an independent instance (a fresh factory call with its own input
seed, or a fresh build of a gap target). A/A pairs (two allocations of the baseline) may run
beside them to estimate the floor the harness reads between identical code. Every *round*
visits every pair once, in a random order, and runs one *block* on it: ``ABBA`` or ``BAAB``
(bench; each pair alternates, starting at random) or ``AB`` / ``BA`` (gap, one sample a side).
A block's value per side is the faster (``reduce="min"``) or the mean of its samples, and the
block's effect is ``log(B / A)``: both sides ran within milliseconds of each other, so drift
and bursts of host noise cancel in it.

The loop looks at the interval (:func:`glmfb.core.measure.intervals.pair_interval`) at the planned
fractions of the budget, at the level :class:`~glmfb.core.measure.sequential.LookPlan` allows,
and stops when it decides or when the budget (or the round cap) is spent; the last look
then uses what alpha is left.

Nothing here reads a real clock or times anything: ``clock`` (seconds, monotonic) and each
allocation's ``sample`` (one timed sample, seconds per call) are injected, so the decisions
are unit-tested on scripted timings.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from glmfb.core.measure.intervals import Interval, pair_interval
from glmfb.core.measure.sequential import LookPlan, decide_with_floor
from glmfb.core.measure.stats import Decision, Estimate

Clock = Callable[[], float]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Arm:
    """One allocation of one side: ``sample()`` takes one timed sample, seconds per call."""

    label: str
    allocation: int
    sample: Callable[[], float]


@dataclass(frozen=True)
class Pair:
    """Two allocations compared block by block: ``kind`` "ab" (baseline, candidate) or "aa"
    (baseline, baseline: the A/A floor)."""

    kind: str
    index: int
    a: Arm
    b: Arm


@dataclass(frozen=True)
class Sample:
    """One timed sample in the order taken."""

    label: str
    allocation: int
    pair: int
    kind: str
    value_s: float


@dataclass
class PairData:
    """A pair's block values (per-call seconds of each side per block)."""

    pair: Pair
    a_blocks: list[float] = field(default_factory=list)
    b_blocks: list[float] = field(default_factory=list)

    @property
    def effects(self) -> list[float]:
        return [math.log(b) - math.log(a) for a, b in zip(self.a_blocks, self.b_blocks, strict=True)]

    def __len__(self) -> int:
        return len(self.a_blocks)


@dataclass(frozen=True)
class Look:
    """One look at the data: the interval at the look's level and what it decided."""

    number: int  # 1-based, counting only the looks performed
    fraction: float  # of the budget when it was made
    rounds: int
    blocks: int
    confidence: float
    interval: Interval
    decision: Decision
    aa: Interval | None
    floor: float


@dataclass(frozen=True)
class Settings:
    """How a comparison runs and decides."""

    threshold: float
    budget_s: float
    pattern: str = "ABBA"  # or "AB"
    reduce: str = "min"  # or "mean": a side's samples within one block
    plan: LookPlan = field(default_factory=LookPlan)
    min_blocks_per_pair: int = 2  # before a look counts
    max_rounds: int | None = None  # a cap on rounds (gap's repeats), besides the budget
    min_rounds: int = 0  # rounds always completed, budget or not
    first_look_rounds: int = 0  # no look before this many rounds (but the final one)
    seed: int = 0
    stop: Callable[[Estimate, Decision], bool] | None = None  # default: any decision

    def __post_init__(self) -> None:
        if self.pattern not in ("ABBA", "AB"):
            raise ValueError(f"pattern {self.pattern!r}: use ABBA or AB")
        if self.reduce not in ("min", "mean"):
            raise ValueError(f"reduce {self.reduce!r}: use min or mean")
        if not self.budget_s > 0:
            raise ValueError("the budget must be positive")

    def stops(self, estimate: Estimate, decision: Decision) -> bool:
        if self.stop is not None:
            return self.stop(estimate, decision)
        return decision is not Decision.UNDECIDED


@dataclass
class Comparison:
    """Everything a comparison measured, and its looks (the last one decides)."""

    pairs: list[PairData]
    samples: list[Sample]
    looks: list[Look]
    stopped_by: str  # "decided" | "budget" | "repeats"
    elapsed_s: float
    rounds: int

    @property
    def final(self) -> Look | None:
        return self.looks[-1] if self.looks else None

    @property
    def decision(self) -> Decision:
        return self.final.decision if self.final is not None else Decision.UNDECIDED

    @property
    def ab(self) -> list[PairData]:
        return [p for p in self.pairs if p.pair.kind == "ab"]

    @property
    def aa(self) -> list[PairData]:
        return [p for p in self.pairs if p.pair.kind == "aa"]

    @property
    def blocks(self) -> int:
        return sum(len(p) for p in self.ab)

    def samples_of(self, label: str, kind: str = "ab") -> list[float]:
        """Every sample of one side in the A/B pairs, in the order taken."""
        return [s.value_s for s in self.samples if s.label == label and s.kind == kind]

    def allocations_of(self, label: str, kind: str = "ab") -> list[int]:
        return [s.allocation for s in self.samples if s.label == label and s.kind == kind]


def _interval(pairs: Sequence[PairData], confidence: float, min_blocks: int) -> Interval | None:
    ready = [p.effects for p in pairs if len(p) >= min_blocks]
    if len(ready) < 2:
        return None
    return pair_interval(ready, confidence)


class _Blocks:
    """Runs one block on a pair, alternating its patterns."""

    def __init__(self, pattern: str, reduce: str, rng: random.Random) -> None:
        self.patterns = ("ABBA", "BAAB") if pattern == "ABBA" else ("AB", "BA")
        self.reduce = min if reduce == "min" else statistics.fmean
        self.next: dict[int, int] = {}
        self.rng = rng

    def run(self, data: PairData, samples: list[Sample]) -> None:
        pair = data.pair
        key = id(data)
        if key not in self.next:
            self.next[key] = self.rng.randrange(2)
        pattern = self.patterns[self.next[key]]
        self.next[key] ^= 1
        taken: dict[str, list[float]] = {"A": [], "B": []}
        for letter in pattern:
            arm = pair.a if letter == "A" else pair.b
            value = arm.sample()
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"a timed sample of the {arm.label} read {value!r} s")
            taken[letter].append(value)
            samples.append(Sample(arm.label, arm.allocation, pair.index, pair.kind, value))
        data.a_blocks.append(self.reduce(taken["A"]))
        data.b_blocks.append(self.reduce(taken["B"]))


def compare(
    pairs: Sequence[Pair], settings: Settings, clock: Clock, progress: Progress | None = None,
) -> Comparison:
    """Run rounds of blocks over ``pairs`` until a look decides or the budget is spent."""
    if not any(p.kind == "ab" for p in pairs):
        raise ValueError("a comparison needs at least one baseline/candidate pair")
    rng = random.Random(settings.seed)
    blocks = _Blocks(settings.pattern, settings.reduce, rng)
    data = [PairData(p) for p in pairs]
    ab = [d for d in data if d.pair.kind == "ab"]
    aa = [d for d in data if d.pair.kind == "aa"]
    samples: list[Sample] = []
    looks: list[Look] = []
    plan = settings.plan
    started = clock()
    deadline = started + settings.budget_s
    rounds = 0
    planned_done = 0  # planned looks passed (performed or skipped)
    spent = 0.0
    stopped_by = "budget"

    def fraction() -> float:
        by_time = (clock() - started) / settings.budget_s
        by_rounds = rounds / settings.max_rounds if settings.max_rounds else 0.0
        return max(by_time, by_rounds)

    def look(at: float, final: bool) -> Look | None:
        nonlocal spent
        level = 1.0 - (plan.alpha - spent) if final else plan.level(spent, at)
        interval = _interval(ab, level, settings.min_blocks_per_pair)
        if interval is None:
            return None
        aa_interval = _interval(aa, level, settings.min_blocks_per_pair)
        floor = abs(aa_interval.estimate.value) if aa_interval is not None else 0.0
        estimate = interval.estimate
        decision = decide_with_floor(estimate, settings.threshold, floor)
        spent = plan.alpha if final else plan.spent(at)
        made = Look(len(looks) + 1, min(at, 1.0), rounds, sum(len(d) for d in ab), level, interval,
                    decision, aa_interval, floor)
        looks.append(made)
        if progress is not None:
            progress(f"{made.blocks} blocks on {interval.units} pairs, {estimate.value:+.1%} "
                     f"[{estimate.low:+.1%}, {estimate.high:+.1%}] at {level:.2%}: {decision.value}")
        return made

    while True:
        order = list(data)
        rng.shuffle(order)
        out_of_time = False
        for pair in order:
            if rounds >= settings.min_rounds and clock() >= deadline:
                out_of_time = True
                break
            blocks.run(pair, samples)
        if not out_of_time:
            rounds += 1
        capped = settings.max_rounds is not None and rounds >= settings.max_rounds
        at = fraction()
        if out_of_time or capped or at >= 1.0:
            final = look(1.0, final=True)
            if final is not None and settings.stops(final.interval.estimate, final.decision):
                stopped_by = "decided"
            else:
                stopped_by = "repeats" if capped and not out_of_time else "budget"
            break
        due = plan.due(planned_done, at)
        if due > planned_done and rounds >= settings.first_look_rounds:
            planned_done = due
            if due < plan.looks:  # the last planned look is the final one, above
                made = look(plan.fractions[due - 1], final=False)
                if made is not None and settings.stops(made.interval.estimate, made.decision):
                    stopped_by = "decided"
                    break
    return Comparison(data, samples, looks, stopped_by, clock() - started, rounds)
