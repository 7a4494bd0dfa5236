"""Every script in benchmarks/ runs at its smoke size, so none rots unseen.

One test per ``benchmarks/*.py``, found by globbing: a new script must take ``--smoke`` (the
smallest run of every section it measures and every table it prints, in seconds), or its test
fails. A smoke run must exit 0 (accuracy.py's 1 for a wrong verdict is a real failure), say in
its first or last line of output that it is a smoke run, and print at least one line with a
measured figure besides that one. The seconds each script took are printed (with pytest's
capture bypassed, so CI's log shows them).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
TIMEOUT_S = 300
FIGURE = re.compile(r"\d")


def run_smoke(script: Path) -> tuple[int, str, str, float]:
    """``python SCRIPT --smoke`` from the repository root, in a session of its own so that a
    timeout stops what it started too (servers, ranks); exit code, stdout, stderr, seconds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, str(script), "--smoke"], cwd=ROOT, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        stdout, stderr = child.communicate()
        pytest.fail(f"{script.name} --smoke ran past {TIMEOUT_S} s\n{stdout[-2000:]}\n{stderr[-2000:]}")
    return child.returncode, stdout, stderr, time.perf_counter() - started


def test_benchmarks_are_found() -> None:
    assert len(SCRIPTS) >= 11, [s.name for s in SCRIPTS]


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_smoke_run(script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr, seconds = run_smoke(script)
    with capsys.disabled():
        print(f"\n{script.name} --smoke: {seconds:.1f} s, exit {code}")
    assert code == 0, f"{script.name} --smoke exited {code}\n{stdout[-3000:]}\n{stderr[-3000:]}"
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, f"{script.name} --smoke printed nothing on stdout\n{stderr[-2000:]}"
    said = [i for i in (0, len(lines) - 1) if "smoke run" in lines[i]]
    assert said, f"neither the first nor the last line says it is a smoke run: {lines[0]!r} ... {lines[-1]!r}"
    figures = [line for i, line in enumerate(lines) if i not in said and FIGURE.search(line)]
    assert figures, f"{script.name} --smoke printed no figure\n{stdout[-2000:]}"
