"""The rules of glmfb gap as tables: findings in, rule and diagnosis out (no timing)."""

from __future__ import annotations

from typing import Any

import pytest

from glmfb.gap.attribution import GilFinding
from glmfb.gap.bandwidth import BandwidthCheck
from glmfb.gap.phases import PhaseChange
from glmfb.gap.rules import RULES, GapFindings
from glmfb.rules import diagnose
from glmfb.verdict import Status

GREW = (PhaseChange("kv_wait_s", None, 0.169),)
HOLDER_IDLE = GilFinding(available=True, status="fail", holder_thread="MainThread", holder_function="intranode_dispatch",
                         holder_file="scenarios/kv_transfer/dispatch.py", holder_line=39, holder_idle_share=0.97,
                         native_frame="usleep", starved_thread="kv-transfer", starved_waiting_share=0.4)
HOLDER_BUSY = GilFinding(available=True, status="fail", holder_thread="sender", holder_function="dumps",
                         holder_file="x.py", holder_line=3, holder_idle_share=0.05, starved_thread="MainThread")
SATURATED = BandwidthCheck("mooncake", 1e8, 9.5e8, 1e9, 1e9)


def findings(gap: float, low: float, high: float, **kwargs: Any) -> GapFindings:
    values: dict[str, Any] = dict(gap=gap, low=low, high=high, threshold=0.05, iterations=20, stopped_by="decided",
                                  budget_s=30.0, repeats=30, grown=GREW, baseline_ref="a.py:prefill",
                                  candidate_ref="a.py:transfer")
    values.update(kwargs)
    return GapFindings(**values)


TABLE = [
    (findings(0.04, 0.01, 0.08, stopped_by="budget"), "undecided", Status.INCONCLUSIVE, ["straddles", "30 s budget"]),
    (findings(0.01, -0.01, 0.03), "within-threshold", Status.PASS, ["Within the threshold"]),
    (findings(0.4, 0.3, 0.5, gil=HOLDER_IDLE), "gil-release-missing", Status.FAIL,
     ["kv_wait_s 169 ms (only in the candidate)", "A missing GIL release in intranode_dispatch",
      "idle in a native call (usleep)"]),
    (findings(0.4, 0.3, 0.5, gil=HOLDER_BUSY), "gil-holder", Status.FAIL, ["held by dumps", "computing"]),
    (findings(0.4, 0.3, 0.5, bandwidth=SATURATED), "bandwidth-bound", Status.FAIL, ["the link is saturated"]),
    (findings(0.4, 0.3, 0.5, gil=GilFinding(available=False, reason="py-spy missing")), "over-threshold",
     Status.FAIL, ["The GIL signal is missing: py-spy missing"]),
]


@pytest.mark.parametrize(("case", "rule", "status", "phrases"), TABLE, ids=[row[1] for row in TABLE])
def test_rule_table(case: GapFindings, rule: str, status: Status, phrases: list[str]) -> None:
    outcome = diagnose(RULES, case)
    assert outcome.rule.name == rule, outcome.diagnosis.why
    assert outcome.diagnosis.status is status
    for phrase in phrases:
        assert phrase in outcome.diagnosis.why, outcome.diagnosis.why


def test_a_missing_release_names_the_starved_thread_and_the_holder() -> None:
    diagnosis = diagnose(RULES, findings(0.4, 0.3, 0.5, gil=HOLDER_IDLE)).diagnosis
    assert diagnosis.where == {"thread": "kv-transfer", "function": "intranode_dispatch",
                               "file": "scenarios/kv_transfer/dispatch.py", "line": 39}
    assert diagnosis.next[-1].startswith("glmfb gap a.py:prefill a.py:transfer --threshold 5%")


def test_without_the_gil_probe_the_next_step_runs_it() -> None:
    diagnosis = diagnose(RULES, findings(0.4, 0.3, 0.5, gil=GilFinding(available=False, reason="x"))).diagnosis
    assert any(step.startswith("glmfb gil --target a.py:transfer") for step in diagnosis.next)
    assert diagnosis.where == {}
