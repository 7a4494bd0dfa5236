"""The decode side of the KV transfer: a separate process that owns the destination buffer.

Run by :mod:`transport` as ``python receiver.py --transport mooncake|socket --buffer FILE
--size N``. The destination buffer is a memory-mapped file (``/dev/shm``) so the sender
process can poison it and read it back to check what arrived; the data itself only travels
through the transfer engine (or the socket). On start it prints one JSON line on stdout
(``{"ready": true, ...}``) and then serves until its stdin closes.

Self-contained on purpose (no imports from glmfb or the scenario package): it is started as
a plain script.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import socket
import struct
import sys
import threading

HEADER = struct.Struct("!QQ")  # destination offset, byte count
ACK = b"\x01"


def _map_buffer(path: str, size: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def _announce(**fields: object) -> None:
    sys.stdout.write(json.dumps({"ready": True, **fields}) + "\n")
    sys.stdout.flush()


def _wait_for_stdin_eof() -> None:
    # The sender closes our stdin (or dies, which closes it too): then we exit.
    while sys.stdin.buffer.read(4096):
        pass


def serve_mooncake(buffer: mmap.mmap, size: int) -> None:
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit("receiver: mooncake initialize failed")
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    if engine.register_memory(address, size) != 0:
        raise SystemExit("receiver: mooncake register_memory failed")
    _announce(transport="mooncake", rpc_port=engine.get_rpc_port(), buffer_address=address)
    _wait_for_stdin_eof()
    engine.unregister_memory(address)
    # Exit here, with the engine still referenced: its destructor (run when this function
    # returned) waited about a second for the engine's own threads, and every close of a
    # build waits for this process to end. The kernel closes its sockets either way.
    os._exit(0)


def _serve_connection(connection: socket.socket, view: memoryview) -> None:
    header = bytearray(HEADER.size)
    while True:
        got = connection.recv_into(header, HEADER.size, socket.MSG_WAITALL)
        if got < HEADER.size:
            return
        offset, count = HEADER.unpack(header)
        if offset + count > len(view):
            return
        received = 0
        while received < count:
            n = connection.recv_into(view[offset + received : offset + count])
            if n == 0:
                return
            received += n
        connection.sendall(ACK)


def serve_socket(buffer: mmap.mmap, size: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    view = memoryview(buffer)

    def accept_loop() -> None:
        while True:
            connection, _ = listener.accept()
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_serve_connection, args=(connection, view), daemon=True).start()

    threading.Thread(target=accept_loop, name="accept", daemon=True).start()
    _announce(transport="socket", port=listener.getsockname()[1], buffer_address=0)
    _wait_for_stdin_eof()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--transport", choices=("mooncake", "socket"), required=True)
    parser.add_argument("--buffer", required=True)
    parser.add_argument("--size", type=int, required=True)
    options = parser.parse_args()
    buffer = _map_buffer(options.buffer, options.size)
    if options.transport == "mooncake":
        serve_mooncake(buffer, options.size)
    else:
        serve_socket(buffer, options.size)
    os._exit(0)  # skip engine teardown races at interpreter exit


if __name__ == "__main__":
    main()
