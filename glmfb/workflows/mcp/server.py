"""The MCP server: the SDK's low-level ``Server`` over stdio or streamable HTTP.

The tools and their schemas come from :class:`~glmfb.workflows.mcp.tools.Toolbox` (the input schemas
are exact: derived from the probes' declared options, not from Python signatures, hence the
low-level server). Every call is prepared (checked) and then worked in a worker thread, so
the event loop keeps answering (progress, cancellations, other calls) while a probe runs in
its supervised child process.

- A bad argument, a refused path, a target that does not load: a tool result with
  ``isError`` and one line that names the argument; nothing a call does crashes the server.
- Progress: the engine's progress messages become ``notifications/progress`` (when the
  client asked for them); the first names the run id.
- Cancellation: a client's ``notifications/cancelled`` (or the ``cancel`` tool) sets the
  call's cancellation event; the supervisor stops the probe's child and every process below
  it, and the error verdict that says "cancelled" is written to the run folder (a cancelled
  request gets no response, by the protocol; the ``cancel`` tool's call does get it). The
  handler waits, shielded, until that is done, so no process outlives the call.
- SIGTERM and SIGINT stop the server the same way: in-flight probes are cancelled, their
  processes stopped, their runs written.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import mcp.types as types
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from glmfb.contract.errors import GlmfbError, UsageError
from glmfb.core.probe import Probe
from glmfb.workflows.mcp import resources
from glmfb.workflows.mcp.boundary import DEFAULT_MAX_CALL_S, Boundary
from glmfb.workflows.mcp.tools import ARTIFACT_URI, RUN_URI, Answer, CallContext, Prepared, Toolbox

RESOURCE_NOT_FOUND = -32002
STOP_WAIT_S = 15.0  # on SIGTERM: longest wait for cancelled probes to stop their processes
INSTRUCTIONS = (
    "glmfb runs probes and answers with a typed verdict: status, layer, where, why, metric, evidence, next. "
    "Follow a verdict's next_calls (a tool and its arguments) to take the next step. list_probes shows the probe "
    "definitions of this project; run runs them; gate turns a run into the CI decision; explain reads a saved run; "
    "history shows each definition's recorded runs as series with their change points (check: did the newest "
    "runs regress); bisect finds the commit between GOOD and BAD where a definition starts to fail. "
    "Paths and targets are relative to the server's root."
)


def instructions(probes: Sequence[Probe]) -> str:
    """The server's instructions: what glmfb does, then one line per probe of the registry
    (its kind, its layer, its hint: when to reach for it), then the commands the probes bring."""
    lines = [INSTRUCTIONS, "", "The probes (each a tool of that name):"]
    for probe in probes:
        hint = probe.agent_hint or probe.summary
        lines.append(f"- {probe.kind} ({probe.layer.value}): {hint}")
    commands = [command for probe in probes for command in probe.commands]
    if commands:
        lines += ["", "Commands the probes bring (each a tool of that name):"]
        lines += [f"- {command.name}: {command.summary}" for command in commands]
    return "\n".join(lines)


@dataclass(frozen=True)
class ServerOptions:
    """``glmfb mcp``'s options."""

    root: Path
    http: str | None = None  # HOST:PORT for streamable HTTP; None: stdio
    token: str | None = None  # over HTTP, the bearer token every request must carry
    allow_commands: bool = False
    max_call_s: float = DEFAULT_MAX_CALL_S
    out: Path | None = None  # where runs go; None: <root>/reports


class GlmfbServer:
    """The tools, resources and in-flight calls of one server process."""

    def __init__(self, boundary: Boundary) -> None:
        from glmfb import __version__

        if Path.cwd().resolve() != boundary.root:
            # Relative paths in specs, verdicts and next steps are relative to the root, and the
            # probes' child processes start in the working directory: the two must agree.
            raise UsageError(f"glmfb mcp serves from its root: the working directory {Path.cwd()} is not "
                             f"{boundary.root}", "change to the root first (glmfb.workflows.mcp.server.run does)")
        self.boundary = boundary
        self.toolbox = Toolbox(boundary, cancel_run=self.cancel_run)
        self.slot = threading.Lock()  # one probe at a time: timings must not disturb each other
        self._in_flight: dict[str, threading.Event] = {}
        self._in_flight_lock = threading.Lock()
        self._uvicorn: Any = None  # the HTTP server, while one serves
        self.server: Server[Any] = Server(
            "glmfb", version=__version__, title="glmfb: dense feedback for inference stacks",
            instructions=instructions(list(self.toolbox.probes.values())), get_tool_input_schema=self.toolbox.input_schema,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
            on_list_resources=self._list_resources, on_list_resource_templates=self._list_resource_templates,
            on_read_resource=self._read_resource,
        )

    # ---- in-flight calls -----------------------------------------------------------------

    def cancel_run(self, run_id: str) -> bool:
        """Cancel the in-flight call of a run; False when none runs under that id."""
        with self._in_flight_lock:
            event = self._in_flight.get(run_id)
        if event is None:
            return False
        event.set()
        return True

    def busy(self) -> bool:
        """Whether a probe, capture or run call is in flight."""
        with self._in_flight_lock:
            return bool(self._in_flight)

    def cancel_all(self) -> None:
        with self._in_flight_lock:
            events = list(self._in_flight.values())
        for event in events:
            event.set()

    # ---- tools ---------------------------------------------------------------------------

    async def _list_tools(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                          ) -> types.ListToolsResult:
        tools = [
            types.Tool(
                name=tool.name, title=tool.title, description=tool.description, input_schema=tool.input_schema,
                output_schema=tool.output_schema,
                annotations=types.ToolAnnotations(title=tool.title, read_only_hint=tool.read_only,
                                                  destructive_hint=False, open_world_hint=False),
            )
            for tool in self.toolbox.tools.values()
        ]
        return types.ListToolsResult(tools=tools)

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                         ) -> types.CallToolResult:
        try:
            prepared = await anyio.to_thread.run_sync(self.toolbox.prepare, params.name, params.arguments or {})
        except GlmfbError as exc:
            return _tool_error(str(exc))
        except Exception as exc:  # glmfb's own failure: said, never a crashed server
            return _tool_error(f"glmfb {params.name}: internal error while checking the arguments: "
                               f"{type(exc).__name__}: {exc}")
        from glmfb.contract.clock import new_run_id

        run_id = new_run_id() if prepared.runs_probes else ""
        sender, receiver = anyio.create_memory_object_stream[str](max_buffer_size=math.inf)

        def progress(message: str) -> None:  # called in the worker thread
            with contextlib.suppress(Exception):  # the call is over, or the client is gone: best effort
                anyio.from_thread.run_sync(sender.send_nowait, message)

        call = CallContext(run_id=run_id, progress=progress, cancel=threading.Event(),
                           deadline=time.monotonic() + prepared.timeout_s, slot=self.slot)
        async with anyio.create_task_group() as group:
            group.start_soon(self._forward_progress, ctx, receiver)
            if prepared.runs_probes:
                sender.send_nowait(f"run {run_id} ({RUN_URI.format(run_id=run_id)}): {prepared.label}, time budget "
                                   f"{prepared.timeout_s:g} s")
            try:
                outcome = await self._work(prepared, call)
            finally:
                sender.close()
        if isinstance(outcome, Answer):
            return types.CallToolResult(content=[types.TextContent(type="text", text=outcome.text)],
                                        structured_content=outcome.structured)
        if isinstance(outcome, GlmfbError):
            return _tool_error(str(outcome))
        return _tool_error(f"glmfb {params.name}: internal error: {type(outcome).__name__}: {outcome}")

    async def _work(self, prepared: Prepared, call: CallContext) -> Answer | BaseException:
        """Run the call's work in a worker thread. A cancelled call sets the cancellation event
        and waits (shielded) until the work has stopped its processes and written its run."""
        done = threading.Event()
        outcome: list[Answer | BaseException] = []

        def work() -> None:
            try:
                outcome.append(prepared.work(call))
            except BaseException as exc:  # handed to the event loop, which answers with it
                outcome.append(exc)
            finally:
                done.set()

        if call.run_id:
            with self._in_flight_lock:
                self._in_flight[call.run_id] = call.cancel
        try:
            await anyio.to_thread.run_sync(work, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            call.cancel.set()
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(done.wait)
            raise
        finally:
            if call.run_id:
                with self._in_flight_lock:
                    self._in_flight.pop(call.run_id, None)
        return outcome[0]

    async def _forward_progress(self, ctx: ServerRequestContext[Any], receiver: MemoryObjectReceiveStream[str]
                                ) -> None:
        count = 0
        async with receiver:
            async for message in receiver:
                count += 1
                with contextlib.suppress(Exception):  # a client that went away: the call goes on
                    await ctx.session.report_progress(count, None, message)

    # ---- resources -----------------------------------------------------------------------

    async def _list_resources(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                              ) -> types.ListResourcesResult:
        listed = await anyio.to_thread.run_sync(resources.list_runs, self.boundary)
        return types.ListResourcesResult(resources=[
            types.Resource(uri=item.uri, name=item.name, description=item.description, mime_type=item.mime_type)
            for item in listed
        ])

    async def _list_resource_templates(self, ctx: ServerRequestContext[Any],
                                       params: types.PaginatedRequestParams | None
                                       ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(uri_template=RUN_URI, name="run", mime_type="application/json",
                                   description="run.json of a run in reports/ (glmfb.run/2)"),
            types.ResourceTemplate(uri_template=ARTIFACT_URI.replace("{path}", "{+path}"), name="run artifact",
                                   description="a file in a run's folder: artifacts, report.html, junit.xml, the "
                                               "probe's stdout and stderr"),
        ])

    async def _read_resource(self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                             ) -> types.ReadResourceResult:
        uri = str(params.uri)
        try:
            contents = await anyio.to_thread.run_sync(resources.read, self.boundary, uri)
        except resources.ResourceError as exc:
            raise MCPError(RESOURCE_NOT_FOUND if exc.not_found else types.INVALID_PARAMS, str(exc)) from None
        item: types.TextResourceContents | types.BlobResourceContents
        if contents.text is not None:
            item = types.TextResourceContents(uri=contents.uri, mime_type=contents.mime_type, text=contents.text)
        else:
            item = types.BlobResourceContents(uri=contents.uri, mime_type=contents.mime_type, blob=contents.blob or "")
        return types.ReadResourceResult(contents=[item])

    # ---- transports ----------------------------------------------------------------------

    async def serve_stdio(self) -> None:
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read_stream, write_stream):
            await self.server.run(read_stream, write_stream, self.server.create_initialization_options())

    async def serve_http(self, host: str, listening: socket.socket, token: str) -> None:
        import contextlib
        from collections.abc import Iterator

        import uvicorn

        class Uvicorn(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # glmfb's own handler stops it (serve)
                yield

        app = BearerToken(self.server.streamable_http_app(host=host), token)
        port = listening.getsockname()[1]
        self._uvicorn = Uvicorn(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
        await self._uvicorn.serve(sockets=[listening])

    async def serve(self, options: ServerOptions, listening: socket.socket | None = None) -> None:
        """Serve until the client goes away or a signal stops the server (then every in-flight
        probe is cancelled and its processes stopped before the server exits)."""
        self._uvicorn = None
        async with anyio.create_task_group() as group:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        self.cancel_all()
                        if self._uvicorn is not None:
                            self._uvicorn.should_exit = True  # answers the in-flight calls, then stops
                            return
                        # stdio: the transport's reader blocks on stdin until the client closes it,
                        # so once every cancelled probe has stopped its processes and written its
                        # run, the process exits here
                        with anyio.move_on_after(STOP_WAIT_S):
                            while self.busy():
                                await anyio.sleep(0.05)
                        sys.stderr.flush()
                        os._exit(0)

            group.start_soon(stop_on_signal)
            if listening is None:
                await self.serve_stdio()
            else:
                await self.serve_http(parse_http(options.http or "")[0], listening, options.token or "")
            group.cancel_scope.cancel()


class BearerToken:
    """ASGI middleware: an HTTP request without ``Authorization: Bearer <token>`` gets 401.

    ``glmfb mcp --http`` runs code for whoever connects, and on a machine several users share,
    a loopback port is open to all of them: as notebook servers do, every request must carry
    the token the server was started with (compared in constant time). The scheme's name is
    matched in any case (``bearer``, ``BEARER``): RFC 9110 makes it case-insensitive, and
    clients that send it in lower case were refused. Lifespan events pass."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = token.encode()

    def authorized(self, header: bytes) -> bool:
        """Whether an ``Authorization`` value carries the token: the scheme ``Bearer`` in any
        case, one or more spaces (RFC 9110's ``1*SP``), then exactly the token (never an empty
        one, which ``glmfb mcp`` refuses at start anyway)."""
        import hmac

        scheme, _, credentials = header.partition(b" ")
        return (scheme.lower() == b"bearer" and bool(self.expected)
                and hmac.compare_digest(credentials.lstrip(b" "), self.expected))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") in ("http", "websocket"):
            given = next((value for name, value in scope.get("headers", ()) if name == b"authorization"), b"")
            if not self.authorized(given):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"www-authenticate", b'Bearer realm="glmfb mcp"')]})
                await send({"type": "http.response.body",
                            "body": b"glmfb mcp: missing or wrong bearer token (send 'Authorization: Bearer TOKEN', "
                                    b"the token glmfb mcp printed at start or was given with --token)\n"})
                return
        await self.app(scope, receive, send)


def new_token() -> str:
    """A bearer token for one server's life: 32 random bytes, URL-safe."""
    import secrets

    return secrets.token_urlsafe(32)


def _tool_error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def parse_http(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; ``PORT`` alone binds to 127.0.0.1)."""
    text = value.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"--http {value!r}: expected HOST:PORT", "e.g. --http 127.0.0.1:8765") from None
    if not 0 < port < 65536:
        raise UsageError(f"--http {value!r}: port {port} is out of range", "use a port from 1 to 65535")
    return host, port


def run(options: ServerOptions) -> None:
    """Start the server (blocks until it stops). The working directory becomes the root, so
    paths in verdicts and next steps read relative to it, as with the CLI run there."""
    root = options.root.resolve()
    if not root.is_dir():
        raise UsageError(f"--root {options.root}: no such folder", "give the project folder to serve")
    if not options.max_call_s > 0:
        raise UsageError(f"--max-call-s {options.max_call_s:g} must be positive", "e.g. --max-call-s 900")
    if options.http is not None and not options.token:
        raise UsageError("glmfb mcp --http needs a bearer token", "give --token TOKEN, or leave it out to get a new one")
    listening = listen(*parse_http(options.http), options.http) if options.http is not None else None
    out = options.out.resolve() if options.out is not None else None  # as the user wrote it, before the chdir
    os.chdir(root)
    server = GlmfbServer(Boundary(root, allow_commands=options.allow_commands, max_call_s=options.max_call_s,
                                  out=out))
    from glmfb.core import workers

    with workers.pool("mcp"):  # every call's probe forks from one warm zygote, started here
        anyio.run(server.serve, options, listening)


def listen(host: str, port: int, given: str) -> socket.socket:
    """A listening socket on ``host:port``, bound before anything starts (a port in use is
    bad input, not a crash)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listening = socket.socket(family, socket.SOCK_STREAM)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind((host, port))
        listening.listen(128)
    except OSError as exc:
        raise UsageError(f"--http {given}: cannot listen there: {exc.strerror or exc}",
                         "choose a free port, e.g. --http 127.0.0.1:8765") from None
    listening.set_inheritable(False)
    return listening
