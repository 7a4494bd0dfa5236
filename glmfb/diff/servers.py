"""Servers a serving diff starts itself: ``baseline_server`` / ``candidate_server``, the command
that starts that side's OpenAI-compatible server.

``{port}`` in the command and in the side's URL (``openai:http://127.0.0.1:{port}/v1``) is a
free loopback port picked here, ``{python}`` the interpreter running glmfb. The command runs in
the definition's folder (the working directory on the command line), in a session of its own,
its output (stdout and stderr) in ``<side>-server.log`` among the probe's artifacts. The diff
starts asking once ``GET <base>/models`` answers 200; a server that exits before it answers, or
does not answer within ``server_startup``, is :class:`ServerStartFailed`, which names the side,
the command and the tail of its log. At the end each server's process group is stopped
(SIGTERM, then SIGKILL after a grace period) and every process below it that the walk saw
(:class:`glmfb.core.process.ProcessTree`); the probe's supervised child stops its whole tree anyway.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmfb.contract.errors import HarnessError

PORT = "{port}"
PYTHON = "{python}"
LOG_TAIL = 600  # characters of a server's log quoted in an error
STOP_GRACE_S = 5.0


def parse_command(raw: Any) -> tuple[str, ...]:
    """A server command from what a user wrote (:func:`glmfb.contract.options.parse_command`)."""
    from glmfb.contract.options import parse_command as parse

    return parse(raw, '["{python}", "server.py", "--port", "{port}"]')


def free_port() -> int:
    """A loopback port free now (the OS's pick; another process may take it before the server
    binds it, which the server's own bind error then says)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def expand(text: str, port: int) -> str:
    return text.replace(PORT, str(port)).replace(PYTHON, sys.executable)


class ServerStartFailed(HarnessError):
    """A server glmfb started exited before it answered, or did not answer in time."""

    def __init__(self, side: str, command: Sequence[str], problem: str, log: Path, tail: str,
                 returncode: int | None) -> None:
        self.side = side
        self.command = tuple(command)
        self.problem = problem
        self.log = log
        self.tail = tail
        self.returncode = returncode
        said = f"; its last output: {tail!r}" if tail else "; it wrote nothing"
        super().__init__(f"the {side}'s server {problem} (command: {shlex.join(self.command)}){said}",
                         f"its whole output is in {log}; run the command alone to see it start")


@dataclass
class StartedServer:
    """One server glmfb started: its side, command (expanded), endpoint and log."""

    side: str
    command: tuple[str, ...]
    endpoint: str  # openai:http://127.0.0.1:PORT/v1[#model], the port filled in
    log: Path
    process: subprocess.Popen[bytes]
    tree: Any = field(default=None)

    def tail(self) -> str:
        from glmfb.core.io import read_end

        text = read_end(self.log, 64 * LOG_TAIL)  # from its end: a server may have logged gigabytes
        flat = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
        return flat if len(flat) <= LOG_TAIL else "..." + flat[-LOG_TAIL:]

    def stop(self) -> None:
        """SIGTERM the server's process group and what is below it, SIGKILL what is left."""
        if self.tree is not None:
            self.tree.stop(grace_s=STOP_GRACE_S)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def start(side: str, command: Sequence[str], endpoint: str, log: Path, cwd: Path | None) -> StartedServer:
    """Start one side's server (``{port}`` and ``{python}`` filled in)."""
    from glmfb.core.process import ProcessTree

    port = free_port()
    words = tuple(expand(word, port) for word in command)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        try:
            process = subprocess.Popen(words, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       cwd=cwd, start_new_session=True)
        except OSError as exc:
            raise ServerStartFailed(side, words, f"could not be started: {exc.strerror or exc}", log, "", None) from None
    server = StartedServer(side, words, expand(endpoint, port), log, process)
    server.tree = ProcessTree(process.pid, leads_group=True)
    return server


def wait_ready(servers: Sequence[StartedServer], startup_s: float) -> None:
    """Until every server answers ``GET <base>/models`` 200; raises :class:`ServerStartFailed`
    for the first (in the order given) that exited or did not answer within ``startup_s``."""
    import httpx

    from glmfb.core.process import describe_returncode
    from glmfb.diff.endpoint import parse_endpoint

    deadline = time.monotonic() + startup_s
    waiting = list(servers)
    with httpx.Client(timeout=httpx.Timeout(2.0), trust_env=False) as client:
        while waiting:
            for server in list(waiting):
                url = parse_endpoint(server.endpoint).base_url + "/models"
                code = server.process.poll()
                if code is not None:
                    raise ServerStartFailed(server.side, server.command,
                                            f"{describe_returncode(code)} before it answered GET {url}",
                                            server.log, server.tail(), code)
                try:
                    if client.get(url).status_code == 200:
                        waiting.remove(server)
                        continue
                except httpx.HTTPError:
                    pass
                if server.tree is not None:
                    server.tree.refresh()  # remember what it started, to stop it too
            if waiting and time.monotonic() >= deadline:
                server = waiting[0]
                raise ServerStartFailed(server.side, server.command,
                                        f"did not answer GET {parse_endpoint(server.endpoint).base_url}/models "
                                        f"with 200 within {startup_s:g} s", server.log, server.tail(), None)
            if waiting:
                time.sleep(0.1)


@contextmanager
def started_servers(commands: Mapping[str, Sequence[str]], endpoints: Mapping[str, str], logs: Mapping[str, Path],
                    cwd: Path | None, startup_s: float,
                    progress: Callable[[str], None] | None = None) -> Iterator[dict[str, StartedServer]]:
    """Every side's server started (all at once), ready, and stopped on the way out, whatever
    happens in between."""
    servers: dict[str, StartedServer] = {}
    try:
        for side, command in commands.items():
            servers[side] = start(side, command, endpoints[side], logs[side], cwd)
            if progress is not None:
                progress(f"{side}: started its server ({shlex.join(servers[side].command)})")
        started = time.monotonic()
        wait_ready(list(servers.values()), startup_s)
        if progress is not None and servers:
            progress(f"{', '.join(servers)}: server{'s' if len(servers) > 1 else ''} answering after "
                     f"{time.monotonic() - started:.1f} s")
        yield servers
    finally:
        for server in servers.values():
            server.stop()


__all__ = ["ServerStartFailed", "StartedServer", "expand", "free_port", "parse_command", "started_servers"]
