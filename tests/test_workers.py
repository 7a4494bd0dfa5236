"""Warm workers (glmfb.core.workers, glmfb.core.zygote): the supervision contract through the pool.

Every case of tests/test_isolation.py's matrix runs here through a pool open in this process
(supervise.run_isolated, as glmfb run calls it): a target that raises, exits, crashes, hangs,
prints, leaks a thread or leaves a daemon behind (one in a session of its own, one that
double-forks with exec and one without) is an error verdict or a stopped_processes evidence,
and nothing it started is left. Then: a cancellation; the zygote gone after its owner exits or
is SIGKILLed (with a job in flight: that job's processes too); each reason a job goes cold; two
jobs at once; and a diff's verdict equal through the pool and cold.

Every process started here carries a marker in its environment (set before the pool starts,
so the zygote and each process forked from it carry it too); "nothing left" is a search of the
process table for it, the zygote itself excepted while its pool is open.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from glmfb.contract.verdict import Verdict
from glmfb.core import workers
from glmfb.core.probe import ProbeSpec, get_probe
from glmfb.core.supervise import call_isolated, run_isolated

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TARGETS = Path(__file__).resolve().parent / "targets" / "misbehave.py"
MARK = "GLMFB_TEST_MARK"


def marked(mark: str, *, besides: tuple[int, ...] = ()) -> list[str]:
    """Live processes whose environment carries ``mark``, but for ``besides``."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if (process.pid not in besides and process.environ().get(MARK) == mark
                    and process.status() != psutil.STATUS_ZOMBIE):
                found.append(f"{process.pid} {' '.join(process.info['cmdline'] or [])[:120]}")
        except (psutil.Error, OSError):
            continue
    return found


def none_left(mark: str, *, besides: tuple[int, ...] = (), within_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while True:
        found = marked(mark, besides=besides)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@dataclasses.dataclass
class Warm:
    pool: workers.Pool
    mark: str

    @property
    def zygote(self) -> int:
        return self.pool.process.pid


@pytest.fixture(scope="module")
def warm() -> Iterator[Warm]:
    """A pool open for the module, its zygote's imports done, every process marked."""
    mark = uuid.uuid4().hex
    os.environ[MARK] = mark
    try:
        with workers.pool("run") as opened:
            assert opened is not None and opened.wait_ready(), opened and opened.failed
            yield Warm(opened, mark)
        assert none_left(mark) == []  # the zygote too, once the pool is closed
    finally:
        os.environ.pop(MARK, None)


def gap_config(behavior: str = "none") -> Any:
    spec = ProbeSpec(kind="gap", name="gap", label="gap", baseline=f"{TARGETS}:gap", candidate=f"{TARGETS}:gap",
                     candidate_args={"behavior": behavior},
                     options={"repeats": 4, "budget_s": 2.0, "threshold": 3.0, "attribute": False})
    return get_probe("gap").build(spec)


def run_gap(folder: Path, behavior: str = "none", timeout_s: float = 60.0,
            cancel: threading.Event | None = None) -> Verdict:
    return run_isolated("gap", "gap", gap_config(behavior), run_id="r", artifact_dir=folder, progress=lambda m: None,
                        timeout_s=timeout_s, cancel=cancel)


# --------------------------------------------------------------------------------------------
# The decision, without processes
# --------------------------------------------------------------------------------------------


def test_which_surfaces_open_a_pool() -> None:
    assert [workers.enabled(s, {}) for s in ("run", "mcp", "bisect", "probe")] == [True, True, True, False]
    assert not workers.enabled("run", {workers.WORKERS_ENV: "off"})
    assert workers.enabled("probe", {workers.WORKERS_ENV: "on"})


@pytest.mark.parametrize(("name", "read"), [
    ("OMP_NUM_THREADS", True), ("MKL_NUM_THREADS", True), ("LD_PRELOAD", True), ("PYTHONHASHSEED", True),
    ("TORCH_LOGS", True), ("PYTORCH_CUDA_ALLOC_CONF", True), ("CUDA_VISIBLE_DEVICES", True), ("MALLOC_ARENA_MAX", True),
    ("LANG", True), ("TMPDIR", True), ("GLMFB_PROBE_COOKIE", False), ("GLMFB_RESULT_FD", False), ("HOME", False),
])
def test_which_variables_are_read_at_import(name: str, read: bool) -> None:
    assert workers.read_at_import(name) is read


# --------------------------------------------------------------------------------------------
# The contract through the pool
# --------------------------------------------------------------------------------------------

FAILING = {
    "raise": "RuntimeError: planted failure in the target",
    "exit": "SystemExit",
    "os_exit": "exited with status 0 before answering",
    "segfault": "signal 11 (SIGSEGV)",
    "hang": "killed after 3 s timeout",
}


@pytest.mark.parametrize("behavior", list(FAILING))
def test_a_broken_target_is_an_error_verdict_through_the_pool(warm: Warm, behavior: str, tmp_path: Path) -> None:
    before = warm.pool.warm
    verdict = run_gap(tmp_path, behavior, timeout_s=3.0 if behavior == "hang" else 60.0)
    assert warm.pool.warm == before + 1  # it ran warm
    assert verdict.status.value == "error" and verdict.layer.value == "harness"
    assert FAILING[behavior] in verdict.why, verdict.why
    assert none_left(warm.mark, besides=(warm.zygote,)) == []


@pytest.mark.parametrize("behavior", ["thread", "print"])
def test_a_thread_or_a_print_through_the_pool(warm: Warm, behavior: str, tmp_path: Path) -> None:
    verdict = run_gap(tmp_path, behavior)
    assert verdict.status.value != "error", verdict.why
    if behavior == "print":
        assert "TARGET NOISE ON STDOUT" in Path(verdict.artifacts["probe_stdout"]).read_text()
    assert none_left(warm.mark, besides=(warm.zygote,)) == []


@pytest.mark.parametrize("behavior", ["daemon", "double_fork", "double_fork_no_exec"])
def test_a_daemon_through_the_pool_is_stopped_and_named(warm: Warm, behavior: str, tmp_path: Path) -> None:
    """A server in a session of its own, a daemon that double-forked and exec'd, and one that
    double-forked without exec (its /proc environment is the zygote's, without the cookie: the
    reaper above the job, a child subreaper, keeps it in the tree)."""
    verdict = run_gap(tmp_path, behavior)
    assert verdict.status.value != "error", verdict.why
    [stopped] = [e for e in verdict.to_dict()["evidence"] if e["kind"] == "stopped_processes"]
    assert len(stopped["processes"]) == 1 and stopped["processes"][0]["own_session"], stopped
    if behavior != "double_fork_no_exec":
        assert "left by misbehave" in stopped["processes"][0]["command"]
    assert none_left(warm.mark, besides=(warm.zygote,)) == []


def test_a_cancelled_job_and_everything_below_it_are_stopped(warm: Warm, tmp_path: Path) -> None:
    cancel = threading.Event()
    verdicts: list[Verdict] = []
    worker = threading.Thread(target=lambda: verdicts.append(run_gap(tmp_path, "hang", cancel=cancel)))
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "probe-stderr.txt").exists():
        time.sleep(0.05)
    time.sleep(0.5)
    cancel.set()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert "cancelled" in verdicts[0].why
    assert none_left(warm.mark, besides=(warm.zygote,)) == []


def test_a_job_that_never_imports_torch_sees_no_torch(warm: Warm, tmp_path: Path) -> None:
    """The zygote imported torch, but a job that does not import it finds no torch in
    sys.modules (as a cold child), so its verdict's environment records no torch threads; a
    job that imports it gets the preloaded module back, whole."""
    module = tmp_path / "imports.py"
    module.write_text(textwrap.dedent("""
        import sys

        def look(config, progress):
            before = "torch" in sys.modules
            import torch.nn.functional as F
            return {"before": before, "after": "torch" in sys.modules, "spec": torch_spec(),
                    "relu": F.relu(__import__("torch").tensor([-1.0, 2.0])).tolist()}

        def torch_spec():
            return sys.modules["torch"].__spec__.origin
    """))
    sys.path.append(str(tmp_path))
    try:
        before = warm.pool.warm
        seen = call_isolated("imports:look", None, artifact_dir=tmp_path / "out", progress=lambda m: None)
    finally:
        sys.path.remove(str(tmp_path))
    assert warm.pool.warm == before + 1
    assert seen["before"] is False and seen["after"] is True and seen["relu"] == [0.0, 2.0]
    assert seen["spec"].endswith("torch/__init__.py")
    verdict = run_gap(tmp_path / "gap")
    assert "threads" not in verdict.env


def test_two_jobs_at_once_from_one_pool(warm: Warm, tmp_path: Path) -> None:
    """Each job waits for the other to have started: run one after the other, both would time out."""
    module = tmp_path / "meet.py"
    module.write_text(textwrap.dedent("""
        import os, time
        from pathlib import Path

        def meet(config, progress):
            me, other = Path(config[0]), Path(config[1])
            me.write_text(str(os.getpid()))
            deadline = time.monotonic() + 60
            while not other.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError("the other job never started")
                time.sleep(0.02)
            return {"pid": os.getpid(), "other": int(other.read_text())}
    """))
    sys.path.append(str(tmp_path))
    results: dict[str, Any] = {}

    def job(name: str, other: str) -> None:
        results[name] = call_isolated("meet:meet", (str(tmp_path / name), str(tmp_path / other)),
                                      artifact_dir=tmp_path / f"out-{name}", progress=lambda m: None, timeout_s=90)

    before = warm.pool.warm
    try:
        threads = [threading.Thread(target=job, args=("a", "b")), threading.Thread(target=job, args=("b", "a"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        sys.path.remove(str(tmp_path))
    assert results["a"]["other"] == results["b"]["pid"] and results["b"]["other"] == results["a"]["pid"], results
    assert warm.pool.warm == before + 2
    assert none_left(warm.mark, besides=(warm.zygote,)) == []


# --------------------------------------------------------------------------------------------
# When a job goes cold
# --------------------------------------------------------------------------------------------


def test_a_job_goes_cold_when_its_environment_differs_in_an_import_time_variable(
        warm: Warm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1" if os.environ.get("OMP_NUM_THREADS") != "1" else "2")
    before = warm.pool.summary()
    verdict = run_gap(tmp_path)
    after = warm.pool.summary()
    assert verdict.status.value != "error", verdict.why
    assert (after["warm"], after["cold"]) == (before["warm"], before["cold"] + 1)
    assert after["why_cold"]["$OMP_NUM_THREADS differs from the zygote's environment"] >= 1
    monkeypatch.setenv("GLMFB_SOMETHING_ELSE", "x")  # not read at import: no reason to go cold
    monkeypatch.delenv("OMP_NUM_THREADS")
    if "OMP_NUM_THREADS" in warm.pool.environ:
        monkeypatch.setenv("OMP_NUM_THREADS", warm.pool.environ["OMP_NUM_THREADS"])
    run_gap(tmp_path / "again")
    assert warm.pool.summary()["warm"] == after["warm"] + 1


def test_a_job_goes_cold_when_the_import_path_changed(warm: Warm, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))  # could shadow what the zygote imported
    before = warm.pool.summary()["cold"]
    run_gap(tmp_path / "out")
    assert warm.pool.summary()["cold"] == before + 1
    assert "the import path changed since the zygote started" in warm.pool.summary()["why_cold"]


def test_a_job_goes_cold_when_its_folder_holds_another_glmfb(warm: Warm, tmp_path: Path) -> None:
    """A cold child started in a folder with a glmfb package imports that one (glmfb bisect of
    glmfb's own repository); a folder without one, or with the zygote's own, stays warm."""
    pool = warm.pool
    job_env = {**pool.environ, "GLMFB_PROBE_COOKIE": "x"}
    assert pool.refusal(job_env, pool.sys_path, tmp_path) is None
    assert pool.refusal(job_env, pool.sys_path, workers.glmfb_run_in(pool.cwd).parent) is None
    (tmp_path / "glmfb").mkdir()
    (tmp_path / "glmfb" / "__init__.py").write_text("")
    assert pool.refusal(job_env, pool.sys_path, tmp_path) == (
        f"{tmp_path} holds a glmfb package other than the one the zygote runs")


def test_a_job_goes_cold_when_no_pool_is_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "_current", None)  # the module's pool, if open, is not this process's now
    monkeypatch.setenv(workers.WORKERS_ENV, "off")
    with workers.pool("run") as opened:
        assert opened is None and workers.current() is None
        verdict = run_gap(tmp_path)
    assert verdict.status.value != "error", verdict.why


def test_a_job_goes_cold_when_the_zygote_died(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a pool of its own (the module's, if open, set aside): this test kills its zygote."""
    monkeypatch.setattr(workers, "_current", None)
    with workers.pool("run") as opened:
        assert opened is not None and opened.wait_ready()
        os.kill(opened.process.pid, signal.SIGKILL)
        opened.process.wait()
        verdict = run_gap(tmp_path)
        assert verdict.status.value != "error", verdict.why
        assert opened.summary() == {"warm": 0, "cold": 1, "why_cold": {"the zygote exited with status -9": 1}}


# --------------------------------------------------------------------------------------------
# The zygote never outlives its owner
# --------------------------------------------------------------------------------------------

OWNER = """
import sys, time
from pathlib import Path
from glmfb.core import workers
from glmfb.core.supervise import run_isolated
from glmfb.core.probe import ProbeSpec, get_probe

with workers.pool("run") as pool:
    assert pool.wait_ready(), pool.failed
    print(pool.process.pid, flush=True)
    if sys.argv[1] == "exit":
        sys.exit(0)
    if sys.argv[1] == "hang":
        target = sys.argv[2]
        spec = ProbeSpec(kind="gap", name="gap", label="gap", baseline=f"{target}:gap", candidate=f"{target}:gap",
                         candidate_args={"behavior": "hang"}, options={"attribute": False})
        run_isolated("gap", "gap", get_probe("gap").build(spec), run_id="r", artifact_dir=Path(sys.argv[3]),
                     progress=lambda m: None)
    time.sleep(3600)
"""


@pytest.mark.parametrize("end", ["exit", "sigkill", "sigkill-mid-job"])
def test_the_zygote_never_outlives_its_owner(end: str, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    how = {"exit": "exit", "sigkill": "sleep", "sigkill-mid-job": "hang"}[end]
    owner = subprocess.Popen([sys.executable, str(script), how, str(TARGETS), str(tmp_path / "job")],
                             stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                             env={**os.environ, MARK: mark, "PYTHONPATH": str(ROOT)})
    try:
        assert owner.stdout is not None
        zygote = int(owner.stdout.readline())
        assert psutil.pid_exists(zygote)
        if end == "sigkill-mid-job":  # the job has started: its process (forked from the zygote) and a reaper
            deadline = time.monotonic() + 60
            while len(marked(mark)) < 4 and time.monotonic() < deadline:  # owner, zygote, reaper, job
                time.sleep(0.1)
            assert len(marked(mark)) >= 4, marked(mark)
        if end != "exit":
            owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=60)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    assert none_left(mark) == []


# --------------------------------------------------------------------------------------------
# The same verdict, warm or cold
# --------------------------------------------------------------------------------------------


def comparable(verdict: Verdict, folder: Path) -> dict[str, Any]:
    """The verdict without what differs from one run to the next: durations, its folder."""
    data = json.loads(json.dumps(verdict.to_dict()).replace(str(folder), "<folder>"))
    data.pop("duration_s", None)
    return data


def test_a_diff_verdict_is_the_same_through_the_pool_as_cold(warm: Warm, tmp_path: Path) -> None:
    from glmfb.workflows.suite import load_definitions, select

    [definition] = select(load_definitions([ROOT / "probes" / "diff.toml"]), ["llama-down-proj-bf16"])

    def run(folder: Path) -> Verdict:
        return run_isolated("diff", definition.name, definition.config, run_id="r", artifact_dir=folder,
                            progress=lambda m: None, timeout_s=300)

    before = warm.pool.warm
    warm_verdict = run(tmp_path / "warm")
    assert warm.pool.warm == before + 1
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(workers.WORKERS_ENV, "off")
        patch.setattr(workers, "_current", None)  # as outside any pool
        cold_verdict = run(tmp_path / "cold")
    assert warm.pool.warm == before + 1
    assert warm_verdict.status.value == "fail", warm_verdict.why
    assert comparable(warm_verdict, tmp_path / "warm") == comparable(cold_verdict, tmp_path / "cold")
