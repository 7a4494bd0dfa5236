"""Two faults a tester reproduced, each through the code path a user hits.

- ``glmfb mcp --http`` refused ``Authorization: bearer TOKEN``: RFC 9110 makes the scheme's
  name case-insensitive, so any case is the token's scheme; a wrong token is still refused.
- A target's forked children inherited the supervised child's SIGTERM handler: glmfb stopping
  a target that forked left one ``BrokenPipeError`` traceback from glmfb/core/child.py per process
  in probe-stderr.txt (and one from the child itself), which read as a crash of glmfb; and a
  target that stopped its own forked worker with SIGTERM got the error verdict "stopped by
  glmfb", sent by the worker's copy of the probe.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
TOKEN = "round3-token_0123456789"


# --------------------------------------------------------------------------------------------
# B: the bearer scheme in any case
# --------------------------------------------------------------------------------------------


def _asgi_status(authorization: bytes | None) -> int:
    """The status :class:`~glmfb.workflows.mcp.server.BearerToken` answers a request with this
    ``Authorization`` value (None: no header); 200 when it lets the request through."""
    import anyio

    from glmfb.workflows.mcp.server import BearerToken

    sent: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    headers = [] if authorization is None else [(b"authorization", authorization)]
    anyio.run(BearerToken(app, TOKEN), {"type": "http", "headers": headers}, receive, send)
    return int(sent[0]["status"])


@pytest.mark.parametrize("value", [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}", f"bEaReR  {TOKEN}"])
def test_the_bearer_scheme_is_accepted_in_any_case(value: str) -> None:
    assert _asgi_status(value.encode()) == 200


@pytest.mark.parametrize("value", [None, "", TOKEN, "bearer wrong", "BEARER wrong", f"Basic {TOKEN}",
                                   f"bearer{TOKEN}", "bearer", "bearer ", f"bearer {TOKEN} extra",
                                   f"bearer {TOKEN[:-1]}", f"Bearers {TOKEN}"])
def test_a_missing_or_wrong_token_is_still_refused(value: str | None) -> None:
    assert _asgi_status(None if value is None else value.encode()) == 401


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    """``glmfb mcp --http`` on a free loopback port with the token given; its URL."""
    pytest.importorskip("mcp")
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port = probe_socket.getsockname()[1]
    root = tmp_path / "project"
    root.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "glmfb", "mcp", "--root", str(root), "--http",
                                f"127.0.0.1:{port}", "--token", TOKEN], cwd=tmp_path, stderr=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert process.poll() is None, "glmfb mcp --http exited"
                assert time.monotonic() < deadline, "glmfb mcp --http did not listen within 60 s"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_over_http_a_lowercase_bearer_scheme_is_served_and_a_wrong_token_refused(http_server: str) -> None:
    import httpx2 as httpx  # the MCP SDK's HTTP client

    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    for scheme in ("bearer", "BEARER"):
        served = httpx.post(http_server, json=initialize, headers={**accept, "Authorization": f"{scheme} {TOKEN}"},
                            timeout=30)
        assert served.status_code == 200 and "serverInfo" in served.text, (scheme, served.status_code, served.text)
        refused = httpx.post(http_server, json=initialize, headers={**accept, "Authorization": f"{scheme} wrong"},
                             timeout=30)
        assert refused.status_code == 401 and "bearer token" in refused.text, (scheme, refused.text)


# --------------------------------------------------------------------------------------------
# C: a target's forked children are the target's, not glmfb's
# --------------------------------------------------------------------------------------------

FORKS = 5

FORKING_TARGET = f"""
import os
import signal
import threading
import time
from pathlib import Path

FORKS = {FORKS}


def _sleeper() -> int:
    pid = os.fork()
    if pid == 0:
        time.sleep(3600)
        os._exit(0)
    return pid


def hangs_after_forking(pids: str):
    \"\"\"Forks workers that sleep (one from a thread), writes their pids, then hangs: glmfb's
    timeout stops the whole tree.\"\"\"
    forked = [_sleeper() for _ in range(FORKS - 1)]
    in_thread = threading.Thread(target=lambda: forked.append(_sleeper()))
    in_thread.start()
    in_thread.join()
    Path(pids).write_text(" ".join(map(str, forked)))
    time.sleep(3600)


def stops_its_own_worker():
    \"\"\"Forks a worker and stops it with SIGTERM, as a pool's terminate() does, then works.\"\"\"
    worker = _sleeper()
    time.sleep(0.1)
    os.kill(worker, signal.SIGTERM)
    os.waitpid(worker, 0)  # what the worker's copy of the probe would answer has been sent by now

    def iteration():
        return {{"work_s": 0.001}}

    return iteration
"""


def _glmfb_gap(tmp_path: Path, factory: str, *extra: str, timeout: str) -> tuple[subprocess.CompletedProcess[str],
                                                                                 dict[str, Any]]:
    target = tmp_path / "forking.py"
    target.write_text(textwrap.dedent(FORKING_TARGET))
    ref = f"{target}:{factory}"
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    ran = subprocess.run([sys.executable, "-m", "glmfb", "gap", ref, ref, *extra, "--repeats", "4", "--budget", "2",
                          "--threshold", "300%", "--no-attribute", "--timeout", timeout, "--json", "--no-history",
                          "--out", str(tmp_path / "reports")], capture_output=True, text=True, cwd=tmp_path,
                         env=environ, timeout=120)
    return ran, json.loads(ran.stdout)


@pytest.mark.slow  # the 8 s timeout is what stops it: room for the target to fork on a loaded host
def test_glmfb_stopping_a_target_that_forked_leaves_no_traceback_of_glmfb(tmp_path: Path) -> None:
    pids = tmp_path / "pids.txt"
    ran, verdict = _glmfb_gap(tmp_path, "hangs_after_forking", "--candidate-arg", f"pids={pids}",
                              "--baseline-arg", f"pids={pids}", timeout="8s")
    assert ran.returncode == 3 and "killed after 8 s timeout" in verdict["why"], (ran.returncode, verdict["why"])
    forked = [int(p) for p in pids.read_text().split()]  # the forks happened before glmfb stopped the tree
    assert len(forked) == FORKS
    stderr = next(tmp_path.glob("reports/*/*/probe-stderr.txt")).read_text()
    assert "Traceback" not in stderr and "glmfb/core/child.py" not in stderr and "BrokenPipeError" not in stderr, stderr
    [process] = [e for e in verdict["evidence"] if e["kind"] == "process"]
    assert process["stderr_tail"] is None and process["description"] == "was killed by signal 15 (SIGTERM)", process
    assert not [p for p in forked if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_target_that_stops_its_own_forked_worker_gets_its_own_verdict(tmp_path: Path) -> None:
    ran, verdict = _glmfb_gap(tmp_path, "stops_its_own_worker", timeout="60s")
    assert verdict["status"] != "error" and "stopped by glmfb" not in verdict["why"], verdict["why"]
    assert ran.returncode in (0, 1, 4), ran.stderr
    stderr = next(tmp_path.glob("reports/*/*/probe-stderr.txt"), None)
    assert stderr is None or "Traceback" not in stderr.read_text()
