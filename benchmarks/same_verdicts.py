"""Do two commits give the same verdicts? A refactoring's guard: the deterministic corpus (the diff
definitions: they compare tensors, never times) run at REV and in this checkout, and each
verdict compared byte for byte once what must differ between two runs is left out.

    python benchmarks/same_verdicts.py [REV] [--definitions FILE ...] [-k NAME]
    python benchmarks/same_verdicts.py --smoke   # one small definition against HEAD: the path, not the figure

REV (default ``HEAD``) is checked out in a temporary git worktree (the checkout is never
touched) and each tree runs ``glmfb run DEFINITIONS --no-history`` with its own code
(``PYTHONPATH``, from its own root). Left out of the comparison: ``duration_s``, ``artifacts``,
``env`` (the commit, the dirty state), the run's id and times, and the two trees' and run
folders' paths inside strings. It prints how many verdicts are identical and, for each one that
is not, the first lines that differ.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFINITIONS = ("probes/diff.toml", "tests/acceptance/diff.toml")
SMOKE_NOTE = "smoke run (--smoke): one definition against HEAD; the figure is measured but is not the benchmark's"
RUN_FOLDER = re.compile(r"<OUT>/[0-9]{8}-[0-9]{6}-[0-9a-f]+")  # a run's folder is named by its id
VOLATILE = frozenset({"duration_s", "artifacts", "env", "run_id", "started", "finished", "id"})


def run_tree(tree: Path, out: Path, definitions: list[str], select: str | None) -> dict[str, Any]:
    """``glmfb run`` of the definitions with ``tree``'s code, from ``tree``'s root: its verdicts by name."""
    argv = [sys.executable, "-m", "glmfb", "run", *definitions, "--out", str(out), "--no-history", "--json"]
    if select:
        argv += ["-k", select]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise SystemExit(f"glmfb run in {tree} exited {done.returncode}: {done.stderr[-600:]}")
    return {v["name"]: v for v in json.loads(done.stdout)["verdicts"]}


def normalized(value: Any, replace: tuple[tuple[str, str], ...]) -> Any:
    if isinstance(value, dict):
        return {k: normalized(v, replace) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [normalized(v, replace) for v in value]
    if isinstance(value, str):
        for old, new in replace:
            value = value.replace(old, new)
        return RUN_FOLDER.sub("<OUT>/<RUN>", value)
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", nargs="?", default="HEAD", help="the commit to compare this checkout with")
    parser.add_argument("--definitions", nargs="+", default=list(DEFINITIONS))
    parser.add_argument("-k", dest="select", help="only definitions whose name matches (glmfb run -k)")
    parser.add_argument("--smoke", action="store_true")
    options = parser.parse_args()
    if options.smoke:
        print(SMOKE_NOTE, flush=True)
        options.rev, options.definitions, options.select = "HEAD", ["probes/diff.toml"], "scan-state-update-fp32"
    scratch = Path(tempfile.mkdtemp(prefix="glmfb-same-verdicts-"))
    other = scratch / "tree"
    try:
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(other), options.rev], cwd=ROOT,
                       check=True, capture_output=True, text=True)
        sha = subprocess.run(["git", "rev-parse", "--short", options.rev], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.strip()
        theirs = run_tree(other, scratch / "out-rev", options.definitions, options.select)
        ours = run_tree(ROOT, scratch / "out-here", options.definitions, options.select)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, check=False, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    replace = ((str(scratch / "out-rev"), "<OUT>"), (str(scratch / "out-here"), "<OUT>"),
               (f"{other}/", "<TREE>/"), (f"{ROOT}/", "<TREE>/"))
    if theirs.keys() != ours.keys():
        print(f"the two runs gave different definitions: {sorted(theirs.keys() ^ ours.keys())}")
    same = 0
    for name in sorted(theirs.keys() & ours.keys()):
        a = json.dumps(normalized(theirs[name], replace), indent=1, sort_keys=True).splitlines()
        b = json.dumps(normalized(ours[name], replace), indent=1, sort_keys=True).splitlines()
        if a == b:
            same += 1
            continue
        print(f"{name}: differs ({theirs[name]['status']} at {sha}, {ours[name]['status']} here)")
        for line in list(difflib.unified_diff(a, b, sha, "here", lineterm="", n=0))[2:14]:
            print(f"    {line[:160]}")
    total = len(theirs.keys() & ours.keys())
    print(f"{same} of {total} verdicts identical at {sha} and in this checkout "
          f"(left out: {', '.join(sorted(VOLATILE))}, and the trees' and run folders' paths)")


if __name__ == "__main__":
    main()
