"""Every surface takes what it needs from the probe: the toy probe of tests/toy, installed only
through the ``glmfb.probes`` entry point (no glmfb file names it), gets its section in
report.html (its order, its question, its own plot drawn), its MCP tool and its line in the
server's instructions, next steps an MCP client follows as tool calls, and its command in
``glmfb --help``. The built-in probes' sections and diff's ``capture`` come the same way."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def glmfb(*args: str, toy: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The glmfb command line in a fresh process that finds the toy only by its entry point."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy), str(REPO)])}
    return subprocess.run([sys.executable, "-m", "glmfb", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def sections(page: str) -> list[str]:
    """The probe sections of a page, in order."""
    return re.findall(r'<h2 class="probe" id="probe-([^"]+)">', page)


def test_the_toy_gets_its_report_section_with_its_question_and_its_plot(tmp_path: Path, toy: Path) -> None:
    ran = glmfb("toy", "--outcome", "fail", "--kernel", "k", "--name", "t", "--out", str(tmp_path / "reports"),
                toy=toy, cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr
    [page_path] = (tmp_path / "reports").glob("*/report.html")
    page = page_path.read_text()
    assert sections(page) == ["toy"]
    assert ('<h2 class="probe" id="probe-toy">toy</h2><p class="question">toy: what did the toy read, against its '
            "threshold?</p>") in page
    figure = re.search(r'<figure class="plot" data-plot="toy-reading" data-state="drawn" data-verdict="t">'
                       r"(<svg.*?</svg>)\s*<figcaption>(.*?)</figcaption>", page, re.S)
    assert figure is not None, page[-2000:]
    assert 'id="v0p0-toy-reading-bar' in figure.group(1)  # the bar the toy's plot drew, ids prefixed
    assert figure.group(2) == "the toy read 0.5 (threshold 0.05) and said fail"


def test_sections_follow_the_probes_order_and_an_unknown_kind_comes_last_without_plots(toy: Path) -> None:
    from glmfb.contract.verdict import Layer, Run, Status, Verdict
    from glmfb.workflows.report.html import render_html

    def verdict(probe: str, name: str) -> Verdict:
        return Verdict(probe=probe, name=name, status=Status.PASS, layer=Layer.KERNEL, why="fine")

    run = Run(id="r", started="", verdicts=(verdict("gil", "g"), verdict("retired", "x"), verdict("bench", "b"),
                                            verdict("toy", "t")))
    page = render_html(run)
    assert sections(page) == ["toy", "bench", "gil", "retired"]  # toy's order is 5, diff's 10, bench 20, gil 30
    assert '<p class="question">kernels: which shape got slower, by how much, and why?</p>' in page
    retired = page[page.index('id="probe-retired"'):]
    assert 'data-verdict="x"' in retired and "data-plot" not in retired and 'class="question"' not in retired
    assert 'data-plot="toy-reading" data-state="missing"' in page  # no toy_reading evidence: said so


def test_the_toy_is_an_mcp_tool_whose_next_step_a_client_follows(tmp_path: Path, toy: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import anyio
    from mcp import Client

    from glmfb.workflows.mcp.boundary import Boundary
    from glmfb.workflows.mcp.server import GlmfbServer

    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.chdir(root)
    server = GlmfbServer(Boundary(root))
    seen: dict[str, Any] = {}

    async def session() -> None:
        async with Client(server.server) as client:
            seen["instructions"] = client.instructions
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            seen["tools"] = tools
            failed = await client.call_tool("toy", {"outcome": "fail", "kernel": "k", "name": "t"})
            assert not failed.is_error, failed.content
            seen["failed"] = failed.structured_content
            [call] = seen["failed"]["next_calls"]
            followed = await client.call_tool(call["tool"], call["arguments"])
            assert not followed.is_error, followed.content
            seen["followed"] = followed.structured_content

    anyio.run(session)
    assert "toy" in seen["tools"] and "outcome" in seen["tools"]["toy"].input_schema["properties"]
    assert "capture" in seen["tools"]  # diff's command, from its declaration
    assert ("- toy (kernel): a stand-in probe for glmfb's own tests: it says what its outcome option tells it"
            in seen["instructions"].splitlines())
    step = seen["failed"]["verdict"]["next"][0]
    assert step == {"why": "run the toy again, told to pass", "command": "toy",
                    "arguments": {"outcome": "pass", "name": "toy-again", "kernel": "k"}}
    call = seen["failed"]["next_calls"][0]
    assert call["tool"] == "toy" and call["arguments"] == step["arguments"]
    assert call["text"] == "glmfb toy --outcome pass --name toy-again --kernel k  # run the toy again, told to pass"
    followed = seen["followed"]["verdict"]
    assert (followed["probe"], followed["name"], followed["status"]) == ("toy", "toy-again", "pass")
    assert (root / seen["followed"]["run"]["folder"] / "run.json").is_file()


def test_glmfb_help_lists_the_toy_and_the_commands_probes_bring(tmp_path: Path, toy: Path) -> None:
    helped = glmfb("--help", toy=toy, cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    commands = re.findall(r"^  (\w+) ", helped.stdout, re.M)
    assert {"diff", "bench", "gil", "gap", "toy", "capture", "run", "gate", "mcp"} <= set(commands)
    assert "A toy probe from outside glmfb." in glmfb("toy", "--help", toy=toy, cwd=tmp_path).stdout


def test_no_glmfb_file_names_the_toy() -> None:
    """What the toy gets above, it gets from its own package."""
    named = [str(path.relative_to(REPO)) for path in (REPO / "glmfb").rglob("*.py")
             if re.search(r"\btoy_(probe|plots)\b|\"toy\"", path.read_text(encoding="utf-8"))]
    assert named == []
