"""glmfb follows its own next steps: a step's intent as data, the follow engine's chain, and
where people read it (the gate's line, junit, the report)."""

from __future__ import annotations

from glmfb.contract.step import Intent, Step
from glmfb.contract.verdict import Verdict
from glmfb.core.commandline import rerun_step, run_step


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
