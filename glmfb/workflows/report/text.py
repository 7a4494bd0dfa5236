"""Plain-text pieces shared by every rendering: a metric, a where, a status label."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from glmfb.contract.verdict import Metric, Verdict

_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


def printable(text: str) -> str:
    """``text`` with control characters and lone surrogates (which a target's exception message
    may hold) written as ``\\xNN`` / ``\\uNNNN``: safe in XML, Markdown and a terminal."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", text)


def format_number(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.3e}"


def format_metric(metric: Metric | None) -> str:
    """``gap = 0.231 ratio [0.19, 0.27] (threshold 0.05)``; ratios as percentages."""
    if metric is None:
        return ""
    as_percent = metric.unit in ("ratio", "fraction", "%")

    def show(value: float | None) -> str:
        if value is None:
            return "n/a"
        return f"{value * 100:+.1f}%" if as_percent else format_number(value)

    text = f"{metric.name} = {show(metric.value)}"
    if metric.unit and not as_percent:
        text += f" {metric.unit}"
    if metric.ci is not None:
        text += f" [{show(metric.ci[0])}, {show(metric.ci[1])}]"
    if metric.threshold is not None:
        text += f" (threshold {show(metric.threshold)})"
    return text


def format_where(where: Mapping[str, Any]) -> str:
    """``module=layers.3.attn.merge position=6144``; file and line joined as file:line."""
    parts: list[str] = []
    for key, value in where.items():
        if key == "line" and "file" in where:
            continue
        if key == "file" and "line" in where:
            parts.append(f"at {value}:{where['line']}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


def status_label(verdict: Verdict) -> str:
    """The status, and for a judged verdict whether the expectation held."""
    if verdict.expect_met is None:
        return verdict.status.value
    return f"{verdict.status.value} ({'as expected' if verdict.expect_met else 'UNEXPECTED'})"


def expectation_text(verdict: Verdict) -> str:
    if verdict.expect is None:
        return ""
    problems = verdict.expect.mismatches(verdict)
    if not problems:
        return "expectation met"
    return "expectation not met: " + "; ".join(problems)


def expected_label(verdict: Verdict) -> str:
    """``fail, layer kernel, where kernel=*tiled*``: the expectation in a table cell."""
    if verdict.expect is None:
        return ""
    expect = verdict.expect
    parts = [expect.status.value if expect.status is not None else "any status"]
    if expect.layer is not None:
        parts.append(f"layer {expect.layer.value}")
    if expect.where:
        parts.append(format_where(expect.where))
    return ", ".join(parts)


def first_line(text: str) -> str:
    """The first line of a why (its headline)."""
    return text.strip().split("\n", 1)[0]


def cause_text(verdict: Verdict) -> str | None:
    """The deepest cause of a verdict's chain (``glmfb --follow``) in one line: the verdict,
    its ``where``, the first line of its why, and why the chain went no deeper where it says;
    None without a chain."""
    if not verdict.chain:
        return None
    cause = verdict.cause
    where = format_where(cause.where)
    text = f"{cause.probe} {cause.name}{f' at {where}' if where else ''}: {first_line(cause.why)}"
    if cause is verdict:
        text = f"no follow-up failed: {text}"
    if verdict.stopped:
        text += f" (went no deeper: {verdict.stopped})"
    return text


def chain_lines(verdict: Verdict, indent: str = "  ") -> list[str]:
    """A verdict's chain as lines, one per link, indented by depth: each follow-up's status,
    name, where and first line of why, or why its step was not taken."""
    lines: list[str] = []

    def walk(parent: Verdict, depth: int) -> None:
        for link in parent.chain:
            pad = indent * depth
            if link.verdict is None:
                lines.append(f"{pad}-> stopped: {link.stopped}")
                continue
            child = link.verdict
            where = format_where(child.where)
            lines.append(f"{pad}-> {child.status.value}: {child.probe} {child.name}"
                         f"{f' at {where}' if where else ''}: {first_line(child.why)}")
            walk(child, depth + 1)

    walk(verdict, 0)
    return lines
