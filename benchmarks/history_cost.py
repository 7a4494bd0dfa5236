"""What recording the history costs ``glmfb run``: the record step, timed in a fresh process
as ``glmfb run`` takes it (the git state of the definition's repository, the store opened and
its schema checked, one transaction of rows), beside the wall time of the run it records; and
``glmfb run`` itself with and without ``--no-history``, alternating, so load bursts fall on
both alike.

    python benchmarks/history_cost.py [--rounds 5] [-k scan-state-update-fp32] [--rows 10000]
    python benchmarks/history_cost.py --smoke     # for CI

The record step is timed into a store that already holds ``--rows`` rows (a history that has
grown), and into PostgreSQL too when ``--postgres URL`` is given. Goal (issue 19): under 2% of
the run's time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What glmfb run has imported and loaded before it records; then the record step, timed.
RECORD = """
import json, sys, time
from pathlib import Path
import glmfb.core.env
from glmfb.workflows import suite
from glmfb.contract.verdict import load_document
definitions = suite.select(suite.load_definitions(suite.discover([Path(sys.argv[3])])), [sys.argv[4]])
run = load_document(json.loads(Path(sys.argv[2]).read_text()))
started = time.perf_counter()
from glmfb.workflows.history.record import record_run, suite_origins
record_run(sys.argv[1], run, suite_origins(definitions))
print(time.perf_counter() - started)
"""

GROW = """
import sys
from glmfb.workflows.history.store import Record, open_store
with open_store(sys.argv[1]) as store:
    store.record([Record(time="2026-01-01T00:00:00+00:00", run_id=f"old-{i}", definition=f"d{i % 50}",
                         definition_hash=None, probe="bench", status="pass", layer="kernel", metric="time_change",
                         value=0.01) for i in range(int(sys.argv[2]))])
"""


def python(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GLMFB_HISTORY", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env, check=True)


def timed_run(out: Path, select: str, history: bool) -> tuple[float, Path]:
    started = time.perf_counter()
    python("-m", "glmfb", "run", "probes", "-k", select, "--out", str(out), *([] if history else ["--no-history"]))
    elapsed = time.perf_counter() - started
    return elapsed, out / (out / "LATEST").read_text().strip() / "run.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-k", dest="select", default="scan-state-update-fp32")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--postgres", default=None, help="also time the record step into this database")
    parser.add_argument("--smoke", action="store_true", help="1 round into 200 rows: checks the path, not the figure")
    options = parser.parse_args()
    if options.smoke:
        options.rounds, options.rows = 1, 200
        print("smoke run (--smoke): 1 round into a store of 200 rows; its figures are not the benchmark's")
    with tempfile.TemporaryDirectory(prefix="glmfb-history-cost-") as scratch:
        measure(options, Path(scratch))


def measure(options: argparse.Namespace, folder: Path) -> None:
    """Time ``options.rounds`` runs with and without the record step, the store in ``folder``."""
    store = f"sqlite:///{folder / 'grown.sqlite'}"
    python("-c", GROW, store, str(options.rows))
    definition = next(p for p in sorted((ROOT / "probes").glob("*.toml")) if options.select in p.read_text())

    walls: dict[bool, list[float]] = {True: [], False: []}
    records: dict[str, list[float]] = {"sqlite": [], **({"postgresql": []} if options.postgres else {})}
    for _ in range(options.rounds):
        for history in (True, False):
            elapsed, run_file = timed_run(folder / "reports", options.select, history)
            walls[history].append(elapsed)
        records["sqlite"].append(float(python("-c", RECORD, store, str(run_file), str(definition),
                                               options.select).stdout))
        if options.postgres:
            records["postgresql"].append(float(python("-c", RECORD, options.postgres, str(run_file), str(definition),
                                                      options.select).stdout))
    run = json.loads(run_file.read_text())
    wall = statistics.median(walls[False])
    print(f"glmfb run -k {options.select}: {len(run['verdicts'])} verdict(s), {options.rounds} rounds, "
          f"store grown to {options.rows} rows")
    print(f"  wall, --no-history   median {wall:.2f} s  (min {min(walls[False]):.2f}, max {max(walls[False]):.2f})")
    print(f"  wall, recording      median {statistics.median(walls[True]):.2f} s  (min {min(walls[True]):.2f}, "
          f"max {max(walls[True]):.2f})")
    for name, seconds in records.items():
        median = statistics.median(seconds)
        print(f"  record step, {name:<10} median {median * 1000:.1f} ms  (max {max(seconds) * 1000:.1f} ms): "
              f"{median / wall:.2%} of the run's wall time")


if __name__ == "__main__":
    main()
