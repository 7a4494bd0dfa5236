"""JUnit XML from a gate result: one testcase per verdict, failure message = why."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from glmfb.contract.verdict import Verdict
from glmfb.core.commandline import shell_line
from glmfb.workflows.gate import GateDecision, GateResult, failing_rows
from glmfb.workflows.report.text import (
    cause_text,
    chain_lines,
    expectation_text,
    format_metric,
    printable,
)


def _properties(verdict: Verdict) -> ET.Element:
    properties = ET.Element("properties")

    def add(name: str, value: object) -> None:
        ET.SubElement(properties, "property", name=name, value=str(value))

    add("status", verdict.status.value)
    add("layer", verdict.layer.value)
    for key, value in verdict.where.items():
        add(f"where.{key}", value)
    if verdict.metric is not None:
        metric = verdict.metric
        add("metric.name", metric.name)
        add("metric.value", metric.value)
        add("metric.unit", metric.unit)
        if metric.threshold is not None:
            add("metric.threshold", metric.threshold)
        if metric.ci is not None:
            add("metric.ci", f"{metric.ci[0]},{metric.ci[1]}")
    if verdict.expect_met is not None:
        add("expect_met", str(verdict.expect_met).lower())
    return properties


def _body(verdict: Verdict) -> str:
    lines = [verdict.why]
    if verdict.expect is not None:
        lines.append(expectation_text(verdict))
    if verdict.metric is not None:
        lines.append(format_metric(verdict.metric))
    lines.extend(f"next: {shell_line(step)}" for step in verdict.next)
    if verdict.chain:  # glmfb --follow: the follow-ups, each link a verdict or why it was not taken
        lines.append(f"deepest cause: {cause_text(verdict)}")
        lines.append("chain:")
        lines.extend(chain_lines(verdict))
    return "\n".join(lines)


def render_junit(result: GateResult) -> str:
    """JUnit XML text (the schema CI systems read: testsuites/testsuite/testcase)."""
    failing = {id(row) for row in failing_rows(result)}
    kinds: list[str] = []
    for row in result.rows:
        if row.decision is GateDecision.ERRORED:
            kinds.append("error")
        elif id(row) in failing:
            kinds.append("failure")
        elif row.decision in (GateDecision.ALLOWED, GateDecision.INCONCLUSIVE):
            kinds.append("skipped")
        else:
            kinds.append("passed")
    counts: dict[str, str] = {
        "tests": str(len(kinds)),
        "failures": str(kinds.count("failure")),
        "errors": str(kinds.count("error")),
        "skipped": str(kinds.count("skipped")),
        "time": f"{sum(row.verdict.duration_s for row in result.rows):.3f}",
    }
    suites = ET.Element("testsuites", {"name": "glmfb", **counts})
    suite = ET.SubElement(suites, "testsuite", {"name": f"glmfb.{result.run.id}", **counts})
    for row, kind in zip(result.rows, kinds, strict=True):
        verdict = row.verdict
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"glmfb.{verdict.probe}",
            name=verdict.name,
            time=f"{verdict.duration_s:.3f}",
        )
        case.append(_properties(verdict))
        if kind in ("error", "failure"):
            cause = cause_text(verdict)
            message = verdict.why if cause is None else f"{verdict.why} | deepest cause: {cause}"
            element = ET.SubElement(case, kind, message=message, type=verdict.outcome.value)
            element.text = _body(verdict)
        elif kind == "skipped":
            label = "allowed" if row.decision is GateDecision.ALLOWED else "inconclusive, tolerated"
            ET.SubElement(case, "skipped", message=f"{label}: {row.reason or verdict.why}")
    for problem in result.problems:  # an empty or interrupted run fails the gate: show why
        case = ET.SubElement(suite, "testcase", classname="glmfb.run", name=result.run.id, time="0")
        ET.SubElement(case, "error", message=problem, type="run")
        counts["tests"] = str(int(counts["tests"]) + 1)
        counts["errors"] = str(int(counts["errors"]) + 1)
    for element in (suites, suite):
        element.attrib.update({k: counts[k] for k in ("tests", "errors")})
    for element in suites.iter():  # a target's message may hold control characters
        element.attrib = {k: printable(v) for k, v in element.attrib.items()}
        if element.text:
            element.text = printable(element.text)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
