"""A broken target is an error verdict in bounded time, never a pass, never a lost run.

The matrix: every probe kind (diff, bench, gap, gil) and ``glmfb run``, against targets that
raise, call sys.exit(0) or os._exit(0), segfault, hang, leave a non-daemon thread running or
print to stdout, and glmfb itself getting SIGTERM or SIGINT. Each case runs the real CLI in a
subprocess and checks the exit code, the verdict's status and message, a valid run.json, and
that no process is left behind (every process glmfb started carries a marker in its
environment; the process table is searched for it afterwards).

Each case runs cold (a fresh ``python -m glmfb.core.child``, ``GLMFB_WORKERS=off``) and, for some
of the kinds (the whole matrix through the pool is tests/test_workers.py), warm: forked from
the zygote of glmfb's warm workers (``GLMFB_WORKERS=on``); run.json's ``env.workers`` says
which it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from glmfb.contract.verdict import Run

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TARGETS = Path(__file__).resolve().parent / "targets" / "misbehave.py"
MARK = "GLMFB_TEST_MARK"


def leftovers(mark: str) -> list[str]:
    """Processes whose environment carries ``mark`` (everything glmfb started inherits it)."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.environ().get(MARK) == mark and process.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{process.pid} {' '.join(process.info['cmdline'] or [])[:120]}")
        except (psutil.Error, OSError):
            continue
    return found


def wait_for_no_leftovers(mark: str, within_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while True:
        found = leftovers(mark)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def probe_args(kind: str, behavior: str, requests: Path) -> list[str]:
    if kind == "bench":
        return ["bench", f"{TARGETS}:bench", f"{TARGETS}:bench", "--candidate-arg", f"behavior={behavior}",
                "--shape", "8x64", "--budget", "0.6", "--threshold", "50%", "--no-profile"]
    if kind == "diff":
        return ["diff", f"{TARGETS}:diff", f"{TARGETS}:diff", "--candidate-arg", f"behavior={behavior}",
                "--requests", str(requests)]
    if kind == "gap":
        return ["gap", f"{TARGETS}:gap", f"{TARGETS}:gap", "--candidate-arg", f"behavior={behavior}",
                "--repeats", "8", "--budget", "3", "--threshold", "300%", "--no-attribute"]
    return ["gil", "--target", f"{TARGETS}:gil", "--arg", f"behavior={behavior}", "--duration", "1"]


@pytest.fixture
def requests(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text('{"id": "r1", "length": 8}\n{"id": "r2", "length": 16}\n')
    return path


def environment(mark: str, workers: str) -> dict[str, str]:
    """glmfb's environment: the marker, and its probes cold or warm (GLMFB_WORKERS)."""
    return {**os.environ, MARK: mark, "PYTHONPATH": str(ROOT), "GLMFB_WORKERS": "on" if workers == "warm" else "off"}


def glmfb(args: list[str], tmp_path: Path, mark: str, timeout_s: float = 120,
          workers: str = "cold") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "glmfb", *args], capture_output=True, text=True, cwd=tmp_path,
                          env=environment(mark, workers), timeout=timeout_s)


def ran_warm(run: Run) -> bool:
    """Whether the run's probes went through a warm worker (run.json's env.workers)."""
    used = run.env.get("workers") or {}
    return bool(used.get("warm")) and not used.get("cold")


def cases(kinds: tuple[str, ...], warm_kinds: tuple[str, ...]) -> list[tuple[str, str]]:
    """(kind, workers): every kind cold, ``warm_kinds`` warm too."""
    return [(kind, "cold") for kind in kinds] + [(kind, "warm") for kind in warm_kinds]


def run_json(out: Path) -> Run:
    run_id = (out / "LATEST").read_text().strip()
    return Run.from_dict(json.loads((out / run_id / "run.json").read_text()))


FAILING = {
    # behavior: phrase in the why, per probe kind ("*" for all)
    "raise": {"*": "RuntimeError: planted failure in the target"},
    "exit": {"*": "SystemExit", "gil": "SystemExit"},
    "os_exit": {"*": "exited with status 0 before answering", "gil": "exited with status 0 during its set-up"},
    "segfault": {"*": "signal 11 (SIGSEGV)"},
    "hang": {"*": "killed after 4 s timeout"},
}
KINDS = ("diff", "bench", "gap", "gil")


@pytest.mark.parametrize(("kind", "workers"), cases(KINDS, ("diff", "gil")))
@pytest.mark.parametrize("behavior", list(FAILING))
def test_a_broken_target_is_an_error_verdict(kind: str, workers: str, behavior: str, tmp_path: Path,
                                             requests: Path) -> None:
    mark = uuid.uuid4().hex
    out = tmp_path / "reports"
    started = time.monotonic()
    # Only the hang needs its timeout short (it is what stops it); the others get room for a
    # loaded host's start-up (importing torch alone took over 4 s under load), so a crash is
    # never read as a hang.
    timeout = "4s" if behavior == "hang" else "60s"
    result = glmfb([*probe_args(kind, behavior, requests), "--json", "--out", str(out), "--timeout", timeout],
                   tmp_path, mark, workers=workers)
    elapsed = time.monotonic() - started
    assert result.returncode == 3, (result.returncode, result.stdout[-500:], result.stderr[-1000:])
    verdict = json.loads(result.stdout)  # stdout holds exactly one JSON document
    assert verdict["status"] == "error" and verdict["layer"] == "harness"
    phrase = FAILING[behavior].get(kind, FAILING[behavior]["*"])
    assert phrase in verdict["why"], verdict["why"]
    run = run_json(out)
    assert run.verdicts[0].to_dict()["why"] == verdict["why"] and not run.interrupted
    assert ran_warm(run) is (workers == "warm"), run.env.get("workers")
    if behavior == "hang":
        assert elapsed < 40, elapsed  # the timeout bounds it (start-up on a loaded host included)
    assert wait_for_no_leftovers(mark) == []


@pytest.mark.parametrize(("kind", "workers"), cases(KINDS, ("bench", "gil")))
@pytest.mark.parametrize("behavior", ["thread", "print"])
def test_a_target_that_leaks_a_thread_or_prints_still_gets_its_verdict(kind: str, workers: str, behavior: str,
                                                                      tmp_path: Path, requests: Path) -> None:
    mark = uuid.uuid4().hex
    out = tmp_path / "reports"
    result = glmfb([*probe_args(kind, behavior, requests), "--json", "--out", str(out), "--timeout", "60s"],
                   tmp_path, mark, workers=workers)
    verdict = json.loads(result.stdout)  # the target's print is not in the JSON stream
    assert verdict["status"] != "error", verdict["why"]
    assert result.returncode in (0, 1, 4)
    assert "TARGET NOISE" not in result.stdout
    if behavior == "print" and kind != "gil":
        assert "TARGET NOISE ON STDOUT" in Path(verdict["artifacts"]["probe_stdout"]).read_text()
    run = run_json(out)
    assert run.verdicts[0].status.value == verdict["status"]
    assert ran_warm(run) is (workers == "warm"), run.env.get("workers")
    assert wait_for_no_leftovers(mark) == []


@pytest.mark.parametrize(("kind", "workers"), cases(KINDS, ("diff", "bench")))
@pytest.mark.parametrize("behavior", ["daemon", "double_fork", "double_fork_no_exec"])
def test_a_daemon_the_target_leaves_is_stopped_and_named(kind: str, workers: str, behavior: str, tmp_path: Path,
                                                        requests: Path) -> None:
    """A server started in a session of its own and never stopped, or a daemon that
    double-forked (init adopts it: it is no longer below the probe), with exec or without (a
    copy of the probe's process): the probe still answers, nothing is left in the process
    table, and where the target ran in the probe's child, the verdict lists what was stopped."""
    mark = uuid.uuid4().hex
    out = tmp_path / "reports"
    result = glmfb([*probe_args(kind, behavior, requests), "--json", "--out", str(out), "--timeout", "60s"],
                   tmp_path, mark, workers=workers)
    verdict = json.loads(result.stdout)
    assert verdict["status"] != "error", verdict["why"]
    assert ran_warm(run_json(out)) is (workers == "warm")
    assert wait_for_no_leftovers(mark) == []
    if kind in ("diff", "bench"):
        stopped = next(e for e in verdict["evidence"] if e["kind"] == "stopped_processes")
        if behavior == "double_fork_no_exec":  # its command line is the probe process's
            sleepers = [p for p in stopped["processes"] if "glmfb" in p["command"]]
        else:
            sleepers = [p for p in stopped["processes"] if "left by misbehave" in p["command"]]
        assert len(sleepers) == 1 and sleepers[0]["own_session"], stopped


def _is_probe_child(process: psutil.Process) -> bool:
    """A cold probe child (``python -m glmfb.core.child``), or a warm one: a process forked from
    a warm worker's reaper, itself forked from the zygote (all three show the zygote's command line)."""
    line = " ".join(process.cmdline())
    if "glmfb.core.child" in line:
        return True
    lineage = [process, *process.parents()[:2]]
    return len(lineage) == 3 and all("glmfb.core.zygote" in " ".join(p.cmdline()) for p in lineage)


def _wait_for_child(mark: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for line in leftovers(mark):
            try:
                if _is_probe_child(psutil.Process(int(line.split()[0]))):
                    time.sleep(1.0)  # let it reach the target
                    return
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise AssertionError("the probe's child process never started")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize(("kind", "workers"), cases((*KINDS, "run"), ("gap", "run")))
def test_a_signal_to_glmfb_stops_everything_and_keeps_a_valid_run(kind: str, workers: str, sig: int, tmp_path: Path,
                                                                   requests: Path) -> None:
    mark = uuid.uuid4().hex
    out = tmp_path / "reports"
    if kind == "run":
        (tmp_path / "p.toml").write_text(
            f'[[probe]]\nname = "first"\nprobe = "gap"\nbaseline = "{TARGETS}:gap"\ncandidate = "{TARGETS}:gap"\n'
            'options = { repeats = 6, budget = 2, threshold = "300%", attribute = false }\n'
            f'[[probe]]\nname = "hangs"\nprobe = "gap"\nbaseline = "{TARGETS}:gap"\ncandidate = "{TARGETS}:gap"\n'
            'candidate_args = { behavior = "hang" }\n'
            f'[[probe]]\nname = "never"\nprobe = "gap"\nbaseline = "{TARGETS}:gap"\ncandidate = "{TARGETS}:gap"\n'
        )
        args = ["run", str(tmp_path / "p.toml"), "--json"]
    else:
        args = [*probe_args(kind, "hang", requests), "--json"]
    env = environment(mark, workers)
    # SIGINT as a terminal delivers it: a shell that starts jobs in the background (without job
    # control) leaves SIGINT ignored in them, and a program that starts with it ignored keeps it so.
    process = subprocess.Popen([sys.executable, "-m", "glmfb", *args, "--out", str(out), "--timeout", "120s"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        if kind == "run":  # wait until the first probe is done and the hanging one has started
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not list(out.glob("*/hangs/probe-stderr.txt")):
                time.sleep(0.1)
        _wait_for_child(mark)
        sent = time.monotonic()
        process.send_signal(sig)
        stdout, stderr = process.communicate(timeout=30)
        stopped_s = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()  # reaped, so no zombie is left to later tests
    assert process.returncode == 3, (process.returncode, stderr[-1500:])
    assert stopped_s < 20
    run = run_json(out)
    assert run.interrupted
    assert ran_warm(run) is (workers == "warm"), run.env.get("workers")
    document: dict[str, Any] = json.loads(stdout)
    name = signal.Signals(sig).name
    if kind == "run":
        statuses = [v.status.value for v in run.verdicts]
        assert statuses[0] != "error" and statuses[1:] == ["error", "error"], statuses
        assert f"interrupted ({name})" in run.verdicts[1].why and "not run" in run.verdicts[2].why
        assert document["interrupted"] is True
    else:
        assert document["status"] == "error" and f"interrupted ({name})" in document["why"]
    assert wait_for_no_leftovers(mark) == []


@pytest.mark.parametrize("workers", ["cold", "warm"])
def test_a_run_goes_on_past_broken_targets(workers: str, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    rows = []
    for behavior in ("raise", "os_exit", "segfault", "hang", "none"):
        rows.append(
            f'[[probe]]\nname = "{behavior}"\nprobe = "bench"\nbaseline = "{TARGETS}:bench"\n'
            f'candidate = "{TARGETS}:bench"\ncandidate_args = {{ behavior = "{behavior}" }}\n'
            'options = { shapes = ["8x64"], budget = 0.6, threshold = "50%", profile = false }\n'
            + ('timeout = "4s"\n' if behavior == "hang" else "")
        )
    (tmp_path / "p.toml").write_text("".join(rows))
    result = glmfb(["run", str(tmp_path / "p.toml"), "--json", "--out", str(tmp_path / "reports")], tmp_path, mark,
                   workers=workers)
    assert result.returncode == 3, result.stderr[-1000:]
    run = Run.from_dict(json.loads(result.stdout))
    assert ran_warm(run) is (workers == "warm"), run.env.get("workers")
    by_name = {v.name: v for v in run.verdicts}
    assert [by_name[n].status.value for n in ("raise", "os_exit", "segfault", "hang")] == ["error"] * 4
    assert "killed after 4 s timeout" in by_name["hang"].why
    assert "SIGSEGV" in by_name["segfault"].why
    assert by_name["none"].status.value != "error"
    assert run_json(tmp_path / "reports") == run
    assert wait_for_no_leftovers(mark) == []


def test_the_leftover_search_finds_a_marked_process() -> None:
    """The check above can fail: a process carrying the marker is found until it is gone."""
    mark = uuid.uuid4().hex
    process = subprocess.Popen(["sleep", "30"], env={**os.environ, MARK: mark})
    try:
        deadline = time.monotonic() + 5
        while not leftovers(mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(line.startswith(str(process.pid)) for line in leftovers(mark))
    finally:
        process.kill()
        process.wait()
    assert wait_for_no_leftovers(mark) == []


def test_sigterm_during_gap_attribution_leaves_no_runner_or_receiver(tmp_path: Path) -> None:
    """The kv_transfer scenario (a receiver process) failing its gap, so the gil probe runs on it
    (a runner process, two py-spy samplers): SIGTERM then must stop all of them."""
    scenario = ROOT / "scenarios" / "kv_transfer" / "scenario.py"
    mark = uuid.uuid4().hex
    out = tmp_path / "reports"
    small = [*(f"--arg={k}={v}" for k, v in {"layers": 2, "tokens": 512, "hidden": 64, "heads": 2, "page_tokens": 8,
                                              "dispatch_ms": 2.0}.items()), "--candidate-arg", "transport=socket"]
    env = {**os.environ, MARK: mark, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "glmfb", "gap", f"{scenario}:prefill_only", f"{scenario}:prefill_transfer_holding",
         *small, "--repeats", "12", "--budget", "30", "--gil-duration", "30", "--json", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(out.glob("*/gap/gil/py-spy.log")):
            if process.poll() is not None:
                break
            time.sleep(0.2)
        assert process.poll() is None, "the gap finished before its attribution could be interrupted"
        time.sleep(1.0)
        running = leftovers(mark)
        assert len(running) >= 4, (running, process.poll(), list(out.rglob("*")))  # glmfb, its child, the gil runner, py-spy
        process.send_signal(signal.SIGTERM)
        stdout, _ = process.communicate(timeout=40)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 3
    assert "interrupted (SIGTERM)" in json.loads(stdout)["why"]
    assert run_json(out).interrupted
    assert wait_for_no_leftovers(mark, within_s=10) == []
