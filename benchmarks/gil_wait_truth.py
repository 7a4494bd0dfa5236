"""How right is glmfb gil's per-thread GIL-wait share? Against a ground truth built for it.

    python benchmarks/gil_wait_truth.py [--seconds 3] [--rounds 3] [--rt] [--smoke]

The workload is the acceptance corpus's short-holds case (tests/acceptance/gil_workloads.py):
a thread pickles 6,000 dicts (a few ms, the GIL held), pauses 1 ms, again and again, beside a
main thread running torch matmuls back to back. The main thread never blocks on anything but
the GIL (each op releases it and takes it back; torch runs single-threaded), so the time it
spends blocked, by its own kernel counters (wall - CPU - run-queue time, read by the workload
itself over the same window), is its GIL wait: the truth. Printed per round:

- ``truth``: that blocked share, and the main thread's throughput against a run without the
  pickling thread (in-process, steps per second);
- ``ticks``: the share of /proc ticks that saw it on the GIL's futex (the old measure);
- ``glmfb``: glmfb's accounting (kernel counters, states seen), with its 95% interval.

``--rt`` runs the workload under SCHED_RR (needs root): the machine's other load then cannot
take the workload's CPUs, and the sampler, at normal priority, only runs when the workload
leaves a CPU free, which shows how biased tick shares get.

``--smoke``: one round of 0.5 s (CI checks the script runs; its figures are not the benchmark's).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE_NOTE = "smoke run (--smoke): 1 round of 0.5 s; the figures are measured but are not the benchmark's"
WORKLOAD = """
import os, sys, time, threading
sys.path.insert(0, {corpus!r})
import gil_workloads as g
work, seconds = sys.argv[1], float(sys.argv[2])
step = g.make("pickle", 6000, 1.0, "decode") if work == "pickle" else g.decode_steps()
step()
def counters():
    with open("/proc/thread-self/schedstat") as f:
        cpu, runqueue = f.read().split()[:2]
    return time.monotonic(), int(cpu) / 1e9, int(runqueue) / 1e9
print(threading.get_native_id(), flush=True)
sys.stdin.readline()  # the sampler started
t0, c0, q0 = counters(); steps = 0
while time.monotonic() - t0 < seconds:
    step(); steps += 1
t1, c1, q1 = counters()
wall = t1 - t0
print(steps / wall, (wall - (c1 - c0) - (q1 - q0)) / wall, flush=True)
"""


def run(work: str, seconds: float, rt: bool) -> tuple[float, float, dict[str, float] | None]:
    sys.path.insert(0, str(ROOT))
    from glmfb.gil import heartbeat as hb
    from glmfb.gil.procwatch import GilWaitSampler

    with tempfile.TemporaryDirectory() as folder:
        prefix = Path(folder) / "heartbeat"
        env = hb.injection_env(prefix, dict(os.environ))
        code = WORKLOAD.format(corpus=str(ROOT / "tests" / "acceptance"))
        argv = [sys.executable, "-c", code, work, str(seconds)]
        if rt:
            argv = ["chrt", "-r", "1", *argv]
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert child.stdout is not None and child.stdin is not None
        main_tid = int(child.stdout.readline())
        header = None
        for _ in range(500):
            header = hb.read_header(prefix)
            if header:
                break
            time.sleep(0.01)
        sampler = GilWaitSampler(child.pid, 100)
        sampler.start()
        started = time.monotonic()
        child.stdin.write("go\n")
        child.stdin.flush()
        rate, blocked = (float(x) for x in child.stdout.readline().split())
        ended = time.monotonic()
        sampler.stop()
        child.wait()
        if header is None:
            return rate, blocked, None
        beat_tid = int(header["heartbeat_tid"])
        account = sampler.thread_times(beat_tid, started, ended).get(main_tid)
        counts, ticks = sampler.waiting_counts(beat_tid)
        if account is None:
            return rate, blocked, None
        return rate, blocked, {"ticks": counts.get(main_tid, 0) / max(1, ticks), "glmfb": account.gil_wait_share,
                               "low": account.gil_wait_ci[0], "high": account.gil_wait_ci[1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rt", action="store_true", help="run the workload under SCHED_RR (root)")
    parser.add_argument("--smoke", action="store_true", help="1 round of 0.5 s (CI checks the script runs)")
    options = parser.parse_args()
    if options.smoke:
        options.rounds, options.seconds = 1, 0.5
        print(SMOKE_NOTE, flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}; {'SCHED_RR' if options.rt else 'normal'} scheduling")
    print(f"{'round':>5}  {'throughput':>10}  {'truth':>6}  {'ticks':>6}  {'glmfb':>6}  interval")
    for index in range(options.rounds):
        alone, _, _ = run("alone", options.seconds, options.rt)
        rate, blocked, measured = run("pickle", options.seconds, options.rt)
        if measured is None:
            print(f"{index + 1:>5}  no heartbeat")
            continue
        print(f"{index + 1:>5}  {rate / alone:>9.2f}x  {blocked:>6.1%}  {measured['ticks']:>6.1%}  "
              f"{measured['glmfb']:>6.1%}  [{measured['low']:.1%}, {measured['high']:.1%}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
