"""glmfb follows its own next steps: a step's intent as data, the follow engine's chain, and
where people read it (the gate's line, junit, the report)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from glmfb.contract.step import Intent, Step
from glmfb.contract.verdict import Status, Verdict, load_document
from glmfb.core.commandline import FollowOptions, rerun_step, run_step
from glmfb.workflows.follow import follow_verdict

ROOT = Path(__file__).resolve().parents[1]


def test_a_step_says_what_it_is_for_and_an_old_step_reads_as_other() -> None:
    deeper = Step("the module diff", command="diff", arguments={"baseline": "a.py:f", "candidate": "b.py:g"},
                  intent=Intent.DEEPER)
    assert deeper.to_dict()["intent"] == "deeper"
    assert Step.from_json(deeper.to_dict()) == deeper
    old = {"why": "rerun", "command": "bench", "arguments": {"baseline": "a.py:f"}}
    assert Step.from_json(old).intent is Intent.OTHER
    assert "intent" not in Step.from_json(old).to_dict()  # other is never written: old readers read it
    verdict = Verdict(probe="bench", name="b", status="fail", layer="kernel", why="slower", next=(deeper,))
    assert Verdict.from_dict(verdict.to_dict()).next[0].intent is Intent.DEEPER
    assert run_step(["x"]).intent is Intent.CONFIRM


def test_rerun_step_takes_the_intent() -> None:
    from glmfb.bench.config import BenchConfig
    from glmfb.core.targets import Target

    config = BenchConfig(name="b", baseline=Target("a.py:f"), candidate=Target("b.py:g"), shapes=((8, 4096),))
    assert rerun_step("bench", config, "again", intent=Intent.AFTER_FIX).intent is Intent.AFTER_FIX
    assert rerun_step("bench", config, "again").intent is Intent.OTHER


def test_the_probes_declare_their_steps_intents() -> None:
    from glmfb.diff.config import DiffConfig
    from glmfb.diff.engine import reproducer_step
    from glmfb.gil.config import GilConfig
    from glmfb.gil.engine import longer_step, trace_step

    gil = GilConfig(command=("python", "serve.py"))
    assert trace_step(gil).intent is Intent.DEEPER  # type: ignore[union-attr]
    assert longer_step(gil).intent is Intent.CONFIRM  # type: ignore[union-attr]
    diff = DiffConfig(name="d", baseline="a.py:f", candidate="b.py:g")
    assert reproducer_step(diff, Path("min.jsonl")).intent is Intent.REPRODUCE


# ---- the follow engine ------------------------------------------------------------------------


def _toy_verdict(tmp_path: Path, **options: Any) -> Verdict:
    """A toy run in its supervised child, as the probe command runs it."""
    from glmfb.core.host import run_probe
    from glmfb.core.probe import ProbeContext, ProbeSpec, get_probe

    probe = get_probe("toy")
    spec = ProbeSpec(kind="toy", name="t", label="glmfb toy", options=options)
    config = probe.build(spec)
    ctx = ProbeContext(run_id="r", artifact_dir=tmp_path / "t")
    return run_probe(probe, config, ctx, isolate=True, timeout_s=60)


@pytest.fixture
def toy_child(toy: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The toy importable in a supervised child, run from ``tmp_path`` (the boundary's root)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(toy), str(ROOT)]))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_failing_verdict_follows_its_deeper_steps_to_the_line(toy_child: Path) -> None:
    verdict = _toy_verdict(toy_child, outcome="fail", kernel="k", deeper="fail,fail")
    followed = follow_verdict(verdict, FollowOptions(), root=toy_child, artifact_dir=toy_child / "t", run_id="r")
    first = followed.chain[0]
    assert first.step.intent is Intent.DEEPER and first.verdict is not None
    assert first.verdict.status is Status.FAIL and first.verdict.where == {"kernel": "k.inner"}
    assert followed.cause.where == {"kernel": "k.inner.inner"}  # two levels down, each a whole verdict
    assert followed.cause.evidence  # with its own evidence
    assert followed.stopped is None
    assert Verdict.from_dict(followed.to_dict()) == followed


def test_depth_is_respected_and_the_last_link_says_so(toy_child: Path) -> None:
    verdict = _toy_verdict(toy_child, outcome="fail", deeper="fail,fail,fail")
    followed = follow_verdict(verdict, FollowOptions(depth=1), root=toy_child, artifact_dir=toy_child / "t",
                              run_id="r")
    assert followed.chain[0].verdict is not None
    assert "depth of 1 is reached" in (followed.stopped or "")


def test_a_spent_budget_stops_the_chain_and_says_so(toy_child: Path) -> None:
    verdict = _toy_verdict(toy_child, outcome="fail", deeper="fail")
    followed = follow_verdict(verdict, FollowOptions(budget_s=0.5), root=toy_child, artifact_dir=toy_child / "t",
                              run_id="r")
    assert followed.chain[0].verdict is None and "budget of 0.5 s is spent" in followed.chain[0].stopped


def test_a_step_that_needs_a_command_line_is_refused_by_the_boundary_and_said(toy_child: Path) -> None:
    verdict = _toy_verdict(toy_child, outcome="fail", deeper="command")
    followed = follow_verdict(verdict, FollowOptions(), root=toy_child, artifact_dir=toy_child / "t", run_id="r")
    (link,) = followed.chain
    assert link.verdict is None and link.step.command == "gil"
    assert "the boundary refuses it" in link.stopped and "glmfb --follow does not run command lines" in link.stopped
    assert "--follow-commands lets a follow-up run it" in link.stopped  # the refusal says how, not the server's flag
    assert followed.cause is followed and followed.stopped == link.stopped


def test_follow_commands_lets_a_follow_up_run_the_command_line(tmp_path: Path, toy: Path) -> None:
    """``--follow-commands`` (implies --follow): the toy's deeper gil step on a command line is
    taken, and its link is gil's whole verdict on that program."""
    ran = _cli(tmp_path, toy, "toy", "--outcome", "fail", "--deeper", "command", "--follow-commands", "--json",
               "--out", "out", "--no-history")
    assert ran.returncode == 1, ran.stderr
    (link,) = Verdict.from_dict(json.loads(ran.stdout)).chain
    assert link.verdict is not None and link.verdict.probe == "gil", link.stopped
    # a program that ends at once: gil cannot decide (whether py-spy saw it start or not), never a pass
    assert link.verdict.status is Status.INCONCLUSIVE, link.verdict.why


def test_a_passing_verdict_follows_nothing(toy_child: Path) -> None:
    verdict = _toy_verdict(toy_child, outcome="pass", deeper="fail")
    assert follow_verdict(verdict, FollowOptions(), root=toy_child, artifact_dir=toy_child / "t",
                          run_id="r") is verdict
    assert "chain" not in verdict.to_dict()


def test_an_old_verdict_without_a_chain_still_reads() -> None:
    old = {"schema": "glmfb.run/2", "id": "x", "started": "", "verdicts": [
        {"schema": "glmfb.verdict/2", "probe": "bench", "name": "b", "status": "fail", "layer": "kernel",
         "why": "slower", "next": [{"why": "again", "command": "bench", "arguments": {"baseline": "a.py:f"}}]}]}
    (verdict,) = load_document(old).verdicts
    assert verdict.chain == () and verdict.cause is verdict and verdict.stopped is None
    assert verdict.next[0].intent is Intent.OTHER


# ---- the command line, and where people read the chain ---------------------------------------


def _cli(cwd: Path, toy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "glmfb", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


def test_follow_on_a_probe_command_writes_the_chain_and_the_gate_prints_the_deepest_cause(
        tmp_path: Path, toy: Path) -> None:
    ran = _cli(tmp_path, toy, "toy", "--outcome", "fail", "--kernel", "attn", "--deeper", "fail,command",
               "--follow", "--json", "--out", "out", "--no-history")
    assert ran.returncode == 1, ran.stderr
    verdict = Verdict.from_dict(json.loads(ran.stdout))
    assert verdict.cause.where == {"kernel": "attn.inner"} and "does not run command lines" in (verdict.stopped or "")
    (run_file,) = (tmp_path / "out").glob("*/run.json")
    assert load_document(json.loads(run_file.read_text())).verdicts[0] == verdict
    gated = _cli(tmp_path, toy, "gate", str(run_file), "--summary", "summary.md")
    assert gated.returncode == 1
    assert ("    deepest cause: toy toy-deeper at kernel=attn.inner: the toy read 0.5 and was told to say fail "
            "(went no deeper: not followed: the boundary refuses it: argument 'command'") in gated.stdout
    junit = (run_file.parent / "junit.xml").read_text()
    assert "deepest cause: toy toy-deeper at kernel=attn.inner" in junit and "-&gt; stopped: not followed" in junit
    assert 'class="chain"' in (run_file.parent / "report.html").read_text()
    assert "- deepest cause: toy toy-deeper at kernel=attn.inner" in (tmp_path / "summary.md").read_text()


def test_a_definitions_follow_key_and_a_passing_verdict_that_follows_nothing(tmp_path: Path, toy: Path) -> None:
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "toy.toml").write_text(
        '[[probe]]\nname = "fails"\nprobe = "toy"\nfollow = { depth = 1 }\n'
        'options = { outcome = "fail", deeper = "fail,fail" }\n'
        '[[probe]]\nname = "passes"\nprobe = "toy"\nfollow = true\noptions = { outcome = "pass", deeper = "fail" }\n')
    ran = _cli(tmp_path, toy, "run", "--json", "--out", "out", "--no-history")
    assert ran.returncode == 1, ran.stderr
    fails, passes = load_document(json.loads(ran.stdout)).verdicts
    assert fails.chain[0].verdict is not None and "depth of 1 is reached" in (fails.stopped or "")
    assert passes.chain == () and "chain" not in passes.to_dict()


def test_the_probe_tool_follows_and_the_agent_gets_the_line_in_one_call(toy_child: Path) -> None:
    import threading
    import time

    from glmfb.workflows.mcp.boundary import Boundary
    from glmfb.workflows.mcp.tools import CallContext, Toolbox

    box = Toolbox(Boundary(toy_child))
    prepared = box.prepare("toy", {"outcome": "fail", "kernel": "attn", "deeper": "fail", "follow": {"depth": 2}})
    call = CallContext(run_id="r1", progress=lambda message: None, cancel=threading.Event(),
                       deadline=time.monotonic() + 120, slot=threading.Lock())
    answer = prepared.work(call)
    verdict = Verdict.from_dict(answer.structured["verdict"])
    assert verdict.cause.where == {"kernel": "attn.inner"}
    assert "deepest cause: toy toy-deeper at kernel=attn.inner" in answer.text
    assert [call["intent"] for call in answer.structured["next_calls"]] == ["other", "deeper"]
    import jsonschema

    from glmfb.core.documents import json_schema

    jsonschema.validate(answer.structured, box.tools["toy"].output_schema)  # the chain, as the tool declares it
    jsonschema.validate(answer.structured["verdict"], json_schema())  # and as glmfb schema does, links and all
    broken = json.loads(json.dumps(answer.structured["verdict"]))
    broken["chain"][0]["verdict"]["status"] = "sideways"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, json_schema())
    with pytest.raises(ValueError, match="sideways"):
        Verdict.from_dict(broken)  # glmfb's own reader checks a link's verdict as a verdict
    unfollowed = box.prepare("toy", {"outcome": "fail", "deeper": "fail"}).work(
        CallContext(run_id="r2", progress=lambda message: None, cancel=threading.Event(),
                    deadline=time.monotonic() + 120, slot=threading.Lock()))
    assert "chain" not in unfollowed.structured["verdict"]  # follow not asked: nothing followed


def test_follow_options_on_the_command_line_are_checked(tmp_path: Path, toy: Path) -> None:
    bad = _cli(tmp_path, toy, "toy", "--outcome", "fail", "--follow-budget", "soon", "--out", "out", "--no-history")
    assert bad.returncode == 2 and "--follow: the follow budget" in bad.stderr
    deep = _cli(tmp_path, toy, "toy", "--outcome", "fail", "--deeper", "fail,fail", "--follow-depth", "1", "--json",
                "--out", "out", "--no-history")  # a depth alone implies --follow
    verdict = Verdict.from_dict(json.loads(deep.stdout))
    assert verdict.chain[0].verdict is not None and "depth of 1 is reached" in (verdict.stopped or "")


def test_the_terminal_panel_shows_the_chain_and_the_cause(tmp_path: Path, toy: Path) -> None:
    shown = _cli(tmp_path, toy, "toy", "--outcome", "fail", "--kernel", "attn", "--deeper", "fail", "--follow",
                 "--out", "out", "--no-history")
    assert shown.returncode == 1, shown.stderr
    assert "-> fail: toy toy-deeper at kernel=attn.inner" in shown.stdout
    assert "cause  toy toy-deeper at kernel=attn.inner" in shown.stdout


def test_a_step_may_name_what_its_run_wrote_outside_the_root(tmp_path: Path) -> None:
    """--out outside the working folder: a deeper step names a file its probe wrote in the run's
    folder (a module diff's requests), which the follow-up may read; anything else outside the
    root is refused, the refusal naming both places."""
    from glmfb.contract.errors import InputError
    from glmfb.workflows.mcp.boundary import Boundary

    root, run = tmp_path / "project", tmp_path / "elsewhere" / "run-1"
    root.mkdir()
    run.mkdir(parents=True)
    (run / "module-diff-requests.jsonl").write_text("{}\n")
    boundary = Boundary(root, who="glmfb --follow", readable=(run,))
    assert boundary.path(str(run / "module-diff-requests.jsonl"), "requests", must_exist=True).parent == run.resolve()
    with pytest.raises(InputError) as refused:
        boundary.path(str(tmp_path / "elsewhere" / "other.jsonl"), "requests")
    assert f"outside the root {root.resolve()} and outside glmfb's own {run.resolve()}" in refused.value.message
    assert Boundary(root).inside(run) is None  # the agent server's boundary reads no other run folder


def test_the_run_tool_follows_every_definition_when_asked(toy_child: Path) -> None:
    """The MCP ``run`` tool's ``follow`` argument: each failing definition's chain, in one call;
    without it a definition without its own follow key follows nothing."""
    import threading
    import time

    import jsonschema

    from glmfb.workflows.mcp.boundary import Boundary
    from glmfb.workflows.mcp.tools import CallContext, Toolbox

    (toy_child / "probes").mkdir()
    (toy_child / "probes" / "toy.toml").write_text(
        '[[probe]]\nname = "fails"\nprobe = "toy"\noptions = { outcome = "fail", kernel = "attn", deeper = "fail" }\n')
    box = Toolbox(Boundary(toy_child, out=toy_child / "out"))

    def call(arguments: dict[str, Any], run_id: str) -> dict[str, Any]:
        answer = box.prepare("run", arguments).work(
            CallContext(run_id=run_id, progress=lambda message: None, cancel=threading.Event(),
                        deadline=time.monotonic() + 120, slot=threading.Lock()))
        jsonschema.validate(answer.structured, box.tools["run"].output_schema)
        return answer.structured

    (followed,) = call({"follow": {"depth": 1}}, "r1")["run"]["verdicts"]
    assert Verdict.from_dict(followed).cause.where == {"kernel": "attn.inner"}
    (plain,) = call({}, "r2")["run"]["verdicts"]
    assert "chain" not in plain
    from glmfb.contract.errors import InputError

    with pytest.raises(InputError, match="argument 'follow'"):
        box.prepare("run", {"follow": "yes"})
