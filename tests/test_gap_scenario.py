"""The kv_transfer scenario with its real parts: the Mooncake transfer engine (or the socket
fallback) between this process and a receiver process, the GIL-holding dispatch, and glmfb gap
on top. Small configurations except the acceptance tests marked slow."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import BundledRun, run
from typer.testing import CliRunner

from glmfb.contract.evidence import HostActivity
from glmfb.contract.verdict import Layer, Status, Verdict
from glmfb.core.targets import Target
from glmfb.gap import GapConfig
from glmfb.workflows import suite

pytestmark = pytest.mark.slow  # the real scenario: a receiver process, Mooncake or a socket

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = str(ROOT / "scenarios" / "kv_transfer" / "scenario.py")
SMALL: dict[str, Any] = {"layers": 2, "tokens": 512, "hidden": 64, "heads": 2, "page_tokens": 8, "dispatch_ms": 2.0}


def _has_mooncake() -> bool:
    try:
        import mooncake.engine  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


HAS_MOONCAKE = _has_mooncake()
needs_mooncake = pytest.mark.skipif(not HAS_MOONCAKE, reason="mooncake-transfer-engine-non-cuda not importable")
TRANSPORTS = [pytest.param("mooncake", marks=[pytest.mark.mooncake, needs_mooncake]), "socket"]


def factory(name: str) -> Any:
    return Target(f"{SCENARIO}:{name}").load()


def scenario_module() -> Any:
    return sys.modules[factory("prefill_only").__module__]


@pytest.fixture
def releasing() -> Iterator[Any]:
    made: list[Any] = []

    def make(**kwargs: Any) -> Any:
        instance = factory("prefill_transfer_releasing")(**{**SMALL, **kwargs})
        made.append(instance)
        return instance

    yield make
    for instance in made:
        instance.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_kv_byte_arrives_intact(releasing: Any, transport: str) -> None:
    scenario = releasing(transport=transport)
    assert scenario.transfer_path == transport
    scenario()  # warm
    for _ in range(2):  # each check poisons the destination first: stale bytes cannot pass
        check = scenario.check_delivery()
        assert check["bytes_expected"] == 2 * 2 * 512 * 64 * 4
        assert check["bytes_sent"] == check["bytes_expected"]
        assert check["bytes_received"] == check["bytes_sent"]
        assert check["received_sha256"] == check["source_sha256"]
        assert check["source_unchanged"]
        assert check["phases"]["kv_bytes"] == check["bytes_sent"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_close_stops_the_receiver_and_leaves_no_buffer_file(releasing: Any, transport: str) -> None:
    scenario = releasing(transport=transport)
    scenario()
    receiver = scenario._receiver
    # unlinked as soon as both sides mapped it: nothing left in /dev/shm even after a kill
    assert not receiver.buffer_path.exists()
    scenario.close()
    assert receiver.process.poll() is not None
    assert not receiver.buffer_path.exists()
    scenario.close()  # idempotent


@pytest.mark.mooncake
@needs_mooncake
def test_the_receiver_exits_as_soon_as_its_stdin_closes() -> None:
    """Closing a build waits for its receiver to end. The receiver's Mooncake engine, destroyed
    on the way out, waited about a second for its own threads (1.07 s, every time, measured
    here); the receiver now exits right after unregistering its buffer (a few ms)."""
    receiver = scenario_module().ReceiverProcess("mooncake", 1 << 20)
    try:
        started = time.monotonic()
        receiver.process.stdin.close()
        code = receiver.process.wait(timeout=10)
        took = time.monotonic() - started
    finally:
        receiver.close()
    assert code == 0, receiver.stderr_tail()
    assert took < 0.5, f"the receiver took {took:.2f} s to exit after its stdin closed"


def test_phases_and_description(releasing: Any) -> None:
    scenario = releasing()
    phases = scenario()
    assert set(phases) == {"prefill_s", "dispatch_s", "kv_wait_s", "transfer_busy_s", "kv_bytes"}
    assert phases["dispatch_s"] >= 2 * 0.002 * 0.9
    info = scenario.describe()
    assert info["dispatch"] == "releasing" and info["kv_bytes_per_iteration"] == phases["kv_bytes"]
    assert scenario.measure_ceiling() > 0 and scenario.measure_page_rate() > 0
    only = factory("prefill_only")(**SMALL)
    try:
        assert set(only()) == {"prefill_s", "dispatch_s"} and only.transfer_path is None
    finally:
        only.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_receiver_death_mid_run_is_an_error_verdict_in_bounded_time(tmp_path: Path, transport: str) -> None:
    config = GapConfig(
        name="dies",
        baseline=Target(f"{SCENARIO}:prefill_only", dict(SMALL)),
        candidate=Target(f"{SCENARIO}:prefill_transfer_releasing",
                         {**SMALL, "transport": transport, "kill_receiver_at": 3, "timeout_s": 5}),
        repeats=20, warmup=1,
    )
    started = time.monotonic()
    verdict = run("gap", config, tmp_path)
    assert time.monotonic() - started < 30
    assert verdict.status is Status.ERROR and verdict.layer is Layer.HARNESS
    assert "receiver process was killed by SIGKILL" in verdict.why
    # 1 warm-up + 2 measured on the first build: the second round, before the first look
    assert "candidate" in verdict.why and "iteration 2 of build" in verdict.why
    transfer = [e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "transfer" and e["side"] == "candidate"]
    assert transfer and transfer[0]["transfer_path"] == transport


def test_receiver_death_through_the_cli_exits_3(tmp_path: Path) -> None:
    from glmfb.cli import app

    result = CliRunner().invoke(app, [
        "gap", f"{SCENARIO}:prefill_only", f"{SCENARIO}:prefill_transfer_releasing",
        *[f"--arg={k}={v}" for k, v in SMALL.items()],
        "--candidate-arg", "kill_receiver_at=2", "--candidate-arg", "transport=socket",
        "--warmup", "1", "--json", "--out", str(tmp_path),
    ])
    assert result.exit_code == 3, result.output
    data = json.loads(result.stdout)
    assert data["status"] == "error" and data["layer"] == "harness"
    assert "receiver" in data["why"]


def test_missing_mooncake_falls_back_to_a_socket_and_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(scenario_module(), "mooncake_unavailable_reason",
                        lambda: "mooncake transfer engine not importable (test)")
    config = GapConfig(
        name="fallback",
        baseline=Target(f"{SCENARIO}:prefill_only", dict(SMALL)),
        candidate=Target(f"{SCENARIO}:prefill_transfer_releasing", dict(SMALL)),
        threshold=5.0, repeats=4, min_repeats=4, warmup=1,
    )
    verdict = run("gap", config, tmp_path)
    assert verdict.env["transfer_path"] == "socket"
    assert "Transfer path: socket" in verdict.why and "not importable (test)" in verdict.why
    bandwidth = next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "bandwidth")
    assert bandwidth["transfer_path"] == "socket" and bandwidth["fallback_reason"]
    # Asking for Mooncake explicitly when it is missing is an error, not a silent fallback.
    with pytest.raises(RuntimeError, match="not importable"):
        factory("prefill_transfer_releasing")(**SMALL, transport="mooncake")


def test_dispatch_modes() -> None:
    dispatch = sys.modules[scenario_module().__name__.rpartition(".")[0] + ".dispatch"]
    with pytest.raises(ValueError):
        dispatch.NativeDispatch("sometimes")
    holding = dispatch.NativeDispatch("holding")
    started = time.perf_counter()
    holding.intranode_dispatch(20_000)
    assert time.perf_counter() - started >= 0.019


# --------------------------------------------------------------------------------------------
# Acceptance: the planted bug and its fix, as the probe definitions run them
# --------------------------------------------------------------------------------------------


def _target_file(target: Target) -> tuple[Path, str, dict[str, Any]]:
    """A target as the file, attribute and arguments it names (a definition's path is relative to
    its file; a test's is absolute)."""
    location, _, attr = target.ref.rpartition(":")
    return ((target.base_dir or Path.cwd()) / location).resolve(), attr, dict(target.args)


@needs_mooncake
@pytest.mark.mooncake
def test_an_engine_woken_for_teardown_still_serves_and_drops_at_once() -> None:
    """``glmfb.gap.mooncake.unblock_teardown``: the receiving engine, woken before the first
    handshake, still answers it and the bytes arrive; each engine then drops in well under its
    listener's one-second accept timeout (about 7 ms measured, against up to 0.95 s unwoken)."""
    import ctypes
    import socket
    import struct

    from mooncake.engine import TransferEngine

    from glmfb.gap.mooncake import LISTENER_TIMEOUT, _listening_socket, unblock_teardown

    size = 1 << 16
    source = ctypes.create_string_buffer(bytes(range(256)) * (size // 256), size)
    destination = ctypes.create_string_buffer(size)
    engines = [TransferEngine(), TransferEngine()]
    for engine, buffer in zip(engines, (source, destination), strict=True):
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert engine.register_memory(ctypes.addressof(buffer), size) == 0
    sender, receiver = engines
    port = receiver.get_rpc_port()
    assert unblock_teardown(receiver)
    listener = _listening_socket(port)
    assert listener is not None
    with listener:
        seconds, microseconds = struct.unpack("ll", listener.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                                                                          len(LISTENER_TIMEOUT)))
    assert seconds == 0 and 0 < microseconds <= 10_000  # 1 ms asked; the kernel rounds up to a tick (4 ms here)
    status = sender.transfer_sync_write(f"127.0.0.1:{port}", ctypes.addressof(source), ctypes.addressof(destination), size)
    assert status == 0 and destination.raw == source.raw
    assert unblock_teardown(sender)
    del sender, receiver, engine
    for _ in range(2):
        started = time.perf_counter()
        engines.pop()  # the last reference: the engine's destructor runs here
        assert time.perf_counter() - started < 0.5
    assert not unblock_teardown(object())


@pytest.mark.slow
@needs_mooncake
@pytest.mark.mooncake
@pytest.mark.bundled("gap.toml")
def test_probe_holding_dispatch_fails_naming_intranode_dispatch(bundled_run: BundledRun) -> None:
    """``glmfb run probes/gap.toml -k kv-transfer-dispatch-holds-gil``: its verdict in the
    session's one run of the bundled suite (conftest.py)."""
    verdict = bundled_run.verdicts("gap.toml")["kv-transfer-dispatch-holds-gil"]
    assert verdict["expect_met"], verdict["why"]
    assert Verdict.from_dict(verdict).exit_code == 0  # what that run exits with
    assert verdict["status"] == "fail" and verdict["layer"] == "transfer"
    assert verdict["where"]["function"] == "intranode_dispatch"
    assert verdict["where"]["thread"] == "kv-transfer"
    assert verdict["metric"]["ci"][0] > 0.05
    assert verdict["env"]["transfer_path"] == "mooncake"
    gil = next(e for e in verdict["evidence"] if e["kind"] == "gil_attribution")
    assert gil["holder_idle_share"] >= 0.5 and gil["native_frame"] == "usleep"


@pytest.mark.slow
@needs_mooncake
@pytest.mark.mooncake
@pytest.mark.bundled("gap.toml")
def test_releasing_dispatch_passes_within_5_percent(bundled_run: BundledRun) -> None:
    """This configuration is probes/gap.toml's kv-transfer-dispatch-releases-gil: its verdict in
    the session's one run of the bundled suite (conftest.py)."""
    config = GapConfig(
        name="releasing",
        baseline=Target(f"{SCENARIO}:prefill_only", {"layers": 1}),
        candidate=Target(f"{SCENARIO}:prefill_transfer_releasing", {"layers": 1}),
        threshold=0.05, repeats=60, budget_s=45,  # as probes/gap.toml; decides in ~10 s when quiet
    )
    name = "kv-transfer-dispatch-releases-gil"
    (definition,) = suite.select(suite.load_definitions([ROOT / "probes" / "gap.toml"]), [name])
    bundled = definition.config
    assert replace(bundled, name=config.name, baseline=config.baseline, candidate=config.candidate) == config
    assert [_target_file(t) for t in (bundled.baseline, bundled.candidate)] == [
        _target_file(t) for t in (config.baseline, config.candidate)]
    verdict = Verdict.from_dict(bundled_run.verdicts("gap.toml")[name])
    load = verdict.find(HostActivity)
    assert load is not None, [e.kind for e in verdict.evidence]
    # The fix is never called a regression. Its gap is a few percent on a quiet host; on a busy
    # one the candidate's transfer thread competes for CPUs other processes already hold, and a
    # CI run read +5.8% [+0.6%, +11.4%] there: undecided, which the verdict must then explain.
    # On a quiet host too its gap sits near the threshold: a fresh-clone run read +2.5%
    # [-0.1%, +5.1%] after the 45 s budget (other processes 0.18 CPUs). Undecided is then the
    # right answer; a fail never is, nor an undecided interval that lies above the threshold.
    # A fresh-clone run read +199.7% [+104.7%, +338.6%] with other processes keeping 0.7 of the 2
    # CPUs busy: the transfer thread did not get its CPU. Over the threshold with nothing
    # measured explaining it, on a busy host, is undecided (rule undecided-busy-host), not a fail.
    assert verdict.status is not Status.FAIL, verdict.why
    if verdict.status is Status.INCONCLUSIVE:
        assert verdict.metric is not None and verdict.metric.ci is not None
        if load.busy:
            assert "The host was busy: other processes kept" in verdict.why, verdict.why
        else:
            assert verdict.metric.ci[0] < 0.05 < verdict.metric.ci[1], verdict.why
        return
    assert verdict.status is Status.PASS, (verdict.why, load)
    assert verdict.metric is not None and verdict.metric.ci is not None and verdict.metric.ci[1] < 0.05
