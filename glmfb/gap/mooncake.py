"""Letting a Mooncake ``TransferEngine`` go at once: for the ``close()`` of a gap target.

An engine started with the P2P handshake runs a listener thread that waits in ``accept()`` on
its RPC port with a one-second receive timeout. The engine's destructor closes that socket and
joins the thread, which wakes only when its ``accept()`` times out: up to a second, and the
destructor runs under the GIL (pybind11 calls it), so every other Python thread of the process
stops with it. Measured here: 0.95 s to drop an engine that had done nothing. A gap target
builds one engine (or two) per build and drops them when glmfb closes its builds, so those
seconds add up, one after another, however many threads close them.

:func:`unblock_teardown` makes the drop take milliseconds: it sets the listener socket's
receive timeout to a millisecond (the kernel rounds it up to a scheduler tick, 4 ms here) and wakes the pending ``accept()`` with one connection that
sends nothing. The listener reads an empty handshake, logs two glog warnings
("readString: incomplete handshake length, got: 0") and goes back to ``accept()``, which now
returns within a millisecond, so the destructor's join does too. Nothing is transferred and
the engine keeps working until it is dropped; call it right before dropping the last
reference, after the engine's last transfer.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from typing import Any

LISTENER_TIMEOUT = struct.pack("ll", 0, 1000)  # struct timeval: 1 ms
CONNECT_TIMEOUT_S = 1.0


def unblock_teardown(engine: Any) -> bool:
    """Wake ``engine``'s handshake listener so that dropping the engine does not wait for its
    ``accept()`` to time out. False, and nothing changed, when this process holds no listening
    socket on the engine's RPC port (another metadata mode, another engine version)."""
    try:
        port = int(engine.get_rpc_port())
    except Exception:  # not a TransferEngine, or one that was never initialized
        return False
    listener = _listening_socket(port)
    if listener is None:
        return False
    with listener:  # a duplicate of the engine's descriptor: closing it leaves the engine's open
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, LISTENER_TIMEOUT)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError:
        return False  # the timeout still applies from the listener's next accept(): at most 1 s more
    return True


def _listening_socket(port: int) -> socket.socket | None:
    """A duplicate of this process's listening TCP socket bound to ``port``, or None."""
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                fd = int(name)
                if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    continue
                candidate = socket.socket(fileno=os.dup(fd))
                try:
                    if (candidate.family in (socket.AF_INET, socket.AF_INET6)
                            and candidate.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                            and candidate.getsockname()[1] == port):
                        return candidate
                except OSError:
                    pass
                candidate.close()
    return None
