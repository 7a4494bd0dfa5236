"""Wall time of the bundled suite, ``glmfb run``, N times: per run its wall time, the
expectations met, the host's load, and each verdict's ``duration_s``; with ``--phases``, also
where each probe's time goes, from its progress messages' timestamps (each probe run alone).

    python benchmarks/suite_speed.py [--runs 3] [--phases] [-k PATTERN ...] [--smoke]

Issue 22's target: the bundled suite in 60 s or less of wall time on the 2-core development
machine, with all 16 expectations met. The machine is shared, so read the load beside each
figure (``os.getloadavg()`` before and after each run). ``--smoke`` runs two small diffs (the
pair the scheduler runs side by side) once, then the phases of one of them.

``--phases`` runs every selected definition on its own through :func:`glmfb.workflows.suite.run_suite`
(each in its supervised child, as ``glmfb run`` does) and timestamps every progress message as
it arrives: a phase is the time from one message to the next, grouped by the message with its
numbers taken out ("building allocation N of N a side"), the last one up to the verdict.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE_SELECT = ["llama-clean-vs-itself", "scan-state-update-fp32"]
SMOKE_PHASES = ["scan-state-update-fp32"]  # the phases section's path needs one definition alone, not two
SMOKE_NOTE = ("smoke run (--smoke): two diffs, one run, then one diff's phases; the figures are measured but are "
              "not the benchmark's")
NUMBER = re.compile(r"\d+(\.\d+)?")


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def run_once(out: Path, select: list[str], paths: list[str]) -> tuple[float, dict]:
    """One ``glmfb run`` into ``out``: its wall time and its run.json."""
    argv = [sys.executable, "-m", "glmfb", "run", "--out", str(out), *paths]
    for pattern in select:
        argv += ["-k", pattern]
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    wall = time.perf_counter() - started
    pointer = out / "LATEST"
    if not pointer.is_file():
        raise SystemExit(f"glmfb run wrote no run (exit {done.returncode}): {done.stderr[-800:]}")
    run_file = out / pointer.read_text().strip() / "run.json"
    if not run_file.is_file():
        raise SystemExit(f"glmfb run wrote no run.json (exit {done.returncode}): {done.stderr[-800:]}")
    return wall, json.loads(run_file.read_text())


def phases(select: list[str], paths: list[str], out: Path) -> None:
    """Every selected definition alone, its progress messages timestamped (see the docstring)."""
    from glmfb.workflows import suite

    search = paths or [str(ROOT / "probes")]
    chosen = suite.selected(suite.load_definitions(suite.discover(search)), select, search)
    for definition in chosen:
        marks: list[tuple[float, str]] = []
        context = suite.SuiteContext(f"phases-{definition.name}", out / definition.name,
                                     on_progress=lambda message, marks=marks: marks.append((time.perf_counter(), message)))
        started = time.perf_counter()
        run = suite.run_suite([definition], context)
        ended = time.perf_counter()
        verdict = run.verdicts[0]
        spent: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        points = [(started, "child start-up and imports"), *marks, (ended, "")]
        for (at, message), (after, _) in itertools.pairwise(points):
            key = NUMBER.sub("N", message)
            spent[key] += after - at
            counts[key] += 1
        print(f"{definition.probe} {definition.name}: {ended - started:.1f} s wall, duration_s "
              f"{verdict.duration_s:.1f}, {verdict.status.value}, expectation met: {verdict.expect_met}, load {load()}")
        for key, seconds in sorted(spent.items(), key=lambda kv: -kv[1])[:8]:
            print(f"    {seconds:6.1f} s  {counts[key]:3d} x  {key[:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--phases", action="store_true", help="also each probe alone, its phases")
    parser.add_argument("-k", dest="select", action="append", default=[], help="definitions to run (glob/substring)")
    parser.add_argument("paths", nargs="*", help="definition files or folders (default: probes/)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        print(SMOKE_NOTE)
        args.runs, args.select, args.phases = 1, SMOKE_SELECT, True
    with tempfile.TemporaryDirectory(prefix="glmfb-suite-speed-") as scratch:
        walls: list[float] = []
        durations: dict[str, list[float]] = defaultdict(list)
        for index in range(args.runs):
            before = load()
            wall, run = run_once(Path(scratch) / f"run-{index}", args.select, args.paths)
            summary = run["summary"]
            verdicts = run["verdicts"]
            walls.append(wall)
            for verdict in verdicts:
                durations[verdict["name"]].append(verdict["duration_s"])
            print(f"run {index + 1}: {wall:.1f} s wall, expectations {summary['expect_met']}/"
                  f"{summary['expect_met'] + summary['expect_unmet']} met, {len(verdicts)} verdicts, "
                  f"load {before} before, {load()} after")
        if walls:
            print(f"median wall {statistics.median(walls):.1f} s over {len(walls)} run(s)")
        for name, values in durations.items():
            print(f"    {statistics.median(values):6.1f} s  {name} (duration_s, median)")
        if args.phases:
            phases(SMOKE_PHASES if args.smoke else args.select, args.paths, Path(scratch) / "phases")
    if args.smoke:
        print(SMOKE_NOTE)


if __name__ == "__main__":
    main()
