"""Error rates of glmfb's measurement core, by simulation on scripted timings (no real timing).

Each trial runs :func:`glmfb.core.measure.compare` on scripted allocation pairs
(:mod:`glmfb.core.measure.simulate`): every allocation gets its own luck (log-normal, sd
``between``), every sample its own jitter (sd ``within``), and bursts of host load add 50%
to everything running for 0.3 s at random times; the fake clock advances by each sample.
For each setting it prints how often the decision was fail (regression), pass (equivalent
or improvement) and inconclusive, beside the same data read the old way (one allocation a
side, its blocks resampled as if independent, one look at 95%).

What the rule promises, and what the table checks: a true change at or below the threshold
is called a fail in at most alpha/2 = 2.5% of trials (far less below it); a true change at
or above the threshold is called equivalent in at most 2.5%; over every look.

    python benchmarks/measure_error_rates.py --trials 400

``--smoke``: every setting, 8 trials each (CI checks the script runs; those rates are not the
benchmark's).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from glmfb.core.measure import Settings, compare
from glmfb.core.measure.intervals import pair_interval
from glmfb.core.measure.simulate import FakeClock, HostModel, ScriptedSide, scripted_pairs
from glmfb.core.measure.stats import decide

SMOKE_NOTE = "smoke run (--smoke): every setting, 8 trials; the rates are measured but are not the benchmark's"
SETTINGS = [
    # (label, true effect, threshold, between-allocation sd)
    ("A/A", 0.0, 0.05, 0.01),
    ("A/A", 0.0, 0.02, 0.01),
    ("A/A, allocation luck 3%", 0.0, 0.02, 0.03),
    ("+5% at 5% (on the threshold)", 0.05, 0.05, 0.01),
    ("+6% at 5%", 0.06, 0.05, 0.01),
    ("+6% at 5%, luck 3%", 0.06, 0.05, 0.03),
    ("+10% at 5%", 0.10, 0.05, 0.01),
    ("+4% at 2%", 0.04, 0.02, 0.01),
    ("+2% at 2% (on the threshold)", 0.02, 0.02, 0.01),
]


def trial(effect: float, threshold: float, between: float, seed: int, *, pairs: int, aa: int,
          budget_s: float) -> tuple[str, float]:
    clock = FakeClock()
    host = HostModel(burst_rate_per_s=0.3, burst_length_s=0.3, burst_slowdown=0.5, seed=seed)
    baseline = ScriptedSide("baseline", between_sd=between, within_sd=0.02)
    candidate = ScriptedSide("candidate", effect=effect, between_sd=between, within_sd=0.02)
    built = scripted_pairs(baseline, candidate, pairs, clock, seed, aa_pairs=aa, host=host)
    comparison = compare(built, Settings(threshold=threshold, budget_s=budget_s, seed=seed + 1), clock)
    return comparison.decision.value, comparison.elapsed_s


def naive_trial(effect: float, threshold: float, between: float, seed: int, budget_s: float) -> str:
    """One allocation a side, blocks as independent units, one look at 95%."""
    clock = FakeClock()
    host = HostModel(burst_rate_per_s=0.3, burst_length_s=0.3, burst_slowdown=0.5, seed=seed)
    baseline = ScriptedSide("baseline", between_sd=between, within_sd=0.02)
    candidate = ScriptedSide("candidate", effect=effect, between_sd=between, within_sd=0.02)
    built = scripted_pairs(baseline, candidate, 2, clock, seed, host=host)[:1] * 2  # one pair, twice
    comparison = compare(built, Settings(threshold=threshold, budget_s=budget_s, seed=seed + 1,
                                         stop=lambda _e, _d: False), clock)
    effects = comparison.pairs[0].effects + comparison.pairs[1].effects
    return decide(pair_interval([[e] for e in effects], 0.95).estimate, threshold).value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--aa-pairs", type=int, default=4)
    parser.add_argument("--budget", type=float, default=2.0, help="simulated seconds a comparison")
    parser.add_argument("--smoke", action="store_true", help="8 trials a setting (CI checks the script runs)")
    args = parser.parse_args()
    if args.smoke:
        args.trials = 8
        print(SMOKE_NOTE, flush=True)
    rng = random.Random(0)
    print(f"{args.trials} trials a setting, {args.pairs} allocation pairs + {args.aa_pairs} A/A, "
          f"{args.budget:g} simulated s, samples 1 ms, within sd 2%, bursts of +50% for 0.3 s at 0.3/s")
    print(f"{'setting':32s} {'fail':>7s} {'pass':>7s} {'inconcl.':>8s} {'mean s':>7s}   "
          f"{'naive fail':>10s} {'naive pass':>10s}")
    started = time.perf_counter()
    for label, effect, threshold, between in SETTINGS:
        seeds = [rng.randrange(1 << 30) for _ in range(args.trials)]
        outcomes = [trial(effect, threshold, between, s, pairs=args.pairs, aa=args.aa_pairs, budget_s=args.budget)
                    for s in seeds]
        counts = Counter(o for o, _ in outcomes)
        naive = Counter(naive_trial(effect, threshold, between, s, args.budget) for s in seeds[: args.trials // 4])
        n, m = len(outcomes), sum(naive.values())

        def share(c: Counter[str], total: int, *keys: str) -> str:
            return f"{sum(c[k] for k in keys) / total:7.1%}"

        mean_s = sum(s for _, s in outcomes) / n
        print(f"{label:32s} {share(counts, n, 'regression')} {share(counts, n, 'equivalent', 'improvement')} "
              f"{share(counts, n, 'undecided'):>8s} {mean_s:7.2f}   {share(naive, m, 'regression'):>10s} "
              f"{share(naive, m, 'equivalent', 'improvement'):>10s}", flush=True)
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
