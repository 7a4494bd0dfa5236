"""Start-up time of `glmfb --help` and of `glmfb gate` on a 1,000-verdict run, each beside
`python -c pass`, measured interleaved in one run (median and p90 of N rounds).

    python benchmarks/startup.py [--rounds 30] [--smoke]

Targets (issue 18): ``glmfb --help`` at most 0.10 s and ``glmfb gate`` at most 0.15 s (median),
on the 2-core development machine when it is otherwise idle; on a loaded machine read the
figures beside ``python -c pass`` (the "x python" column). The floors are printed too: the
interpreter, ``import typer`` (the CLI framework every command loads) and ``import
glmfb.contract.verdict`` (the contract).

Commands run as an installed package runs: with its bytecode. The sources are compiled first
and the children run without ``PYTHONDONTWRITEBYTECODE`` (set on some machines, where it makes
every start compile every module it imports: about 0.15 s more here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from glmfb.contract.step import Step
from glmfb.contract.verdict import Layer, Metric, Run, Status, Verdict

TARGETS = {"glmfb --help": 0.10, "glmfb gate (1,000 verdicts)": 0.15}  # median seconds
SMOKE_NOTE = "smoke run (--smoke): every command, 2 rounds; the figures are measured but are not the benchmark's"


def thousand_verdict_run() -> Run:
    statuses = [Status.PASS, Status.WARN, Status.PASS, Status.PASS, Status.INCONCLUSIVE]
    verdicts = tuple(
        Verdict(
            probe="bench",
            name=f"kernel-{i}",
            status=statuses[i % len(statuses)],
            layer=Layer.KERNEL,
            why="ratio of medians within the threshold",
            where={"kernel": f"k{i}", "shape": "8x4096"},
            metric=Metric("change", 0.01, "ratio", 0.05, (-0.01, 0.03)),
            evidence=[{"kind": "samples", "n": 200, "median_s": 1.3e-4}],
            next=[Step("reproduce on the worst shape", "bench",
                       {"baseline": "a.py:k", "candidate": "b.py:k", "shapes": ["8x4096"]})],
        )
        for i in range(1000)
    )
    return Run(id="bench-startup", started="2026-11-29T00:00:00+00:00", verdicts=verdicts)


def time_command(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="every command, 2 rounds (CI checks the script runs)")
    options = parser.parse_args()
    if options.smoke:
        options.rounds = 2
        print(SMOKE_NOTE, flush=True)
    import compileall
    import os

    import glmfb

    compileall.compile_dir(str(Path(glmfb.__file__).parent), quiet=1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as folder:
        run_file = Path(folder) / "run.json"
        run_file.write_text(json.dumps(thousand_verdict_run().to_dict()))
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "python -c 'import typer'": [sys.executable, "-c", "import typer"],
            "python -c 'import glmfb.contract.verdict'": [sys.executable, "-c", "import glmfb.contract.verdict"],
            "glmfb --help": [sys.executable, "-m", "glmfb", "--help"],
            "glmfb gate (1,000 verdicts)": [sys.executable, "-m", "glmfb", "gate", str(run_file)],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for argv in commands.values():  # warm the file cache once
            time_command(argv, env)
        for _ in range(options.rounds):
            for name, argv in commands.items():
                times[name].append(time_command(argv, env))
    baseline = statistics.median(times["python -c pass"])
    print(f"{'command':<34} {'median s':>9} {'p90 s':>7} {'x python':>9}  (rounds: {options.rounds})")
    for name, samples in times.items():
        median = statistics.median(samples)
        p90 = sorted(samples)[int(0.9 * (len(samples) - 1))]
        print(f"{name:<34} {median:>9.3f} {p90:>7.3f} {median / baseline:>9.1f}")
    for name, target in TARGETS.items():
        median = statistics.median(times[name])
        print(f"target: {name} at most {target:.2f} s -> {'met' if median <= target else 'NOT met'} ({median:.3f} s)")


if __name__ == "__main__":
    main()
