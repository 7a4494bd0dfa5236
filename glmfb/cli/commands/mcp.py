"""``glmfb mcp``: serve glmfb to coding agents over the Model Context Protocol.

The server itself is :mod:`glmfb.workflows.mcp` (imported only when the command runs, with the SDK):
this module only declares the command's options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glmfb.cli.commands.common import console
from glmfb.contract.errors import UsageError


def mcp_command(
    root: Annotated[Path, typer.Option(
        "--root", metavar="DIR", help="Project folder: targets and files resolve only under it; runs go to "
        "DIR/reports. [default: the working directory]", show_default=False)] = Path("."),
    http: Annotated[str | None, typer.Option(
        "--http", metavar="HOST:PORT", help="Serve streamable HTTP on HOST:PORT (e.g. 127.0.0.1:8765) "
        "instead of stdio.")] = None,
    token: Annotated[str | None, typer.Option(
        "--token", metavar="TOKEN", envvar="GLMFB_MCP_TOKEN", help="With --http: the bearer token every "
        "request must carry (Authorization: Bearer TOKEN). [default: a new random one, printed once at start]",
        show_default=False)] = None,
    allow_commands: Annotated[bool, typer.Option(
        "--allow-commands", help="Let gil run an arbitrary command line and targets import modules from "
        "outside the root.")] = False,
    max_call_s: Annotated[float, typer.Option(
        "--max-call-s", metavar="SECONDS", help="Longest time one tool call may take; a call's timeout "
        "argument is capped at it. [default: 900]", show_default=False)] = 900.0,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", help="Where runs go (and the default history store, DIR/history.sqlite). "
        "[default: DIR/reports under the root]", show_default=False)] = None,
) -> None:
    try:
        from glmfb.workflows.mcp.server import ServerOptions, run
    except ImportError as exc:
        raise UsageError(f"glmfb mcp needs the MCP SDK: {exc}", "pip install 'glmfb[mcp]' (the mcp package)") from None
    from glmfb.workflows.mcp.server import new_token, parse_http

    if http is not None:
        if token is not None and not token.strip():
            raise UsageError("--token is empty", "give a token, or leave --token out to get a new one")
        if token is None:
            token = new_token()
            host, port = parse_http(http)
            console(stderr=True).print(
                f"glmfb mcp: every request to http://{host}:{port}/mcp must carry the header "
                f"'Authorization: Bearer {token}'", soft_wrap=True, highlight=False, markup=False)
    run(ServerOptions(root=root, http=http, token=token, allow_commands=allow_commands, max_call_s=max_call_s,
                      out=out))
