from __future__ import annotations

import io

from rich.console import Console

from glmfb.report.terminal import render_run, render_verdict, theme
from glmfb.verdict import Expectation, Layer, Metric, Run, Status, Verdict


def render(renderable: object) -> str:
    console = Console(file=io.StringIO(), width=200, theme=theme(), color_system=None)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def planted() -> Verdict:
    verdict = Verdict(
        probe="bench",
        name="tiled-vs-fused",
        status=Status.FAIL,
        layer=Layer.KERNEL,
        why="aten::mean called 4x as often",
        where={"kernel": "norm_tiled", "shape": "8x4096"},
        metric=Metric("change", 0.93, "ratio", 0.05, (0.88, 0.99)),
        next=["glmfb bench a b --shape 8x4096"],
    )
    return verdict.with_expectation(Expectation(status=Status.FAIL, where={"kernel": "*tiled"}))


def test_verdict_panel_shows_where_why_metric_next() -> None:
    text = render(render_verdict(planted()))
    assert "kernel=norm_tiled shape=8x4096" in text
    assert "aten::mean called 4x as often" in text
    assert "change = +93.0% [+88.0%, +99.0%] (threshold +5.0%)" in text
    assert "glmfb bench a b --shape 8x4096" in text
    assert "expectation met" in text


def test_run_table_shows_expected_against_got() -> None:
    unmet = Verdict(
        probe="gil",
        name="holds-gil",
        status=Status.PASS,
        layer=Layer.RUNTIME,
        why="no starvation",
    ).with_expectation(Expectation(status=Status.FAIL, layer=Layer.RUNTIME))
    text = render(render_run(Run(id="r", started="s", verdicts=(planted(), unmet))))
    assert "expected" in text
    assert "fail, layer runtime" in text
    assert "pass (UNEXPECTED)" in text
    assert "expectation not met: status: expected fail, got pass" in text
    assert "1 met, 1 unmet" in text
