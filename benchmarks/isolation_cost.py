"""What running each probe in a supervised child process costs: wall time of the same probe
command with the child (the default) and in glmfb's own process (``GLMFB_ISOLATE=0``),
alternating, so load bursts fall on both alike. The timing a bench measures happens inside the
child either way; the cost is the child's start-up (an interpreter, glmfb's and torch's imports)
and the round trip of the config and the verdict.

    python benchmarks/isolation_cost.py --rounds 8

``--smoke``: one round (CI checks the script runs; its figures are not the benchmark's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "scenarios" / "decode_norm" / "kernels.py"
SMOKE_NOTE = "smoke run (--smoke): every probe, 1 round; the figures are measured but are not the benchmark's"

TARGETS = '''
import time, torch

def kernel(shape):
    x = torch.ones(shape)
    return lambda: x * 2.0

def callable_target():
    return lambda request: {"y": request["input_ids"].float()}

def iteration():
    return lambda: {"work_s": 0.0}
'''


def commands(folder: Path) -> dict[str, list[str]]:
    targets = folder / "targets.py"
    targets.write_text(TARGETS)
    requests = folder / "requests.jsonl"
    requests.write_text('{"id": "a", "length": 16}\n{"id": "b", "length": 32}\n')
    out = ["--out", str(folder / "reports"), "--json"]
    return {
        "bench (8x64, budget 1s)": ["bench", f"{targets}:kernel", f"{targets}:kernel", "--shape", "8x64",
                                    "--budget", "1", "--no-profile", "--threshold", "50%", *out],
        "diff (2 requests)": ["diff", f"{targets}:callable_target", f"{targets}:callable_target",
                              "--requests", str(requests), *out],
        "gap (8 iterations)": ["gap", f"{targets}:iteration", f"{targets}:iteration", "--repeats", "8",
                               "--no-attribute", "--threshold", "300%", *out],
    }


def timed(args: list[str], isolate: bool) -> float:
    env = {**os.environ, "GLMFB_ISOLATE": "1" if isolate else "0", "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "glmfb", *args], capture_output=True, env=env, check=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="1 round (CI checks the script runs)")
    options = parser.parse_args()
    if options.smoke:
        options.rounds = 1
        print(SMOKE_NOTE, flush=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, args in commands(Path(tmp)).items():
            times: dict[bool, list[float]] = {True: [], False: []}
            for index in range(options.rounds):
                for isolate in ((True, False) if index % 2 == 0 else (False, True)):
                    times[isolate].append(timed(args, isolate))
            isolated, inline = statistics.median(times[True]), statistics.median(times[False])
            extra = statistics.median(a - b for a, b in zip(times[True], times[False], strict=True))
            print(f"{label:28s} in-process {inline:6.2f} s   supervised child {isolated:6.2f} s   "
                  f"median paired cost {extra:+.2f} s over {options.rounds} rounds")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
