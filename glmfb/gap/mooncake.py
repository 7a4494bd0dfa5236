"""Letting a Mooncake ``TransferEngine`` go at once: for the ``close()`` of a gap target.

An engine started with the P2P handshake runs a listener thread that waits in ``accept()`` on
its RPC port with a one-second receive timeout. The engine's destructor stops and joins that
thread, which wakes only when its ``accept()`` returns: up to a second, and the destructor
runs under the GIL (pybind11 calls it), so every other Python thread of the process stops with
it. Measured here: 0.95 s to drop an engine that had done nothing. A gap target builds one
engine (or two) per build and drops them when glmfb closes its builds, so those seconds add
up, one after another, however many threads close them.

:func:`unblock_teardown` makes the drop take milliseconds: it sets the listener socket's
receive timeout to a millisecond (the kernel rounds it up to a scheduler tick, 4 ms here) and
wakes the pending ``accept()`` with one connection that sends nothing. The listener reads an
empty handshake, logs two glog warnings ("readString: incomplete handshake length, got: 0")
and goes back to ``accept()``, which now returns within a tick, so the destructor's join does
too. Nothing is transferred and the engine keeps working until it is dropped; call it right
before dropping the last reference, after the engine's last transfer.

The listener is found by its socket's inode: the process's listening TCP sockets on the
engine's port (``/proc/self/net/tcp``, ``tcp6``) against the descriptors in
``/proc/self/fd``; only that descriptor is duplicated, so no other socket of the process is
touched.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
from typing import Any

LISTENER_TIMEOUT = struct.pack("ll", 0, 1000)  # struct timeval: 1 ms
CONNECT_TIMEOUT_S = 1.0
LISTEN_STATE = "0A"  # TCP_LISTEN in /proc/net/tcp


def unblock_teardown(engine: Any) -> bool:
    """Wake ``engine``'s handshake listener so that dropping the engine does not wait for its
    ``accept()`` to time out. False, and the engine left as it was, when this process holds no
    listening socket on the engine's RPC port (another metadata mode, another engine version)
    or the socket refuses; it never raises (it is called from ``close()``)."""
    try:
        port = int(engine.get_rpc_port())
    except Exception:  # not a TransferEngine, or one that was never initialized
        return False
    listener = _listening_socket(port)
    if listener is None:
        return False
    with listener:  # a duplicate of the engine's descriptor: closing it leaves the engine's open
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, LISTENER_TIMEOUT)
            host, family = str(listener.getsockname()[0]), listener.family
        except OSError:
            return False
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_unspecified:  # bound to every address: one of ours
            host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError:
        return False  # the timeout still applies from the listener's next accept(): at most 1 s more
    return True


def _listening_socket(port: int) -> socket.socket | None:
    """A duplicate of this process's listening TCP socket on ``port``, or None."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                link = os.readlink(f"/proc/self/fd/{name}")
                if not (link.startswith("socket:[") and link[len("socket:["):-1] in inodes):
                    continue
                duplicate = os.dup(int(name))
                try:
                    candidate = socket.socket(fileno=duplicate)
                except OSError:  # the number was closed and reused since readlink
                    os.close(duplicate)
                    continue
                if socket.getdefaulttimeout() is not None:
                    # wrapping made the shared descriptor non-blocking: give the engine back
                    # the blocking accept() its listener loop is written for
                    candidate.setblocking(True)
                if candidate.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    return candidate
                candidate.close()
    return None


def _listening_inodes(port: int) -> set[str]:
    """The inodes of the listening TCP sockets on ``port`` in this process's network namespace."""
    inodes: set[str] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as handle:
            next(handle, None)  # the header
            for line in handle:
                fields = line.split()
                if len(fields) > 9 and fields[3] == LISTEN_STATE and fields[1].rsplit(":", 1)[-1] == f"{port:04X}":
                    inodes.add(fields[9])
    return inodes
