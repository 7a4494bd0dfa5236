"""glmfb gil on a live server: a real threaded HTTP server written here, under a real load.

Attached by ``--pid`` (the test starts the server, not glmfb) no heartbeat can be injected; the
verdict is decided from py-spy's GIL holder samples and the per-thread /proc accounts (the
GIL's futex found inside ``_PyRuntime``), and says so. Launched with ``--ready`` and ``--load``,
the window opens once the server answers and the load runs inside it.

The server's handler threads keep one persistent connection per client (HTTP/1.1). The planted
hold is a thread pickling a 30,000-item list in a loop: one C call that keeps the GIL for tens of
milliseconds, far beyond this machine's noise; the clean twin has no such thread.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import run

from glmfb.contract.verdict import Status, Verdict
from glmfb.gil import GilConfig
from glmfb.gil.engine import SIGNAL_HEARTBEAT, SIGNAL_HOLDERS, SIGNAL_PROC
from glmfb.gil.pyspy import find_pyspy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc"),
    pytest.mark.skipif(find_pyspy() is None, reason="needs py-spy"),
]

SERVER = """
import http.server, json, os, pickle, socketserver, sys, threading, time

MODE, PORT, PORT_FILE = sys.argv[1], int(sys.argv[2]), sys.argv[3]
DELAY_S = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
PAGES = [{"id": i, "tokens": list(range(8))} for i in range(int(sys.argv[5]) if len(sys.argv) > 5 else 30000)]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # persistent connections: one handler thread per client

    def do_GET(self):
        body = json.dumps({"ok": True, "total": sum(range(100))}).encode()  # light work
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


def serialize_pages():
    while True:
        pickle.dumps(PAGES)  # one C call holding the GIL for tens of ms
        time.sleep(0.001)


time.sleep(DELAY_S)  # a slow start-up before the port is bound
server = Server(("127.0.0.1", PORT), Handler)
if MODE == "contended":
    threading.Thread(target=serialize_pages, name="serializer", daemon=True).start()
with open(PORT_FILE + ".tmp", "w") as handle:
    handle.write(str(server.server_address[1]))
os.replace(PORT_FILE + ".tmp", PORT_FILE)
print("serving on port", server.server_address[1], flush=True)
server.serve_forever()
"""

LOAD = """
import http.client, json, sys, threading, time

PORT, SECONDS, CLIENTS = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
done = [0] * CLIENTS
failed = []
latencies_ms = []


def report():  # as load generators do: its figures so far, a JSON object a line, twice a second
    ordered = sorted(latencies_ms) or [0.0]
    print(json.dumps({"requests": sum(done), "errors": len(failed),
                      "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))], 1)}), flush=True)


def reporter():
    while True:
        time.sleep(0.5)
        report()


def client(index):
    connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        try:
            sent = time.perf_counter()
            connection.request("GET", "/work")
            answer = connection.getresponse()
            answer.read()
            latencies_ms.append((time.perf_counter() - sent) * 1000)
            done[index] += 1
            if answer.status != 200:
                failed.append(answer.status)
        except OSError as exc:
            failed.append(repr(exc))
            connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
        time.sleep(0.01)


threading.Thread(target=reporter, daemon=True).start()
threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
report()
sys.exit(1 if failed else 0)
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _evidence(verdict: Verdict, kind: str) -> dict[str, Any]:
    return next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == kind)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Any]:
    """Start the server (a mode) and its load, both by the test; stopped at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(mode: str) -> tuple[int, subprocess.Popen[bytes]]:
        server_py = _write(tmp_path, "server.py", SERVER)
        load_py = _write(tmp_path, "load.py", LOAD)
        port_file = tmp_path / f"{mode}.port"
        server = subprocess.Popen([sys.executable, str(server_py), mode, "0", str(port_file)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(server)
        deadline = time.monotonic() + 10
        while not port_file.exists():
            assert server.poll() is None and time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.05)
        load = subprocess.Popen([sys.executable, str(load_py), port_file.read_text(), "30", "4"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        started.append(load)
        time.sleep(1.0)  # the four handler threads are up and serving
        assert load.poll() is None, load.communicate()[0]
        return server.pid, load

    yield start
    for process in reversed(started):
        _stop(process)


def test_attached_to_a_clean_server_it_passes_and_names_its_signals(tmp_path: Path, served: Any) -> None:
    pid, load = served("clean")
    started = time.monotonic()
    verdict = run("gil", GilConfig(name="clean", pid=pid, duration_s=4), tmp_path / "out")
    assert time.monotonic() - started < 20
    assert load.poll() is None  # the load ran throughout
    assert verdict.status is Status.PASS, verdict.why
    assert "Decided from py-spy's GIL holder samples" in verdict.why, verdict.why
    assert "/proc per-thread states" in verdict.why and "no heartbeat: attached by --pid" in verdict.why
    signals = _evidence(verdict, "gil_signals")
    assert signals["attached"] is True
    assert SIGNAL_HOLDERS in signals["used"] and SIGNAL_PROC in signals["used"]
    assert SIGNAL_HEARTBEAT not in signals["used"] and signals["missing"] == ["heartbeat"]
    assert signals["gil_futex"].startswith("_PyRuntime in "), signals
    assert _evidence(verdict, "diagnosis")["rule"] == "pass"


def test_attached_to_a_server_whose_pickling_thread_holds_the_gil_it_fails_naming_both(
    tmp_path: Path, served: Any
) -> None:
    pid, _load = served("contended")
    started = time.monotonic()
    verdict = run("gil", GilConfig(name="contended", pid=pid, duration_s=4), tmp_path / "out")
    assert time.monotonic() - started < 20
    assert verdict.status is Status.FAIL, verdict.why
    assert verdict.where["thread"] == "serializer" and verdict.where["function"] == "pickle.dumps", verdict.where
    assert _evidence(verdict, "diagnosis")["rule"] == "gil-wait-attached"
    waits = _evidence(verdict, "gil_waits")
    # the top waiter: a request handler, or the accept loop (MainThread), which waits for the GIL too
    assert waits["holder"] == "serializer" and ("process_request_thread" in waits["waiter"]
                                                or waits["waiter"] == "MainThread"), waits
    handlers = [w for w in waits["threads"] if "process_request_thread" in w["thread"]]
    assert len(handlers) >= 2 and all(w["of_ready_share"] >= 0.2 for w in handlers[:2]), handlers
    assert waits["holder_states"].get("running", 0) >= 0.5 * waits["wait_ticks"], waits  # it ran while they waited
    assert waits["waiter"] in verdict.why and "serializer" in verdict.why and "pickle.dumps" in verdict.why
    assert sum(w["thread"] in verdict.why for w in handlers) >= 2, verdict.why  # the waiting threads are named
    assert "no heartbeat: attached by --pid" in verdict.why and "/proc per-thread states" in verdict.why


def test_launched_server_is_sampled_after_ready_under_the_load(tmp_path: Path) -> None:
    server_py = _write(tmp_path, "server.py", SERVER)
    load_py = _write(tmp_path, "load.py", LOAD)
    port = _free_port()
    config = GilConfig(
        name="launched", duration_s=3,
        # 100,000 pages: holds of 40-60 ms, far over the heartbeat's 10 ms threshold even beside
        # the holder's own waits for a CPU on a busy host (30,000 read p99 11.7 ms there once)
        command=(sys.executable, str(server_py), "contended", str(port), str(tmp_path / "port"), "2", "100000"),
        ready_url=f"http://127.0.0.1:{port}/health", ready_log=r"serving on port \d+",
        load=("{python}", str(load_py), str(port), "30", "4"),
    )
    started = time.monotonic()
    verdict = run("gil", config, tmp_path / "out")
    assert time.monotonic() - started < 20
    readiness = _evidence(verdict, "readiness")
    assert readiness["ready_s"] >= 2.0, readiness  # the server slept 2 s before it bound its port
    assert readiness["window_start_s"] >= readiness["ready_s"], readiness
    assert readiness["status"] == 200 and readiness["log_line"].startswith("serving on port"), readiness
    load = _evidence(verdict, "load")
    assert load["stopped"] and not load["failed"] and load["started_s"] < 1.0, load  # ran until the window closed
    assert load["command"][0] == sys.executable
    # the load's own figures, from the last JSON line it printed before it was stopped, in the why
    reported = load["reported"]
    assert set(reported) == {"requests", "errors", "p99_ms"} and reported["requests"] > 0, load
    assert (f"Under this load, the load command reported requests {reported['requests']}, errors "
            f"{reported['errors']}, p99_ms ") in verdict.why, verdict.why
    # the load reached the handlers: they waited for the GIL the serializer held
    assert verdict.status is Status.FAIL, verdict.why
    assert verdict.where["thread"] == "serializer", verdict.where
    waiting = [w["thread"] for w in _evidence(verdict, "starvation")["waiting_for_gil"]]
    assert any("process_request_thread" in name for name in waiting), waiting


def test_a_load_command_that_fails_is_said_and_never_a_pass(tmp_path: Path) -> None:
    server_py = _write(tmp_path, "server.py", SERVER)
    failing = _write(tmp_path, "failing_load.py", "import sys\nprint('no such endpoint', file=sys.stderr)\nsys.exit(3)\n")
    port = _free_port()
    config = GilConfig(
        name="bad-load", duration_s=2,
        command=(sys.executable, str(server_py), "clean", str(port), str(tmp_path / "port")),
        ready_url=f"http://127.0.0.1:{port}/", load=(sys.executable, str(failing)),
    )
    verdict = run("gil", config, tmp_path / "out")
    assert verdict.status is Status.INCONCLUSIVE, verdict.why
    assert _evidence(verdict, "diagnosis")["rule"] == "load-failed"
    assert "the load command" in verdict.why and "exited with status 3" in verdict.why, verdict.why
    assert "no such endpoint" in verdict.why
    load = _evidence(verdict, "load")
    assert load["failed"] and load["returncode"] == 3 and "no such endpoint" in load["stderr_tail"]

    missing = GilConfig(name="no-load", duration_s=1.5,
                        command=(sys.executable, str(server_py), "clean", str(_free_port()), str(tmp_path / "p2")),
                        load=("no-such-load-generator-glmfb",))
    verdict = run("gil", missing, tmp_path / "out2")
    assert verdict.status is Status.INCONCLUSIVE, verdict.why
    assert "could not start: command not found" in verdict.why


def test_a_server_not_ready_in_time_is_an_error_naming_what_it_waited_for(tmp_path: Path) -> None:
    server_py = _write(tmp_path, "server.py", SERVER)
    port = _free_port()
    config = GilConfig(
        name="slow", duration_s=2,
        command=(sys.executable, str(server_py), "clean", str(port), str(tmp_path / "port"), "30"),
        ready_url=f"http://127.0.0.1:{port}/", ready_timeout_s=1.5,
    )
    started = time.monotonic()
    verdict = run("gil", config, tmp_path / "out")
    assert time.monotonic() - started < 15
    assert verdict.status is Status.ERROR, verdict.why
    assert "not ready within 1.5 s" in verdict.why and f"GET http://127.0.0.1:{port}/" in verdict.why, verdict.why


def test_cli_attached_json(tmp_path: Path, served: Any) -> None:
    """The command a new user types: glmfb gil --pid PID --json, one verdict on stdout."""
    pid, _load = served("clean")
    done = subprocess.run([sys.executable, "-m", "glmfb", "gil", "--pid", str(pid), "--duration", "3", "--json",
                           "--out", str(tmp_path / "reports")], capture_output=True, text=True, timeout=60)
    data = json.loads(done.stdout)
    assert data["status"] == "pass" and done.returncode == 0, data["why"]
    assert "attached by --pid" in data["why"]
