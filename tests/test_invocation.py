"""One invocation for every surface (:mod:`glmfb.workflows.invocation`), and the gate after faults.

Every surface (each probe command, ``glmfb run``, ``glmfb bisect``, and their agent-server
tools) leaves the same things: its run folder with run.json (with the run's environment),
junit.xml and report.html, ``LATEST`` naming it, and its verdicts in the history (a bisection
excepted: its verdict is about a range of commits). Then the faults that turned a gate green or
lost what a run had written: a full disk before the first write, a target that rewrites
``LATEST`` while it runs, and a second Ctrl-C while report.html is drawn."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_bisect import build_repo

from glmfb.contract.clock import new_run_id
from glmfb.contract.errors import HarnessError
from glmfb.core.runs import latest_run

ROOT = Path(__file__).resolve().parents[1]
TOY = Path(__file__).resolve().parent / "toy"

TOY_TOML = '[[probe]]\nname = "toy-check"\nprobe = "toy"\noptions = { outcome = "pass" }\n'
BISECT_TOML = '[[probe]]\nname = "toy-bisect"\nprobe = "toy"\noptions = {{ outcome = "{outcome}" }}\n'


def cli(*args: str, cwd: Path, timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TOY)]), **env}
    environ.pop("GLMFB_HISTORY", None)
    return subprocess.run([sys.executable, "-m", "glmfb", *args], capture_output=True, text=True, cwd=cwd,
                          env=environ, timeout=timeout)


def left_behind(out: Path) -> dict[str, Any]:
    """What the latest invocation into ``out`` left: its run folder's files, whether run.json
    carries an environment, and its rows in the history."""
    from glmfb.workflows.history.store import open_store

    run_id = (out / "LATEST").read_text().strip()
    folder = out / run_id
    run = json.loads((folder / "run.json").read_text())
    with open_store(f"sqlite:///{out / 'history.sqlite'}", create=True) as store:
        rows = [r for r in store.records() if r.run_id == run_id]
    return {"files": sorted(p.name for p in folder.iterdir() if p.is_file()), "env": bool(run["env"].get("python")),
            "id": run["id"] == run_id, "history_rows": len(rows)}


@pytest.mark.slow
def test_every_surface_leaves_the_same_artifacts(tmp_path: Path, toy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mcp")
    from glmfb.workflows.mcp.boundary import Boundary
    from glmfb.workflows.mcp.tools import CallContext, Toolbox

    monkeypatch.delenv("GLMFB_HISTORY", raising=False)
    repo = build_repo(tmp_path / "project", 3, {
        1: ("", {"checks.toml": BISECT_TOML.format(outcome="pass"), "probes/toy.toml": TOY_TOML}),
        3: ("toy: told to fail", {"checks.toml": BISECT_TOML.format(outcome="fail")}),
    })
    project, out = repo.path, repo.path / "reports"
    good, bad = repo.shas[0], repo.shas[-1]
    box = Toolbox(Boundary(project))

    def tool(name: str, arguments: dict[str, Any]) -> None:
        ctx = CallContext(run_id=new_run_id(), progress=lambda message: None, cancel=threading.Event(),
                          deadline=time.monotonic() + 300, slot=threading.Lock())
        box.prepare(name, arguments).work(ctx)

    surfaces = {
        "glmfb toy": lambda: cli("toy", "--outcome", "pass", "--name", "toy-check", cwd=project),
        "glmfb run": lambda: cli("run", "probes/toy.toml", cwd=project),
        "glmfb bisect": lambda: cli("bisect", good, bad, "checks.toml", cwd=project),
        "MCP toy": lambda: tool("toy", {"outcome": "pass", "name": "toy-check"}),
        "MCP run": lambda: tool("run", {"paths": "probes/toy.toml"}),
        "MCP bisect": lambda: tool("bisect", {"good": good, "bad": bad, "definition": "checks.toml"}),
    }
    table = {}
    for surface, call in surfaces.items():
        done = call()
        if isinstance(done, subprocess.CompletedProcess):
            assert done.returncode in (0, 1), (surface, done.stderr[-800:])
        table[surface] = left_behind(out)
    print("\n" + "\n".join(f"{surface:>14}: {row}" for surface, row in table.items()))
    for surface, row in table.items():
        assert row["files"] == ["junit.xml", "report.html", "run.json"], (surface, row)
        assert row["env"] and row["id"], (surface, row)
        assert row["history_rows"] == (0 if "bisect" in surface else 1), (surface, row)


# --------------------------------------------------------------------------------------------
# The gate never reads a run other than the newest invocation's
# --------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A 4 MiB tmpfs of 200 inodes, as a full disk is made (root only; skipped elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=200", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode}): needs root")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> None:
    """Write until the disk is full."""
    with open(disk / "filler", "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass


@pytest.mark.slow
def test_a_run_on_a_full_disk_fails_in_one_line_and_the_gate_does_not_pass(small_disk: Path, tmp_path: Path) -> None:
    """Before: ``internal error: OSError: [Errno 28]``, LATEST still named the previous passing
    run, and ``glmfb gate`` exited 0."""
    out = small_disk / "reports"
    first = cli("toy", "--outcome", "pass", "--out", str(out), "--no-history", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert cli("gate", "--out", str(out), cwd=tmp_path).returncode == 0
    fill(small_disk)
    second = cli("toy", "--outcome", "pass", "--out", str(out), "--no-history", cwd=tmp_path)
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 3, second.stderr
    assert len(lines) == 1 and "No space left on device" in lines[0] and str(out) in lines[0], lines
    assert "internal error" not in second.stderr and "Traceback" not in second.stderr
    gate = cli("gate", "--out", str(out), cwd=tmp_path)
    assert gate.returncode == 3, (gate.returncode, gate.stderr)  # whichever write failed: never the older run
    assert "glmfb gate never gates an older run instead" in gate.stderr or "no LATEST pointer" in gate.stderr


@pytest.mark.slow
def test_a_full_disk_before_the_pointer_moves_leaves_no_pointer_to_an_older_run(small_disk: Path,
                                                                               tmp_path: Path) -> None:
    """The disk has no inode left, so the run folder cannot be made (before: exit 3 with
    "internal error", LATEST on the older passing run, the gate green). The pointer is removed
    first (removing needs no space), so the gate refuses."""
    out = small_disk / "reports"
    assert cli("toy", "--outcome", "pass", "--out", str(out), "--no-history", cwd=tmp_path).returncode == 0
    for number in range(100000):  # every inode taken
        try:
            (small_disk / f"inode-{number}").touch()
        except OSError:
            break
    second = cli("toy", "--outcome", "pass", "--out", str(out), "--no-history", cwd=tmp_path)
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 3 and len(lines) == 1, second.stderr
    assert "No space left on device" in lines[0] and str(out) in lines[0] and "internal error" not in lines[0]
    gate = cli("gate", "--out", str(out), cwd=tmp_path)
    assert gate.returncode == 3, (gate.returncode, gate.stderr)
    assert "no LATEST pointer" in gate.stderr


HIJACK = '''"""A bench target that points LATEST at the run before it, then fails."""

from pathlib import Path

OUT = Path({out!r})


def make(shape):
    older = sorted(p.name for p in OUT.iterdir() if (p / "run.json").is_file())[0]
    (OUT / "LATEST").write_text(older + "\\n")
    raise RuntimeError("broken kernel")
'''


@pytest.mark.slow
def test_a_target_that_rewrites_latest_does_not_turn_the_gate_green(tmp_path: Path) -> None:
    """Before: run.json of the failing run was whole (exit 3), but LATEST stayed on the older
    passing run and the gate exited 0."""
    out = tmp_path / "reports"
    assert cli("toy", "--outcome", "pass", "--out", str(out), "--no-history", cwd=tmp_path).returncode == 0
    (tmp_path / "hijack.py").write_text(HIJACK.format(out=str(out)))
    failing = cli("bench", "hijack.py:make", "hijack.py:make", "--shape", "8", "--budget", "1s", "--out", str(out),
                  "--no-history", cwd=tmp_path)
    assert failing.returncode == 3, failing.stderr[-800:]
    gate = cli("gate", "--out", str(out), cwd=tmp_path)
    assert gate.returncode == 3, (gate.returncode, gate.stdout[-500:], gate.stderr[-500:])


def test_a_newer_run_folder_than_latest_names_is_refused(tmp_path: Path) -> None:
    """Both faults at once: code rewrote LATEST, and the invocation that made the newer folder
    never finished (killed): the gate refuses rather than read the older run."""
    out = tmp_path / "reports"
    older, newer = new_run_id(), new_run_id()
    (out / older).mkdir(parents=True)
    (out / older / "run.json").write_text("{}")
    (out / newer).mkdir()
    (out / "LATEST").write_text(older + "\n")
    with pytest.raises(HarnessError, match=f"latest run into .* [(]{newer}[)] has no run.json: it is still running, or "
                       f"it stopped.*glmfb gate .*{older}"):
        latest_run(out)
    (out / newer / "run.json").write_text("{}")  # it finished after all: the newest complete run is gated
    assert latest_run(out) == out / newer / "run.json"
    (out / newer / "run.json").unlink()
    (out / newer).rmdir()
    assert latest_run(out) == out / older / "run.json"
    (out / "LATEST").write_text("not a run id\n")  # a pointer overwritten with anything
    assert latest_run(out) == out / older / "run.json"


@pytest.mark.slow
def test_a_second_ctrl_c_while_the_report_is_drawn_keeps_the_run_and_says_what_was_written(tmp_path: Path) -> None:
    """Two SIGINTs: the first stops the suite's second probe, the second lands while report.html
    is drawn (the toy's plot takes 20 s). Before: exit 130, "interrupted (SIGINT) before anything
    could be written" though run.json was on disk, and --json printed nothing."""
    (tmp_path / "p.toml").write_text(
        '[[probe]]\nname = "quick"\nprobe = "toy"\noptions = { outcome = "pass" }\n'
        '[[probe]]\nname = "slow"\nprobe = "toy"\noptions = { outcome = "pass", sleep = "60s" }\n')
    out = tmp_path / "reports"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TOY)]), "TOY_PLOT_SLEEP_S": "20"}
    process = subprocess.Popen([sys.executable, "-m", "glmfb", "run", "p.toml", "--out", str(out), "--json",
                                "--no-history"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=tmp_path, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert _wait_for(lambda: list(out.glob("*/slow/probe-stderr.txt")), 90), "the slow probe never started"
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        assert _wait_for(lambda: list(out.glob("*/junit.xml")), 60), "junit.xml was never written"
        time.sleep(0.5)  # report.html is being drawn: the toy's plot sleeps
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 3, (process.returncode, stderr[-1500:])
    assert "before anything could be written" not in stderr
    assert "interrupted (SIGINT) while writing, so report.html was not written" in stderr, stderr[-1500:]
    folder = next(out.glob("*/run.json")).parent
    run = json.loads((folder / "run.json").read_text())
    assert run["interrupted"] is True and [v["name"] for v in run["verdicts"]] == ["quick", "slow"]
    assert json.loads(stdout)["id"] == run["id"]  # --json printed the run
    assert (folder / "junit.xml").is_file() and not (folder / "report.html").exists()


def _wait_for(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False
