"""Overhead of ``glmfb gil`` at its default settings, beside viztracer's, on a starved workload.

The workload: a ``serializer`` thread running ``json.dumps`` on a small object as fast as it
can, beside a ``kv-transfer`` thread that wakes every millisecond to copy a 64 KiB buffer
(the thread that starves). Its throughput (serializer ops/s and transfer jobs/s) is measured
plain, under ``glmfb gil`` (py-spy at 100 Hz with --native, the heartbeat, the /proc GIL-waiter
sampler) and under ``viztracer``, interleaved round by round in one run. Prints the medians and
the ratios to the plain runs around it (median over rounds).

    python benchmarks/gil_overhead.py [--rounds 8] [--seconds 1.5] [--smoke]

``--smoke``: one round of 0.3 s (CI checks the script runs; its figures are not the benchmark's).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

WORKLOAD_FLAG = "--workload"
SMOKE_NOTE = "smoke run (--smoke): 1 round of 0.3 s; the figures are measured but are not the benchmark's"


def workload(seconds: float) -> None:
    """Run the starved workload for ``seconds`` and print its throughput as JSON."""
    record = {"id": 12345, "tokens": list(range(32)), "meta": {"model": "glm", "shard": 3}}
    source, destination = bytes(64 * 1024), bytearray(64 * 1024)
    stop = threading.Event()
    counts = {"ops": 0, "jobs": 0}

    def serialize() -> None:
        dumps, ops = json.dumps, 0
        while not stop.is_set():
            dumps(record)
            ops += 1
        counts["ops"] = ops

    def transfer() -> None:
        jobs = 0
        while not stop.is_set():
            time.sleep(0.001)
            destination[:] = source
            jobs += 1
        counts["jobs"] = jobs

    threads = [
        threading.Thread(target=serialize, name="serializer"),
        threading.Thread(target=transfer, name="kv-transfer"),
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    heartbeat = next((t for t in threading.enumerate() if t.name == "glmfb-heartbeat"), None)
    times = os.times()
    print(
        json.dumps(
            {
                "ops_per_s": counts["ops"] / elapsed,
                "jobs_per_s": counts["jobs"] / elapsed,
                "elapsed_s": elapsed,
                "cpu_s": times.user + times.system,
                "heartbeat_cpu_s": thread_cpu_s(heartbeat.native_id)
                if heartbeat and heartbeat.native_id
                else None,
            }
        )
    )


def thread_cpu_s(native_id: int) -> float:
    """CPU seconds (user + system) one thread of this process has used, from /proc."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_plain(seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, WORKLOAD_FLAG, str(seconds)],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


def run_viztracer(seconds: float, folder: Path) -> dict[str, float]:
    trace = folder / "viztracer.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "viztracer",
            "--quiet",
            "--output_file",
            str(trace),
            "--",
            __file__,
            WORKLOAD_FLAG,
            str(seconds),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
    return dict(json.loads(line))


def run_glmfb(seconds: float, folder: Path) -> tuple[dict[str, float], str]:
    from glmfb.gil import GilConfig, trace_gil

    config = GilConfig(
        name="overhead",
        command=(sys.executable, __file__, WORKLOAD_FLAG, str(seconds)),
        duration_s=seconds + 10,  # the workload ends by itself and prints its throughput
    )
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    self_before = os.times()
    from glmfb.core.probe import ProbeContext

    verdict = trace_gil(config, ProbeContext(run_id="overhead", artifact_dir=folder))
    self_after = os.times()
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stdout = (folder / "stdout.txt").read_text()
    measured = dict(json.loads(stdout.strip().splitlines()[-1]))
    children_cpu = (children_after.ru_utime - children_before.ru_utime) + (
        children_after.ru_stime - children_before.ru_stime
    )
    # CPU seconds per second of the workload: what glmfb's pieces cost besides the program.
    measured["pyspy_cpu_share"] = max(0.0, children_cpu - measured["cpu_s"]) / measured["elapsed_s"]
    measured["glmfb_cpu_share"] = (
        (self_after.user - self_before.user) + (self_after.system - self_before.system)
    ) / measured["elapsed_s"]
    measured["heartbeat_cpu_share"] = (measured["heartbeat_cpu_s"] or 0.0) / measured["elapsed_s"]
    samples = next((getattr(e, "samples", None) for e in verdict.evidence if e.kind == "gil_threads"), None)
    note = f"verdict {verdict.status.value}, py-spy samples {samples}"
    return measured, note


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--smoke", action="store_true", help="1 round of 0.3 s (CI checks the script runs)")
    options = parser.parse_args()
    if options.smoke:
        options.rounds, options.seconds = 1, 0.3
        print(SMOKE_NOTE, flush=True)
    # Each round runs plain, glmfb gil, viztracer, plain again; a mode's ratio in a round is its
    # throughput over the mean of the two plain runs around it (cancels slow drifts in load).
    ratios: dict[str, list[tuple[float, float]]] = {"glmfb gil": [], "viztracer": []}
    paired: dict[str, tuple[list[float], list[float]]] = {
        "glmfb gil": ([], []),
        "viztracer": ([], []),
    }
    plain_runs: list[dict[str, float]] = []
    traced_runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="glmfb-gil-bench-") as tmp:
        for round_index in range(options.rounds):
            folder = Path(tmp) / f"round{round_index}"
            folder.mkdir()
            before = run_plain(options.seconds)
            traced, note = run_glmfb(options.seconds, folder / "glmfb")
            vizt = run_viztracer(options.seconds, folder)
            after = run_plain(options.seconds)
            plain_runs += [before, after]
            traced_runs.append(traced)
            plain_ops = (before["ops_per_s"] + after["ops_per_s"]) / 2
            plain_jobs = (before["jobs_per_s"] + after["jobs_per_s"]) / 2
            for mode, measured in (("glmfb gil", traced), ("viztracer", vizt)):
                ratios[mode].append(
                    (measured["ops_per_s"] / plain_ops, measured["jobs_per_s"] / plain_jobs)
                )
                paired[mode][0].append(plain_ops)
                paired[mode][1].append(measured["ops_per_s"])
            print(
                f"round {round_index + 1}: plain {before['ops_per_s']:.0f}/{after['ops_per_s']:.0f} ops/s, "
                f"glmfb gil {traced['ops_per_s']:.0f}, viztracer {vizt['ops_per_s']:.0f} ({note})",
                file=sys.stderr,
            )
    print(
        f"starved workload, {options.rounds} interleaved rounds of {options.seconds:g} s; "
        f"plain median {statistics.median(r['ops_per_s'] for r in plain_runs):.0f} serializer ops/s, "
        f"{statistics.median(r['jobs_per_s'] for r in plain_runs):.0f} transfer jobs/s"
    )
    from glmfb.core.measure.stats import paired_median_ratio

    print(
        f"{'mode':<10} {'ops ratio':>10} {'(min-max)':>14} {'jobs ratio':>11} "
        f"{'throughput change, 95% CI (rounds resampled)':>46}"
    )
    for mode, values in ratios.items():
        ops = [v[0] for v in values]
        jobs = [v[1] for v in values]
        change = paired_median_ratio(*paired[mode])
        print(
            f"{mode:<10} {statistics.median(ops):>10.3f} {f'({min(ops):.2f}-{max(ops):.2f})':>14} "
            f"{statistics.median(jobs):>11.3f} {100 * change.value:>+21.1f}% [{100 * change.low:+.1f}%, "
            f"{100 * change.high:+.1f}%]"
        )
    print(
        "CPU cost of glmfb gil's parts, in CPU-seconds per second of workload (medians; the "
        "machine has 2 cores):"
    )
    for key, label in (
        ("heartbeat_cpu_share", "heartbeat thread (in the program)"),
        ("pyspy_cpu_share", "py-spy process"),
        ("glmfb_cpu_share", "glmfb parent (/proc sampler, parsing)"),
    ):
        print(f"  {label:<40} {statistics.median(r[key] for r in traced_runs):.4f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == WORKLOAD_FLAG:
        workload(float(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
