"""How much a kernel's own time scatters from one run to the next, in seconds (``median_time``)
and in units of the reference timed beside it (``normalized_time``, :mod:`glmfb.bench.reference`):
is the normalized series the quieter one, for a pure-Python kernel and for a torch kernel, on a
quiet host and on a busy one?

    python benchmarks/reference_ratio.py [--runs 10] [--processes 8] [--budget 2] [--load]
    python benchmarks/reference_ratio.py --smoke     # torch_norm alone, 2 runs of 2 processes: the path, not the figure

With ``--load`` every run is taken twice, once as it is and once beside a process of this script
that keeps one CPU busy (a Python loop), alternating: does either series move under load, and by
how much (the loaded runs' mean against the others', with a Welch interval)?

Each run is ``glmfb bench FILE:KERNEL --processes N --json`` (a one-target bench, as a history
records it), the two kernels alternating run by run. For each kernel it prints every run's time,
its normalized time, the scatter over the run's processes (cv of the kernel's own time, of the
reference's and of their ratio) and the host's load (evidence ``host_load``: a busy run is
inconclusive, but its measurement is still read here), then the run-to-run cv of each series
over all runs and over the quiet runs alone. Nothing is changed between runs: every scatter is
noise, and the quieter series is the one a step is easier to see in.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KERNELS = '''
def python_sum(shape):
    """Pure Python: a sum of squares over the shape's rows."""
    data = list(range(shape[0]))

    def run():
        total = 0
        for x in data:
            total += x * x
        return total

    return run


def torch_norm(shape):
    """torch: an RMS norm with a gate, the shape's rows x columns in fp32."""
    import torch

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=generator)
    gate = torch.randn(*shape, generator=generator)
    weight = torch.randn(shape[-1], generator=generator)

    def run():
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * scale * weight * torch.sigmoid(gate)

    return run
'''

CASES = {"python_sum": "2000", "torch_norm": "16x4096"}


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else float("nan")


def one_run(folder: Path, kernel: str, args: argparse.Namespace) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "glmfb", "bench", f"kernels.py:{kernel}", "--shape", CASES[kernel],
                           "--processes", str(args.processes), "--budget", f"{args.budget}s", "--json"],
                          capture_output=True, text=True, cwd=folder, timeout=600)
    if done.returncode not in (0, 4):
        raise SystemExit(f"glmfb bench {kernel} exited {done.returncode}: {done.stderr[-600:]}")
    verdict = json.loads(done.stdout)
    [measurement] = [e for e in verdict["evidence"] if e["kind"] == "measurement"]
    load: dict[str, Any] = next((e for e in verdict["evidence"] if e["kind"] == "host_load"), {})
    return {"time": measurement["time_s"], "normalized": measurement["normalized_time"],
            "cv_time": cv(measurement["process_times_s"]), "cv_reference": cv(measurement["process_reference_s"]),
            "cv_ratio": cv(measurement["process_ratios"]),
            "busy": bool(load.get("busy")), "load": load.get("other_busy_cpus", float("nan"))}


def hog() -> subprocess.Popen[bytes]:
    """A process that keeps one CPU busy until it is killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def shift(loaded: list[float], quiet: list[float]) -> str:
    """The loaded runs' mean against the quiet ones', as a fraction, with a 95% Welch interval."""
    from glmfb.core.measure.tdist import t_quantile

    if len(loaded) < 2 or len(quiet) < 2:
        return "fewer than 2 runs a side"
    a, b = statistics.fmean(loaded), statistics.fmean(quiet)
    va, vb = statistics.variance(loaded) / len(loaded), statistics.variance(quiet) / len(quiet)
    df = (va + vb) ** 2 / (va**2 / (len(loaded) - 1) + vb**2 / (len(quiet) - 1)) if va + vb > 0 else math.inf
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    return f"{a / b - 1:+.1%} [{(a - half) / b - 1:+.1%}, {(a + half) / b - 1:+.1%}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each kernel")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--budget", type=float, default=2.0, help="each run's bench budget (s)")
    parser.add_argument("--load", action="store_true", help="each run also beside a process keeping one CPU busy")
    parser.add_argument("--smoke", action="store_true", help="torch_norm alone, 2 runs of 2 processes, 0.4 s: the path, not the figure")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.processes, args.budget, args.load = 2, 2, 0.4, True
    folder = Path(tempfile.mkdtemp(prefix="glmfb-reference-ratio-"))
    started = time.monotonic()
    kernels = ["torch_norm"] if args.smoke else list(CASES)  # a smoke run takes the path once, not the figure
    runs: dict[str, list[dict[str, Any]]] = {kernel: [] for kernel in kernels}
    try:
        (folder / "kernels.py").write_text(KERNELS)
        for index in range(args.runs):
            for kernel in kernels:
                runs[kernel].append({**one_run(folder, kernel, args), "loaded": False})
                if args.load:
                    spinning = hog()
                    try:
                        time.sleep(0.5)
                        runs[kernel].append({**one_run(folder, kernel, args), "loaded": True})
                    finally:
                        spinning.kill()
                        spinning.wait()
            print(f"run {index + 1}/{args.runs} of each kernel ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{'smoke run: ' if args.smoke else ''}{args.runs} runs of each kernel, {args.processes} fresh processes a run, budget {args.budget:g} s, "
          f"{time.monotonic() - started:.0f} s in all")
    for kernel, rows in runs.items():
        print(f"\n{kernel} ({CASES[kernel]}): per run, time (µs), normalized (ref), cv over its processes of "
              "time / reference / ratio, other processes' load (CPUs)")
        for k, row in enumerate(rows, 1):
            print(f"  {k:>2}: {row['time'] * 1e6:8.2f} µs  {row['normalized']:7.4f}  "
                  f"{row['cv_time']:6.1%} / {row['cv_reference']:6.1%} / {row['cv_ratio']:6.1%}  "
                  f"load {row['load']:.2f}{' busy' if row['busy'] else ''}{' (beside the hog)' if row['loaded'] else ''}")
        groups = [("all runs", rows), ("quiet runs", [r for r in rows if not r["busy"]])]
        if args.load:
            groups = [("runs as they are", [r for r in rows if not r["loaded"]]),
                      ("runs beside the hog", [r for r in rows if r["loaded"]])]
        for label, chosen in groups:
            if len(chosen) < 2:
                print(f"  {label}: fewer than 2")
                continue
            print(f"  {label} ({len(chosen)}): run-to-run cv of median_time {cv([r['time'] for r in chosen]):.1%}, "
                  f"of normalized_time {cv([r['normalized'] for r in chosen]):.1%}")
        if args.load:
            loaded, quiet = [r for r in rows if r["loaded"]], [r for r in rows if not r["loaded"]]
            for key, metric in (("time", "median_time"), ("normalized", "normalized_time")):
                print(f"  beside the hog, {metric} moved {shift([r[key] for r in loaded], [r[key] for r in quiet])}")


if __name__ == "__main__":
    main()
