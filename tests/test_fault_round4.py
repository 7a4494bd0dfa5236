"""Faults a tester reproduced from outside (round 4), each through ``glmfb`` as a user runs it.

- A target's error naming a file whose name is not UTF-8 (``os.listdir`` gives surrogate
  escapes) ended the run with an internal error, no ``--json``, no report.html.
- A target's text with ANSI colours, a window title (OSC 0) and a hyperlink (OSC 8) put raw
  ESC/BEL bytes into report.html and the terminal.
- A target that floods stderr (hundreds of MB) and aborts: glmfb read the whole log to quote
  its last lines (memory as large as the flood), and kept the whole log in the run folder.
- Two ``glmfb run --out o`` at once: the gate refused with "a newer invocation ... did not
  finish", which was false.
- A definition, a policy or an ``--arg`` nested 30,000 levels deep: an internal
  RecursionError, exit 3.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ESC, BEL = "\x1b", "\x07"

TARGET = textwrap.dedent('''
    import os
    import time

    import torch


    def make(delay=0.0):
        time.sleep(delay)
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Embedding(64, 8), torch.nn.Linear(8, 8))


    def latin1(folder):
        """A checkpoint loader that lists its folder and names what it found in its error."""
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(os.fsencode(folder), b"caf\\xe9.safetensors"), "wb"):
            pass
        found = ", ".join(os.listdir(folder))
        raise FileNotFoundError(
            "no weights matching model-*.safetensors in " + found
            + " \\x1b[31;1mCUDA error\\x1b[0m \\x1b]0;window title\\x07"
            + "see \\x1b]8;;https://example.com/help\\x1b\\\\the help page\\x1b]8;;\\x1b\\\\")


    def flood(megabytes):
        line = b"x" * (1 << 20) + b"\\n"
        for _ in range(megabytes):
            os.write(2, line)
        os.write(2, b"the last line before the abort\\n")
        os.abort()
''')


def glmfb(*args: str, cwd: Path, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("GLMFB_HISTORY", None)
    return subprocess.run([sys.executable, "-m", "glmfb", *args], cwd=cwd, env=env, capture_output=True,
                          timeout=300, **kwargs)  # type: ignore[call-overload,no-any-return]


def definition(tmp_path: Path, name: str, candidate: str, **args: object) -> Path:
    (tmp_path / "target.py").write_text(TARGET)
    (tmp_path / "requests.jsonl").write_text('{"id": "r", "length": 4, "seed": 1, "vocab": 64}\n')
    path = tmp_path / f"{name}.toml"
    table = ", ".join(f"{key} = {json.dumps(value)}" for key, value in args.items())
    path.write_text(textwrap.dedent(f'''
        [[probe]]
        name = "{name}"
        probe = "diff"
        baseline = "target.py:make"
        candidate = "target.py:{candidate}"
        options = {{ requests = "requests.jsonl", minimize = false }}
    ''') + (f"candidate_args = {{ {table} }}\n" if table else ""))
    return path


def test_a_target_error_in_bytes_that_are_not_utf8_with_control_sequences_finishes_the_run(tmp_path: Path) -> None:
    """Every writer carries the text: --json parses, run.json, junit.xml and report.html are
    written, the history holds the verdict; the bytes read as ``\\xe9``; the page and the
    terminal show the message without ESC or BEL, its words kept."""
    path = definition(tmp_path, "latin", "latin1", folder=str(tmp_path / "ckpt"))
    result = glmfb("run", str(path), "--out", "o", "--json", cwd=tmp_path)
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 3 and "internal error" not in stderr, stderr[-1500:]  # an error verdict's code
    run = json.loads(result.stdout)
    (verdict,) = run["verdicts"]
    assert verdict["status"] == "error" and "caf\\xe9.safetensors" in verdict["why"], verdict["why"]
    folder = tmp_path / "o" / run["id"]
    page = (folder / "report.html").read_text(encoding="utf-8")
    assert ESC not in page and BEL not in page
    why_row = page.split('<span class="why">', 1)[1].split("</span>", 1)[0]  # the card's why, as a person reads it
    assert "caf\\xe9.safetensors CUDA error" in why_row and "see the help page" in why_row, why_row
    assert "[31;1m" not in why_row and "window title" not in why_row and "example.com" not in why_row
    assert ESC not in stderr and BEL not in stderr
    junit = ET.parse(folder / "junit.xml").getroot()  # valid XML
    assert "caf" in ET.tostring(junit, encoding="unicode")
    with sqlite3.connect(tmp_path / "o" / "history.sqlite") as db:
        assert db.execute("select count(*) from verdicts").fetchone()[0] == 1
    gate = glmfb("gate", "--out", "o", cwd=tmp_path)
    said = (gate.stderr + gate.stdout).decode()  # the terminal's lines
    assert gate.returncode == 3 and "caf\\xe9.safetensors CUDA error see the help page" in said, said
    assert ESC not in said and BEL not in said


@pytest.mark.slow
def test_a_flood_on_stderr_keeps_memory_and_the_log_bounded(tmp_path: Path) -> None:
    """512 MB on stderr, then SIGABRT: the verdict quotes the last line; no glmfb process grew
    by the flood (peak resident set of the whole tree, measured by a wrapper process that waits
    for it); the run folder keeps the log's head and tail and says how much was dropped."""
    flood_mb = 512
    path = definition(tmp_path, "flood", "flood", megabytes=flood_mb)
    wrapper = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
               "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    measured = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "glmfb", "run", str(path),
                               "--out", "o", "--no-history", "--json"], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    code, peak_kib = measured.stdout.strip().splitlines()[-1].split()
    assert int(code) == 3
    peak_mib = int(peak_kib) / 1024
    assert peak_mib < flood_mb * 0.8, f"a glmfb process peaked at {peak_mib:.0f} MiB for a {flood_mb} MB flood"
    run_file = sorted((tmp_path / "o").glob("*/run.json"))[-1]
    (verdict,) = json.loads(run_file.read_text())["verdicts"]
    assert "SIGABRT" in verdict["why"] and "the last line before the abort" in verdict["why"]
    log = run_file.parent / "flood" / "probe-stderr.txt"
    assert log.stat().st_size < 3 << 20
    with open(log, "rb") as handle:
        handle.seek(1 << 20)
        assert b"bytes dropped here; this log keeps the first 1,048,576 and the last 1,048,576 bytes" in handle.read(400)
    assert log.read_bytes().endswith(b"the last line before the abort\n")


@pytest.mark.slow
def test_two_runs_into_one_folder_at_once_gate_the_newest_complete_run(tmp_path: Path) -> None:
    """A starts (its target takes 6 s), B starts 1.5 s later and finishes first, then A: both
    run.json are whole and the gate gates B, the newest run (newer id), not a false refusal."""
    slow = definition(tmp_path, "slow", "make", delay=6.0)
    quick = definition(tmp_path, "quick", "make")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    first = subprocess.Popen([sys.executable, "-m", "glmfb", "run", str(slow), "--out", "o"], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.5)  # run ids are ordered to the second
    second = glmfb("run", str(quick), "--out", "o", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-1000:]
    assert first.poll() is None, "the slow run ended before the quick one: the test's order did not happen"
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr[-1000:]
    runs = sorted((tmp_path / "o").glob("*/run.json"))
    assert [json.loads(r.read_text())["verdicts"][0]["name"] for r in runs] == ["slow", "quick"]
    assert (tmp_path / "o" / "LATEST").read_text().strip() == runs[1].parent.name
    gate = glmfb("gate", "--out", "o", cwd=tmp_path)
    assert gate.returncode == 0, gate.stderr[-800:]
    assert f"read o/{runs[1].parent.name}/run.json".encode() in gate.stderr


@pytest.mark.parametrize("where", ["definition", "policy", "arg"])
def test_input_nested_30000_levels_deep_is_one_line_exit_2(tmp_path: Path, where: str) -> None:
    deep = "[" * 30000 + "]" * 30000
    if where == "definition":
        path = definition(tmp_path, "deep", "make")
        path.write_text(path.read_text() + f"args = {{ x = {deep} }}\n")
        result = glmfb("run", str(path), "--out", "o", cwd=tmp_path)
    elif where == "policy":
        (tmp_path / "policy.toml").write_text(f"allow = {deep}\n")
        from glmfb.contract.verdict import Layer, Run, Status, Verdict

        verdict = Verdict(probe="diff", name="v", status=Status.PASS, layer=Layer.NUMERICS, why="same outputs")
        run = Run(id="20261207-000000-0000", started="2026-12-07T00:00:00+00:00",
                  finished="2026-12-07T00:00:01+00:00", verdicts=(verdict,), env={})
        (tmp_path / "run.json").write_text(json.dumps(run.to_dict()))
        result = glmfb("gate", "run.json", "--policy", "policy.toml", cwd=tmp_path)
    else:
        result = glmfb("diff", "target.py:make", "target.py:make", "--arg", f"x={deep}", "--out", "o", cwd=tmp_path)
    stderr = result.stderr.decode()
    errors = [line for line in stderr.splitlines() if line.startswith("glmfb: error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr[-600:]
    assert "nested too deeply" in errors[0] and "RecursionError" not in errors[0]
