"""Precision and recall of glmfb's change points beside ruptures' defaults on point values and
a per-run threshold gate, on synthetic series with noise as this machine produces it.

The noise: a small numpy kernel (a sort of 2,048 float64 values: one thread, no BLAS pool
to fight over) timed in ``--runs`` runs of 48 samples (each sample a batch of 20 calls); each run's value is its batch-means statistic, as
``glmfb bench`` takes one run's (``glmfb.core.measure.intervals.batch_means``), with its 95% t
interval. The runs' relative deviations from their median, each with its own interval, are
the noise pool: a synthetic run draws one (seeded, with replacement, so the pool's drift over
time is not kept) and scales it onto the planted level.

The series, ``--per-kind`` of each, 30 runs: a step of +3%, +8% or -5% at a random run in
8..22; a creep of +1% a run over 10 runs (then flat at +10%); spikes (two single runs +30%,
which must not count); pure noise. The methods, on the same series:

- glmfb: ``glmfb.workflows.history.changepoints.change_points`` with the runs' intervals (defaults:
  three runs a segment, alpha 1%, the permutation test); also with the t distribution's
  p-value alone (Otava's test) and on the point values alone (no intervals);
- ruptures Pelt (least squares) with a BIC penalty ``2 sigma^2 log n`` (sigma from the
  successive differences), at ruptures' defaults (``min_size=2, jump=5``) and at ``jump=1``;
- a per-run gate: a run more than 5% from the run before is flagged.

A detected point is right within +-1 run of a planted step; for the creep, anywhere from the
run before the ramp to its last run. Precision counts every detection on every series;
"false alarms" is the share of noise (and of spike) series with any detection. "newest worse"
is what ``glmfb history --check`` reads on the creep: the share of creep series whose last
segment's level is more than 5% above the segment before its run of worsening segments.

    python benchmarks/changepoints.py [--per-kind 40] [--runs 150] [--seed 0]
    python benchmarks/changepoints.py --smoke                     # a tiny size, for CI
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from glmfb.core.measure.intervals import batch_means
from glmfb.core.measure.tdist import t_quantile
from glmfb.workflows.history.changepoints import Observation, change_points

RUNS_PER_SERIES = 30
STEPS = {"+3%": 0.03, "+8%": 0.08, "-5%": -0.05}
CREEP = (0.01, 10)  # +1% a run over 10 runs
SPIKE = 0.30
GATE = 0.05
CHECK = 0.05  # "newest worse": the last segment this much above the one before


@dataclass(frozen=True)
class Noise:
    """One measured run: its relative deviation from the runs' median and its interval's
    relative ends (value x (1 + low), value x (1 + high))."""

    deviation: float
    low: float
    high: float


@dataclass(frozen=True)
class Series:
    kind: str
    runs: list[Observation]
    truth: list[int]  # planted steps (the first run of the new level)
    span: tuple[int, int] | None = None  # the creep's runs [start, stop)


def measure_noise(runs: int, seed: int) -> list[Noise]:
    """``runs`` runs of a small sort, each with its batch-means value and interval."""
    import numpy as np

    values = np.random.default_rng(seed).standard_normal(2048)
    measured = []
    for _ in range(runs):
        samples = []
        for _ in range(48):
            start = time.perf_counter()
            for _ in range(20):
                np.sort(values)
            samples.append((time.perf_counter() - start) / 20)
        run = batch_means(samples)
        half = t_quantile(0.975, run.df) * run.se
        measured.append((math.exp(run.log_value), math.exp(run.log_value - half), math.exp(run.log_value + half)))
    middle = statistics.median(v for v, _, _ in measured)
    return [Noise(v / middle - 1.0, low / v - 1.0, high / v - 1.0) for v, low, high in measured]


def make_series(kind: str, pool: Sequence[Noise], rng: random.Random) -> Series:
    n = RUNS_PER_SERIES
    levels, truth, span = [1.0] * n, [], None
    if kind in STEPS:
        at = rng.randint(8, 22)
        levels = [1.0 if i < at else 1.0 + STEPS[kind] for i in range(n)]
        truth = [at]
    elif kind == "creep":
        rate, length = CREEP
        start = rng.randint(8, 12)
        levels = [1.0 + rate * min(max(i - start + 1, 0), length) for i in range(n)]
        span = (start, start + length)
    elif kind == "spikes":
        for at in rng.sample(range(2, n - 2), 2):
            levels[at] = 1.0 + SPIKE
    runs = []
    for level in levels:
        noise = rng.choice(pool)
        value = level * (1.0 + noise.deviation)
        runs.append(Observation(value, value * (1.0 + noise.low), value * (1.0 + noise.high)))
    return Series(kind, runs, truth, span)


def glmfb_points(series: Series) -> list[int]:
    return [p.index for p in change_points(series.runs)]


def glmfb_t_only(series: Series) -> list[int]:
    return [p.index for p in change_points(series.runs, calibrated=False)]


def glmfb_values_only(series: Series) -> list[int]:
    return [p.index for p in change_points([Observation(o.value) for o in series.runs])]


def ruptures_pelt(jump: int) -> Callable[[Series], list[int]]:
    def detect(series: Series) -> list[int]:
        import numpy as np
        import ruptures

        values = np.array([o.value for o in series.runs])
        sigma = float(np.median(np.abs(np.diff(values)))) / (0.6745 * math.sqrt(2.0))
        penalty = 2.0 * sigma**2 * math.log(len(values))
        ends = ruptures.Pelt(model="l2", min_size=2, jump=jump).fit(values).predict(pen=penalty)
        return [int(e) for e in ends if e < len(values)]

    return detect


def per_run_gate(series: Series) -> list[int]:
    values = [o.value for o in series.runs]
    return [i for i in range(1, len(values)) if abs(values[i] / values[i - 1] - 1.0) > GATE]


METHODS: dict[str, Callable[[Series], list[int]]] = {
    "glmfb (intervals, permutation test)": glmfb_points,
    "glmfb, t p-value only (Otava's test)": glmfb_t_only,
    "glmfb, point values only": glmfb_values_only,
    "ruptures Pelt l2, BIC pen (defaults: jump=5)": ruptures_pelt(5),
    "ruptures Pelt l2, BIC pen, jump=1": ruptures_pelt(1),
    "per-run gate (5% vs the run before)": per_run_gate,
}


@dataclass
class Score:
    detections: int = 0
    right: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.found: dict[str, list[bool]] = {}
        self.alarms: dict[str, list[bool]] = {}
        self.newest_worse: list[bool] = []


def score(method: Callable[[Series], list[int]], all_series: Sequence[Series]) -> Score:
    result = Score()
    for series in all_series:
        start = time.perf_counter()
        points = method(series)
        result.seconds += time.perf_counter() - start
        result.detections += len(points)
        if series.span is not None:
            low, high = series.span[0] - 1, series.span[1] - 1
            inside = [p for p in points if low <= p <= high]
            result.right += len(inside)
            result.found.setdefault(series.kind, []).append(bool(inside))
            result.newest_worse.append(_newest_worse(series, points))
        elif series.truth:
            for truth in series.truth:
                hit = [p for p in points if abs(p - truth) <= 1]
                result.right += min(len(hit), 1)
                result.found.setdefault(series.kind, []).append(bool(hit))
        else:
            result.alarms.setdefault(series.kind, []).append(bool(points))
    return result


def _newest_worse(series: Series, points: Sequence[int]) -> bool:
    """What ``glmfb history --check`` reads (glmfb.workflows.history.series.Series.check): whether the
    last segment's mean is more than CHECK above the mean of the segment before its unbroken
    run of worsening segments began (the one before, unless that one worsened too)."""
    if not points:
        return False
    bounds = [0, *sorted(points), len(series.runs)]
    levels = [statistics.fmean(o.value for o in series.runs[a:b]) for a, b in itertools.pairwise(bounds)]
    start = len(levels) - 2
    if levels[-1] <= levels[start]:
        return False  # the newest change is an improvement
    while start > 0 and levels[start] > levels[start - 1]:
        start -= 1
    return levels[-1] > (1.0 + CHECK) * levels[start]


def share(flags: Sequence[bool]) -> str:
    return f"{sum(flags) / len(flags):.2f}" if flags else "-"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-kind", type=int, default=40, help="series of each kind")
    parser.add_argument("--runs", type=int, default=150, help="measured runs in the noise pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="a tiny size (CI runs every benchmark)")
    args = parser.parse_args(argv)
    per_kind, measured_runs = (2, 30) if args.smoke else (args.per_kind, args.runs)
    if args.smoke:
        print("smoke run (--smoke): 2 series of each kind over 30 measured runs; its figures are not the benchmark's")

    start = time.perf_counter()
    pool = measure_noise(measured_runs, args.seed)
    deviations = [n.deviation for n in pool]
    mad = statistics.median(abs(d - statistics.median(deviations)) for d in deviations) * 1.4826
    halves = [(n.high - n.low) / 2.0 for n in pool]
    print(f"noise: {len(pool)} runs of a 2,048-value sort in {time.perf_counter() - start:.1f} s; "
          f"run-to-run scatter {statistics.stdev(deviations):.2%} (sd), {mad:.2%} (MAD x 1.4826); "
          f"per-run 95% interval +-{statistics.median(halves):.2%} (median half-width)")

    import ruptures  # noqa: F401  (imported before the clock of the first method starts)

    rng = random.Random(args.seed)
    kinds = [*STEPS, "creep", "spikes", "noise"]
    all_series = [make_series(kind, pool, rng) for kind in kinds for _ in range(per_kind)]
    print(f"{len(all_series)} series of {RUNS_PER_SERIES} runs: {per_kind} of each kind\n")

    header = ["method", "precision", *(f"recall {k}" for k in STEPS), "creep found", "newest worse",
              "false alarms: noise", "spikes", "ms/series"]
    rows = []
    for name, method in METHODS.items():
        s = score(method, all_series)
        rows.append([name, f"{s.right / s.detections:.2f}" if s.detections else "-",
                     *(share(s.found.get(k, [])) for k in STEPS), share(s.found.get("creep", [])),
                     share(s.newest_worse), share(s.alarms.get("noise", [])),
                     share(s.alarms.get("spikes", [])), f"{1000 * s.seconds / len(all_series):.1f}"])
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n(seed {args.seed}; {time.perf_counter() - start:.1f} s in all; load average "
          f"{' '.join(Path('/proc/loadavg').read_text().split()[:3]) if Path('/proc/loadavg').exists() else '?'})")


if __name__ == "__main__":
    main()
