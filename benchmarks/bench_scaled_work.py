"""The size of a slowdown: does glmfb bench's interval hold the truth for a candidate doing
k times the baseline's work? (issue 53, class 3)

Cases, as a third party writes them (``tests/acceptance/torch_ops.py``): the baseline is a
factory, the candidate the same factory with ``scale=k`` (the same ops on k times the rows):

- ``rmsnorm_rows`` on 64x4096 (memory-bound: a gated RMS norm, elementwise passes and a row
  mean, float32);
- ``matmul_rows`` on 256x256x256 (compute-bound: an n x 256 by 256 x 256 product);

for k = 1.5, 2 and 4. Per case, in a fresh process each:

- **truth**: a plain timing loop in one process, as ``timeit`` would (one thread, glibc's
  malloc pinned as glmfb pins it, :mod:`glmfb.bench.heap`, so that no call faults pages in):
  each side's kernel on one input set, warmed up, loops of about 5 ms per
  side interleaved ABBA for ``--rounds`` rounds, each round's time per side the faster of its
  two loops; the change is the median over rounds of the candidate's time over the
  baseline's, minus 1, with the 95% t interval of the rounds' log ratios beside it. It is not
  exactly k - 1: fixed per-call costs (Python, dispatch) weigh less on the larger side;
- **plain loop, default heap**: the same loop with malloc as it comes, and the page faults
  per call of each side: there glibc mmaps or trims back the temporaries of some sizes, so
  some kernels fault their pages in on every call and others on none, depending on the sizes
  the process allocated before (the other side's included);
- **glmfb**: ``glmfb bench BASE CAND --candidate-arg scale=k --shape S --json --no-profile``
  (defaults otherwise: 4 rotated input sets, a 10 s budget), its change, interval and hot check;
- **holds**: whether glmfb's interval contains the truth's change.

``--glmfb PATH`` times another checkout's glmfb (an unpacked ``git archive`` of an older
commit: the figures before a fix). ``--repeat N`` runs every case N times (the glmfb runs
and the truths alike, cases shuffled).

    python benchmarks/bench_scaled_work.py                    # six cases, about 2 minutes
    python benchmarks/bench_scaled_work.py --glmfb /tmp/before --repeat 2
    python benchmarks/bench_scaled_work.py --smoke            # one case, small, seconds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS = ROOT / "tests" / "acceptance" / "torch_ops.py"
CASES = [("rmsnorm_rows", "64x4096"), ("matmul_rows", "256x256x256")]
SCALES = [1.5, 2.0, 4.0]

# The plain loop, run in a fresh process: argv = factory, shape, scale, rounds.
PLAIN = r"""
import ctypes, importlib.util, json, resource, statistics, sys, time
import torch
torch.set_num_threads(1)
if sys.argv[6] == "pinned":  # as glmfb.bench.heap pins it: no trimming, blocks below 32 MiB from the heap
    libc = ctypes.CDLL(None)
    assert libc.mallopt(-1, -1) == 1 and libc.mallopt(-3, 32 << 20) == 1
spec = importlib.util.spec_from_file_location("torch_ops", sys.argv[1])
ops = importlib.util.module_from_spec(spec); spec.loader.exec_module(ops)
factory = getattr(ops, sys.argv[2])
shape = tuple(int(p) for p in sys.argv[3].split("x"))
scale, rounds = float(sys.argv[4]), int(sys.argv[5])
a, b = factory(shape), factory(shape, scale=scale)
faults = {"a": 0, "b": 0}
def loop(fn, n, side=None):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = (time.perf_counter() - start) / n
    if side:
        faults[side] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return elapsed
for fn in (a, b):
    for _ in range(5):
        fn()
na = max(1, round(0.005 / loop(a, 5))); nb = max(1, round(0.005 / loop(b, 5)))
ratios, ta, tb = [], [], []
for _ in range(rounds):
    a1 = loop(a, na, "a"); b1 = loop(b, nb, "b"); b2 = loop(b, nb, "b"); a2 = loop(a, na, "a")
    ta.append(min(a1, a2)); tb.append(min(b1, b2)); ratios.append(min(b1, b2) / min(a1, a2))
print(json.dumps({"ratios": ratios, "a_s": statistics.median(ta), "b_s": statistics.median(tb),
                  "a_faults": faults["a"] / (2 * rounds * na), "b_faults": faults["b"] / (2 * rounds * nb)}))
"""


def t95(df: int) -> float:
    table = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}
    return table.get(df, 2.0 + 2.4 / df)


def truth(factory: str, shape: str, scale: float, rounds: int, heap: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", PLAIN, str(OPS), factory, shape, str(scale), str(rounds), heap],
                          capture_output=True, text=True, check=True)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    logs = [math.log(r) for r in answer["ratios"]]
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.inf
    mean = statistics.fmean(logs)
    return {"change": statistics.median(answer["ratios"]) - 1, "low": math.exp(mean - half) - 1,
            "high": math.exp(mean + half) - 1, "a_s": answer["a_s"], "b_s": answer["b_s"],
            "a_faults": answer["a_faults"], "b_faults": answer["b_faults"]}


def glmfb(factory: str, shape: str, scale: float, budget: float | None, path: Path) -> dict[str, object]:
    target = f"{OPS}:{factory}"
    command = [sys.executable, "-m", "glmfb", "bench", target, target, "--candidate-arg", f"scale={scale:g}",
               "--shape", shape, "--json", "--no-profile"]
    if budget is not None:
        command += ["--budget", f"{budget:g}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([*command, "--out", out], capture_output=True, text=True, env=env, check=False,
                              cwd=path)  # python -m puts the working folder first on sys.path
    verdict = json.loads(done.stdout)
    metric = verdict.get("metric") or {}
    shapes = [e for e in verdict["evidence"] if e.get("kind") == "shape"]
    regime = [e for e in verdict["evidence"] if e.get("kind") == "cache_regime"]
    hot = regime[0].get("hot_change") if regime else None
    ci = metric.get("ci") or [math.nan, math.nan]
    return {"status": verdict["status"], "change": metric.get("value", math.nan), "low": ci[0], "high": ci[1],
            "hot": hot, "calls": (shapes[0].get("calls_per_sample"), shapes[0].get("candidate_calls_per_sample"))
            if shapes else None, "regime": regime[0].get("regime") if regime else None}


def pct(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value * 100:+.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--glmfb", type=Path, default=ROOT, help="the checkout whose glmfb is timed")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=40, help="rounds of the plain loop")
    parser.add_argument("--budget", type=float, default=None, help="glmfb's --budget (its default if unset)")
    parser.add_argument("--smoke", action="store_true", help="one case, small: checks the script runs")
    args = parser.parse_args()
    cases = [(f, s, k) for f, s in CASES for k in SCALES]
    if args.smoke:
        cases, args.rounds, args.budget, args.repeat = [("matmul_rows", "64x64x64", 2.0)], 4, 0.5, 1
        print("bench_scaled_work: smoke run (one small case, tiny budget: not the benchmark's figures)")
    runs = [case for case in cases for _ in range(args.repeat)]
    random.Random(0).shuffle(runs)
    load = os.getloadavg()[0]
    print(f"glmfb from {args.glmfb}; load {load:.2f}; {len(runs)} runs")
    print("| kernel | k | truth: plain loop, heap pinned | glmfb | holds | hot check | calls/sample (base, cand) "
          "| plain loop, default heap (page faults a call) |")
    print("|---|---|---|---|---|---|---|---|")
    held = 0
    for factory, shape, scale in runs:
        real = truth(factory, shape, scale, args.rounds, "pinned")
        plain = truth(factory, shape, scale, args.rounds, "default")
        got = glmfb(factory, shape, scale, args.budget, args.glmfb)
        low, high = float(got["low"]), float(got["high"])  # type: ignore[arg-type]
        holds = low <= real["change"] <= high
        held += holds
        print(f"| {factory} {shape} | {scale:g} | {pct(real['change'])} [{pct(real['low'])}, {pct(real['high'])}] "
              f"({real['a_s'] * 1e6:.0f} / {real['b_s'] * 1e6:.0f} µs) | {pct(float(got['change']))} "  # type: ignore[arg-type]
              f"[{pct(low)}, {pct(high)}] {got['status']} | {'yes' if holds else 'NO'} | {pct(got['hot'])} "  # type: ignore[arg-type]
              f"| {got['calls']} | {pct(plain['change'])} ({plain['a_s'] * 1e6:.0f} / {plain['b_s'] * 1e6:.0f} µs; "
              f"{plain['a_faults']:.0f} / {plain['b_faults']:.0f}) |", flush=True)
    print(f"held {held} of {len(runs)}; load {os.getloadavg()[0]:.2f} at the end"
          + ("; smoke run" if args.smoke else ""))


if __name__ == "__main__":
    main()
