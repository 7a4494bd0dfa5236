"""Warm workers against cold children (issue 38): what a probe waits before its first progress
message, the bundled suite's wall time, and the MCP agent loop, each cold (every probe in a
fresh ``python -m glmfb.core.child``) and warm (forked from the zygote of glmfb.core.workers).

    python benchmarks/warm_workers.py [--rounds 5] [--suite all|small|none] [--mcp-rounds 2]

1. **Before the first progress message.** The same probe, run as ``glmfb run`` runs it
   (``supervise.run_isolated``) and cancelled at its first message: the time from the call to
   that message is the child's start-up (an interpreter, glmfb's, numpy's and torch's imports,
   or a fork) plus the probe's own set-up before it says anything. Rounds alternate cold and
   warm; each warm round opens a pool, waits for its zygote (that figure is printed too: it is
   paid once per glmfb run, in the background) and then measures. Issue target: under 0.5 s
   warm (2-5 s cold here before).
2. **The bundled suite**, ``glmfb run`` on probes/ (``--suite all``; ``small``: one small diff),
   with ``GLMFB_WORKERS=off`` and with the default (warm): wall time, expectations met, and the
   run's ``env.workers``.
3. **The MCP agent loop** of benchmarks/mcp_agent_loop.py over stdio, its server with
   ``GLMFB_WORKERS=off`` and with the default: each call's wall time and the loop's. Issue
   target: twice as fast.

The machine is shared: the load average is printed at the start and end of each section.
``--smoke``: one round of section 1 (bench and gap), the small suite, and the loop with 1 s
budgets and without its bench steps (CI checks the script runs; its figures are not the
benchmark's).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SMOKE_NOTE = ("smoke run (--smoke): bench and gap once, one small diff as the suite, the agent loop with 1 s budgets "
              "and no bench steps; the figures are measured but are not the benchmark's")
SMALL_SUITE = ["scan-state-update-fp32"]
STEP = re.compile(r"^\[(\d+)\] call (\S+) .*\((\d+(?:\.\d+)?) s\)$")

TARGETS = '''
import time

def kernel(shape):
    import torch
    x = torch.ones(shape)
    return lambda: x * 2.0

def callable_target():
    import torch
    return lambda request: {"y": request["input_ids"].to(torch.float32)}

def iteration():
    def step():
        started = time.perf_counter()
        sum(range(20_000))
        return {"work_s": time.perf_counter() - started}
    return step

def loop():
    return lambda: time.sleep(0.001)
'''


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


# --------------------------------------------------------------------------------------------
# 1. Before the first progress message
# --------------------------------------------------------------------------------------------


def configs(folder: Path, kinds: list[str]) -> dict[str, Any]:
    """A small config per probe kind, its targets in ``folder``."""
    from glmfb.core.probe import ProbeSpec, get_probe

    targets = folder / "targets.py"
    targets.write_text(TARGETS)
    requests = folder / "requests.jsonl"
    requests.write_text('{"id": "a", "length": 16}\n{"id": "b", "length": 32}\n')
    specs = {
        "bench": dict(baseline=f"{targets}:kernel", candidate=f"{targets}:kernel",
                      options={"shapes": ((8, 64),), "profile": False}),
        "diff": dict(baseline=f"{targets}:callable_target", candidate=f"{targets}:callable_target",
                     options={"requests": requests}),
        "gap": dict(baseline=f"{targets}:iteration", candidate=f"{targets}:iteration",
                    options={"attribute": False}),
        "gil": dict(target=f"{targets}:loop", options={}),
    }
    built = {}
    for kind in kinds:
        spec = ProbeSpec(kind=kind, name=kind, label=kind, **specs[kind])
        built[kind] = get_probe(kind).build(spec)
    return built


def first_message_s(kind: str, config: Any, folder: Path) -> float:
    """Seconds from the call to the probe's first progress message (then it is cancelled)."""
    from glmfb.core.supervise import run_isolated

    cancel = threading.Event()
    first: list[float] = []
    started = time.perf_counter()

    def progress(message: str) -> None:
        if not first:
            first.append(time.perf_counter() - started)
            cancel.set()

    run_isolated(kind, kind, config, run_id="warm-workers", artifact_dir=folder, progress=progress, cancel=cancel,
                 timeout_s=300)
    return first[0] if first else float("nan")


def section_first_message(rounds: int, kinds: list[str], scratch: Path) -> None:
    from glmfb.core import workers

    print(f"\n== 1. before the first progress message (supervise.run_isolated, {rounds} round(s), load {load()}) ==")
    built = configs(scratch, kinds)
    times: dict[tuple[str, str], list[float]] = {}
    ready_s: list[float] = []
    for index in range(rounds):
        for side in (("cold", "warm") if index % 2 == 0 else ("warm", "cold")):
            if side == "cold":
                for kind in kinds:
                    times.setdefault((kind, side), []).append(
                        first_message_s(kind, built[kind], scratch / f"r{index}-{side}-{kind}"))
                continue
            opened_at = time.perf_counter()
            with workers.pool("run") as pool:
                if pool is None or not pool.wait_ready():
                    raise SystemExit(f"no warm workers: {pool.failed if pool else 'the pool is off'}")
                ready_s.append(time.perf_counter() - opened_at)
                for kind in kinds:
                    times.setdefault((kind, side), []).append(
                        first_message_s(kind, built[kind], scratch / f"r{index}-{side}-{kind}"))
                summary = pool.summary()
            if summary.get("cold"):
                raise SystemExit(f"a warm round went cold: {summary}")
    for kind in kinds:
        cold, warm = times[(kind, "cold")], times[(kind, "warm")]
        print(f"{kind:6s} cold {statistics.median(cold):5.2f} s  warm {statistics.median(warm):5.2f} s  "
              f"(medians; cold {' '.join(f'{t:.2f}' for t in cold)}; warm {' '.join(f'{t:.2f}' for t in warm)})")
    print(f"zygote ready (its imports, paid once per pool) in {statistics.median(ready_s):.2f} s "
          f"(median of {' '.join(f'{t:.2f}' for t in ready_s)}); load {load()}")


# --------------------------------------------------------------------------------------------
# 2. The bundled suite
# --------------------------------------------------------------------------------------------


def suite_once(out: Path, select: list[str], warm: bool) -> tuple[float, dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if warm:
        env.pop("GLMFB_WORKERS", None)
    else:
        env["GLMFB_WORKERS"] = "off"
    argv = [sys.executable, "-m", "glmfb", "run", "--out", str(out), "--no-history", str(ROOT / "probes")]
    for pattern in select:
        argv += ["-k", pattern]
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          check=False)
    wall = time.perf_counter() - started
    pointer = out / "LATEST"
    run_file = out / pointer.read_text().strip() / "run.json" if pointer.is_file() else None
    if run_file is None or not run_file.is_file():
        raise SystemExit(f"glmfb run wrote no run.json (exit {done.returncode}): {done.stderr[-800:]}")
    return wall, json.loads(run_file.read_text())


def section_suite(which: str, runs: int, scratch: Path) -> None:
    select = SMALL_SUITE if which == "small" else []
    label = "one small diff" if which == "small" else "every definition in probes/"
    print(f"\n== 2. the bundled suite: glmfb run ({label}), cold then warm, {runs} time(s) ==")
    for index in range(runs):
        for warm in ((False, True) if index % 2 == 0 else (True, False)):
            before = load()
            wall, run = suite_once(scratch / f"suite-{index}-{'warm' if warm else 'cold'}", select, warm)
            summary = run["summary"]
            print(f"{'warm' if warm else 'cold'}: {wall:6.1f} s wall, expectations {summary['expect_met']}/"
                  f"{summary['expect_met'] + summary['expect_unmet']} met, {len(run['verdicts'])} verdicts, "
                  f"sum of duration_s {sum(v['duration_s'] for v in run['verdicts']):.1f} s, "
                  f"workers {run['env'].get('workers', 'none (cold)')}, load {before} -> {load()}")


# --------------------------------------------------------------------------------------------
# 3. The MCP agent loop
# --------------------------------------------------------------------------------------------


def agent_loop(warm: bool, budget: str, benches: bool) -> tuple[float, list[tuple[str, float]]]:
    """One loop of benchmarks/mcp_agent_loop.py over stdio (its runs in a scratch folder): its wall
    time and each call's."""
    import tempfile

    import anyio

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import mcp_agent_loop
    finally:
        sys.path.pop(0)
    saved = os.environ.get("GLMFB_WORKERS")
    if warm:
        os.environ.pop("GLMFB_WORKERS", None)
    else:
        os.environ["GLMFB_WORKERS"] = "off"
    transcript = io.StringIO()
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(transcript), tempfile.TemporaryDirectory(prefix="glmfb-agent-loop-") as runs:
            anyio.run(mcp_agent_loop.main, False, budget, Path(runs) / "reports", benches, True)
    finally:
        if saved is None:
            os.environ.pop("GLMFB_WORKERS", None)
        else:
            os.environ["GLMFB_WORKERS"] = saved
    wall = time.perf_counter() - started
    steps = [(match.group(2), float(match.group(3)))
             for match in map(STEP.match, transcript.getvalue().splitlines()) if match]
    return wall, steps


def section_agent_loop(rounds: int, budget: str, benches: bool) -> None:
    print(f"\n== 3. the MCP agent loop (benchmarks/mcp_agent_loop.py over stdio, budgets {budget}"
          f"{'' if benches else ', no bench steps'}), {rounds} round(s) each ==")
    walls: dict[bool, list[float]] = {False: [], True: []}
    steps: dict[bool, list[list[tuple[str, float]]]] = {False: [], True: []}
    for index in range(rounds):
        for warm in ((False, True) if index % 2 == 0 else (True, False)):
            before = load()
            wall, calls = agent_loop(warm, budget, benches)
            walls[warm].append(wall)
            steps[warm].append(calls)
            print(f"{'warm' if warm else 'cold'}: {wall:6.1f} s for the loop ({len(calls)} calls, "
                  f"{sum(s for _, s in calls):.1f} s in them), load {before} -> {load()}")
    cold, warm_ = statistics.median(walls[False]), statistics.median(walls[True])
    print(f"loop: cold {cold:.1f} s, warm {warm_:.1f} s (medians): {cold / warm_:.2f}x")
    first_cold, first_warm = steps[False][0], steps[True][0]
    if [t for t, _ in first_cold] == [t for t, _ in first_warm]:
        for index, (tool, _) in enumerate(first_cold):
            cold_s = statistics.median(run[index][1] for run in steps[False])
            warm_s = statistics.median(run[index][1] for run in steps[True])
            print(f"    [{index + 1}] {tool:12s} cold {cold_s:5.1f} s  warm {warm_s:5.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of section 1")
    parser.add_argument("--suite", choices=("all", "small", "none"), default="all")
    parser.add_argument("--suite-runs", type=int, default=1)
    parser.add_argument("--mcp-rounds", type=int, default=2)
    parser.add_argument("--smoke", action="store_true")
    options = parser.parse_args()
    kinds = ["bench", "diff", "gap", "gil"]
    budget, benches = "3s", True
    if options.smoke:
        print(SMOKE_NOTE, flush=True)
        options.rounds, options.suite, options.suite_runs, options.mcp_rounds = 1, "small", 1, 1
        kinds, budget, benches = ["bench", "gap"], "1s", False
    print(f"load average at start: {load()} ({os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory(prefix="glmfb-warm-workers-") as tmp:
        scratch = Path(tmp)
        section_first_message(options.rounds, kinds, scratch)
        if options.suite != "none":
            section_suite(options.suite, options.suite_runs, scratch)
        if options.mcp_rounds > 0:
            section_agent_loop(options.mcp_rounds, budget, benches)
    print(f"\nload average at end: {load()}")
    if options.smoke:
        print(SMOKE_NOTE)


if __name__ == "__main__":
    main()
