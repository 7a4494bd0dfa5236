"""The prefill side of the KV transfer: a receiver process and a sender over Mooncake or a socket.

The receiver (:mod:`receiver`) runs in its own process, as the decode instance would, and owns
a destination buffer mapped from a file in ``/dev/shm``; this process maps the same file too,
only to poison it before a delivery check and to read back what arrived. Data moves only
through the transfer path:

- ``mooncake``: the real Mooncake ``TransferEngine`` (TCP transport, P2P handshake) on both
  sides; :meth:`MooncakeSender.write` is one ``transfer_sync_write`` (it releases the GIL).
- ``socket``: a plain TCP socket over loopback, one acknowledged write per page; used when the
  Mooncake package (or its system libraries) cannot be loaded.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

RECEIVER_SCRIPT = Path(__file__).with_name("receiver.py")
HEADER = struct.Struct("!QQ")
GLOG_LINE = re.compile(r"^(?:[IWEF]\d{4} |WARNING: Logging before InitGoogleLogging)")
TRANSPORTS = ("auto", "mooncake", "socket")


class TransferError(RuntimeError):
    """The KV transfer failed: the receiver died, a write failed, or a deadline passed."""


def mooncake_unavailable_reason() -> str | None:
    """Why the Mooncake engine cannot be used here, or None when it can."""
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except ImportError as exc:  # the package, or libibverbs / librdmacm / libnuma
        return f"mooncake transfer engine not importable ({exc})"
    except OSError as exc:
        return f"mooncake transfer engine failed to load ({exc})"
    return None


class ReceiverProcess:
    """The decode-side process and the shared destination buffer."""

    def __init__(self, transport: str, size: int, start_timeout_s: float = 60.0) -> None:
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, name = tempfile.mkstemp(prefix="glmfb-kv-", dir=directory)
        self.buffer_path = Path(name)
        self.size = size
        try:
            os.ftruncate(fd, size)
            self.buffer = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.stderr_file = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            # -I: the receiver is a program of its own; it must not pick up this process's
            # PYTHONPATH hooks (a profiler's sitecustomize tracing the prefill side, say).
            [sys.executable, "-I", str(RECEIVER_SCRIPT), "--transport", transport,
             "--buffer", name, "--size", str(size)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr_file,
            env=dict(os.environ),
        )
        try:
            self.info = self._read_ready(start_timeout_s)
        except BaseException:
            self.close()
            raise
        # Both processes have it mapped now: unlink the name, so the memory goes away with
        # them even when they are killed (the gil probe stops its child with SIGTERM).
        with contextlib.suppress(FileNotFoundError):
            self.buffer_path.unlink()

    def _read_ready(self, timeout_s: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if selector.select(timeout=0.1):
                    line = self.process.stdout.readline()
                    if not line:
                        break
                    data: dict[str, Any] = json.loads(line)
                    return data
                if self.process.poll() is not None:
                    break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=2)  # stdout closed: it is exiting
        code = self.process.poll()
        problem = (f"the receiver process did not start (exit code {code})"
                   if code is not None else f"the receiver process did not answer within {timeout_s:.0f} s")
        last_line = self.stderr_tail()
        raise TransferError(f"{problem}: {last_line}" if last_line else problem)

    def stderr_tail(self) -> str:
        """The receiver's last line on stderr that is not a glog line (Mooncake's logging)."""
        self.stderr_file.seek(0)
        lines = self.stderr_file.read().decode("utf-8", "replace").splitlines()
        useful = [line for line in lines if line.strip() and not GLOG_LINE.match(line)]
        return useful[-1].strip() if useful else ""

    def exit_reason(self, wait_s: float = 0.0) -> str | None:
        """None while the receiver runs; else how it ended. ``wait_s`` gives a receiver that
        is going down that long to be reaped: a write to a peer killed a moment ago can fail
        before the kernel has reported the peer's exit."""
        try:
            code = self.process.wait(timeout=wait_s) if wait_s > 0 else self.process.poll()
        except subprocess.TimeoutExpired:
            return None
        if code is None:
            return None
        if code < 0:
            with contextlib.suppress(ValueError):
                return f"the receiver process was killed by {signal.Signals(-code).name}"
        return f"the receiver process exited with code {code}"

    def kill(self) -> None:
        """Kill the receiver at once (fault injection: the decode side dies)."""
        if self.process.poll() is None:
            self.process.kill()

    def close(self) -> None:
        if self.process.poll() is None:
            if self.process.stdin is not None:
                with contextlib.suppress(OSError):
                    self.process.stdin.close()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.stderr_file.close()
        with contextlib.suppress(BufferError, ValueError):
            self.buffer.close()
        with contextlib.suppress(FileNotFoundError):
            self.buffer_path.unlink()


class Sender(Protocol):
    path: str

    def write(self, offset: int, count: int) -> None:
        """Copy ``count`` bytes at ``offset`` of the source to the same offset at the receiver."""

    def close(self) -> None: ...


class MooncakeSender:
    """One Mooncake engine on this side, with the source buffer registered."""

    path = "mooncake"

    def __init__(self, source_address: int, size: int, receiver: ReceiverProcess) -> None:
        from mooncake.engine import TransferEngine

        self.engine: Any = TransferEngine()
        if self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise TransferError("mooncake: initialize failed")
        if self.engine.register_memory(source_address, size) != 0:
            raise TransferError("mooncake: register_memory failed")
        self.source_address = source_address
        self.peer = f"127.0.0.1:{receiver.info['rpc_port']}"
        self.destination_address = int(receiver.info["buffer_address"])

    def write(self, offset: int, count: int) -> None:
        status = self.engine.transfer_sync_write(
            self.peer, self.source_address + offset, self.destination_address + offset, count
        )
        if status != 0:
            raise TransferError(f"mooncake transfer_sync_write returned {status} at offset {offset}")

    def close(self) -> None:
        """Unregister the source and drop the engine, so its native shutdown runs here, not in
        whichever thread a later garbage collection happens to run in; its handshake listener
        is woken first, or the drop would wait up to a second for it under the GIL
        (:mod:`glmfb.gap.mooncake`)."""
        if self.engine is None:
            return
        from glmfb.gap.mooncake import unblock_teardown

        with contextlib.suppress(Exception):
            self.engine.unregister_memory(self.source_address)
        unblock_teardown(self.engine)
        self.engine = None


class SocketSender:
    """A loopback TCP connection: header, payload, one-byte acknowledgement per write."""

    path = "socket"

    def __init__(self, source: memoryview, receiver: ReceiverProcess, timeout_s: float) -> None:
        self.source = source
        self.connection = socket.create_connection(("127.0.0.1", int(receiver.info["port"])), timeout=timeout_s)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.acknowledgement = bytearray(1)

    def write(self, offset: int, count: int) -> None:
        try:
            self.connection.sendall(HEADER.pack(offset, count))
            self.connection.sendall(self.source[offset : offset + count])
            if self.connection.recv_into(self.acknowledgement, 1) != 1:
                raise TransferError(f"socket: the receiver closed the connection at offset {offset}")
        except OSError as exc:
            raise TransferError(f"socket: {type(exc).__name__}: {exc} at offset {offset}") from exc

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.close()
