"""glmfb gil: parsing, statistics and verdict rules on fixed inputs (fast, no processes)."""

from __future__ import annotations

import json
import signal
from array import array
from pathlib import Path

import pytest

from glmfb.contract.errors import UsageError
from glmfb.contract.units import OptionValueError, parse_milliseconds
from glmfb.contract.verdict import Layer, Status, Verdict
from glmfb.core.commandline import command_line, shell_line
from glmfb.core.process import describe_returncode
from glmfb.core.targets import Target
from glmfb.gil import GilConfig
from glmfb.gil.engine import python_command, trace_step
from glmfb.gil.heartbeat import Heartbeat, injection_env, read_heartbeat
from glmfb.gil.pyspy import explain_failure, parse_raw, profile_holders, sampled_cleanly
from glmfb.gil.trace import overlap_blame
from glmfb.gil.verdict import Observations, decide

# As py-spy 0.4.3 writes it with --gil --idle --threads --native --full-filenames (shortened).
RAW_HOLD = """\
thread (4740): moe-dispatch;Thread.run (/usr/lib/python3.11/threading.py:982);main.<locals>.dispatch_loop (/src/dispatch.py:98);make_dispatch.<locals>.intranode_dispatch (/src/dispatch.py:71);_ctypes_callproc (callproc.c:1262);_call_function_pointer (callproc.c:943);ffi_call (libffi.so.8.1.2);0x7f6b3ace540e (libffi.so.8.1.2);usleep (libc.so.6);nanosleep (libc.so.6);clock_nanosleep (libc.so.6) 186
thread (4740): moe-dispatch;Thread.run (/usr/lib/python3.11/threading.py:982);main.<locals>.dispatch_loop (/src/dispatch.py:97) 3
thread (4739): kv-transfer;Thread.run (/usr/lib/python3.11/threading.py:982);KvTransfer._loop (/src/dispatch.py:63);KvTransfer._submit (/src/dispatch.py:49) 2
thread (4741): glmfb-heartbeat;beat (/x/sitecustomize.py:60) 4
thread (4735) 3
"""
RAW_BUSY = """\
thread (10): log-scanner;Thread.run (/usr/lib/python3.11/threading.py:982);scan_logs (/src/regex_prog.py:11);_sre_SRE_Pattern_match (libpython3.11.so.1.0);sre_match (libpython3.11.so.1.0) 90
thread (11): ticker;tick (/src/regex_prog.py:17) 2
"""


def test_parse_raw_reads_threads_frames_and_counts() -> None:
    samples = parse_raw(RAW_HOLD)
    assert [s.count for s in samples] == [186, 3, 2, 4, 3]
    first = samples[0]
    assert (first.thread_id, first.thread_name) == (4740, "moe-dispatch")
    assert first.python_frames[-1].function == "make_dispatch.<locals>.intranode_dispatch"
    assert first.python_frames[-1].line == 71
    assert first.python_frames[-1].short_function == "intranode_dispatch"
    assert first.native_tail[0].function == "_ctypes_callproc"
    assert first.blocked()
    assert first.native_call() == "usleep"
    assert samples[4].thread_name is None and samples[4].frames == ()
    assert not samples[2].blocked()


def test_profile_holders_splits_idle_and_excludes_heartbeat() -> None:
    profile = profile_holders(parse_raw(RAW_HOLD), native=True, names={}, exclude_tids={4741})
    assert profile.total_samples == 198
    top = profile.sites[0]
    assert (top.thread_name, top.function, top.line) == (
        "moe-dispatch",
        "make_dispatch.<locals>.intranode_dispatch",
        71,
    )
    assert top.samples == 186 and top.idle == 186
    assert top.native_calls.most_common(1)[0][0] == "usleep"
    assert all(site.thread_name != "glmfb-heartbeat" for site in profile.sites)
    by_thread = {t["thread"]: t for t in profile.threads}
    assert by_thread["moe-dispatch"]["idle"] == 186 and by_thread["moe-dispatch"]["active"] == 3


def test_profile_without_native_leaves_split_unknown() -> None:
    profile = profile_holders(parse_raw(RAW_HOLD), native=False, names={}, exclude_tids=set())
    assert profile.sites[0].idle == 0
    assert profile.threads[0]["idle"] is None


def test_pyspy_failures_are_explained_in_one_line() -> None:
    log = "Error: Failed to find python version from target process\n\nStack backtrace:\n   0: anyhow::msg\n"
    assert explain_failure(log) == "Error: Failed to find python version from target process"
    assert explain_failure("Error: Permission denied (os error 13)").startswith("ptrace refused")


def test_sampled_cleanly_reads_the_pyspy_summary() -> None:
    assert sampled_cleanly("py-spy> Wrote raw flamegraph data to 'x'. Samples: 0 Errors: 0")
    assert not sampled_cleanly("py-spy> Wrote raw flamegraph data to 'x'. Samples: 10 Errors: 3")
    assert not sampled_cleanly("Permission denied (os error 13)")


def _heartbeat(lateness_ms: list[float], period_s: float = 0.001) -> Heartbeat:
    wake, now = [], 100.0
    for late in lateness_ms:
        now += period_s + late / 1e3
        wake.append(now)
    return Heartbeat(
        1, 7, period_s, {7: "glmfb-heartbeat"}, tuple(wake), tuple(x / 1e3 for x in lateness_ms)
    )


def test_heartbeat_percentiles_and_windows() -> None:
    beat = _heartbeat([0.1] * 98 + [30.0, 50.0])
    assert beat.percentile_ms(50) == pytest.approx(0.1)
    assert beat.percentile_ms(99) == pytest.approx(30.0)
    assert beat.summary()["max_ms"] == pytest.approx(50.0)
    windows = beat.windows(0.010)
    assert len(windows) == 1  # two late wake-ups in a row merge into one window
    assert windows[0].max_lateness_s == pytest.approx(0.050)
    assert windows[0].duration_s == pytest.approx(0.081, abs=0.002)


def test_read_heartbeat_round_trip_and_torn_write(tmp_path: Path) -> None:
    prefix = tmp_path / "heartbeat"
    assert read_heartbeat(prefix) is None
    (tmp_path / "heartbeat.json").write_text(
        json.dumps(
            {
                "pid": 5,
                "heartbeat_tid": 6,
                "period_s": 0.001,
                "threads": {"6": "glmfb-heartbeat", "8": "kv"},
            }
        )
    )
    data = array("d", [1.0, 0.0002, 1.002, 0.0301]).tobytes()
    (tmp_path / "heartbeat.bin").write_bytes(data + b"\x00\x01\x02")  # a write cut short
    beat = read_heartbeat(prefix)
    assert beat is not None
    assert beat.ticks == 2 and beat.thread_names[8] == "kv"
    assert beat.lateness_s[1] == pytest.approx(0.0301)


def test_injection_env_puts_the_site_dir_first(tmp_path: Path) -> None:
    env = injection_env(tmp_path / "hb", {"PYTHONPATH": "/elsewhere"})
    first = env["PYTHONPATH"].split(":")[0]
    assert (Path(first) / "sitecustomize.py").is_file()
    assert env["PYTHONPATH"].endswith("/elsewhere")
    assert env["GLMFB_GIL_HEARTBEAT"] == str(tmp_path / "hb")


def _observations(raw: str | None, lateness_ms: list[float], **kwargs: object) -> Observations:
    holders = kwargs.pop("holders", None)
    waiting = kwargs.pop("waiting", [{"thread": "kv-transfer", "tid": 4739, "waiting_share": 0.7}])
    if raw is not None:
        holders = profile_holders(parse_raw(raw), native=True, names={}, exclude_tids={4741})
    return Observations(
        config=GilConfig(name="unit", command=("python", "x.py")),
        heartbeat=_heartbeat(lateness_ms),
        holders=holders,  # type: ignore[arg-type]
        waiting=waiting,  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


def test_rule_idle_holder_with_starvation_fails_naming_the_native_call(tmp_path: Path) -> None:
    # The Python function whose own line calls the foreign function is its binding: named.
    source = tmp_path / "dispatch.py"
    source.write_text("\n" * 70 + "        usleep(dispatch_us)\n", encoding="utf-8")
    verdict = decide(_observations(RAW_HOLD.replace("/src/dispatch.py", str(source)), [0.2] * 80 + [25.0] * 20))
    assert verdict.status is Status.FAIL and verdict.layer is Layer.RUNTIME
    assert verdict.where == {
        "thread": "moe-dispatch",
        "function": "intranode_dispatch",
        "file": str(source),
        "line": 71,
    }
    assert verdict.why.startswith(
        "intranode_dispatch holds the GIL inside a native call (usleep); release it"
    )
    assert "py::gil_scoped_release, Py_BEGIN_ALLOW_THREADS" in verdict.why
    starvation = next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "starvation")
    assert starvation["threads"] == ["kv-transfer", "glmfb-heartbeat"]
    assert starvation["p99_ms"] == pytest.approx(25.0)
    holder = next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "gil_holder")
    assert holder["idle_share"] == 1.0 and holder["native_frame"] == "usleep"
    assert "share_of_samples" not in holder  # the old duplicate of share_of_time is gone
    from glmfb.contract.evidence import RuleFired

    assert verdict.find(RuleFired).rule == "gil-hold-native"  # type: ignore[union-attr]
    assert Verdict.from_dict(verdict.to_dict()) == verdict


def test_rule_active_holder_names_hot_frames() -> None:
    verdict = decide(_observations(RAW_BUSY, [0.2] * 50 + [200.0] * 50))
    assert verdict.status is Status.FAIL
    # The C function holding the GIL is named; its Python caller stays in the why.
    assert verdict.where["function"] == "re.Pattern.match" and verdict.where["thread"] == "log-scanner"
    assert "hogs the interpreter" in verdict.why and "_sre_SRE_Pattern_match" in verdict.why
    assert "called from scan_logs (/src/regex_prog.py:11)" in verdict.why


def test_rule_not_starved_passes_and_missing_pyspy_warns() -> None:
    calm = [0.2] * 200
    assert decide(_observations(RAW_BUSY, calm)).status is Status.PASS  # busy, but nobody starved
    release = decide(_observations("", calm))
    assert release.status is Status.PASS and release.where == {}
    missing = decide(
        _observations(
            None, calm, missing=[{"signal": "holder sampling", "reason": "py-spy is not installed"}]
        )
    )
    assert missing.status is Status.WARN and "py-spy is not installed" in missing.why


def test_rule_starved_without_holder_is_inconclusive() -> None:
    missing = [{"signal": "holder sampling", "reason": "ptrace refused"}]
    verdict = decide(_observations(None, [0.2] * 50 + [40.0] * 50, missing=missing))
    assert verdict.status is Status.INCONCLUSIVE and "ptrace refused" in verdict.why
    assert any(e.kind == "missing_signal" for e in verdict.evidence)
    cpu = decide(_observations("", [0.2] * 50 + [40.0] * 50))
    assert cpu.status is Status.INCONCLUSIVE and "not the GIL" in cpu.why


def test_rule_without_heartbeat_never_passes() -> None:
    observations = _observations("", [])
    observations.heartbeat = None
    assert decide(observations).status is Status.INCONCLUSIVE


def test_overlap_blame_ranks_the_holder_over_releasing_waits(tmp_path: Path) -> None:
    def slice_(tid: int, name: str, ts: float, dur: float) -> dict[str, object]:
        return {"ph": "X", "pid": 1, "tid": tid, "name": name, "ts": ts, "dur": dur}

    events: list[dict[str, object]] = [
        {"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "MainThread"}},
        {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "kv-transfer"}},
        {"ph": "M", "pid": 1, "tid": 3, "name": "thread_name", "args": {"name": "moe-dispatch"}},
        slice_(2, "time.sleep", 1000, 20000),  # starved: 20 ms for a 1 ms sleep
        slice_(2, "KvTransfer._submit (d.py:49)", 21000, 50),
        slice_(3, "dispatch_loop (d.py:98)", 0, 40000),
        slice_(3, "intranode_dispatch (d.py:71)", 500, 21000),
        slice_(1, "_thread.lock.acquire", 0, 40000),  # waits with the GIL released
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    ranked = overlap_blame(path, {"kv-transfer"}, 0.010)
    assert ranked[0]["thread"] == "moe-dispatch"
    assert ranked[0]["function"] == "intranode_dispatch (d.py:71)"
    assert ranked[0]["overlap_ms"] == pytest.approx(20.0)
    assert all(r["function"] != "_thread.lock.acquire" for r in ranked)


def test_config_validation() -> None:
    with pytest.raises(UsageError, match="exactly one"):
        GilConfig(name="x")
    with pytest.raises(UsageError, match="exactly one"):
        GilConfig(name="x", command=("python",), pid=3)
    with pytest.raises(UsageError, match="rate"):
        GilConfig(name="x", command=("python",), rate_hz=0)
    with pytest.raises(UsageError, match="duration"):
        GilConfig(name="x", command=("python",), duration_s=0)


def test_command_lines() -> None:
    config = GilConfig(name="x", target=Target("a.py:make", {"mode": "hold"}), duration_s=2)
    argv = python_command(config)
    assert argv[1:3] == ["-m", "glmfb.gil.target_loop"] and json.loads(
        argv[argv.index("--args") + 1]
    ) == {"mode": "hold"}
    step = trace_step(config)
    assert step is not None and step.command == "gil"
    assert step.arguments == {"target": "a.py:make", "args": {"mode": "hold"}, "duration": "2s", "trace": True}
    assert shell_line(step) == ("glmfb gil --target a.py:make --arg mode=hold --duration 2s --trace  "
                                "# ranks what overlaps the starved slices")
    command = trace_step(GilConfig(name="x", command=("python", "p y.py"), rate_hz=200))
    assert command is not None and command.arguments == {"command": ["python", "p y.py"], "rate": 200, "trace": True}
    assert command_line(command) == "glmfb gil --rate 200 --trace -- python 'p y.py'"
    assert trace_step(GilConfig(name="x", pid=1234)) is None  # a rerun needs a program glmfb starts


def test_describe_returncode_and_milliseconds() -> None:
    assert describe_returncode(3) == "exited with status 3"
    assert describe_returncode(-signal.SIGSEGV) == "was killed by signal 11 (SIGSEGV)"
    assert parse_milliseconds("10ms") == 10.0
    assert parse_milliseconds("0.02s") == pytest.approx(20.0)
    assert parse_milliseconds("7") == 7.0
    with pytest.raises(OptionValueError):
        parse_milliseconds("fast")


def test_a_rare_holder_is_not_blamed_for_cpu_starvation() -> None:
    # The releasing scenario on a loaded machine: the heartbeat is late (no CPU), and the only
    # GIL-holding sample in 3 s at 100 Hz is the transfer thread's copy. Not the GIL: no fail.
    raw = "thread (4739): kv-transfer;KvTransfer._loop (/src/dispatch.py:63);KvTransfer._submit (/src/dispatch.py:49) 1\n"
    observations = _observations(None, [0.1] * 95 + [20.0] * 5)
    observations.holders = profile_holders(
        parse_raw(raw), native=True, names={}, exclude_tids=set(), sample_instants=300
    )
    assert observations.holders.threads[0]["share"] == pytest.approx(1 / 300, abs=1e-4)
    verdict = decide(observations)
    assert verdict.status is Status.INCONCLUSIVE and "not the GIL" in verdict.why


def test_read_heartbeat_drops_records_that_cannot_be_real(tmp_path: Path) -> None:
    prefix = tmp_path / "heartbeat"
    header = {
        "pid": 5,
        "heartbeat_tid": 6,
        "started_s": 1000.0,
        "fields": ["wake_s", "lateness_s", "cpu_wait_s"],
    }
    (tmp_path / "heartbeat.json").write_text(json.dumps(header))
    good = [(1000.5, 0.0002, 0.0), (1000.6, 0.030, 0.010), (1000.7, 0.001, 0.0)]
    values = [x for r in good[:2] for x in r]
    values.append(0.0005)  # one stray double: every field after it shifts by one
    values += [x for x in good[2]]
    values += [1000.8, float("nan"), 0.0]
    values += [1000.9, 9000.0, 0.0]  # an hour and more late: not a measurement
    (tmp_path / "heartbeat.bin").write_bytes(array("d", values).tobytes())
    beat = read_heartbeat(prefix)
    assert beat is not None
    assert beat.wake_s == (1000.5, 1000.6)  # what follows the stray double cannot be read
    assert beat.dropped_records == 3
    assert beat.gil_lateness_s[1] == pytest.approx(0.020)
    assert beat.summary()["dropped_records"] == 3


def test_a_few_wake_ups_spread_over_seconds_are_usable_starvation_data() -> None:
    from glmfb.gil.verdict import heartbeat_is_usable

    # Five wake-ups, each ~90 ms late, spread over 1.6 s (the heartbeat also waited for the
    # GIL after its own writes): the rarity is the signal, not missing data.
    wake = (100.0, 100.4, 100.8, 101.2, 101.6)
    beat = Heartbeat(1, 7, 0.001, {7: "glmfb-heartbeat"}, wake, (0.09,) * 5)
    assert heartbeat_is_usable(beat)
    short = Heartbeat(1, 7, 0.001, {7: "glmfb-heartbeat"}, (100.0, 100.01, 100.02), (0.001,) * 3)
    assert not heartbeat_is_usable(short)


def test_a_recording_that_ended_with_its_program_keeps_the_sampled_window(tmp_path: Path) -> None:
    """py-spy stops by itself when the traced program exits; the shares of the time a thread
    held the GIL are still taken over the instants of the window, not over the held ones."""
    import subprocess
    import sys
    import time

    from glmfb.gil import pyspy

    executable = pyspy.find_pyspy()
    if executable is None:
        pytest.skip("py-spy is not installed")
    program = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
    recording = pyspy.Recording(executable, program.pid, tmp_path / "raw.txt", tmp_path / "log.txt",
                                rate_hz=100, native=False, nonblocking=False)
    program.wait()
    ended = time.monotonic()
    deadline = ended + 10
    while recording.process.poll() is None and time.monotonic() < deadline:  # py-spy notices the exit
        time.sleep(0.05)
    time.sleep(0.5)
    recording.stop(target_running=False, sampling_ended_s=ended)
    assert recording.elapsed_s == pytest.approx(ended - recording.started_s, abs=0.01)
    assert recording.sample_instants >= 100  # ~1.5 s at 100 Hz, not 0 (which left the held lines as the total)


# ---- threads that come and go; start-up apart from the steady state --------------------------


def test_short_lived_threads_of_one_name_are_grouped_and_long_lived_ones_kept_apart() -> None:
    from glmfb.gil.groups import describe, group_key, thread_groups

    names = {10: "Thread-12 (_send_loop)", 11: "Thread-13 (_send_loop)", 12: "Thread-14 (_send_loop)",
             20: "worker-1", 21: "worker-2", 30: "thread 30", 31: "thread 31", 40: "kv-sender", 41: "kv-sender",
             50: "prefill", 60: "glmfb-heartbeat", 61: "glmfb-heartbeat"}
    short = {10, 11, 12, 30, 31, 40, 41, 60, 61}  # the worker pool and the prefill lived throughout
    groups = thread_groups(names, names, short, exclude={60, 61})
    assert dict(groups.members) == {10: (10, 11, 12), 40: (40, 41)}
    assert groups.names[10] == "Thread-N (_send_loop)" and groups.names[40] == "kv-sender"
    assert [groups.of(t) for t in (11, 12, 20, 21, 30, 50)] == [10, 10, 20, 21, 30, 50]
    assert groups.count(10) == 3 and groups.count(20) == 1 and groups.tids(41) == (41,)
    assert group_key("thread 30") is None  # known only by its id: never grouped
    assert describe("prefill", 1) == "thread prefill"
    assert describe("Thread-N (_send_loop)", 3) == "3 short-lived threads Thread-N (_send_loop) (taken as one)"
    from collections import Counter

    merged = groups.merge({10: Counter({("pickle.dumps", "_pickle_dumps"): 2}),
                           12: Counter({("pickle.dumps", "_pickle_dumps"): 3}), 50: Counter({("", ""): 1})})
    assert merged == {10: Counter({("pickle.dumps", "_pickle_dumps"): 5}), 50: Counter({("", ""): 1})}


def _ticks_of_two_senders() -> list:
    """2 s of 10 ms ticks: thread 7 runs throughout; sender 8 runs from 0.2 to 0.6 s, sender 9
    from 1.0 to 1.4 s, each on a CPU all its life (the prefill, 7, waits for a CPU half of it)."""
    from glmfb.gil.procwatch import Tick

    ticks = []
    for i in range(201):
        at = i * 0.01
        tick = Tick(at_s=at, running=frozenset({7}))
        tick.cpu_ns[7], tick.runqueue_ns[7], tick.read_s[7] = int(at * 0.5e9), int(at * 0.5e9), at
        for tid, (born, ended) in ((8, (0.2, 0.6)), (9, (1.0, 1.4))):
            if born <= at <= ended:
                tick.cpu_ns[tid], tick.runqueue_ns[tid], tick.read_s[tid] = int((at - born) * 1e9), 0, at
                tick.running = tick.running | {tid}
        ticks.append(tick)
    return ticks


def test_a_group_of_short_lived_threads_is_accounted_over_the_window() -> None:
    from glmfb.gil.procwatch import GilWaitSampler, account

    sampler = GilWaitSampler(0, 100)
    sampler.ticks = _ticks_of_two_senders()
    assert sampler.short_lived() == {8, 9}
    alone = account(sampler.ticks, 8, None)
    assert alone.cpu_share == pytest.approx(1.0)  # over its own life: always on a CPU
    times = sampler.thread_times(0, groups={8: (8, 9)})
    assert set(times) == {7, 8}
    group = times[8]
    assert group.wall_s == pytest.approx(2.0, abs=0.02)
    # 0.8 s on a CPU in a 2 s window; the time no sender was alive is blocked on something else
    assert group.cpu_share == pytest.approx(0.4, abs=0.02)
    assert group.other_wait_share == pytest.approx(0.6, abs=0.02) and group.gil_wait_share == 0.0
    assert times[7].runqueue_share == pytest.approx(0.5, abs=0.02)
    assert sampler.runqueue_between(7, 0.0, 1.0, (7,)) == pytest.approx(0.5, abs=0.01)


RAW_STARTUP = """\
thread (5): MainThread;<module> (/src/prog.py:16);_find_and_load (<frozen importlib._bootstrap>:1176);_call_with_frames_removed (<frozen importlib._bootstrap>:241);dlopen (libc.so.6) 300
thread (6): tolist-worker;Thread.run (/usr/lib/python3.11/threading.py:982);tolist_loop (/src/prog.py:24);torch::autograd::THPVariable_tolist (libtorch_python.so) 120
thread (7): ticker;ticker (/src/prog.py:33) 2
"""


def test_samples_inside_imports_are_start_up_not_the_steady_state_holder() -> None:
    from glmfb.gil.pyspy import in_startup

    samples = parse_raw(RAW_STARTUP)
    assert [in_startup(s) for s in samples] == [True, False, False]
    steady = [s for s in samples if not in_startup(s)]
    startup = [s for s in samples if in_startup(s)]
    verdict = decide(_observations(None, [0.2] * 50 + [150.0] * 50,
                                   holders=profile_holders(steady, native=True, names={}, exclude_tids=set()),
                                   startup=profile_holders(startup, native=True, names={}, exclude_tids=set())))
    assert verdict.status is Status.FAIL
    assert verdict.where["thread"] == "tolist-worker" and "tolist" in verdict.where["function"]
    assert "dlopen" not in verdict.why and "importlib" not in verdict.why
    startup = next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "gil_startup")
    assert startup["thread"] == "MainThread" and startup["samples_total"] == 300
    assert startup["native_frame"] == "dlopen"
    threads = next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "gil_threads")
    assert "MainThread" not in [t["thread"] for t in threads["threads"]]
    assert Verdict.from_dict(verdict.to_dict()) == verdict


def _raw_export() -> str:
    """py-spy's samples of an exporter thread in json's C encoder, called from the user's
    FileExporter.export through the standard library's json (its real paths here)."""
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    return (
        f"thread (20): exporter;Thread.run ({stdlib}/threading.py:982);FileExporter.run (/srv/app/exporter.py:31);"
        f"FileExporter.export (/srv/app/exporter.py:24);dumps ({stdlib}/json/__init__.py:231);"
        f"JSONEncoder.encode ({stdlib}/json/encoder.py:200);JSONEncoder.iterencode ({stdlib}/json/encoder.py:258);"
        "encoder_call (_json.cpython-311-x86_64-linux-gnu.so);encoder_listencode_obj "
        "(_json.cpython-311-x86_64-linux-gnu.so) 90\n"
        "thread (1): MainThread;serve (/srv/app/main.py:10) 30\n"
    )


# Issue 53: once a second the exporter holds the GIL 555-641 ms; between the holds the heartbeat
# wakes on time thousands of times, so 4 late wake-ups of 2,600 leave its p99 at 0.2 ms.
EXPORT_HOLDS = [0.2] * 500 + [600.0] + [0.2] * 700 + [555.0] + [0.2] * 700 + [641.0] + [0.2] * 700 + [598.0]
MAIN_WAITS = [{"thread": "MainThread", "tid": 1, "waiting_share": 0.35, "of_runnable_share": 0.4,
               "of_runnable_ci": (0.3, 0.5)}]


def test_long_holds_the_p99_does_not_count_starve_and_where_names_the_users_frame() -> None:
    verdict = decide(_observations(_raw_export(), EXPORT_HOLDS, waiting=MAIN_WAITS, observed_s=5.0))
    from glmfb.contract.evidence import RuleFired

    assert verdict.find(RuleFired).rule == "gil-hold-compute", verdict.why  # type: ignore[union-attr]
    assert verdict.status is Status.FAIL
    assert ("the heartbeat could not run for 555 to 641 ms at a time (longest 641 ms, median 599 ms), 4 times in "
            "5.0 s, blocked on the GIL (its p99 wake-up lateness, 0.2 ms, counts wake-ups, not holds") in verdict.why
    assert "short holds" not in verdict.why
    assert {k: verdict.where[k] for k in ("thread", "function", "file", "line")} == {
        "thread": "exporter", "function": "FileExporter.export", "file": "/srv/app/exporter.py", "line": 24}
    assert verdict.where["library_function"] != "FileExporter.export"  # json's, beside the user's frame
    assert "json/encoder.py" not in str(verdict.where)
    assert "called from FileExporter.export (/srv/app/exporter.py:24)" in verdict.why
    starvation = next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "starvation")
    assert starvation["held_long"] is True and starvation["hold_median_ms"] == pytest.approx(599.0)
    assert starvation["max_ms"] == pytest.approx(641.0)
    # one long hold is not starvation, and the why never calls the holds short
    one = decide(_observations(_raw_export(), [0.2] * 2000 + [600.0] + [0.2] * 600, waiting=MAIN_WAITS))
    assert one.find(RuleFired).rule == "gil-wait-share", one.why  # type: ignore[union-attr]
    assert "short holds" not in one.why and "one of them long" in one.why


def test_the_load_reports_the_fields_of_its_last_json_line() -> None:
    from glmfb.gil.evidence import REPORTED_FIELDS, LoadRun, reported_fields

    printed = '{"p99_ms": 12.0}\nwarming up\n{"p99_ms": 1352.37, "requests": 126, "ok": true, "by_path": {"/a": 3}}\nbye\n'
    fields = reported_fields(printed)
    assert fields == {"p99_ms": 1352.37, "requests": 126, "ok": True}  # the last object's scalars, in its order
    load = LoadRun(command=("load",), window_s=3.0, failed=False, reported=fields)
    assert load.figures() == "p99_ms 1352, requests 126, ok True"
    assert reported_fields("no json here\n{not json}\n[1, 2]\n") is None
    assert len(reported_fields("{" + ", ".join(f'"k{i}": {i}' for i in range(40)) + "}") or {}) == REPORTED_FIELDS
