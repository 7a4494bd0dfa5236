"""What a long history costs ``glmfb run``: a definition whose own series already holds 100,
1,000 and 10,000 earlier runs, ``glmfb run`` of it recording into that store (and drawing its
report, which reads the series) against ``glmfb run --no-history``, alternating in one sitting so
load bursts fall on both alike; and the report's read of the history alone
(:func:`glmfb.workflows.history.series.history_of_run`), in SQLite and, with ``--postgres``, in
PostgreSQL.

    python benchmarks/history_length.py [--lengths 100,1000,10000] [--rounds 3] [-k NAME]
    python benchmarks/history_length.py --postgres postgresql://USER@HOST:PORT/postgres
    python benchmarks/history_length.py --smoke     # for CI: the path, not the figures

The earlier runs are copies of one real run's rows (the same definition hash, machine and git
state, so they are the run's own series), each an hour apart with 1% noise on its value. Goal
(issue 47): recording at 10,000 runs costs at most 1.2x the run without a history.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def glmfb_run(out: Path, select: str, history: str | None) -> float:
    """Wall seconds of ``glmfb run probes -k SELECT`` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GLMFB_HISTORY", None)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "glmfb", "run", "probes", "-k", select, "--out", str(out),
                    *(["--history", history] if history else ["--no-history"])],
                   cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    return time.perf_counter() - started


def grow(url: str, out: Path, select: str, length: int) -> None:
    """A store whose series of ``select`` holds ``length`` runs: one real run, then
    ``length - 1`` earlier copies of its rows."""
    from glmfb.workflows.history.store import open_store

    glmfb_run(out, select, url)
    with open_store(url) as store:
        seed = store.records()
    started = datetime.fromisoformat(seed[0].time)
    rng = random.Random(length)
    batch = []
    for index in range(length - 1):
        when = (started - timedelta(hours=length - index)).isoformat()
        noise = 1.0 + rng.gauss(0.0, 0.01)
        batch.extend(dataclasses.replace(
            row, time=when, run_id=f"earlier-{index:05d}",
            value=None if row.value is None else row.value * noise,
            low=None if row.low is None else row.low * noise,
            high=None if row.high is None else row.high * noise) for row in seed)
        if len(batch) >= 5000 or index == length - 2:
            with open_store(url) as store:
                store.record(batch)
            batch = []


def report_read_s(url: str, out: Path) -> float:
    """Seconds the report's read of the history takes for the newest run in ``out``."""
    from glmfb.workflows.history.series import history_of_run

    run_id = (out / "LATEST").read_text().strip()
    history_of_run(url, run_id)  # imports and the store's first open: not the read's cost
    started = time.perf_counter()
    history_of_run(url, run_id)
    return time.perf_counter() - started


def postgres_database(admin_url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    return admin_url.rsplit("/", 1)[0] + f"/{name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="100,1000,10000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-k", dest="select", default="scan-state-update-fp32")
    parser.add_argument("--postgres", default=None, help="a PostgreSQL server's URL (a database per length is made)")
    parser.add_argument("--smoke", action="store_true", help="one round at 20 runs: checks the path, not the figures")
    options = parser.parse_args()
    lengths = [int(n) for n in options.lengths.split(",")]
    if options.smoke:
        lengths, options.rounds = [20], 1
        print("smoke run (--smoke): one round at 20 runs; its figures are not the benchmark's")
    print(f"glmfb run -k {options.select}, {options.rounds} round(s) a length, alternating; medians")
    print(f"{'store':<11}{'runs':>7}{'--no-history':>14}{'recording':>11}{'ratio':>7}{'report read':>13}")
    with tempfile.TemporaryDirectory(prefix="glmfb-history-length-") as scratch:
        folder = Path(scratch)
        stores = ["sqlite"] + (["postgresql"] if options.postgres else [])
        for kind in stores:
            for length in lengths:
                if kind == "sqlite":
                    url = f"sqlite:///{folder / f'len-{length}.sqlite'}"
                else:
                    url = postgres_database(options.postgres, f"glmfb_history_length_{length}")
                out = folder / f"{kind}-{length}"
                grow(url, out, options.select, length)
                walls: dict[bool, list[float]] = {True: [], False: []}
                reads = []
                for _ in range(options.rounds):
                    walls[False].append(glmfb_run(out, options.select, None))
                    walls[True].append(glmfb_run(out, options.select, url))
                    reads.append(report_read_s(url, out))
                plain, recording = statistics.median(walls[False]), statistics.median(walls[True])
                print(f"{kind:<11}{length:>7}{plain:>12.2f} s{recording:>9.2f} s{recording / plain:>7.2f}"
                      f"{statistics.median(reads) * 1000:>10.0f} ms", flush=True)


if __name__ == "__main__":
    main()
