"""glmfb gil on real programs: py-spy, the injected heartbeat and /proc, end to end.

Each test traces a real child process for one to two seconds. The planted effects are far
beyond this machine's noise: a 20 ms native call holding the GIL against 1 ms ticks, a regex
or json.dumps holding it for 100-400 ms.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import run

from glmfb.contract.verdict import Layer, Status, Verdict
from glmfb.core.targets import Target
from glmfb.gil import GilConfig
from glmfb.gil import engine as gil_engine

ROOT = Path(__file__).resolve().parents[1]
DISPATCH = ROOT / "scenarios" / "dispatch_gil" / "dispatch.py"

pytestmark = pytest.mark.slow


def _evidence(verdict: Verdict, kind: str) -> dict[str, object]:
    return next(dict(e) for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == kind)


def _program(tmp_path: Path, name: str, body: str, tail: str = "") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body) + textwrap.dedent(tail))
    return path


def _gone(pid: int, within_s: float = 3.0) -> bool:
    """Whether ``pid`` stops running within ``within_s`` (a SIGKILL lands asynchronously)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":  # a zombie waiting for its new parent to reap it runs nothing
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def test_holding_dispatch_names_the_call_the_thread_and_the_starved_transfer(
    tmp_path: Path,
) -> None:
    config = GilConfig(
        name="hold",
        command=(sys.executable, str(DISPATCH), "--mode", "hold", "--duration", "30"),
        duration_s=2,
    )
    verdict = run("gil", config, tmp_path)
    assert verdict.status is Status.FAIL, verdict.why
    assert verdict.layer is Layer.RUNTIME
    assert verdict.where["thread"] == "moe-dispatch"
    assert verdict.where["function"] == "intranode_dispatch"
    assert str(verdict.where["file"]).endswith("dispatch_gil/dispatch.py")
    assert verdict.why.startswith("intranode_dispatch holds the GIL inside a native call")
    holder = _evidence(verdict, "gil_holder")
    assert holder["idle_share"] >= 0.8  # type: ignore[operator]
    assert holder["native_frame"] == "usleep"
    starvation = _evidence(verdict, "starvation")
    assert "kv-transfer" in starvation["threads"]  # type: ignore[operator]
    assert starvation["p99_ms"] > 15  # type: ignore[operator]
    windows = starvation["windows"]
    assert any(  # /proc saw the holder blocked in its sleep while others waited
        w.get("holder") == "moe-dispatch"
        and any(k in w["holder_states"] for k in ("in clock_nanosleep", "in restart_syscall"))
        for w in windows  # type: ignore[union-attr]
    )
    assert verdict.metric is not None and verdict.metric.name == "starvation_p99"
    assert Path(verdict.artifacts["pyspy_raw"]).is_file()
    assert Verdict.from_dict(verdict.to_dict()) == verdict


def test_releasing_dispatch_passes(tmp_path: Path) -> None:
    config = GilConfig(
        name="release",
        command=(sys.executable, str(DISPATCH), "--mode", "release", "--duration", "30"),
        duration_s=2,
    )
    verdict = run("gil", config, tmp_path)
    assert verdict.status is Status.PASS, verdict.why
    assert _evidence(verdict, "starvation")["p99_ms"] < 10  # type: ignore[operator]


TICKER = """
def tick(stop):
    while not stop.is_set():
        time.sleep(0.001)

stop = threading.Event()
threads = [threading.Thread(target=work, args=(stop,), name=WORKER),
           threading.Thread(target=tick, args=(stop,), name="ticker")]
for t in threads:
    t.start()
time.sleep(30)
"""


def test_regex_backtracking_is_named_with_its_thread(tmp_path: Path) -> None:
    program = _program(
        tmp_path,
        "scan.py",
        """
        import re, threading, time
        PATTERN = re.compile(r"(a+)+$")  # catastrophic backtracking on a near miss
        WORKER = "log-scanner"

        def work(stop):
            line = "a" * 21 + "!"
            while not stop.is_set():
                PATTERN.match(line)
    """,
        TICKER,
    )
    verdict = run("gil",
        GilConfig(name="regex", command=(sys.executable, str(program)), duration_s=4),
        tmp_path / "a",
    )
    assert verdict.status is Status.FAIL, verdict.why
    assert verdict.where["thread"] == "log-scanner"
    assert verdict.where["function"] == "re.Pattern.match"  # the C call; its caller is in the why
    assert "called from work (" in verdict.why
    assert "ticker" in _evidence(verdict, "starvation")["threads"]  # type: ignore[operator]
    holder = _evidence(verdict, "gil_holder")
    assert holder["active_share"] >= 0.8  # type: ignore[operator]
    assert "sre" in str(holder["native_frame"]).lower()
    assert "hogs the interpreter" in verdict.why


def test_json_dumps_of_a_huge_object_is_named_with_its_caller(tmp_path: Path) -> None:
    program = _program(
        tmp_path,
        "snap.py",
        """
        import json, threading, time
        SNAPSHOT = {f"request-{i}": {"tokens": list(range(64)), "score": i / 7} for i in range(20000)}
        WORKER = "serializer"

        def work(stop):
            while not stop.is_set():
                json.dumps(SNAPSHOT)
    """,
        TICKER,
    )
    verdict = run("gil",
        GilConfig(name="json", command=(sys.executable, str(program)), duration_s=4), tmp_path / "a"
    )
    assert verdict.status is Status.FAIL, verdict.why
    assert verdict.where["thread"] == "serializer"
    # the user's frame in where (issue 53: json's own encoder.py was), json's C encoder beside it
    assert verdict.where["function"] == "work" and str(verdict.where["file"]).endswith("snap.py")
    assert verdict.where["library_function"] == "json.encoder.c_make_encoder"
    assert "json.encoder.c_make_encoder" in verdict.why and "(in JSONEncoder.iterencode, " in verdict.why
    assert "called from work (" in verdict.why
    holder = _evidence(verdict, "gil_holder")
    assert str(holder["caller"]).startswith("work (")
    assert "ticker" in _evidence(verdict, "starvation")["threads"]  # type: ignore[operator]


def test_target_form_runs_the_callable_in_a_child(tmp_path: Path) -> None:
    config = GilConfig(
        name="target", target=Target(f"{DISPATCH}:make", {"mode": "hold"}), duration_s=2
    )
    verdict = run("gil", config, tmp_path)
    assert verdict.status is Status.FAIL, verdict.why
    assert verdict.where["function"] == "intranode_dispatch"
    assert "kv-transfer" in _evidence(verdict, "starvation")["threads"]  # type: ignore[operator]


def test_bad_target_is_an_error_verdict(tmp_path: Path) -> None:
    config = GilConfig(name="bad", target=Target(f"{DISPATCH}:no_such_factory"), duration_s=1)
    verdict = run("gil", config, tmp_path)
    assert verdict.status is Status.ERROR and verdict.layer is Layer.HARNESS
    assert "exited with status 3" in verdict.why and "no_such_factory" in verdict.why


def test_without_pyspy_starvation_is_inconclusive_and_names_the_missing_signal(
    tmp_path: Path,
) -> None:
    command = (sys.executable, str(DISPATCH), "--mode", "hold", "--duration", "30")
    verdict = run("gil",
        GilConfig(name="nospy", command=command, duration_s=1.5, use_pyspy=False), tmp_path
    )
    assert verdict.status is Status.INCONCLUSIVE, verdict.why
    assert "py-spy disabled" in verdict.why
    assert _evidence(verdict, "missing_signal")["signal"] == "holder sampling"
    assert "kv-transfer" in _evidence(verdict, "starvation")["threads"]  # type: ignore[operator]


def test_ptrace_refused_is_named_and_never_a_silent_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Root may always ptrace here, so a stand-in py-spy fails the way a refused attach does.
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Error: Permission denied (os error 13)' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(gil_engine.pyspy, "find_pyspy", lambda: str(fake))
    command = (sys.executable, str(DISPATCH), "--mode", "release", "--duration", "30")
    verdict = run("gil", GilConfig(name="refused", command=command, duration_s=1), tmp_path / "a")
    assert verdict.status is Status.WARN, verdict.why
    assert "ptrace refused" in verdict.why


def test_pyspy_not_installed_warns_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gil_engine.pyspy, "find_pyspy", lambda: None)
    command = (sys.executable, str(DISPATCH), "--mode", "release", "--duration", "30")
    verdict = run("gil", GilConfig(name="nospy", command=command, duration_s=1), tmp_path)
    assert verdict.status is Status.WARN, verdict.why
    assert "py-spy is not installed" in verdict.why


def test_pyspy_without_native_support_still_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A py-spy build that cannot unwind native stacks: the real one, refusing --native.
    real = gil_engine.pyspy.find_pyspy()
    assert real is not None
    wrapper = tmp_path / "py-spy"
    wrapper.write_text(
        '#!/bin/sh\nfor a in "$@"; do [ "$a" = --native ] && { echo "Error: native unwinding '
        f'is not supported" >&2; exit 1; }}; done\nexec {real} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(gil_engine.pyspy, "find_pyspy", lambda: str(wrapper))
    command = (sys.executable, str(DISPATCH), "--mode", "hold", "--duration", "30")
    verdict = run("gil", GilConfig(name="nonative", command=command, duration_s=2), tmp_path / "a")
    assert verdict.status is Status.FAIL, verdict.why
    assert verdict.where["function"] == "intranode_dispatch"
    assert "active/idle split unknown" in verdict.why
    assert _evidence(verdict, "missing_signal")["signal"] == "native frames"


def test_a_program_too_brief_to_sample_is_inconclusive(tmp_path: Path) -> None:
    verdict = run("gil",
        GilConfig(name="brief", command=(sys.executable, "-c", "pass"), duration_s=1), tmp_path
    )
    assert verdict.status is Status.INCONCLUSIVE, verdict.why


def test_a_program_that_is_not_python_is_inconclusive(tmp_path: Path) -> None:
    verdict = run("gil", GilConfig(name="sleep", command=("sleep", "5"), duration_s=1), tmp_path)
    assert verdict.status is Status.INCONCLUSIVE, verdict.why
    reasons = {e["signal"]: e["reason"] for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "missing_signal"}
    assert "never started the heartbeat" in reasons["heartbeat"]
    assert "Failed to find python version" in reasons["holder sampling"]


def test_command_not_found_is_an_error_verdict(tmp_path: Path) -> None:
    verdict = run("gil",
        GilConfig(name="nf", command=("no-such-command-glmfb",), duration_s=1), tmp_path
    )
    assert verdict.status is Status.ERROR and verdict.layer is Layer.HARNESS
    assert "command not found: 'no-such-command-glmfb'" in verdict.why


def test_non_zero_exit_is_an_error_naming_the_status_and_leaves_nothing(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    program = _program(
        tmp_path,
        "fails.py",
        f"""
        import subprocess, sys, time
        child = subprocess.Popen(["sleep", "300"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(0.3)
        sys.exit(3)
    """,
    )
    verdict = run("gil",
        GilConfig(name="exit3", command=(sys.executable, str(program)), duration_s=3),
        tmp_path / "a",
    )
    assert verdict.status is Status.ERROR and verdict.layer is Layer.HARNESS
    assert "exited with status 3" in verdict.why
    assert _gone(int(pid_file.read_text()))


def test_segfault_is_an_error_naming_the_signal_and_leaves_nothing(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    program = _program(
        tmp_path,
        "crash.py",
        f"""
        import ctypes, subprocess, time
        child = subprocess.Popen(["sleep", "300"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(0.3)
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    """,
    )
    verdict = run("gil",
        GilConfig(name="segv", command=(sys.executable, str(program)), duration_s=3), tmp_path / "a"
    )
    assert verdict.status is Status.ERROR and verdict.layer is Layer.HARNESS
    assert "killed by signal 11 (SIGSEGV)" in verdict.why
    assert _gone(int(pid_file.read_text()))


def test_a_program_outliving_the_duration_is_stopped_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    program = _program(
        tmp_path,
        "forever.py",
        f"""
        import subprocess, time
        child = subprocess.Popen(["sleep", "300"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        while True:
            time.sleep(0.01)
    """,
    )
    started = time.monotonic()
    verdict = run("gil",
        GilConfig(name="forever", command=(sys.executable, str(program)), duration_s=1),
        tmp_path / "a",
    )
    assert time.monotonic() - started < 15
    assert verdict.status is Status.PASS, verdict.why
    assert _gone(int(pid_file.read_text()))


def test_attach_by_pid_decides_from_pyspy_and_proc_without_a_heartbeat(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, str(DISPATCH), "--mode", "hold", "--duration", "30"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)  # let it start its threads
        verdict = run("gil", GilConfig(name="attach", pid=process.pid, duration_s=1.5), tmp_path)
    finally:
        process.kill()
        process.wait()
    # no heartbeat: the transfer thread's GIL waits (/proc) beside the holder py-spy saw decide
    assert verdict.status is Status.FAIL, verdict.why
    assert verdict.where["function"] == "intranode_dispatch"
    assert "kv-transfer" in verdict.why and "inside a native call (usleep)" in verdict.why, verdict.why
    assert "no heartbeat: attached by --pid" in verdict.why
    assert _evidence(verdict, "diagnosis")["rule"] == "gil-wait-attached"


def test_trace_mode_writes_a_perfetto_trace_and_ranks_the_holder(tmp_path: Path) -> None:
    command = (sys.executable, str(DISPATCH), "--mode", "hold", "--duration", "30")
    verdict = run("gil",
        GilConfig(name="trace", command=command, duration_s=2, trace=True), tmp_path
    )
    assert verdict.status is Status.FAIL, verdict.why
    trace = Path(verdict.artifacts["trace"])
    assert trace.is_file() and trace.parent == tmp_path / "trace"
    ranked = _evidence(verdict, "trace_overlap")["functions"]
    assert ranked[0]["thread"] == "moe-dispatch"  # type: ignore[index]
    assert "intranode_dispatch" in ranked[0]["function"]  # type: ignore[index]
    # viztracer writing its trace on the way out (JSON, the GIL held) is the tracer's, not the holder
    assert verdict.where["function"] == "intranode_dispatch", verdict.why
    assert "viztracer" not in verdict.why and "json" not in verdict.why, verdict.why


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
def test_gil_waiters_are_seen_in_proc(tmp_path: Path) -> None:
    command = (sys.executable, str(DISPATCH), "--mode", "hold", "--duration", "30")
    verdict = run("gil",
        GilConfig(name="waiters", command=command, duration_s=1.5, use_pyspy=False), tmp_path
    )
    waiting = _evidence(verdict, "starvation")["waiting_for_gil"]
    assert waiting[0]["thread"] == "kv-transfer" and waiting[0]["waiting_share"] > 0.2  # type: ignore[index]
    windows = _evidence(verdict, "starvation")["windows"]
    assert windows and any("kv-transfer" in w["waiting_threads"] for w in windows)  # type: ignore[union-attr]


def test_heartbeat_site_chains_the_users_sitecustomize(tmp_path: Path) -> None:
    from glmfb.gil.heartbeat import injection_env, read_heartbeat

    user_site = tmp_path / "user"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    env = injection_env(tmp_path / "hb", {**os.environ, "PYTHONPATH": str(user_site)})
    code = "import os, time; time.sleep(0.3); print(os.environ.get('USER_SITE_RAN'), os.environ.get('GLMFB_GIL_HEARTBEAT'))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.stdout.split() == ["1", "None"]  # user's site ran; the variable is not inherited
    beat = read_heartbeat(tmp_path / "hb")
    assert beat is not None and beat.ticks > 50
    assert beat.thread_names[beat.thread_id] == "glmfb-heartbeat"


@pytest.mark.mooncake
def test_holding_dispatch_starves_a_real_mooncake_transfer_thread(tmp_path: Path) -> None:
    pytest.importorskip(
        "mooncake.engine", reason="needs the Mooncake transfer engine (mooncake extra)"
    )
    command = (sys.executable, str(DISPATCH), "--mode", "hold", "--transport", "mooncake")
    verdict = run("gil",
        GilConfig(name="mooncake", command=(*command, "--duration", "30"), duration_s=2), tmp_path
    )
    assert verdict.status is Status.FAIL, verdict.why
    assert verdict.where["function"] == "intranode_dispatch"
    assert "kv-transfer" in _evidence(verdict, "starvation")["threads"]  # type: ignore[operator]
    assert _evidence(verdict, "gil_holder")["native_frame"] == "usleep"


def test_a_forked_child_does_not_write_into_the_parents_heartbeat(tmp_path: Path) -> None:
    from glmfb.gil.heartbeat import injection_env, read_heartbeat

    program = _program(
        tmp_path,
        "forks.py",
        """
        import os, time
        time.sleep(0.35)
        pid = os.fork()
        if pid == 0:
            time.sleep(0.05)
            raise SystemExit(0)  # runs atexit handlers in the child
        os.waitpid(pid, 0)
        time.sleep(0.2)
        """,
    )
    env = injection_env(tmp_path / "hb", dict(os.environ))
    subprocess.run([sys.executable, str(program)], env=env, check=True, timeout=30)
    beat = read_heartbeat(tmp_path / "hb")
    assert beat is not None and beat.ticks > 100
    assert all(a < b for a, b in zip(beat.wake_s, beat.wake_s[1:], strict=False))  # no copies


def test_a_target_whose_set_up_hangs_is_an_error_not_a_warn(tmp_path: Path) -> None:
    program = tmp_path / "slow_factory.py"
    program.write_text("import time\n\ndef make():\n    time.sleep(3600)\n    return lambda: None\n")
    verdict = run("gil", GilConfig(name="hang", target=Target(f"{program}:make"), duration_s=1, setup_timeout_s=2.0),
                  tmp_path)
    assert verdict.status is Status.ERROR and verdict.layer is Layer.HARNESS
    assert "did not finish within 2 s, so nothing was sampled" in verdict.why


def test_a_target_that_exits_during_set_up_is_an_error(tmp_path: Path) -> None:
    program = tmp_path / "exits.py"
    program.write_text("import os\n\ndef make():\n    os._exit(0)\n")
    verdict = run("gil", GilConfig(name="exits", target=Target(f"{program}:make"), duration_s=1), tmp_path)
    assert verdict.status is Status.ERROR and "exited with status 0 during its set-up" in verdict.why


def test_a_builtin_the_native_sampler_cannot_show_is_named_from_native_snapshots(tmp_path: Path) -> None:
    # py-spy --native leaves libpython's own functions out (sorted shows as its Python caller);
    # glmfb's snapshots of the running thread name it.
    program = _program(
        tmp_path,
        "sort.py",
        """
        import random, threading, time
        DATA = [random.random() for _ in range(2_000_000)]
        WORKER = "sorter"

        def work(stop):
            while not stop.is_set():
                sorted(DATA)
    """,
        TICKER,
    )
    verdict = run("gil", GilConfig(name="sort", command=(sys.executable, str(program)), duration_s=4), tmp_path / "a")
    assert verdict.status is Status.FAIL, verdict.why
    assert verdict.where["thread"] == "sorter" and verdict.where["function"] == "sorted", verdict.where
    holder = _evidence(verdict, "gil_holder")
    assert holder["c_symbol"] == "builtin_sorted" and holder["function"] == "work"
    times = _evidence(verdict, "thread_times")
    assert any(t["thread"] == "sorter" and t["c_function"] == "sorted" for t in times["threads"])  # type: ignore[index, union-attr]


def test_short_holds_that_add_up_fail_on_the_waiting_threads_share(tmp_path: Path) -> None:
    program = _program(
        tmp_path,
        "holds.py",
        """
        import pickle, threading, time
        PAGES = [{"id": f"page-{i}", "tokens": list(range(8))} for i in range(6000)]
        WORKER = "serializer"

        def work(stop):  # a few ms of pickling, a 1 ms pause, again and again
            while not stop.is_set():
                pickle.dumps(PAGES)
                time.sleep(0.001)

        def spin(stop):  # needs the GIL between short GIL-free calls, thousands of times a second
            while not stop.is_set():
                time.sleep(0)
    """,
        TICKER.replace('name="ticker")]', 'name="ticker"),\n           threading.Thread(target=spin, args=(stop,), name="spinner")]'),
    )
    verdict = run("gil", GilConfig(name="holds", command=(sys.executable, str(program)), duration_s=4), tmp_path / "a")
    assert verdict.status is Status.FAIL, verdict.why
    assert verdict.where["thread"] == "serializer" and verdict.where["function"] == "pickle.dumps", verdict.why
    starvation = _evidence(verdict, "starvation")
    waiting = {w["thread"]: w for w in starvation["waiting_for_gil"]}  # type: ignore[index, union-attr]
    assert max(w["of_runnable_share"] or 0 for w in waiting.values()) >= 0.2


def test_a_program_that_ended_while_a_tracer_held_it_keeps_its_own_exit_status(tmp_path: Path) -> None:
    """Under load py-spy or the native sampler can still hold the ended program under ptrace
    when sampling stops, so its exit cannot be collected yet: stopping it then must not turn its
    status 3 into "stopped by glmfb" (which read as a pass in CI)."""
    from glmfb.gil.process import Launched, exited, wait_until

    launched = Launched([sys.executable, "-c", "import time, sys; time.sleep(0.5); sys.exit(3)"], env=dict(os.environ),
                        cwd=None, stdout_path=tmp_path / "out", stderr_path=tmp_path / "err")
    tracer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import ctypes, sys, time
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        ok = libc.ptrace(0x4206, {launched.pid}, None, None) == 0  # PTRACE_SEIZE, never waited on
        print("seized" if ok else "refused", flush=True)
        time.sleep(2.0)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert tracer.stdout is not None
        if tracer.stdout.readline().strip() != "seized":
            pytest.skip("ptrace is refused here")
        assert wait_until(lambda: exited(launched.pid), 5.0)
        assert launched.poll() is None  # ended, but held by the tracer: not collectable yet
        launched.stop(grace_s=0.2)
        assert not launched.stopped_by_glmfb
        assert launched.poll() == 3
    finally:
        tracer.kill()
        tracer.wait()
        launched.stop(grace_s=0.2)
        launched.close()
