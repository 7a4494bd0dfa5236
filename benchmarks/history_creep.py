"""A creep on a busy host: ``glmfb history --check`` on 15-commit series that grow 1%, 1.5% or 2%
a commit, against flat ones, with the noise of a quiet host and of one beside a busy process.

The noise: a small numpy kernel (a sort of 2,048 float64 values) timed in ``--runs`` runs of 48
samples (each a batch of 20 calls); each run's value is its batch-means statistic with its 95%
t interval, as ``glmfb bench`` takes one run's (as ``benchmarks/changepoints.py`` measures it).
Measured twice, in alternating blocks of 10 runs so that both see the same background load:
as the host is ("quiet"), and beside one process that keeps a core busy (``python -c "while
True: pass"``, started and stopped here: "busy"). Each pool is the runs' relative deviations
from their median, each with its own interval. A third pool is Gaussian with the figures of
docs/history.md's first measured pool (sd 1.29%, run intervals +-1.80%): a quiet host without
heavy tails. ``--save``/``--load`` keep the measured pools, so a table can be recomputed.

The series, ``--series`` of each, 15 runs (commits 0..14) drawn from one pool (seeded, with
replacement): flat, and a creep of +1%, +1.5% and +2% a commit (level 1 + rate x commit: +14%,
+21% and +28% at the last). Each is judged as ``glmfb history --check --threshold 5%`` judges
it (``Series.judge``: the step test, then the trend of the newest runs), and as the step test
alone judged it before (``Series.check``). A time series: higher is worse, by ratio.

``--real`` adds one measured series each way: 15 "commits" of the same kernel whose work grows
1.5% a commit (the calls per sample scaled by 1 + 0.015 x commit, the time per call reported),
timed in order, quiet and then beside the busy process.

    python benchmarks/history_creep.py [--series 200] [--runs 150] [--seed 0] [--real] [--save F | --load F]
    python benchmarks/history_creep.py --smoke                     # a tiny size, for CI
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from glmfb.core.measure.intervals import batch_means
from glmfb.core.measure.tdist import t_quantile
from glmfb.workflows.history.series import CANNOT_TELL, PASS, REGRESSED, Series, build_series
from glmfb.workflows.history.store import Record

COMMITS = 15
RATES = (0.0, 0.01, 0.015, 0.02)
THRESHOLD = 0.05
DOCS_SCATTER, DOCS_HALF = 0.0129, 0.018  # docs/history.md's first measured pool: MAD x 1.4826, median half-width


def measure(runs: int, seed: int, rate: float = 0.0) -> list[tuple[float, float, float]]:
    """``runs`` runs of the sort, each (value, low, high) in seconds a call; with ``rate``, run
    ``i`` does ``1 + rate x i`` times the work (a creep a commit)."""
    import numpy as np

    values = np.random.default_rng(seed).standard_normal(2048)
    measured = []
    for run in range(runs):
        calls = round(20 * (1.0 + rate * run)) if rate else 20
        samples = []
        for _ in range(48):
            start = time.perf_counter()
            for _ in range(calls):
                np.sort(values)
            samples.append((time.perf_counter() - start) / 20)  # per call of the commit-0 kernel's work
        estimate = batch_means(samples)
        half = t_quantile(0.975, estimate.df) * estimate.se
        measured.append((math.exp(estimate.log_value), math.exp(estimate.log_value - half),
                         math.exp(estimate.log_value + half)))
    return measured


@contextmanager
def busy() -> Iterator[None]:
    """One process keeping a core busy beside the measurement (stopped by its own id)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        spinner.kill()
        spinner.wait()


def measure_pools(runs: int, seed: int, block: int = 10) -> dict[str, list[tuple[float, float, float]]]:
    """The quiet and the busy pool, measured in alternating blocks of ``block`` runs, so that
    both see the same background load (this host is shared)."""
    quiet: list[tuple[float, float, float]] = []
    loaded: list[tuple[float, float, float]] = []
    while len(quiet) < runs or len(loaded) < runs:
        quiet += measure(min(block, runs - len(quiet)), seed)
        if len(loaded) < runs:
            with busy():
                loaded += measure(min(block, runs - len(loaded)), seed)
    return {"quiet": pool(quiet), "busy": pool(loaded)}


def gaussian(scatter: float, half: float, runs: int, seed: int) -> list[tuple[float, float, float]]:
    """A pool of Gaussian deviations of sd ``scatter``, each run's interval +-``half``."""
    rng = random.Random(seed)
    return [(rng.gauss(0.0, scatter), -half, half) for _ in range(runs)]


def pool(measured: Sequence[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    middle = statistics.median(v for v, _, _ in measured)
    return [(v / middle - 1.0, low / v - 1.0, high / v - 1.0) for v, low, high in measured]


def describe(noise: Sequence[tuple[float, float, float]]) -> str:
    deviations = [d for d, _, _ in noise]
    mad = statistics.median(abs(d - statistics.median(deviations)) for d in deviations) * 1.4826
    halves = sorted((high - low) / 2.0 for _, low, high in noise)
    return (f"scatter {statistics.stdev(deviations):.2%} sd, {mad:.2%} MAD x 1.4826; run interval "
            f"+-{statistics.median(halves):.2%} (median half-width)")


def series_of(runs: Sequence[tuple[float, float, float]]) -> Series:
    records = [Record(time=f"2026-01-01T00:{i:02d}:00+00:00", run_id=f"run-{i:02d}", definition="creep",
                      definition_hash="h", probe="bench", status="pass", layer="kernel", metric="median_time",
                      value=v, low=low, high=high, unit="s", worse="higher", relative=False, commit=f"c{i}",
                      machine="m", machine_label="m")
               for i, (v, low, high) in enumerate(runs)]
    [series] = build_series(records)
    return series


def planted(noise: Sequence[tuple[float, float, float]], rate: float, rng: random.Random) -> Series:
    runs = []
    for commit in range(COMMITS):
        deviation, low, high = rng.choice(noise)
        value = (1.0 + rate * commit) * (1.0 + deviation)
        runs.append((value, value * (1.0 + low), value * (1.0 + high)))
    return series_of(runs)


def judged(series: Series) -> tuple[str, bool]:
    """The check's answer now, and whether the step test alone (before) flagged it."""
    return series.judge(THRESHOLD).status, series.check(THRESHOLD) is not None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=200, help="simulated series of each rate and noise")
    parser.add_argument("--runs", type=int, default=150, help="measured runs in each noise pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--real", action="store_true", help="also one measured 15-commit creep each way")
    parser.add_argument("--smoke", action="store_true", help="a tiny size (CI runs every benchmark)")
    parser.add_argument("--save", type=Path, help="write the measured noise pools to this JSON file")
    parser.add_argument("--load", type=Path, help="read the noise pools from this JSON file (no measuring)")
    args = parser.parse_args(argv)
    count, runs = (5, 20) if args.smoke else (args.series, args.runs)
    if args.smoke:
        print("smoke run (--smoke): 5 series, noise pools of 20 runs; its figures are not the benchmark's")
    started = time.perf_counter()
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    if args.load:
        pools = {name: [tuple(run) for run in noise] for name, noise in json.loads(args.load.read_text()).items()}
        print(f"noise pools read from {args.load}")
    else:
        pools = measure_pools(runs, args.seed)
        if args.save:
            args.save.write_text(json.dumps(pools))
    pools["docs (Gaussian)"] = gaussian(DOCS_SCATTER, DOCS_HALF, max(runs, 200), args.seed)
    for name, noise in pools.items():
        print(f"{name} noise ({len(noise)} runs; load average before {load}): {describe(noise)}")
    print(f"\n{count} series of {COMMITS} commits each; --check --threshold {THRESHOLD:.0%}\n")
    print("| noise | creep a commit | regressed | cannot tell | pass (a clean bill) | before: flagged (step test) |")
    print("|---|---|---|---|---|---|")
    rng = random.Random(args.seed)
    for name, noise in pools.items():
        for rate in RATES:
            answers = [judged(planted(noise, rate, rng)) for _ in range(count)]
            share = {status: sum(1 for a, _ in answers if a == status) / count for status in (REGRESSED, CANNOT_TELL, PASS)}
            before = sum(1 for _, b in answers if b) / count
            print(f"| {name} | {'flat' if not rate else f'+{rate:.1%}'} | {share[REGRESSED]:.3f} | "
                  f"{share[CANNOT_TELL]:.3f} | {share[PASS]:.3f} | {before:.3f} |")
    if args.real:
        print()
        for name in ("quiet", "busy"):
            if name == "busy":
                with busy():
                    measured = measure(COMMITS, args.seed + 1, rate=0.015)
            else:
                measured = measure(COMMITS, args.seed + 1, rate=0.015)
            series = series_of(measured)
            judgement = series.judge(THRESHOLD)
            last = measured[-1][0] / measured[0][0] - 1.0
            print(f"real creep of +1.5% a commit, {name}: last run {last:+.1%} of the first; change points at "
                  f"{[s.index for s in series.steps]}; before: {'flagged' if series.check(THRESHOLD) else 'a clean bill'}"
                  f"; now: {judgement.status}: {judgement.reason}")
    print(f"\n(seed {args.seed}; {time.perf_counter() - started:.1f} s; load average after "
          f"{Path('/proc/loadavg').read_text().split()[0] if Path('/proc/loadavg').exists() else '?'})")


if __name__ == "__main__":
    main()
