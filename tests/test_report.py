from __future__ import annotations

import io

from rich.console import Console

from glmfb.contract.verdict import Expectation, Layer, Metric, Run, Status, Verdict
from glmfb.workflows.report.terminal import render_run, render_verdict, theme


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


def test_a_run_shows_panels_only_for_what_needs_a_look_and_the_table_last() -> None:
    from rich.console import Console

    from glmfb.workflows.report.terminal import render_run, theme

    expect = Expectation(status=Status.FAIL)
    met = Verdict(probe="bench", name="planted", status=Status.FAIL, layer=Layer.KERNEL, why="slower: found"
                  ).with_expectation(expect)
    unmet = Verdict(probe="bench", name="missed", status=Status.PASS, layer=Layer.KERNEL, why="looked fine"
                    ).with_expectation(expect)
    clean = Verdict(probe="gil", name="clean", status=Status.PASS, layer=Layer.RUNTIME, why="no thread starved")

    def text(run: Run, verbose: bool = False) -> str:
        console = Console(width=120, record=True, theme=theme(), file=open("/dev/null", "w"))  # noqa: SIM115
        console.print(render_run(run, verbose=verbose, folder_size="1.2 MB"))
        return console.export_text()

    green = text(Run(id="r", started="s", verdicts=(met, clean)))
    assert "╭─" not in green  # no panel when everything went as expected
    assert green.rstrip().splitlines()[-1].startswith("1 pass") or "expectations: 1 met" in green.splitlines()[-1]
    assert "run folder 1.2 MB" in green.splitlines()[-1]
    assert "fail (as expected)" in green
    red = text(Run(id="r", started="s", verdicts=(met, unmet, clean)))
    panels = red.split("glmfb run r")[0]
    assert "missed" in panels and "planted" not in panels and "clean" not in panels
    assert "glmfb run r" in red.splitlines()[-6] or red.index("glmfb run r") > red.index("missed")
    assert text(Run(id="r", started="s", verdicts=(met, clean)), verbose=True).count("╭─") == 2
