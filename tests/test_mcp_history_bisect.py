"""The ``history`` and ``bisect`` tools of glmfb mcp, through the Toolbox (and once through the
SDK's in-memory client): history reads a store with planted rows as glmfb history --json does,
with --check's verdict and exit code; bisect names the commit of a real git repository built
here that makes a bench kernel 3x slower, and stops when cancelled."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from test_bisect import KERNELS, build_repo
from test_history_command import planted, store_of

from glmfb.contract.errors import InputError
from glmfb.workflows.mcp.boundary import Boundary
from glmfb.workflows.mcp.tools import Answer, CallContext, Toolbox

STEP = [0.02] * 12 + [0.12] * 12  # +10 points of the baseline's time at run 12
FLAT = [0.02] * 24


def context(run_id: str = "", *, cancel: threading.Event | None = None, budget_s: float = 300.0,
            said: list[str] | None = None) -> CallContext:
    return CallContext(run_id=run_id, progress=(said.append if said is not None else lambda message: None),
                       cancel=cancel or threading.Event(), deadline=time.monotonic() + budget_s, slot=threading.Lock())


def call(box: Toolbox, tool: str, arguments: dict[str, Any], ctx: CallContext | None = None) -> Answer:
    return box.prepare(tool, arguments).work(ctx or context())


def refused(box: Toolbox, tool: str, arguments: dict[str, Any]) -> str:
    with pytest.raises(InputError) as caught:
        call(box, tool, arguments)
    return str(caught.value)


def validate(box: Toolbox, tool: str, structured: dict[str, Any]) -> None:
    import jsonschema

    schema = box.tools[tool].output_schema
    assert schema is not None
    jsonschema.validate(structured, schema)


# --------------------------------------------------------------------------------------------
# history
# --------------------------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A root whose default store (reports/history.sqlite) holds a step and a flat series."""
    root = tmp_path / "project"
    (root / "reports").mkdir(parents=True)
    store_of(root / "reports", planted("kernel-step", STEP) + planted("kernel-flat", FLAT, seed=1, start=100))
    return root


def test_history_answers_the_history_document_with_each_change_point(project: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLMFB_HISTORY", raising=False)
    box = Toolbox(Boundary(project))
    answer = call(box, "history", {})
    validate(box, "history", answer.structured)
    document = answer.structured["history"]
    assert document["schema"] == "glmfb.history/1" and "regressed" not in answer.structured
    by_name = {s["definition"]: s for s in document["series"]}
    assert set(by_name) == {"kernel-step", "kernel-flat"}
    [point] = by_name["kernel-step"]["change_points"]
    assert point["index"] == 12 and point["first_after"]["run_id"] == "run-012"
    assert point["regression"] == pytest.approx(0.10, abs=0.01) and point["confidence"] > 0.99
    assert by_name["kernel-flat"]["change_points"] == []
    assert "kernel-step" in answer.text and "run 12 -> 13" in answer.text
    only = call(box, "history", {"patterns": "step"}).structured["history"]
    assert [s["definition"] for s in only["series"]] == ["kernel-step"]


def test_history_check_gives_the_exit_code_of_glmfb_history_check(project: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLMFB_HISTORY", raising=False)
    box = Toolbox(Boundary(project))
    checked = call(box, "history", {"check": True})
    validate(box, "history", checked.structured)
    assert (checked.structured["regressed"], checked.structured["exit_code"]) == (1, 1)
    assert {s["definition"]: s["regressed"] for s in checked.structured["history"]["series"]} == {
        "kernel-step": True, "kernel-flat": False}
    assert "exit code 1" in checked.text and "REGRESSED" in checked.text
    flat = call(box, "history", {"check": True, "patterns": ["flat"], "threshold": "5%"}).structured
    assert (flat["regressed"], flat["exit_code"]) == (0, 0)
    lenient = call(box, "history", {"check": True, "patterns": ["kernel-step"], "threshold": 0.5}).structured
    assert lenient["exit_code"] == 0  # a 10-point step is under a 50% threshold
    unchecked = call(box, "history", {"check": False}).structured
    assert "exit_code" not in unchecked and "threshold" not in unchecked["history"]


def test_history_reads_a_store_named_by_url_and_refuses_bad_ones_in_one_line(project: Path, tmp_path: Path) -> None:
    box = Toolbox(Boundary(project))
    other = project / "other"
    store_of(other, planted("elsewhere", FLAT[:8]))
    answer = call(box, "history", {"store": "sqlite:///other/history.sqlite"})
    assert [s["definition"] for s in answer.structured["history"]["series"]] == ["elsewhere"]
    for arguments, named in [
        ({"store": "mysql://db/history"}, "argument 'store'"),
        ({"store": f"sqlite:///{tmp_path / 'outside.sqlite'}"}, "outside the root"),
        ({"store": "sqlite:///reports/none.sqlite"}, "no history at"),
        ({"patterns": ["nothing-like-it"]}, "no series in the history"),
        ({"threshold": "5"}, "argument 'threshold'"),
        ({"check": "yes"}, "argument 'check'"),
        ({"since": "monday"}, "unknown argument 'since'"),
    ]:
        message = refused(box, "history", arguments)
        assert message.startswith("glmfb history: ") and named in message and "\n" not in message, message


def test_history_through_the_client_is_typed_and_a_bad_url_is_a_tool_error(project: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import anyio
    import jsonschema
    from mcp import Client

    from glmfb.workflows.mcp.server import GlmfbServer

    monkeypatch.chdir(project)
    monkeypatch.delenv("GLMFB_HISTORY", raising=False)
    server = GlmfbServer(Boundary(project))

    async def session() -> None:
        async with Client(server.server) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert {"history", "bisect"} <= set(listed)
            bad = await client.call_tool("history", {"store": "mysql://db/history"})
            assert bad.is_error and "argument 'store'" in bad.content[0].text  # type: ignore[union-attr]
            missing = await client.call_tool("history", {"store": "sqlite:///reports/none.sqlite"})
            assert missing.is_error and "no history at" in missing.content[0].text  # type: ignore[union-attr]
            good = await client.call_tool("history", {"check": True})
            assert not good.is_error and good.structured_content is not None
            jsonschema.validate(good.structured_content, listed["history"].output_schema or {})
            assert good.structured_content["exit_code"] == 1

    anyio.run(session)


# --------------------------------------------------------------------------------------------
# bisect
# --------------------------------------------------------------------------------------------


SLOW_AT = 3  # of 5 commits: the one that makes the kernel 3x slower


@pytest.fixture(scope="module")
def slowed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository of five commits; the third accumulates in three passes."""
    repo = build_repo(tmp_path_factory.mktemp("mcp-bisect") / "project", 5, {
        SLOW_AT: ("kernels: accumulate in three passes", {"kernels.py": KERNELS.format(passes=3)}),
    })
    return repo.path


def test_bisect_refuses_bad_arguments_before_anything_runs(slowed: Path, tmp_path: Path) -> None:
    box = Toolbox(Boundary(slowed))
    outside = tmp_path / "outside.toml"
    outside.write_text("")
    for arguments, named in [
        ({"bad": "HEAD", "definition": "probes/bisect.toml"}, "argument 'good' is required"),
        ({"good": "HEAD~4", "bad": "HEAD"}, "argument 'definition' is required"),
        ({"good": "HEAD~4", "bad": "HEAD", "definition": str(outside)}, "outside the root"),
        ({"good": "HEAD~4", "bad": "HEAD", "definition": "probes/none.toml"}, "no such definition file"),
        ({"good": "HEAD~4", "bad": "HEAD", "definition": "probes/bisect.toml"}, "a bisection follows one"),
        ({"good": "HEAD~4", "bad": "HEAD", "definition": "probes/bisect.toml", "select": "nothing"}, "no probe in"),
        ({"good": "HEAD~4", "bad": "HEAD", "definition": "probes/bisect.toml", "select": "kernel-speed",
          "setup": "pip install -e ."}, "--allow-commands"),
        ({"good": "HEAD~4", "bad": "HEAD", "definition": "probes/bisect.toml", "select": "kernel-speed",
          "max_evaluations": 0}, "argument 'max_evaluations'"),
    ]:
        with pytest.raises(InputError) as caught:
            box.prepare("bisect", arguments)
        message = str(caught.value)
        assert message.startswith("glmfb bisect: ") and named in message, message
    assert not (slowed / "reports").exists()  # nothing was written
    prepared = Toolbox(Boundary(slowed, allow_commands=True)).prepare("bisect", {
        "good": "HEAD~4", "bad": "HEAD", "definition": "probes/bisect.toml", "select": "kernel-speed",
        "setup": "true", "timeout": "10min"})
    assert prepared.runs_probes and prepared.timeout_s == 600


def test_a_cancelled_bisection_stops_and_says_so(slowed: Path) -> None:
    box = Toolbox(Boundary(slowed))
    cancel = threading.Event()
    cancel.set()
    answer = call(box, "bisect", {"good": "HEAD~4", "bad": "HEAD", "definition": "probes/bisect.toml",
                                  "select": "kernel-speed"}, context("cancelled-run", cancel=cancel))
    validate(box, "bisect", answer.structured)
    verdict = answer.structured["verdict"]
    assert verdict["status"] == "error" and "cancelled" in verdict["why"], verdict["why"]
    assert answer.structured["evaluations"] == 0
    run = slowed / "reports" / "cancelled-run"
    assert (run / "run.json").is_file() and (run / "report.html").is_file()


@pytest.mark.slow
def test_bisect_names_the_commit_that_made_the_kernel_slower(slowed: Path) -> None:
    import json
    import subprocess

    box = Toolbox(Boundary(slowed))
    said: list[str] = []
    answer = call(box, "bisect", {"good": "HEAD~4", "bad": "HEAD", "definition": "probes/bisect.toml",
                                  "select": ["kernel-speed"]}, context("bisect-run", said=said))
    validate(box, "bisect", answer.structured)
    verdict = answer.structured["verdict"]
    culprit = subprocess.run(["git", "-C", str(slowed), "rev-parse", f"HEAD~{5 - SLOW_AT}"], capture_output=True,
                             text=True, check=True).stdout.strip()
    assert verdict["status"] == "fail", verdict["why"]
    assert verdict["where"]["commit"] == culprit and "kernels: accumulate in three passes" in verdict["why"]
    roles = {e["role"]: e["verdict"]["status"] for e in verdict["evidence"] if e["kind"] == "bisect_verdict"}
    assert roles == {"last good": "pass", "first bad": "fail"}
    assert 1 <= answer.structured["evaluations"] <= 5  # ceil(log2(4)) + 3
    assert answer.structured["run"] == {"id": "bisect-run", "uri": "glmfb://runs/bisect-run",
                                        "folder": "reports/bisect-run"}
    assert any(message.startswith("evaluation 1:") for message in said)  # progress as it goes
    saved = json.loads((slowed / "reports" / "bisect-run" / "run.json").read_text())
    assert saved["verdicts"][0]["where"]["commit"] == culprit
    assert "fail" in answer.text.lower() and culprit[:7] in answer.text


def test_a_bisection_stops_when_its_time_budget_is_spent(slowed: Path) -> None:
    box = Toolbox(Boundary(slowed))
    started = time.monotonic()
    answer = call(box, "bisect", {"good": "HEAD~4", "bad": "HEAD", "definition": "probes/bisect.toml",
                                  "select": "kernel-speed"}, context("spent-run", budget_s=1.5))
    verdict = answer.structured["verdict"]
    assert verdict["status"] == "error" and "its time budget ran out" in verdict["why"], verdict["why"]
    assert time.monotonic() - started < 30  # the first evaluation was stopped at the deadline, not run out


# --------------------------------------------------------------------------------------------
# the probe tools and run record into the history, as the commands do
# --------------------------------------------------------------------------------------------


def test_the_probe_tools_and_run_record_their_verdicts_in_the_history(tmp_path: Path, toy: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    root = tmp_path / "project"
    (root / "probes").mkdir(parents=True)
    (root / "probes" / "toy.toml").write_text('[[probe]]\nname = "toy-suite"\nprobe = "toy"\n')
    monkeypatch.delenv("GLMFB_HISTORY", raising=False)
    monkeypatch.chdir(root)
    box = Toolbox(Boundary(root))
    for run_id in ("r1", "r2"):
        answer = call(box, "toy", {"name": "toy-tool"}, context(run_id))
        assert answer.structured["verdict"]["status"] == "pass" and "notes" not in answer.structured
    call(box, "run", {}, context("r3"))
    with sqlite3.connect(root / "reports" / "history.sqlite") as db:
        rows = sorted(db.execute("SELECT run_id, definition, definition_hash FROM verdicts").fetchall())
    assert [(r[0], r[1]) for r in rows] == [("r1", "toy-tool"), ("r2", "toy-tool"), ("r3", "toy-suite")]
    assert rows[0][2] == rows[1][2] is not None  # the same call: the same series
    series = call(box, "history", {"patterns": "toy-tool"}).structured["history"]["series"]
    assert [s["runs"] for s in series] == [2]
    # a store that cannot be written is a note on the answer, and the verdict still comes back
    monkeypatch.setenv("GLMFB_HISTORY", f"sqlite:///{tmp_path}/no/such/folder/h.sqlite")
    (tmp_path / "no").write_text("a file where the folder would be")
    answer = call(box, "toy", {"name": "toy-tool"}, context("r4"))
    assert answer.structured["verdict"]["status"] == "pass"
    assert any("not recorded in the history" in note for note in answer.structured["notes"])
