"""A kernel's own time over 15 commits of a real repository, recorded in SQLite and in a real
PostgreSQL: is the change point at the right commit, is a creep caught by ``--check``, and does
a twin with no change stay without a change point?

    python benchmarks/history_commits.py [--budget 2] [--no-postgres]
    python benchmarks/history_commits.py --smoke   # 4 commits with a +50% step, SQLite: the path, not the figure

Three repositories of 15 commits each (``tests/test_history_commits.py`` builds them: a
pure-Python kernel whose rows a commit scales): ``step``, the kernel's rows x1.09 from commit 8
on (a ~9% step); ``creep``, x1.015 a commit from commit 4 to commit 15 (12 commits, ~+19% in
all); ``flat``, no change. Each repository is checked out at each commit in turn and its
one-target definition (``kernel-alone``: ``median_time`` with its interval, its budget spread
over ``--processes`` fresh processes, 8 by default: a process's memory layout moves the time
by more than its samples scatter; and ``normalized_time``, the same in units of a reference
workload timed beside it in each process, :mod:`glmfb.bench.reference`) is run with
``glmfb run`` from outside it, once into a SQLite history and once into a PostgreSQL database
(a server started here as the tests start theirs). A run on a busy host is inconclusive with
no metric (no point of the series); the figures say how many there were. Then ``glmfb history --json --check
--threshold 5%`` reads each series: it prints, per store and series, the change points (the
first commit after each, its size and confidence) and whether ``--check`` flags it, and whether
the series reads its scenario right.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_history_commits import kernel_repo, run_at  # noqa: E402

COMMITS = 15
SCENARIOS: dict[str, list[float]] = {
    "step": [1.0] * 7 + [1.09] * 8,  # commit 8 (index 7) on: +9%
    "creep": [1.0] * 3 + [1.015 ** (k + 1) for k in range(12)],  # commits 4..15: +1.5% each
    "flat": [1.0] * COMMITS,
}


def history(url: str, out: Path) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "glmfb", "history", "kernel-alone", "--history", url, "--json",
                           "--check", "--threshold", "5%"], capture_output=True, text=True, timeout=300, cwd=out)
    if done.returncode not in (0, 1, 4):  # 4: a series cannot tell (too noisy to rule a creep out)
        raise SystemExit(f"glmfb history exited {done.returncode}: {done.stderr[-800:]}")
    return done.returncode, json.loads(done.stdout)


def judge(scenario: str, shas: list[str], series: dict[str, Any], step_at: int = 8) -> tuple[str, bool]:
    """What one series (``median_time`` in seconds, or ``normalized_time`` in the reference's
    units) says, and whether it reads the scenario right: the step's one change point at its
    commit, the creep flagged by ``--check`` with no change point before commit 4, no change
    point and no flag on the twin."""
    points = series["change_points"]
    index = {sha: i + 1 for i, sha in enumerate(shas)}
    scale, unit = (1e6, "µs") if series["unit"] == "s" else (1.0, series["unit"])
    said = "; ".join(f"at commit {index.get(p['first_after']['commit'], '?')}"
                     + (f" (its bootstrap: commits {index.get(p['location']['earliest_run']['commit'], '?')}-"
                        f"{index.get(p['location']['latest_run']['commit'], '?')})" if p.get("location") else "")
                     + f": {p['regression'] * 100:+.1f}% "
                     f"[{p['regression_ci'][0] * 100:+.1f}, {p['regression_ci'][1] * 100:+.1f}], "
                     f"confidence {p['confidence'] * 100:.1f}%" for p in points) or "no change point"
    regressed = bool(series.get("regressed"))
    values = [p["value"] for p in series["points"]]
    status = series.get("check", {}).get("status", "regressed" if regressed else "pass")
    said += (f"; --check {'flags it' if regressed else 'cannot tell' if status == 'cannot_tell' else 'passes it'}; "
             f"{min(values) * scale:.4g}-{max(values) * scale:.4g} {unit}")
    said += f"\n          per commit ({unit}, value [interval]): " + ", ".join(
        f"{index.get(p['commit'], '?')}: {p['value'] * scale:.4g} [{p['ci'][0] * scale:.4g}, {p['ci'][1] * scale:.4g}]"
        if p.get("ci") else f"{index.get(p['commit'], '?')}: {p['value'] * scale:.4g}"
        for p in series["points"])
    if scenario == "step":
        right = len(points) == 1 and index.get(points[0]["first_after"]["commit"]) == step_at and regressed
    elif scenario == "creep":
        right = regressed and all(index.get(p["first_after"]["commit"], 0) >= 4 for p in points)
    else:
        right = not points and not regressed
    return said, right


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=2.0, help="each run's bench budget (s)")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=8, help="fresh processes a run's budget is spread over")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append", help="run only these scenarios")
    parser.add_argument("--smoke", action="store_true", help="4 commits, a +50%% step, SQLite only, 0.5 s runs")
    args = parser.parse_args()
    scenarios, step_at = {k: v for k, v in SCENARIOS.items() if not args.only or k in args.only}, 8
    if args.smoke:
        scenarios, step_at = {"step": [1.0] * 2 + [1.5] * 2}, 3
        args.budget, args.rows, args.no_postgres, args.processes = 0.5, 400, True, 2
    folder = Path(tempfile.mkdtemp(prefix="glmfb-history-commits-"))
    server = None
    stores = {"sqlite": lambda name: f"sqlite:///{folder / name / 'history.sqlite'}"}
    if not args.no_postgres:
        from test_history_postgres import Server

        server = Server()
        server.start()
        databases = {name: server.create_database() for name in scenarios}
        stores["postgresql"] = lambda name: databases[name]
    started = time.monotonic()
    results: list[tuple[str, str, str, bool | None]] = []  # right: None when no run recorded a point
    busy: dict[tuple[str, str], int] = {}  # runs on a busy host: inconclusive, no point of the series
    try:
        for scenario, scales in scenarios.items():
            repo = folder / scenario / "repo"
            shas = kernel_repo(repo, scales, rows=args.rows, budget=f"{args.budget}s", scaled=True,
                               processes=args.processes)
            outside = folder / scenario / "elsewhere"
            outside.mkdir()
            for number, sha in enumerate(shas, 1):
                for store, url in stores.items():
                    if run_at(repo, sha, folder / scenario / f"reports-{store}", outside, "kernel-alone", url(scenario),
                              exit_codes=(0, 4)) == 4:
                        busy[scenario, store] = busy.get((scenario, store), 0) + 1
                print(f"{scenario}: commit {number}/{len(shas)} recorded ({time.monotonic() - started:.0f} s)",
                      file=sys.stderr)
            for store, url in stores.items():
                if busy.get((scenario, store), 0) == len(shas):  # no run recorded a point: no series to read
                    results.append((scenario, store, "no point: every run was on a busy host", None))
                    continue
                code, document = history(url(scenario), folder)
                for series in document["series"]:
                    said, right = judge(scenario, shas, series, step_at)
                    results.append((scenario, f"{store} {series['metric']}", f"{said}\n          check exit {code}",
                                    right))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)  # the repositories and their histories: nothing left behind
    commits = len(next(iter(scenarios.values())))
    print(f"{'smoke run: ' if args.smoke else ''}{commits} commits per scenario, bench budget {args.budget:g} s a run "
          f"over {args.processes} fresh processes, {args.rows} rows, {time.monotonic() - started:.0f} s in all")
    for scenario, label_of, said, right in results:
        skipped = busy.get((scenario, label_of.split()[0]), 0)
        label = "UNDECIDED" if right is None else "RIGHT" if right else "WRONG"
        print(f"{scenario:>6} {label_of:>26}: {label}: {said}"
              + (f"; {skipped} run(s) on a busy host left out" if skipped else ""))
    print(f"right {sum(r[3] is True for r in results)}/{len(results)}")


if __name__ == "__main__":
    main()
