"""Bug 2 of docs/background.md in miniature: an MoE dispatch call that keeps the GIL beside a KV-transfer
thread that must submit a small job every millisecond.

``intranode_dispatch`` stands in for DeepEP's native dispatch: a libc ``usleep`` reached through
``ctypes``. Through ``ctypes.PyDLL`` the call keeps the GIL while it blocks (the bug); through
``ctypes.CDLL`` ctypes releases the GIL around it (the fix, what ``py::gil_scoped_release``
does in a pybind11 binding). The ``kv-transfer`` thread submits a 64 KiB job every ~1 ms (a
memory copy, or with ``--transport mooncake`` a real Mooncake TCP transfer between two engines
in this process) and counts how late each submission was.

Run it as a program (``python dispatch.py --mode hold --duration 3``) or as a glmfb target
(``dispatch.py:make`` with ``mode=hold``), whose callable runs one dispatch per call.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import sys
import threading
import time
from collections.abc import Callable

DISPATCH_US = 20_000  # one dispatch blocks this long inside the native call
TRANSFER_PERIOD_S = 0.001
JOB_BYTES = 64 * 1024


def _libc(mode: str) -> ctypes.CDLL:
    name = ctypes.util.find_library("c") or "libc.so.6"
    if mode == "hold":
        return ctypes.PyDLL(name)  # keeps the GIL during the foreign call
    if mode == "release":
        return ctypes.CDLL(name)  # releases the GIL during the foreign call
    raise ValueError(f"mode must be 'hold' or 'release', got {mode!r}")


class MooncakeLink:
    """Two Mooncake transfer engines in this process over TCP: ``write`` moves one
    job from a registered source buffer to the peer's registered destination. Its Python calls
    release the GIL, like the real KV-transfer path."""

    def __init__(self, nbytes: int) -> None:
        from mooncake.engine import TransferEngine

        self.sender, self.receiver = TransferEngine(), TransferEngine()
        for engine in (self.sender, self.receiver):
            if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
                raise RuntimeError("Mooncake TransferEngine.initialize failed")
        self.nbytes = nbytes
        self.source = ctypes.create_string_buffer(b"k" * nbytes, nbytes)
        self.destination = ctypes.create_string_buffer(nbytes)
        self.source_ptr = ctypes.addressof(self.source)
        self.destination_ptr = ctypes.addressof(self.destination)
        self.sender.register_memory(self.source_ptr, nbytes)
        self.receiver.register_memory(self.destination_ptr, nbytes)
        self.peer = f"127.0.0.1:{self.receiver.get_rpc_port()}"

    def write(self) -> None:
        status = self.sender.transfer_sync_write(
            self.peer, self.source_ptr, self.destination_ptr, self.nbytes
        )
        if status != 0:
            raise RuntimeError(f"Mooncake transfer_sync_write returned {status}")


class KvTransfer:
    """A transfer engine's Python side: submits a small job every millisecond, a memory copy
    or (``transport="mooncake"``) a real Mooncake TCP transfer."""

    def __init__(self, transport: str = "memcpy") -> None:
        if transport not in ("memcpy", "mooncake"):
            raise ValueError(f"transport must be 'memcpy' or 'mooncake', got {transport!r}")
        self.source = bytes(JOB_BYTES)
        self.destination = bytearray(JOB_BYTES)
        self.link = MooncakeLink(JOB_BYTES) if transport == "mooncake" else None
        self.lateness_s: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="kv-transfer", daemon=True)

    def _submit(self) -> None:
        if self.link is not None:
            self.link.write()
        else:
            self.destination[:] = self.source

    def _loop(self) -> None:
        due = time.perf_counter()
        while not self.stop.is_set():
            due += TRANSFER_PERIOD_S
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            now = time.perf_counter()
            self.lateness_s.append(max(0.0, now - due))
            if now - due > 0.1:  # fell far behind: restart the schedule instead of bursting
                due = now
            self._submit()


def make_dispatch(mode: str, dispatch_us: int = DISPATCH_US) -> Callable[[], None]:
    usleep = _libc(mode).usleep
    usleep.argtypes = [ctypes.c_uint]

    def intranode_dispatch() -> None:
        usleep(dispatch_us)

    return intranode_dispatch


def make(
    mode: str = "hold", dispatch_us: int = DISPATCH_US, transport: str = "memcpy"
) -> Callable[[], None]:
    """glmfb target: start the kv-transfer thread, return one dispatch per call."""
    transfer = KvTransfer(transport)
    transfer.thread.start()
    return make_dispatch(mode, dispatch_us)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--mode", choices=("hold", "release"), default="hold")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds")
    parser.add_argument("--dispatch-us", type=int, default=DISPATCH_US)
    parser.add_argument("--transport", choices=("memcpy", "mooncake"), default="memcpy")
    options = parser.parse_args(argv)

    transfer = KvTransfer(options.transport)
    dispatch = make_dispatch(options.mode, options.dispatch_us)
    deadline = time.perf_counter() + options.duration
    calls = 0

    def dispatch_loop() -> None:
        nonlocal calls
        while time.perf_counter() < deadline:
            dispatch()
            calls += 1

    worker = threading.Thread(target=dispatch_loop, name="moe-dispatch")
    transfer.thread.start()
    worker.start()
    worker.join()
    transfer.stop.set()
    transfer.thread.join()
    late = sorted(transfer.lateness_s)
    summary = {
        "mode": options.mode,
        "transport": options.transport,
        "dispatch_calls": calls,
        "transfer_jobs": len(late),
        "transfer_p50_ms": 1e3 * late[len(late) // 2] if late else None,
        "transfer_p99_ms": 1e3 * late[int(len(late) * 0.99)] if late else None,
    }
    print(json.dumps(summary), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
