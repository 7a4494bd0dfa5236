"""report.html as a page: built from run JSON, links relative to the page, one broken plot
never breaks it, and ``glmfb report`` re-renders a saved run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from glmfb.contract.verdict import load_document
from glmfb.gap import plots as gap_plots
from glmfb.workflows.report.html import render_html, write_html
from glmfb.workflows.report.plots import PlotSpec

ROOT = Path(__file__).resolve().parents[1]
RUN_ID = "20260101-000000-abcd"


def run_document(run_dir: Path) -> dict[str, Any]:
    """A run with one gap verdict whose artifact lies in the run folder, as glmfb run writes it
    (paths relative to where the run started: reports/<run-id>/...)."""
    (run_dir / "gap-case").mkdir(parents=True, exist_ok=True)
    (run_dir / "gap-case" / "trace.txt").write_text("trace\n")
    evidence = [
        {"kind": "gap", "gap": 0.25, "ci": [0.15, 0.44], "confidence": 0.95, "threshold": 0.05,
         "baseline_median_s": 0.57, "candidate_median_s": 0.71, "iterations_per_side": 8},
        {"kind": "phase", "phase": "prefill_s", "baseline_s": 0.57, "candidate_s": 0.57, "change": 0.0,
         "ci": [-0.01, 0.01], "concurrent": False},
        {"kind": "phase", "phase": "kv_wait_s", "baseline_s": None, "candidate_s": 0.14, "change": None,
         "ci": None, "concurrent": False},
        {"kind": "transfer", "side": "candidate", "transfer_path": "tcp"},
    ]
    verdict = {"schema": "glmfb.verdict/1", "probe": "gap", "name": "gap-case", "status": "fail",
               "layer": "transfer", "where": {"thread": "kv-transfer"}, "why": "the transfer thread starved",
               "metric": {"name": "gap", "value": 0.25, "unit": "ratio", "threshold": 0.05, "ci": [0.15, 0.44]},
               "evidence": evidence, "next": ["glmfb gap a b"],
               "artifacts": {"trace": f"reports/{RUN_ID}/gap-case/trace.txt",
                             "gone": f"reports/{RUN_ID}/gap-case/gone.txt"},
               "env": {}, "duration_s": 2.0}
    return {"schema": "glmfb.run/1", "id": RUN_ID, "started": "2026-01-01T00:00:00+00:00", "finished": None,
            "interrupted": False, "env": {}, "verdicts": [verdict],
            "summary": {"pass": 0, "warn": 0, "fail": 1, "inconclusive": 0, "error": 0}}


def test_page_from_json_and_from_the_run_object_are_the_same(tmp_path: Path) -> None:
    run_dir = tmp_path / RUN_ID
    document = run_document(run_dir)
    assert render_html(document, run_dir) == render_html(load_document(document), run_dir)


def test_a_single_verdict_gets_a_page(tmp_path: Path) -> None:
    run_dir = tmp_path / RUN_ID
    verdict = load_document(run_document(run_dir)).verdicts[0]
    page = render_html(verdict, run_dir)
    assert 'data-verdict="gap-case"' in page and 'data-plot="gap-phases" data-state="drawn"' in page
    assert render_html(verdict.to_dict(), run_dir) == page


def test_page_is_self_contained_with_named_plots(tmp_path: Path) -> None:
    run_dir = tmp_path / RUN_ID
    page = render_html(run_document(run_dir), run_dir)
    assert not re.search(r"<script|<link|<img|<iframe|\bsrc=|@import|url\(http", page)
    assert 'data-plot="gap-phases" data-state="drawn"' in page
    assert 'data-plot="gap-interval" data-state="drawn"' in page
    # no bandwidth evidence: said, not drawn
    assert re.search(r'data-plot="gap-bandwidth" data-state="missing">Not drawn, [^<]*no bandwidth evidence', page)
    # evidence the plots did not use is kept, collapsed
    assert re.search(r"<details><summary>evidence not plotted \(1: transfer\)</summary>", page)


def test_artifact_links_are_relative_to_the_page_and_resolve(tmp_path: Path) -> None:
    run_dir = tmp_path / "moved" / RUN_ID
    page_path = write_html(run_document(run_dir), run_dir)
    page = page_path.read_text()
    hrefs = re.findall(r'<a href="([^"#][^"]*)" data-artifact="([^"]+)"', page)
    assert ("gap-case/trace.txt", "trace") in hrefs
    for href, _ in hrefs:
        assert (page_path.parent / href).is_file()
    assert 'data-artifact="gone">reports/' in page and "(not found)" in page
    assert not list(run_dir.glob(".*.tmp"))


def test_a_page_written_elsewhere_links_back_into_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / RUN_ID
    out = tmp_path / "pages" / "r.html"
    page = write_html(run_document(run_dir), run_dir, out).read_text()
    assert f'href="../{RUN_ID}/gap-case/trace.txt"' in page


def test_one_broken_plot_does_not_break_the_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(view: Any) -> Any:
        raise RuntimeError("boom")

    broken = PlotSpec("gap-broken", "a broken plot", ("gap",), explode)
    monkeypatch.setattr(gap_plots, "PLOTS", (*gap_plots.PLOTS, broken))  # the plots gap's report section names
    run_dir = tmp_path / RUN_ID
    page = render_html(run_document(run_dir), run_dir)
    assert re.search(r'data-plot="gap-broken" data-state="error">The plot a broken plot could not be drawn '
                     r"\(RuntimeError: boom\)", page)
    assert 'data-plot="gap-phases" data-state="drawn"' in page


def glmfb(*args: str, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from typer.testing import CliRunner

    from glmfb.cli import app

    monkeypatch.chdir(cwd)
    return CliRunner().invoke(app, list(args))


def test_report_command_rerenders_a_saved_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "reports" / RUN_ID
    (run_dir / "run.json").parent.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(run_document(run_dir)))
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    result = glmfb("report", str(run_dir / "run.json"), cwd=elsewhere, monkeypatch=monkeypatch)  # not where it ran
    assert result.exit_code == 0, result.output
    page = (run_dir / "report.html").read_text()
    assert 'href="gap-case/trace.txt"' in page and 'href="run.json"' in page


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no such file"), ("{not json", "not valid JSON"), ('{"schema": "other/1"}', "is not a glmfb run")],
)
def test_report_command_bad_input_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None, message: str
) -> None:
    source = tmp_path / "run.json"
    if content is not None:
        source.write_text(content)
    result = glmfb("report", str(source), cwd=tmp_path, monkeypatch=monkeypatch)
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "report.html").exists()


def test_help_and_gate_do_not_import_matplotlib(tmp_path: Path) -> None:
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps(run_document(tmp_path / RUN_ID)))
    code = (
        "import sys\nfrom glmfb.cli import app\n"
        f"for args in (['--help'], ['gate', {str(run_file)!r}]):\n"
        "    try:\n        app(args, prog_name='glmfb')\n    except SystemExit:\n        pass\n"
        "print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr
