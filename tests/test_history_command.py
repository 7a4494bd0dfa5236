"""``glmfb history`` on a store of planted series: a series per definition, metric and machine
(machines mixed only with ``--all-machines``), the change point named by its runs and commits
with its size and confidence, the ``glmfb.history/1`` document valid against its schema, the
CSV file, ``--check``'s exit codes, and one-line errors (exit 2) for an empty history or a bad
URL."""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from glmfb.cli import app
from glmfb.contract.verdict import validate
from glmfb.workflows.history.series import HISTORY_JSON_SCHEMA
from glmfb.workflows.history.store import Record, open_store

runner = CliRunner()


def planted(definition: str, levels: Sequence[float], *, machine: str = "m1", metric: str = "time_change",
            relative: bool = True, seed: int = 0, start: int = 0) -> list[Record]:
    """One run per level, each with noise of 0.3% and an interval of +-0.5%, commit c<index>."""
    rng = random.Random(seed)
    rows = []
    for index, level in enumerate(levels, start=start):
        value = level + rng.gauss(0.0, 0.003)
        rows.append(Record(time=f"2026-01-{1 + index // 24:02d}T{index % 24:02d}:00:00+00:00", run_id=f"run-{index:03d}",
                           definition=definition, definition_hash="h", probe="bench", status="pass", layer="kernel",
                           metric=metric, value=value, low=value - 0.005, high=value + 0.005,
                           unit="fraction" if relative else "s", worse="higher", relative=relative,
                           commit=commit(index), dirty=False, machine=machine, machine_label=f"{machine}: cpu"))
    return rows


def commit(index: int) -> str:
    return f"{index:03d}".ljust(40, "a")


def store_of(tmp_path: Path, rows: Sequence[Record]) -> str:
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    with open_store(url) as store:
        store.record(rows)
    return url


def history(*args: str) -> tuple[int, str]:
    """The exit code and stdout (stderr too, where stdout is empty: an error)."""
    result = runner.invoke(app, ["history", *args], env={"COLUMNS": "400"})  # a table row on one line
    return result.exit_code, result.stdout or result.output


STEP = [0.02] * 12 + [0.12] * 12  # +10 points of the baseline's time at run 12
FLAT = [0.02] * 24


def test_a_step_is_named_by_its_runs_and_commits_with_its_size_and_confidence(tmp_path: Path) -> None:
    url = store_of(tmp_path, planted("kernel-step", STEP) + planted("kernel-flat", FLAT, seed=1, start=100))
    code, output = history("--history", url, "--json")
    assert code == 0, output
    document = json.loads(output)
    validate(document, HISTORY_JSON_SCHEMA)
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(HISTORY_JSON_SCHEMA).validate(document)
    assert document["schema"] == "glmfb.history/1"
    by_name = {s["definition"]: s for s in document["series"]}
    assert set(by_name) == {"kernel-step", "kernel-flat"} and by_name["kernel-flat"]["change_points"] == []
    step = by_name["kernel-step"]
    assert step["runs"] == 24 and step["newest"]["run_id"] == "run-023"
    [point] = step["change_points"]
    assert point["index"] == 12
    assert point["last_before"]["run_id"] == "run-011" and point["last_before"]["commit"] == commit(11)
    assert point["first_after"]["run_id"] == "run-012" and point["first_after"]["commit"] == commit(12)
    low, high = point["regression_ci"]
    assert low < 0.10 < high and abs(point["regression"] - 0.10) < 0.01  # points of the baseline: a difference
    assert point["confidence"] > 0.99
    where = point["location"]  # a clean 10-point step: its start is the one run
    assert (where["earliest"], where["latest"], where["nominal"]) == (12, 12, 0.95)
    assert where["earliest_run"] == where["latest_run"] == point["first_after"]

    code, table = history("--history", url, "step")  # a pattern: the rich table of that series only
    assert code == 0 and "kernel-step" in table and "kernel-flat" not in table
    assert "run 12 -> 13" in table and f"({commit(11)[:10]}..{commit(12)[:10]})" in table and "worse by +10" in table and "confidence" in table


def test_check_fails_on_a_newest_segment_worse_than_the_threshold_and_passes_otherwise(tmp_path: Path) -> None:
    creeping = [0.02] * 10 + [0.05] * 10  # +3 points: under 5%, over 2%
    better = [0.12] * 12 + [0.02] * 12  # a step down: an improvement for a cost
    url = store_of(tmp_path, planted("step", STEP) + planted("creep", creeping, seed=2, start=100)
                   + planted("better", better, seed=3, start=200) + planted("flat", FLAT, seed=4, start=300))
    assert history("--history", url, "--check", "step")[0] == 1
    assert history("--history", url, "--check")[0] == 1  # one series of four is enough
    assert history("--history", url, "--check", "creep")[0] == 0  # +3 points is within 5%
    assert history("--history", url, "--check", "--threshold", "2%", "creep")[0] == 1
    assert history("--history", url, "--check", "better", "flat")[0] == 0
    code, output = history("--history", url, "--check", "--json", "step", "flat")
    document = json.loads(output)
    assert code == 1 and document["regressed"] == 1 and document["threshold"] == 0.05
    assert {s["definition"]: s["regressed"] for s in document["series"]} == {"step": True, "flat": False}


def test_a_quantity_is_compared_as_a_fraction_of_its_level_before(tmp_path: Path) -> None:
    seconds = [1.0] * 12 + [1.08] * 12  # +8% of the level: over 5%
    url = store_of(tmp_path, planted("median", seconds, metric="median_time", relative=False))
    code, output = history("--history", url, "--check", "--json")
    [series] = json.loads(output)["series"]
    assert code == 1 and abs(series["change_points"][0]["regression"] - 0.08) < 0.01
    assert history("--history", url, "--check", "--threshold", "10%")[0] == 0


def test_machines_are_never_mixed_unless_asked(tmp_path: Path) -> None:
    # the same definition on two machines whose levels differ by 10 points: no change point in either
    url = store_of(tmp_path, planted("k", [0.02] * 12, machine="m1")
                   + planted("k", [0.12] * 12, machine="m2", seed=5, start=12))
    document = json.loads(history("--history", url, "--json")[1])
    assert [(s["machine"], s["runs"], s["change_points"]) for s in document["series"]] == [("m1", 12, []), ("m2", 12, [])]
    mixed = json.loads(history("--history", url, "--json", "--all-machines")[1])
    [series] = mixed["series"]
    assert series["machine"] is None and series["runs"] == 24 and len(series["change_points"]) == 1


def test_csv_holds_every_run_with_its_segment(tmp_path: Path) -> None:
    url = store_of(tmp_path, planted("kernel-step", STEP))
    target = tmp_path / "history.csv"
    code, _ = history("--history", url, "--csv", str(target))
    assert code == 0
    with target.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 24 and rows[0]["run_id"] == "run-000" and rows[0]["commit"] == commit(0)
    assert [row["segment"] for row in rows] == ["0"] * 12 + ["1"] * 12


@pytest.mark.parametrize(("args", "message"), [
    (["--history", "reports/history.sqlite"], "names no store"),
    (["--history", "sqlite:///{tmp}/missing.sqlite"], "no history at"),
    (["--history", "sqlite:///{tmp}/empty.sqlite"], "holds no verdicts"),
    (["--history", "sqlite:///{tmp}/one.sqlite", "nothing-like-it"], "matches 'nothing-like-it'"),
    (["--history", "sqlite:///{tmp}/one.sqlite", "--check", "--threshold", "5"], "--threshold 5"),
])
def test_an_empty_history_or_a_bad_url_is_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    open_store(f"sqlite:///{tmp_path / 'empty.sqlite'}").close()
    with open_store(f"sqlite:///{tmp_path / 'one.sqlite'}") as store:
        store.record(planted("k", FLAT[:3]))
    code, output = history(*[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and message in output and len(output.strip().splitlines()) == 1, output


def test_the_history_schema_is_printed_by_glmfb_schema() -> None:
    result = runner.invoke(app, ["schema", "history"])
    assert result.exit_code == 0 and json.loads(result.output) == HISTORY_JSON_SCHEMA


def test_check_adds_up_a_creep_cut_into_steps_each_under_the_threshold(tmp_path: Path) -> None:
    """+3 points, then +3 more: each step is under 5%, the two together are not; a step back
    down after them ends the chain (an improvement is never a regression)."""
    stairs = [0.02] * 10 + [0.05] * 10 + [0.08] * 10
    fixed = stairs + [0.02] * 10
    url = store_of(tmp_path, planted("stairs", stairs, seed=3) + planted("fixed", fixed, seed=4, start=100))
    code, out = history("--history", url, "--json", "stairs")
    assert code == 0, out
    assert len(json.loads(out)["series"][0]["change_points"]) == 2, out
    assert history("--history", url, "--check", "stairs")[0] == 1  # +6 points since run 9
    assert history("--history", url, "--check", "--threshold", "7%", "stairs")[0] == 0
    assert history("--history", url, "--check", "fixed")[0] == 0
