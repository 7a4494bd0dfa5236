"""A real history: ``glmfb run`` of a bundled kernel N times, with a +10% slowdown planted
halfway, then ``glmfb history``: is the change point at the right run?

    python benchmarks/history_real_step.py [--runs 30] [--extra 0.10] [--budget 3]
    python benchmarks/history_real_step.py --smoke      # 4 runs of 0.5 s, for CI: not the figure

The definition benches the bundled fused gated RMS norm (``scenarios/decode_norm``) against
itself; its candidate side is a wrapper that, from run N/2 on, runs the same kernel on
``1 + extra`` times the rows (64x4096 against 70x4096: about ``extra`` more time, the call's
fixed cost aside). Each run is a real ``glmfb run`` into
one output folder, recording into its default history (``<out>/history.sqlite``); then
``glmfb history --json`` reads the series back. Prints each run's time change with its
interval, the change points found (the first run after each, its size with its interval and
its confidence), and whether the first one is the planted run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "fused-norm-planted-step"

PLANTED = '''"""The fused kernel on ``1 + extra`` times the rows: about ``extra`` more time."""
from kernels import gated_norm_fused


def fused_plus(shape, extra=0.0, seed=0):
    rows = round(shape[0] * (1 + extra))
    kernel = gated_norm_fused((rows, *shape[1:]), seed)
    kernel.flops_per_call = kernel.flops_per_call * shape[0] / rows  # the useful work stays the shape's
    kernel.bytes_per_call = kernel.bytes_per_call * shape[0] / rows
    return kernel
'''


def definition(extra: float, budget: float) -> str:
    return (f'[[probe]]\nname = "{NAME}"\nprobe = "bench"\n'
            'baseline = "kernels.py:gated_norm_fused"\ncandidate = "planted.py:fused_plus"\n'
            f'candidate_args = {{ extra = {extra} }}\n'
            f'options = {{ shapes = ["64x4096"], threshold = "50%", budget = {budget}, profile = false }}\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--extra", type=float, default=0.10, help="the planted slowdown (a fraction)")
    parser.add_argument("--budget", type=float, default=4.0, help="each run's bench budget (s)")
    parser.add_argument("--smoke", action="store_true", help="4 runs of 0.5 s: checks the path, not the figure")
    args = parser.parse_args()
    if args.smoke:
        # the planted step at run 2: runs on both sides of it, each a real glmfb run, then the history
        args.runs, args.budget = 4, 0.5
        print("smoke run (--smoke): 4 runs of 0.5 s each (too few for a change point: a 2-2 split has 6 orders); "
              "its figures are not the benchmark's")
    planted_at = args.runs // 2
    folder = Path(tempfile.mkdtemp(prefix="glmfb-history-step-"))
    try:
        shutil.copy(ROOT / "scenarios" / "decode_norm" / "kernels.py", folder / "kernels.py")
        (folder / "planted.py").write_text(PLANTED)
        out = folder / "reports"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GLMFB_HISTORY": ""}
        started = time.monotonic()
        for index in range(args.runs):
            extra = args.extra if index >= planted_at else 0.0
            (folder / "probes.toml").write_text(definition(extra, args.budget))
            result = subprocess.run([sys.executable, "-m", "glmfb", "run", str(folder / "probes.toml"), "--out",
                                     str(out), "--json"], capture_output=True, text=True, cwd=folder, env=env)
            if result.returncode not in (0, 1, 3, 4):
                raise SystemExit(f"run {index}: glmfb run exited {result.returncode}: {result.stderr[-500:]}")
            verdict = json.loads(result.stdout)["verdicts"][0]
            if verdict["status"] == "error":  # no metric: not in the series (said, not hidden)
                print(f"run {index:2d} (extra {extra:.2f}): error: {verdict['why'][:300]}", flush=True)
                continue
            metric = verdict["metric"]
            low, high = metric["ci"] or (None, None)
            interval = f"[{100 * low:+.1f}, {100 * high:+.1f}]" if low is not None else ""
            print(f"run {index:2d} (extra {extra:.2f}): {verdict['status']}, {metric['name']} "
                  f"{100 * metric['value']:+.1f}% {interval}", flush=True)
        wall = time.monotonic() - started
        history = subprocess.run([sys.executable, "-m", "glmfb", "history", NAME, "--out", str(out), "--json"],
                                 capture_output=True, text=True, cwd=folder, env=env)
        if history.returncode != 0:
            raise SystemExit(f"glmfb history exited {history.returncode}: {history.stderr[-500:]}")
        series = json.loads(history.stdout)["series"]
        print(f"\n{args.runs} runs in {wall:.0f} s; {len(series)} series; slowdown of {args.extra:.0%} planted "
              f"from run {planted_at}")
        for item in series:
            points = item["change_points"]
            for point in points:
                print(f"  change point: first run after {point['index']}, {_size(point)}, confidence "
                      f"{point['confidence']:.3f}")
            first = points[0]["index"] if points else None
            verdict = "right" if first == planted_at else "wrong" if first is not None else "none found"
            print(f"  {item['definition']} / {item['metric']}: {len(points)} change point(s); the first at run "
                  f"{first} against the planted {planted_at}: {verdict}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _size(point: dict[str, object]) -> str:
    change = point.get("regression")
    interval = point.get("regression_ci") or (None, None)
    if not isinstance(change, float):
        return "size unknown"
    low, high = interval if isinstance(interval, list) else (None, None)
    bounds = f" [{100 * low:+.1f}, {100 * high:+.1f}]" if low is not None and high is not None else ""
    return f"{100 * change:+.1f} pts{bounds}"


if __name__ == "__main__":
    main()
