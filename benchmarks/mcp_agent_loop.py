"""An agent-style loop over ``glmfb mcp``, driven by the MCP SDK's client; prints the transcript.

What a coding agent does with glmfb's dense feedback, without parsing any shell output:

1. ``list_probes``: what this project checks;
2. ``bench`` the tiled decode-norm kernel against the fused one (the planted slowdown);
3. follow the verdict's first machine-readable next step (``next_calls``) as it is given;
4. "apply the fix" (the fused kernel as the candidate) and bench again;
5. ``gil`` on the dispatch scenario that keeps the GIL, and follow its next step (a trace);
6. ``gate`` the latest run: the decision CI would take.

Each step prints the call (tool and arguments), the verdict's status, layer, where and why,
and the next calls offered, with the wall time of the call::

    .venv/bin/python benchmarks/mcp_agent_loop.py            # stdio, the repository as the root
    .venv/bin/python benchmarks/mcp_agent_loop.py --http     # the same over streamable HTTP
    .venv/bin/python benchmarks/mcp_agent_loop.py --smoke    # 0.5 s budgets, over stdio then HTTP

``--smoke`` gives each bench and gil call a 0.5 s budget and runs the loop over stdio without
calling the bench's next step (the gil's is followed), then over HTTP without the bench steps
(CI checks the script runs; its figures are not the benchmark's).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
KERNELS = "scenarios/decode_norm/kernels.py"
SMOKE_NOTE = ("smoke run (--smoke): 0.5 s budgets, over stdio (the bench's next step not called), then over "
              "streamable HTTP without the bench steps; the figures are measured but are not the benchmark's")


def show(step: int, tool: str, arguments: dict[str, Any], result: Any, elapsed_s: float) -> dict[str, Any]:
    print(f"\n[{step}] call {tool} {json.dumps(arguments)}  ({elapsed_s:.1f} s)")
    data = result.structured_content or {}
    if result.is_error:
        print(f"    tool error: {result.content[0].text}")
        return {}
    verdict = data.get("verdict")
    if verdict is not None:
        where = ", ".join(f"{k}={v}" for k, v in verdict["where"].items()) or "-"
        print(f"    verdict: {verdict['status']} ({verdict['layer']}) at {where}")
        print(f"    why: {verdict['why']}")
        for call in data.get("next_calls", []):
            offered = (f"{call['tool']} {json.dumps(call['arguments'])}" if "arguments" in call
                       else f"(not callable: {call['error']})")
            print(f"    next_calls[{call['index']}]: {offered}")
    else:
        print("    " + result.content[0].text.replace("\n", "\n    "))
    return dict(data)


async def loop(client: Client, budget: str, benches: bool = True, follow_bench: bool = True) -> None:
    """The agent's calls; ``budget``: each bench's budget and each gil's duration; without
    ``benches``, steps 2-4 are left out; without ``follow_bench``, step 3."""
    step = 0

    async def call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        nonlocal step
        step += 1
        started = time.monotonic()
        result = await client.call_tool(tool, arguments)
        return show(step, tool, arguments, result, time.monotonic() - started)

    tools = (await client.list_tools()).tools
    print(f"glmfb mcp serves {len(tools)} tools: {', '.join(t.name for t in tools)}")
    await call("list_probes", {"select": ["gated-norm", "gil-dispatch-target"]})
    if benches:
        await bench_steps(call, budget, follow_bench)
    held = await call("gil", {"target": "scenarios/dispatch_gil/dispatch.py:make", "args": {"mode": "hold"},
                              "duration": budget})
    follow = next((c for c in held.get("next_calls", []) if "arguments" in c), None)
    if follow is not None:
        await call(follow["tool"], follow["arguments"])
    await call("gate", {})


async def bench_steps(call: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]], budget: str,
                      follow: bool) -> None:
    """Bench the planted slowdown, follow its next step (when ``follow``), bench again after the fix."""
    first = await call("bench", {"baseline": f"{KERNELS}:gated_norm_fused", "candidate": f"{KERNELS}:gated_norm_tiled",
                                 "shapes": ["8x4096"], "budget": budget})
    offered = next((c for c in first.get("next_calls", []) if "arguments" in c), None)
    if follow and offered is not None:
        await call(offered["tool"], offered["arguments"])
    await call("bench", {"baseline": f"{KERNELS}:gated_norm_tiled", "candidate": f"{KERNELS}:gated_norm_fused",
                         "shapes": ["8x4096"], "budget": budget, "name": "after-the-fix"})


async def main(http: bool, budget: str, out: Path, benches: bool = True, follow_bench: bool = True) -> None:
    """The loop against a server rooted at the repository, its runs (and their history) in ``out``."""
    if not http:
        params = StdioServerParameters(command=sys.executable, args=["-m", "glmfb", "mcp", "--root", str(ROOT),
                                                                     "--out", str(out)], env=dict(os.environ))
        async with Client(params) as client:
            await loop(client, budget, benches, follow_bench)
        return
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    token = secrets.token_urlsafe(32)
    server = subprocess.Popen([sys.executable, "-m", "glmfb", "mcp", "--root", str(ROOT), "--out", str(out), "--http",
                               f"127.0.0.1:{port}", "--token", token])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("glmfb mcp --http did not listen within 60 s") from None
                time.sleep(0.1)
        from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

        http_client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http_client)) as client:
            await loop(client, budget, benches, follow_bench)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", action="store_true", help="serve over streamable HTTP instead of stdio")
    parser.add_argument("--smoke", action="store_true", help="0.5 s budgets, stdio then HTTP (CI checks the script runs)")
    options = parser.parse_args()
    os.environ.pop("GLMFB_HISTORY", None)  # the runs' history goes beside them, in the scratch folder
    with tempfile.TemporaryDirectory(prefix="glmfb-mcp-loop-") as scratch:
        runs = Path(scratch) / "reports"  # not the checkout's reports/
        if not options.smoke:
            anyio.run(main, options.http, "3s", runs)
        else:
            print(SMOKE_NOTE, flush=True)
            print("\n== over stdio ==", flush=True)
            anyio.run(main, False, "0.5s", runs, True, False)
            print("\n== over streamable HTTP, with the token (bench steps left out) ==", flush=True)
            anyio.run(main, True, "0.5s", runs, False)
