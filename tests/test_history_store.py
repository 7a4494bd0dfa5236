"""The history store on SQLite: what a real ``glmfb run`` and a probe command record (and
``--no-history``, ``--history``, ``$GLMFB_HISTORY``, a store that cannot be written), two
processes writing at once without losing a row, and a database of an older schema migrated
forward when opened (one of a newer schema refused)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from glmfb.workflows.history.record import definition_digest, machine_of
from glmfb.workflows.history.store import (
    MIGRATIONS,
    SCHEMA_VERSION,
    SQLITE,
    HistoryError,
    Record,
    migrate,
    open_store,
)
from glmfb.workflows.suite import discover, load_definitions, select

REPO = Path(__file__).resolve().parents[1]
FAST = "scan-state-update-fp32"  # the fastest bundled definition (a small diff, ~4 s)


def glmfb(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    environ = {key: value for key, value in os.environ.items() if key != "GLMFB_HISTORY"}
    environ["PYTHONPATH"] = str(REPO)
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "glmfb", *args], capture_output=True, text=True, cwd=cwd,
                          env=environ, timeout=300)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def rows(url: str) -> list[Record]:
    with open_store(url, create=False) as store:
        return store.records()


@pytest.mark.slow
def test_a_real_run_records_each_verdict_with_its_definition_commit_and_machine(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    ran = glmfb("run", "probes/diff.toml", "-k", FAST, "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    run = json.loads((out / (out / "LATEST").read_text().strip() / "run.json").read_text())
    [record] = rows(f"sqlite:///{out / 'history.sqlite'}")
    [verdict] = run["verdicts"]
    [definition] = select(load_definitions(discover([REPO / "probes" / "diff.toml"])), [FAST])
    assert (record.run_id, record.time, record.definition) == (run["id"], run["started"], FAST)
    assert record.definition_hash == definition_digest(definition)
    assert (record.probe, record.status, record.layer) == ("diff", verdict["status"], "numerics")
    assert (record.metric, record.value, record.unit) == ("output_rel_l2", verdict["metric"]["value"], "")
    assert (record.worse, record.relative) == ("higher", False)
    assert record.where == verdict["where"]
    assert record.commit == git("rev-parse", "HEAD")
    assert record.dirty == bool(git("status", "--porcelain", "--untracked-files=no"))
    assert (record.machine, record.machine_label) == machine_of(verdict["env"])
    assert record.glmfb_version and "AMD" not in record.machine  # a hash, not the label



@pytest.mark.slow
def test_a_probe_command_records_and_a_store_that_cannot_be_written_is_a_warning(tmp_path: Path, toy: Path) -> None:
    out, elsewhere = tmp_path / "reports", tmp_path / "elsewhere.sqlite"
    with_toy = {"PYTHONPATH": os.pathsep.join([str(toy), str(REPO)])}
    command = glmfb("toy", "--outcome", "pass", "--name", "toy-one", "--out", str(out),
                    env={**with_toy, "GLMFB_HISTORY": f"sqlite:///{elsewhere}"})  # the store $GLMFB_HISTORY names
    assert command.returncode == 0, command.stderr
    [record] = rows(f"sqlite:///{elsewhere}")
    assert (record.definition, record.probe, record.metric) == ("toy-one", "toy", "value")
    assert record.commit == git("rev-parse", "HEAD") and record.definition_hash  # the working folder's repository
    assert not (out / "history.sqlite").exists()

    skipped = glmfb("toy", "--outcome", "pass", "--out", str(out), "--no-history", env=with_toy)
    assert skipped.returncode == 0 and not (out / "history.sqlite").exists()

    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    failed = glmfb("toy", "--outcome", "fail", "--out", str(out), "--history", f"sqlite:///{blocked}/h.sqlite",
                   env=with_toy)
    assert failed.returncode == 1, failed.stderr  # the verdict's own exit code: recording changed nothing
    warnings = [line for line in failed.stderr.splitlines() if line.startswith("glmfb: warning:")]
    assert len(warnings) == 1 and "not recorded in the history" in warnings[0], failed.stderr
    newest = out / (out / "LATEST").read_text().strip() / "run.json"
    assert json.loads(newest.read_text())["verdicts"][0]["status"] == "fail"


def test_a_url_that_names_no_store_is_refused_before_anything_runs(tmp_path: Path) -> None:
    ran = glmfb("run", "probes/diff.toml", "-k", FAST, "--out", str(tmp_path), "--history", "reports/h.sqlite")
    assert ran.returncode == 2 and "names no store" in ran.stderr and len(ran.stderr.splitlines()) == 1
    assert not list(tmp_path.glob("*/run.json"))


WRITER = textwrap.dedent("""
    import sys
    from glmfb.workflows.history.store import Record, open_store

    url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for index in range(count):  # a transaction per row, as a run records each of its runs
        with open_store(url) as store:
            store.record([Record(time=f"2026-01-01T00:00:{index % 60:02d}+00:00", run_id=f"{name}-{index}",
                                 definition=name, definition_hash=None, probe="bench", status="pass",
                                 layer="kernel", metric="time_change", value=index / count)])
""")


@pytest.mark.slow
def test_two_processes_writing_at_once_lose_no_row(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    count = 150
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, str(script), url, name, str(count)], env=environ,
                                stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    for writer in writers:
        _, errors = writer.communicate(timeout=120)
        assert writer.returncode == 0, errors
    written = rows(url)
    assert len(written) == 2 * count
    assert {r.run_id for r in written} == {f"{name}-{i}" for name in "ab" for i in range(count)}


def test_a_database_of_an_older_schema_is_migrated_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    old = sqlite3.connect(path, isolation_level=None)
    old.execute("BEGIN IMMEDIATE")
    assert migrate(old, SQLITE, target=1) == 1  # the database as the first schema wrote it
    old.execute("COMMIT")
    columns = [row[1] for row in old.execute("PRAGMA table_info(verdicts)")]
    old.execute(f"INSERT INTO verdicts ({', '.join(columns[1:])}) VALUES ({', '.join('?' * (len(columns) - 1))})",
                ("2026-01-01T00:00:00+00:00", "r1", "d", None, "bench", "pass", "kernel", "time_change", 0.01, 0.0,
                 0.02, "fraction", 0.05, "higher", 1, "{}", "abc", 0, "m", "label", "0.1.0"))
    assert not old.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND name = 'verdicts_series'").fetchall()
    old.close()

    with open_store(f"sqlite:///{path}") as store:
        assert store.version == SCHEMA_VERSION == len(MIGRATIONS) > 1
        [record] = store.records()
    assert (record.run_id, record.value, record.low, record.high, record.relative) == ("r1", 0.01, 0.0, 0.02, True)
    check = sqlite3.connect(path)
    assert check.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND name = 'verdicts_series'").fetchall()
    assert [v for (v,) in check.execute("SELECT version FROM schema_version ORDER BY version")] == [1, 2, 3]
    check.close()


def test_a_database_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    open_store(url).close()
    newer = sqlite3.connect(tmp_path / "history.sqlite", isolation_level=None)
    newer.execute("INSERT INTO schema_version (version, applied) VALUES (?, ?)", (SCHEMA_VERSION + 1, "later"))
    newer.close()
    with pytest.raises(HistoryError, match="newer glmfb"):
        open_store(url)


def test_reading_a_history_that_was_never_written_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="no history at"):
        open_store(f"sqlite:///{tmp_path / 'missing.sqlite'}", create=False)
    assert not (tmp_path / "missing.sqlite").exists()
