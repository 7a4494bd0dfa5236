"""report.html draws the history of each verdict's series: a run whose verdict has planted
history gets the series plot (an inline SVG named ``history``) with its change point and this
run marked; a run without history, or with one run of it, gets none and no error; ``glmfb
report`` finds the store beside the run folder; a probe command draws it from its second run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_history_command import planted, store_of
from typer.testing import CliRunner

from glmfb.cli import app
from glmfb.workflows.history.series import history_of_run
from glmfb.workflows.report.html import render_html

REPO = Path(__file__).resolve().parents[1]
STEP = [0.02] * 12 + [0.12] * 12  # +10 points of the baseline's time at run 12
CURRENT = 20  # the run the page is about, in the segment after the step


def run_document(run_id: str, value: float) -> dict[str, Any]:
    """A run with one bench verdict of the planted series' definition and metric."""
    verdict = {"schema": "glmfb.verdict/2", "probe": "bench", "name": "kernel-step", "status": "fail",
               "layer": "kernel", "where": {"kernel": "k"}, "why": "the kernel is slower",
               "metric": {"name": "time_change", "value": value, "unit": "fraction", "threshold": 0.05,
                          "ci": [value - 0.005, value + 0.005]},
               "evidence": [], "next": [], "artifacts": {}, "env": {}, "duration_s": 1.0}
    return {"schema": "glmfb.run/2", "id": run_id, "started": "2026-01-01T20:00:00+00:00", "finished": None,
            "interrupted": False, "env": {}, "verdicts": [verdict],
            "summary": {"pass": 0, "warn": 0, "fail": 1, "inconclusive": 0, "error": 0}}


def planted_store(folder: Path) -> str:
    return store_of(folder, planted("kernel-step", STEP) + planted("kernel-other", [0.02] * 24, seed=1, start=100))


def test_a_verdict_with_history_gets_its_series_plot_with_the_change_point_and_this_run(tmp_path: Path) -> None:
    url = planted_store(tmp_path)
    run_id = f"run-{CURRENT:03d}"
    series = history_of_run(url, run_id)
    assert [s["definition"] for s in series] == ["kernel-step"]  # only the series this run is in
    page = render_html(run_document(run_id, 0.12), tmp_path / run_id, history=series)
    assert 'data-plot="history" data-state="drawn" data-verdict="kernel-step"' in page
    figure = page[page.index('data-plot="history"'):]
    figure = figure[:figure.index("</figure>")]
    assert "<svg" in figure  # ids are prefixed per plot on the page: v<verdict>p<plot>-
    assert re.search(r'id="v0p\d+-history-change-12"', figure) and re.search(r'id="v0p\d+-history-current"', figure)
    assert "run 12 -&gt; 13" in figure and re.search(r"worse by \+(9|10)\.\d \[", figure)  # its size, in the caption
    assert f"(run {CURRENT + 1})" in figure  # this run, numbered as the plot numbers runs


def test_without_history_or_with_one_run_of_it_there_is_no_history_plot(tmp_path: Path) -> None:
    document = run_document("run-new", 0.12)
    assert 'data-plot="history"' not in render_html(document, tmp_path / "run-new")
    url = planted_store(tmp_path)
    assert history_of_run(url, "run-new") == []  # the store has no row of this run
    assert history_of_run(f"sqlite:///{tmp_path / 'none.sqlite'}", "run-new") == []  # no store: no history
    alone = store_of(tmp_path / "alone", planted("kernel-step", [0.02]))
    assert history_of_run(alone, "run-000") == []  # one run is no history yet


def test_glmfb_report_draws_the_history_beside_the_run_folder(tmp_path: Path, monkeypatch: Any) -> None:
    import json

    monkeypatch.delenv("GLMFB_HISTORY", raising=False)
    reports = tmp_path / "reports"
    planted_store(reports)
    run_id = f"run-{CURRENT:03d}"
    (reports / run_id).mkdir()
    (reports / run_id / "run.json").write_text(json.dumps(run_document(run_id, 0.12)))
    result = CliRunner().invoke(app, ["report", str(reports / run_id / "run.json")])
    assert result.exit_code == 0, result.output
    assert 'data-plot="history" data-state="drawn"' in (reports / run_id / "report.html").read_text()
    result = CliRunner().invoke(app, ["report", str(reports / run_id / "run.json"), "--no-history"])
    assert result.exit_code == 0 and 'data-plot="history"' not in (reports / run_id / "report.html").read_text()


@pytest.mark.slow
def test_a_probe_command_draws_the_history_from_its_second_run(tmp_path: Path, toy: Path) -> None:
    out = tmp_path / "reports"
    environ = {key: value for key, value in os.environ.items() if key != "GLMFB_HISTORY"}
    environ["PYTHONPATH"] = os.pathsep.join([str(toy), str(REPO)])
    pages = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "glmfb", "toy", "--outcome", "pass", "--name", "toy-h",
                               "--out", str(out)], capture_output=True, text=True, env=environ, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "warning" not in done.stderr, done.stderr
        pages.append((out / (out / "LATEST").read_text().strip() / "report.html").read_text())
    assert 'data-plot="history"' not in pages[0]  # one run: no history yet
    assert 'data-plot="history" data-state="drawn" data-verdict="toy-h"' in pages[1]
    assert "history-current" in pages[1] and "No change point." in pages[1]


def test_the_page_is_the_same_byte_for_byte_drawn_here_or_beside_workers(tmp_path: Path) -> None:
    """A page of 8 verdicts (one with history, 7 gap verdicts with their plots) drawn by this
    process alone and beside two spawned workers: the same page."""
    from test_report_html import run_document as gap_run

    from glmfb.contract.verdict import load_document
    from glmfb.workflows.report.plots import MIN_PARALLEL_JOBS

    url = planted_store(tmp_path)
    run_id = f"run-{CURRENT:03d}"
    document = run_document(run_id, 0.12)
    gap = load_document(gap_run(tmp_path / run_id)).to_dict()["verdicts"][0]  # glmfb.verdict/2
    document["verdicts"] += [{**gap, "name": f"gap-case-{i}", "metric": {**gap["metric"], "value": 0.1 + i / 50}}
                             for i in range(7)]
    document["summary"]["fail"] = len(document["verdicts"])
    assert len(document["verdicts"]) >= MIN_PARALLEL_JOBS
    series = history_of_run(url, run_id)
    alone = render_html(document, tmp_path / run_id, history=series, workers=0)
    beside = render_html(document, tmp_path / run_id, history=series, workers=2)
    assert alone == beside
    assert alone.count('data-plot="history" data-state="drawn"') == 1
    assert alone.count('data-plot="gap-phases" data-state="drawn"') == 7


def test_a_long_series_is_read_as_its_newest_window_up_to_the_run(tmp_path: Path) -> None:
    """300 runs of a series: the report reads the newest 200 up to the run it is about (a run's
    report costs what its window costs, not the history's length), says how many the store
    holds, and finds the step inside the window; an older run's window ends at that run."""
    levels = [0.02] * 250 + [0.12] * 50
    url = store_of(tmp_path, planted("kernel-step", levels) + planted("kernel-other", [0.02] * 30, seed=1, start=400))
    (newest,) = history_of_run(url, "run-299")
    assert (newest["runs"], newest["runs_in_store"]) == (200, 300)
    assert newest["points"][0]["run_id"] == "run-100" and newest["points"][-1]["run_id"] == "run-299"
    assert [c["first_after"]["run_id"] for c in newest["change_points"]] == ["run-250"]
    (older,) = history_of_run(url, "run-120")
    assert (older["runs"], older["runs_in_store"], older["points"][-1]["run_id"]) == (121, 121, "run-120")
    page = render_html(run_document("run-299", 0.12), tmp_path / "run-299", history=[newest])
    assert "200 runs of kernel-step on m1: cpu (the newest 200 of 300), oldest first" in page
