"""A creep and a noisy series are never a clean bill (issue 53, class 6): ``--check`` reads the
trend of a series' newest runs beside its change points, flags a creep that makes no step, and
answers "cannot tell" (exit 4, ``cannot_tell`` in ``glmfb.history/1``) where the runs scatter
too much to rule out a regression of the threshold's size."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from glmfb.cli import app
from glmfb.contract.verdict import validate
from glmfb.workflows.history.changepoints import Observation, trend
from glmfb.workflows.history.series import (
    CANNOT_TELL,
    HISTORY_JSON_SCHEMA,
    PASS,
    REGRESSED,
    Series,
    build_series,
)
from glmfb.workflows.history.store import Record, open_store

runner = CliRunner()


def runs(definition: str, levels: Sequence[float], *, scatter: float, interval: float, seed: int = 0,
         start: int = 0) -> list[Record]:
    """A time series in seconds (higher is worse, by ratio): each run its level times Gaussian
    noise of ``scatter``, with an interval of +-``interval`` of its value."""
    rng = random.Random(seed)
    rows = []
    for index, level in enumerate(levels, start=start):
        value = level * (1.0 + rng.gauss(0.0, scatter))
        rows.append(Record(time=f"2026-02-{1 + index // 24:02d}T{index % 24:02d}:00:00+00:00", run_id=f"run-{index:03d}",
                           definition=definition, definition_hash="h", probe="bench", status="pass", layer="kernel",
                           metric="median_time", value=value, low=value * (1 - interval), high=value * (1 + interval),
                           unit="s", worse="higher", relative=False, commit=f"{index:040d}", dirty=False,
                           machine="m1", machine_label="m1: cpu"))
    return rows


def creep(rate: float, commits: int = 15) -> list[float]:
    return [1e-4 * (1.0 + rate * commit) for commit in range(commits)]


FLAT = [1e-4] * 15


def one(rows: Sequence[Record]) -> Series:
    [series] = build_series(rows)
    return series


def test_the_trend_is_the_least_squares_line_with_its_noise() -> None:
    found = trend([Observation(10.0 + 0.5 * i, 9.0 + 0.5 * i, 11.0 + 0.5 * i) for i in range(11)])
    assert found is not None and found.runs == 11
    assert found.start == pytest.approx(10.0) and found.change == pytest.approx(5.0) and found.scatter == pytest.approx(0.0)
    assert found.own == pytest.approx(1.0 / 1.959964, rel=1e-4)  # the intervals floor the variance of an exact line
    assert found.se > 0 and found.bound(0.95, upper=True) > 5.0 > found.bound(0.95, upper=False)
    assert trend([Observation(1.0)] * 3) is None  # two runs of freedom at least


def test_the_issues_creep_on_a_busy_host_is_never_a_clean_bill() -> None:
    # +1.5% a commit over 15 commits (+21% at the last) with a busy host's noise: the step test alone
    # often finds no change point, and then read it as a pass
    missed = 0
    for seed in range(20):
        series = one(runs("k", creep(0.015), scatter=0.05, interval=0.06, seed=seed))
        judged = series.judge(0.05)
        assert judged.status in (REGRESSED, CANNOT_TELL), (seed, judged)
        missed += series.check(0.05) is None
    assert missed > 0  # the old answer: a clean bill on some of them


@pytest.mark.parametrize("rate", [0.01, 0.015, 0.02])
def test_a_creep_on_a_quiet_host_is_a_regression_by_its_trend(rate: float) -> None:
    for seed in range(10):
        judged = one(runs("k", creep(rate), scatter=0.01, interval=0.015, seed=seed)).judge(0.05)
        assert judged.status == REGRESSED, (seed, judged)
        assert judged.worse is not None and judged.worse > 0.05


def test_a_flat_quiet_series_passes_and_a_flat_noisy_one_cannot_tell() -> None:
    for seed in range(10):
        quiet = one(runs("k", FLAT, scatter=0.005, interval=0.01, seed=seed)).judge(0.05)
        assert quiet.status == PASS and "ruled out" in quiet.reason, (seed, quiet)
        noisy = one(runs("k", FLAT, scatter=0.10, interval=0.15, seed=seed)).judge(0.05)
        assert noisy.status == CANNOT_TELL and "cannot be ruled out" in noisy.reason, (seed, noisy)
        assert noisy.creep is not None and noisy.creep.resolution > 0.05  # the noise alone leaves more open


def test_wide_run_intervals_alone_make_a_flat_series_cannot_tell() -> None:
    # values that sit close, each run saying it is known to +-20%: the runs are read as that uncertain
    judged = one(runs("k", FLAT, scatter=0.001, interval=0.20)).judge(0.05)
    assert judged.status == CANNOT_TELL and judged.creep is not None and judged.creep.own > 0.05


def test_too_few_runs_cannot_tell() -> None:
    judged = one(runs("k", FLAT[:3], scatter=0.001, interval=0.001)).judge(0.05)
    assert judged.status == CANNOT_TELL and "too few" in judged.reason


def test_a_creep_after_a_step_back_is_read_in_the_newest_segment_only() -> None:
    # an improvement (-30%) then a flat newest segment: the improvement is no creep, and the runs
    # before it are not read
    levels = [1.3e-4] * 10 + [1e-4] * 12
    series = one(runs("k", levels, scatter=0.005, interval=0.01))
    judged = series.judge(0.05)
    assert series.steps and judged.status == PASS and judged.creep is not None and judged.creep.start == 10


def store_of(tmp_path: Path, rows: Sequence[Record]) -> str:
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    with open_store(url) as store:
        store.record(rows)
    return url


def history(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["history", *args], env={"COLUMNS": "400"})
    return result.exit_code, result.stdout, result.stderr


def test_check_exits_1_on_a_creep_4_on_a_noisy_series_and_0_on_a_quiet_flat_one(tmp_path: Path) -> None:
    url = store_of(tmp_path, runs("creep", creep(0.015), scatter=0.05, interval=0.06, seed=4)
                   + runs("noisy", FLAT, scatter=0.10, interval=0.15, seed=4, start=100)
                   + runs("quiet", FLAT, scatter=0.005, interval=0.01, seed=5, start=200))
    code, output, stderr = history("--history", url, "--check", "--json")
    document = json.loads(output)
    validate(document, HISTORY_JSON_SCHEMA)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(HISTORY_JSON_SCHEMA).validate(document)
    by_name = {s["definition"]: s for s in document["series"]}
    assert by_name["creep"]["change_points"] == []  # no step: the step test alone passed it (the bug)
    assert by_name["creep"]["check"]["status"] == REGRESSED and by_name["creep"]["regressed"] is True
    assert "creep" in by_name["creep"]["check"]["reason"] and by_name["creep"]["check"]["worse"] > 0.05
    assert by_name["noisy"]["check"]["status"] == CANNOT_TELL and by_name["noisy"]["regressed"] is False
    assert by_name["noisy"]["check"]["trend"]["resolution"] > 0.05
    assert by_name["quiet"]["check"]["status"] == PASS
    assert (code, document["regressed"], document["cannot_tell"], document["exit_code"]) == (1, 1, 1, 1)
    assert "cannot tell" in stderr and "noisy" in stderr

    code, output, stderr = history("--history", url, "--check", "--json", "noisy", "quiet")
    document = json.loads(output)
    assert (code, document["regressed"], document["cannot_tell"], document["exit_code"]) == (4, 0, 1, 4)
    assert "cannot be ruled out" in stderr
    assert history("--history", url, "--check", "quiet")[0] == 0
    code, table, _ = history("--history", url, "--check", "noisy")
    assert code == 4 and "CANNOT TELL" in table and "cannot be ruled out" in table
    unchecked = json.loads(history("--history", url, "--json")[1])
    assert "cannot_tell" not in unchecked and all("check" not in s for s in unchecked["series"])


def test_the_mcp_history_tool_gives_the_same_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from glmfb.workflows.mcp.boundary import Boundary
    from glmfb.workflows.mcp.tools import CallContext, Toolbox

    monkeypatch.delenv("GLMFB_HISTORY", raising=False)
    root = tmp_path / "project"
    (root / "reports").mkdir(parents=True)
    store_of(root / "reports", runs("noisy", FLAT, scatter=0.10, interval=0.15, seed=4))
    box = Toolbox(Boundary(root))
    ctx = CallContext(run_id="", progress=lambda message: None, cancel=threading.Event(),
                      deadline=time.monotonic() + 300, slot=threading.Lock())
    answer = box.prepare("history", {"check": True}).work(ctx)
    import jsonschema

    schema = box.tools["history"].output_schema
    assert schema is not None
    jsonschema.validate(answer.structured, schema)
    assert (answer.structured["regressed"], answer.structured["cannot_tell"], answer.structured["exit_code"]) == (0, 1, 4)
    assert "CANNOT TELL" in answer.text and "exit code 4" in answer.text


def test_a_metric_where_lower_is_worse_creeps_the_other_way() -> None:
    falling = [record.__class__(**{**record.__dict__, "worse": "lower"})
               for record in runs("k", [1e-4 * (1.0 - 0.015 * c) for c in range(15)], scatter=0.01, interval=0.015)]
    judged = one(falling).judge(0.05)
    assert judged.status == REGRESSED and judged.creep is not None and judged.creep.worse > 0.05
    rising = [record.__class__(**{**record.__dict__, "worse": "lower"})
              for record in runs("k", creep(0.015), scatter=0.01, interval=0.015)]
    assert one(rising).judge(0.05).status == PASS  # higher is better here
