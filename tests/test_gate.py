from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from glmfb.contract.errors import InputError
from glmfb.contract.verdict import ExitCode, Layer, Metric, Run, Status, Verdict
from glmfb.workflows.gate import GateDecision, Policy, evaluate, load_policy, parse_policy
from glmfb.workflows.report.junit import render_junit
from glmfb.workflows.report.markdown import render_markdown


def verdict(name: str, status: Status, probe: str = "bench") -> Verdict:
    return Verdict(
        probe=probe,
        name=name,
        status=status,
        layer=Layer.KERNEL,
        why=f"{name} is {status.value}",
        where={"kernel": "k", "shape": "8x4096"},
        metric=Metric("change", 0.2, "ratio", 0.05, (0.1, 0.3)),
    )


def run_of(*verdicts: Verdict) -> Run:
    return Run(id="r1", started="2026-11-29T00:00:00+00:00", verdicts=verdicts)


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        ([Status.PASS, Status.WARN], ExitCode.OK),
        ([Status.PASS, Status.FAIL], ExitCode.REGRESSION),
        ([Status.FAIL, Status.ERROR], ExitCode.HARNESS_ERROR),
        ([Status.INCONCLUSIVE], ExitCode.INCONCLUSIVE),
        ([Status.FAIL, Status.INCONCLUSIVE], ExitCode.REGRESSION),
    ],
)
def test_default_policy_follows_the_contract(statuses: list[Status], code: ExitCode) -> None:
    result = evaluate(run_of(*(verdict(f"v{i}", s) for i, s in enumerate(statuses))))
    assert result.exit_code is code


def test_policy_overrides_and_allow_list() -> None:
    policy = parse_policy(
        {
            "max_inconclusive": 1,
            "probes": {"bench": {"fail_on": ["fail", "warn", "error", "inconclusive"]}},
            "names": {"report-*": {"fail_on": []}},
            "allow": [{"name": "flaky-*", "reason": "shared runner, tracked in #12"}],
        }
    )
    run = run_of(
        verdict("bench-warn", Status.WARN),
        verdict("gil-warn", Status.WARN, "gil"),
        verdict("report-only", Status.FAIL),
        verdict("flaky-gap", Status.FAIL, "gap"),
        verdict("maybe", Status.INCONCLUSIVE),
    )
    result = evaluate(run, policy)
    decisions = {row.verdict.name: row.decision for row in result.rows}
    assert decisions == {
        "bench-warn": GateDecision.FAILED,  # warn fails for bench
        "gil-warn": GateDecision.OK,
        "report-only": GateDecision.OK,
        "flaky-gap": GateDecision.ALLOWED,
        "maybe": GateDecision.INCONCLUSIVE,  # within max_inconclusive
    }
    assert result.exit_code is ExitCode.REGRESSION
    assert evaluate(run_of(verdict("maybe", Status.INCONCLUSIVE)), policy).exit_code is ExitCode.OK
    two = run_of(verdict("a", Status.INCONCLUSIVE), verdict("b", Status.INCONCLUSIVE))
    assert evaluate(two, policy).exit_code is ExitCode.INCONCLUSIVE


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"fail_on": ["fail"], "colour": "red"}, "unknown key 'colour'"),
        ({"probes": {"bench": {"fail_on": ["warn"], "extra": 1}}}, "unknown key 'extra'"),
        ({"probes": {"kernelz": {"fail_on": ["warn"]}}}, "unknown probe kind"),
        ({"fail_on": ["broken"]}, "unknown status 'broken'"),
        ({"fail_on": ["pass"]}, "'pass' cannot fail"),
        ({"allow": [{"name": "x"}]}, "needs a reason"),
        ({"allow": [{"name": "x", "reason": "r", "until": "2027"}]}, "unknown key allow"),
        ({"max_inconclusive": -1}, "non-negative"),
    ],
)
def test_bad_policies_are_errors(document: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_policy(document)


def test_policy_file(tmp_path: Path) -> None:
    file = tmp_path / "policy.toml"
    file.write_text('fail_on = ["fail"]\n[probes.bench]\nfail_on = ["fail", "warn"]\n')
    policy = load_policy(file)
    assert policy.fail_on == frozenset({Status.FAIL})
    file.write_text("fail_on = [\n")
    with pytest.raises(InputError, match="invalid TOML"):
        load_policy(file)


def test_junit_counts_and_properties() -> None:
    run = run_of(
        verdict("ok", Status.PASS),
        verdict("slow", Status.FAIL),
        verdict("slower", Status.FAIL),
        verdict("broken", Status.ERROR),
        verdict("unsure", Status.INCONCLUSIVE),
    )
    result = evaluate(run, Policy())
    root = ET.fromstring(render_junit(result))
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("5", "3", "1")
    cases = {case.get("name"): case for case in root.iter("testcase")}
    failure = cases["slow"].find("failure")
    assert failure is not None and failure.get("message") == "slow is fail"
    assert cases["ok"].find("failure") is None
    assert cases["broken"].find("error") is not None
    props = {p.get("name"): p.get("value") for p in cases["slow"].iter("property")}
    assert props["where.kernel"] == "k" and props["metric.value"] == "0.2"


def test_markdown_summary_lists_failures() -> None:
    result = evaluate(run_of(verdict("ok", Status.PASS), verdict("slow", Status.FAIL)))
    text = render_markdown(result)
    assert text.startswith("## glmfb gate failed (exit 1)")
    assert "| ❌ | bench | slow |" in text
    assert "**slow** (failed): slow is fail" in text


# ---- runs that must not gate green ----------------------------------------------------------


def test_an_empty_or_interrupted_run_fails_unless_the_policy_allows_it() -> None:
    empty = Run(id="r", started="s", verdicts=())
    result = evaluate(empty)
    assert result.exit_code is ExitCode.HARNESS_ERROR and "no verdicts" in result.problems[0]
    assert evaluate(empty, parse_policy({"allow_empty": True})).exit_code is ExitCode.OK
    cut = Run(id="r", started="s", verdicts=(verdict("done", Status.PASS),), interrupted=True)
    assert evaluate(cut).exit_code is ExitCode.HARNESS_ERROR
    assert evaluate(cut, parse_policy({"allow_interrupted": True})).exit_code is ExitCode.OK
    junit = ET.fromstring(render_junit(evaluate(cut)))
    assert junit.get("errors") == "1" and junit.find(".//testcase[@classname='glmfb.run']/error") is not None
    with pytest.raises(InputError, match="allow_empty must be true or false"):
        parse_policy({"allow_empty": "yes"})


def test_junit_stays_well_formed_with_control_characters_in_a_why() -> None:
    nasty = Verdict(probe="bench", name="k\x1b[31m", status=Status.FAIL, layer=Layer.KERNEL,
                    why="the target raised ValueError: \x00\x07 bad \ud800 bytes")
    text = render_junit(evaluate(Run(id="r", started="s", verdicts=(nasty,))))
    root = ET.fromstring(text)  # parses: no raw control character left
    assert "\\x00" in root.find(".//failure").get("message")  # type: ignore[union-attr]
    assert "\x1b" not in render_markdown(evaluate(Run(id="r", started="s", verdicts=(nasty,))))
