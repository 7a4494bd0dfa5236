"""Detection power of glmfb bench beside pytest-benchmark and pyperf, on the same kernels.

A CPU kernel (a gated RMS norm on 16x4096, one thread, ~100 µs here) is slowed by a
controlled amount: the candidate also runs one extra elementwise op on a buffer whose size is
calibrated (by interleaved measurement in one process, glmfb's own ABBA runner) so the slowdown
is 5% or 10%; the calibrated slowdowns are measured again and printed. Then, many trials each,
for A/A pairs (no change), +5% and +10%:

- glmfb: ``glmfb bench BASE CAND --shape 16x4096 --threshold T --json`` (one process);
  flagged = status fail. Run at each ``--glmfb-threshold`` given.
- pytest-benchmark: two separate pytest runs (defaults), the second with
  ``--benchmark-compare --benchmark-compare-fail=median:5%``; flagged = exit code 1.
- pyperf: two separate runs (``-p 3`` worker processes each), then ``pyperf compare_to
  --min-speed 5``; flagged = the candidate reported significantly slower.

It prints, per tool, the false-alarm rate (A/A flagged), the detection rates at +5% and +10%
and the wall seconds per comparison (everything a comparison needs, process starts included).
Timing on a shared host is noisy: read the figures with the conditions of the run.

    python benchmarks/bench_detection_power.py --trials 10
    python benchmarks/bench_detection_power.py --trials 3 --tools glmfb,pytest-benchmark
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = "16x4096"
KERNELS = textwrap.dedent(
    """
    import os
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)

    def factory(shape=(16, 4096), extra=0, seed=0):
        shape = tuple(shape)
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(shape, generator=generator)
        gate = torch.randn(shape, generator=generator)
        weight = torch.ones(shape[-1])
        out = torch.empty(shape)
        extra = int(extra)
        pad = torch.randn(max(extra, 1), generator=generator)
        pad_out = torch.empty_like(pad)

        def kernel():
            rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            torch.mul(x, rstd, out=out)
            out.mul_(weight).mul_(F.silu(gate))
            if extra:
                torch.neg(pad, out=pad_out)  # the controlled slowdown
            return out

        return kernel

    def from_env():
        return factory((16, 4096), int(os.environ.get("DP_EXTRA", "0")))
    """
)
PYTEST_FILE = textwrap.dedent(
    """
    from dp_kernels import from_env

    def test_kernel(benchmark):
        benchmark(from_env())
    """
)
PYPERF_FILE = textwrap.dedent(
    """
    import pyperf
    from dp_kernels import factory

    def add_cmdline_args(cmd, args):
        cmd.extend(("--extra", str(args.extra)))

    runner = pyperf.Runner(add_cmdline_args=add_cmdline_args)
    runner.argparser.add_argument("--extra", type=int, default=0)
    args = runner.parse_args()
    runner.bench_func("kernel", factory((16, 4096), args.extra))
    """
)


def write_workdir(directory: Path) -> None:
    (directory / "dp_kernels.py").write_text(KERNELS)
    (directory / "test_dp.py").write_text(PYTEST_FILE)
    (directory / "dp_pyperf.py").write_text(PYPERF_FILE)
    (directory / "pytest.ini").write_text("[pytest]\n")


def measured_slowdown(directory: Path, extra: int, seconds: float, seed: int) -> tuple[float, float, float]:
    """The candidate's slowdown measured by interleaving both sides in this process."""
    sys.path.insert(0, str(directory))
    sys.path.insert(0, str(ROOT))
    import torch

    from glmfb.bench.decision import paired_change
    from glmfb.bench.runner import Blocks, InterleavedRunner, Side, calibrate, warm_up
    from glmfb.bench.timers import CpuTimer

    torch.set_num_threads(1)
    dp_kernels = __import__("dp_kernels")
    sides = {
        "baseline": Side("baseline", "base", "base", [dp_kernels.factory((16, 4096), 0, s) for s in range(4)]),
        "candidate": Side("candidate", "cand", "cand", [dp_kernels.factory((16, 4096), extra, s) for s in range(4)]),
    }
    for side in sides.values():
        warm_up(side)
    timer = CpuTimer()
    calls = calibrate(timer, list(sides.values()), 1e-3)
    loops = {label: timer.prepare(side.kernels, calls) for label, side in sides.items()}
    blocks = Blocks()
    InterleavedRunner(timer, loops, sides, seed).run(blocks, 1 << 40, time.perf_counter() + seconds)
    change = paired_change(blocks.baseline, blocks.candidate)
    return change.estimate.value, change.estimate.low, change.estimate.high


def calibrate_extras(directory: Path, targets: list[float], rounds: int = 3) -> dict[float, int]:
    """Buffer sizes giving each target slowdown: a least-squares line (slowdown against size)
    through every measurement so far, refined by measuring at each new guess."""
    import numpy as np

    points = [(n, measured_slowdown(directory, n, 2.0, seed)[0]) for seed, n in enumerate((2048, 65536))]
    extras: dict[float, int] = {}
    for target in targets:
        n = 1
        for step in range(rounds):
            sizes, slowdowns = np.array(points, dtype=float).T
            slope, intercept = np.polyfit(sizes, slowdowns, 1)
            n = max(1, int((target - intercept) / slope)) if slope > 0 else 2048
            points.append((n, measured_slowdown(directory, n, 3.0, 10 + step)[0]))
        extras[target] = n
    return extras


def run_glmfb(directory: Path, extra: int, threshold: str, budget: float) -> tuple[bool, str]:
    kernel = str(directory / "dp_kernels.py") + ":factory"
    command = [
        sys.executable, "-m", "glmfb", "bench", kernel, kernel, "--shape", SHAPE,
        "--baseline-arg", "extra=0", "--candidate-arg", f"extra={extra}",
        "--threshold", threshold, "--budget", str(budget), "--json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    try:
        status = json.loads(done.stdout)["status"]
    except (json.JSONDecodeError, KeyError):
        status = f"broken(rc={done.returncode}): {done.stderr.strip()[-200:]}"
    return status == "fail", status


def run_pytest_benchmark(directory: Path, extra: int) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(dir=directory) as storage:
        common = [sys.executable, "-m", "pytest", "test_dp.py", "-q", "-p", "no:cacheprovider",
                  "--benchmark-only", f"--benchmark-storage=file://{storage}"]
        first = subprocess.run([*common, "--benchmark-save=base"], capture_output=True, text=True,
                               cwd=directory, env={**os.environ, "DP_EXTRA": "0"})
        if first.returncode != 0:
            return False, f"broken: {first.stdout[-200:]}"
        second = subprocess.run(
            [*common, "--benchmark-compare", "--benchmark-compare-fail=median:5%"],
            capture_output=True, text=True, cwd=directory, env={**os.environ, "DP_EXTRA": str(extra)},
        )
    if second.returncode not in (0, 1):
        return False, f"broken(rc={second.returncode}): {second.stdout[-200:]}"
    return second.returncode == 1, "fail" if second.returncode == 1 else "pass"


def run_pyperf(directory: Path, extra: int) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(dir=directory) as out:
        files = []
        for label, value in (("base", 0), ("cand", extra)):
            path = Path(out) / f"{label}.json"
            done = subprocess.run(
                [sys.executable, "dp_pyperf.py", "--quiet", "-p", "3", "--extra", str(value), "-o", str(path)],
                capture_output=True, text=True, cwd=directory,
            )
            if done.returncode != 0:
                return False, f"broken: {done.stderr[-200:]}"
            files.append(str(path))
        compared = subprocess.run(
            [sys.executable, "-m", "pyperf", "compare_to", *files, "--min-speed", "5"],
            capture_output=True, text=True, cwd=directory,
        )
    text = compared.stdout
    flagged = "slower" in text and "Not significant" not in text and "hidden" not in text
    return flagged, text.strip().splitlines()[-1] if text.strip() else "no output"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10, help="comparisons per case and tool")
    parser.add_argument("--pyperf-trials", type=int, default=None, help="pyperf trials (default --trials)")
    parser.add_argument("--tools", default="glmfb,pytest-benchmark,pyperf")
    parser.add_argument("--glmfb-threshold", action="append", default=None,
                        help="glmfb --threshold; repeatable (default 5%% and 2.5%%)")
    parser.add_argument("--budget", type=float, default=10.0, help="glmfb --budget seconds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    thresholds = args.glmfb_threshold or ["5%", "2.5%"]
    rng = random.Random(args.seed)

    with tempfile.TemporaryDirectory(prefix="glmfb-dp-") as tmp:
        directory = Path(tmp)
        write_workdir(directory)
        started = time.perf_counter()
        extras = calibrate_extras(directory, [0.05, 0.10])
        print(f"calibrated extra work in {time.perf_counter() - started:.0f} s: "
              + ", ".join(f"+{t:.0%}: {n} elements" for t, n in extras.items()), flush=True)
        cases = {"A/A": 0, "+5%": extras[0.05], "+10%": extras[0.10]}
        for label, extra in cases.items():
            if extra:
                value, low, high = measured_slowdown(directory, extra, 4.0, 11)
                print(f"check {label}: measured interleaved {value:+.1%} [{low:+.1%}, {high:+.1%}]", flush=True)

        runners = []
        for tool in tools:
            if tool == "glmfb":
                for threshold in thresholds:
                    runners.append((f"glmfb --threshold {threshold}", args.trials,
                                    lambda e, t=threshold: run_glmfb(directory, e, t, args.budget)))
            elif tool == "pytest-benchmark":
                runners.append(("pytest-benchmark median:5%", args.trials,
                                lambda e: run_pytest_benchmark(directory, e)))
            elif tool == "pyperf":
                runners.append(("pyperf compare_to --min-speed 5", args.pyperf_trials or args.trials,
                                lambda e: run_pyperf(directory, e)))
            else:
                parser.error(f"unknown tool {tool!r}")
        jobs = [(name, case, fn) for name, trials, fn in runners for case in cases for _ in range(trials)]
        rng.shuffle(jobs)  # spread host noise evenly over tools and cases
        flagged: dict[tuple[str, str], list[bool]] = defaultdict(list)
        statuses: dict[tuple[str, str], list[str]] = defaultdict(list)
        wall: dict[str, list[float]] = defaultdict(list)
        for index, (name, case, fn) in enumerate(jobs, 1):
            begin = time.perf_counter()
            hit, status = fn(cases[case])
            wall[name].append(time.perf_counter() - begin)
            flagged[(name, case)].append(hit)
            statuses[(name, case)].append(status)
            print(f"[{index}/{len(jobs)}] {name:36s} {case:5s} flagged={hit!s:5s} {status} "
                  f"({wall[name][-1]:.1f} s)", flush=True)

    print()
    print(f"{'tool':36s} {'false alarms (A/A)':>19s} {'detected +5%':>13s} {'detected +10%':>14s} {'s/comparison':>13s}")
    for name, _, _ in runners:
        def rate(case: str, name: str = name) -> str:
            hits = flagged[(name, case)]
            return f"{sum(hits)}/{len(hits)} ({sum(hits) / max(1, len(hits)):.0%})"
        seconds = sum(wall[name]) / max(1, len(wall[name]))
        print(f"{name:36s} {rate('A/A'):>19s} {rate('+5%'):>13s} {rate('+10%'):>14s} {seconds:>13.1f}")
    print()
    for (name, case), values in sorted(statuses.items()):
        counts = {s: values.count(s) for s in sorted(set(values))}
        print(f"{name:36s} {case:5s} {counts}")


if __name__ == "__main__":
    main()
