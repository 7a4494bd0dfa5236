"""A history store that another connection keeps locked costs a run a bounded wait and one
warning line, never the run: PostgreSQL with another session holding ``LOCK TABLE verdicts IN
SHARE MODE`` (the lock an index build takes; recording waited forever), SQLite with another
connection in ``BEGIN EXCLUSIVE`` (a run answered after 153 s: five 30 s busy timeouts in a
row). The bound is ``$GLMFB_HISTORY_TIMEOUT_S`` here, a couple of seconds, and each recording
runs in a thread the test gives up on past a wide margin, so the old code fails the test
instead of hanging it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, TypeVar

import pytest
from test_history_postgres import Server, record

from glmfb.workflows.history.store import (
    LOCK_WAIT_ENV,
    LOCK_WAIT_S,
    HistoryError,
    describe,
    lock_wait_s,
    open_store,
)

REPO = Path(__file__).resolve().parents[1]
BOUND_S = 2.0  # the bound these tests set through $GLMFB_HISTORY_TIMEOUT_S
T = TypeVar("T")


def within(seconds: float, work: Callable[[], T], release: Callable[[], None]) -> tuple[T | BaseException, float]:
    """``work()``'s result (or what it raised) and how long it took; a test failure when it is
    still going after ``seconds``. ``release()`` (the holder's lock let go) runs in every case,
    so a ``work`` that waits on the lock ends either way and leaves no thread behind."""
    pool = ThreadPoolExecutor(max_workers=1)
    started = time.monotonic()
    future = pool.submit(work)
    try:
        outcome: T | BaseException = future.result(timeout=seconds)
    except FutureTimeout:
        pytest.fail(f"still waiting on the lock after {seconds:g} s: recording is not bounded")
    except Exception as exc:  # what work raised: the caller checks it
        outcome = exc
    finally:
        elapsed = time.monotonic() - started
        release()
        pool.shutdown(wait=True)
    return outcome, elapsed


def write_one(url: str, index: int) -> Callable[[], int]:
    def work() -> int:
        with open_store(url) as store:
            return store.record([record(index)])

    return work


def assert_bounded_refusal(outcome: object, elapsed: float, url: str, *, limit_s: float) -> None:
    assert isinstance(outcome, HistoryError), repr(outcome)
    message = str(outcome)
    assert "\n" not in message and describe(url) in message, message
    assert f"locked or busy for {BOUND_S:g} s" in message and LOCK_WAIT_ENV in message, message
    assert elapsed < limit_s, elapsed
    assert elapsed >= BOUND_S * 0.9, elapsed  # it did wait: a short lock would have been waited out


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def postgres() -> Iterator[Server]:
    running = Server()
    running.start()
    try:
        yield running
    finally:
        running.stop()


def test_postgresql_recording_under_a_share_lock_gives_up_within_the_bound(postgres: Server,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Another session holds the lock ``CREATE INDEX`` takes in an open transaction: recording
    is refused within the bound (3x as margin) with a one-line message naming the store; once
    the lock is let go, recording works again."""
    import psycopg

    url = postgres.create_database()
    with open_store(url) as store:
        assert store.record([record(0)]) == 1
    monkeypatch.setenv(LOCK_WAIT_ENV, str(BOUND_S))
    holder = psycopg.connect(url)  # not autocommit: the lock lasts until the rollback
    holder.execute("LOCK TABLE verdicts IN SHARE MODE")
    outcome, elapsed = within(3 * BOUND_S + 5, write_one(url, 1), holder.rollback)
    try:
        assert_bounded_refusal(outcome, elapsed, url, limit_s=3 * BOUND_S)
        assert write_one(url, 2)() == 1  # the lock let go: recording works
        with open_store(url) as store:
            assert [r.run_id for r in store.records()] == ["r0", "r2"]
    finally:
        holder.close()


def test_postgresql_reading_under_an_exclusive_lock_gives_up_within_the_bound(postgres: Server,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's report reads the history too: an ``ACCESS EXCLUSIVE`` lock (``ALTER TABLE``,
    ``VACUUM FULL``) holds a read, and the connection's ``lock_timeout`` bounds that wait."""
    import psycopg

    url = postgres.create_database()
    with open_store(url) as store:
        store.record([record(0)])
        assert store.connection.execute("SHOW lock_timeout").fetchone()[0] == f"{LOCK_WAIT_S:g}s"
    monkeypatch.setenv(LOCK_WAIT_ENV, str(BOUND_S))
    holder = psycopg.connect(url)
    holder.execute("LOCK TABLE verdicts IN ACCESS EXCLUSIVE MODE")

    def read() -> Any:
        with open_store(url) as store:
            return store.records()

    outcome, elapsed = within(3 * BOUND_S + 5, read, holder.rollback)
    holder.close()
    assert isinstance(outcome, HistoryError) and "cannot read the history" in str(outcome), repr(outcome)
    assert describe(url) in str(outcome) and elapsed < 3 * BOUND_S, (str(outcome), elapsed)


# --------------------------------------------------------------------------------------------
# SQLite
# --------------------------------------------------------------------------------------------


def exclusive(path: Path) -> sqlite3.Connection:
    """Another connection to ``path`` in ``BEGIN EXCLUSIVE`` (an open ``sqlite3`` shell, say)."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)  # let go from a timer
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def test_sqlite_recording_under_an_exclusive_lock_gives_up_within_the_bound(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    assert write_one(url, 0)() == 1  # a store in WAL mode, as glmfb leaves it
    monkeypatch.setenv(LOCK_WAIT_ENV, str(BOUND_S))
    holder = exclusive(tmp_path / "history.sqlite")
    outcome, elapsed = within(20, write_one(url, 1), holder.rollback)
    holder.close()
    assert_bounded_refusal(outcome, elapsed, url, limit_s=20)
    assert write_one(url, 2)() == 1
    with open_store(url) as store:
        assert [r.run_id for r in store.records()] == ["r0", "r2"]


def test_sqlite_a_file_locked_before_glmfb_first_opened_it_gives_up_within_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No WAL yet (a file another program created and holds): opening, which switches the
    journal mode, is bounded too."""
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    monkeypatch.setenv(LOCK_WAIT_ENV, str(BOUND_S))
    holder = exclusive(tmp_path / "history.sqlite")
    outcome, elapsed = within(20, write_one(url, 0), holder.rollback)
    holder.close()
    assert_bounded_refusal(outcome, elapsed, url, limit_s=20)


def test_sqlite_a_lock_let_go_within_the_bound_is_waited_out(tmp_path: Path) -> None:
    """The bound is a bound, not a refusal: a writer that holds the lock for a moment is waited
    for, and the row is written."""
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    write_one(url, 0)()
    holder = exclusive(tmp_path / "history.sqlite")
    letting_go = threading.Timer(1.0, holder.rollback)
    letting_go.start()
    try:
        with open_store(url, wait_s=10) as store:
            assert store.record([record(1)]) == 1
    finally:
        letting_go.join()
        holder.close()


def test_a_run_on_a_locked_history_answers_with_one_warning(tmp_path: Path, toy: Path) -> None:
    """The tester's case end to end: a probe command whose history another connection holds in
    ``BEGIN EXCLUSIVE`` gives its verdict's exit code, and one warning line, within the bound."""
    path = tmp_path / "history.sqlite"
    write_one(f"sqlite:///{path}", 0)()
    environ = {key: value for key, value in os.environ.items() if key != "GLMFB_HISTORY"}
    environ.update({"PYTHONPATH": os.pathsep.join([str(toy), str(REPO)]), LOCK_WAIT_ENV: str(BOUND_S)})
    holder = exclusive(path)
    try:
        started = time.monotonic()
        ran = subprocess.run([sys.executable, "-m", "glmfb", "toy", "--outcome", "fail", "--out",
                              str(tmp_path / "reports"), "--history", f"sqlite:///{path}"],
                             capture_output=True, text=True, cwd=REPO, env=environ, timeout=60)
        elapsed = time.monotonic() - started
    finally:
        holder.rollback()
        holder.close()
    assert ran.returncode == 1, ran.stderr  # the verdict's own exit code
    warnings = [line for line in ran.stderr.splitlines() if line.startswith("glmfb: warning:")]
    assert len(warnings) == 1 and f"locked or busy for {BOUND_S:g} s" in warnings[0], ran.stderr
    assert elapsed < 30, elapsed


@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan"])
def test_a_bound_that_is_no_number_of_seconds_is_refused(value: str) -> None:
    with pytest.raises(HistoryError, match=LOCK_WAIT_ENV):
        lock_wait_s({LOCK_WAIT_ENV: value})
    assert lock_wait_s({}) == LOCK_WAIT_S and lock_wait_s({LOCK_WAIT_ENV: " 2.5 "}) == 2.5


def test_glmfb_run_on_a_share_locked_postgresql_writes_its_report_and_junit_and_warns_once(
        postgres: Server, tmp_path: Path, toy: Path) -> None:
    """The tester's case, through ``glmfb run``: another session holds ``LOCK TABLE verdicts IN
    SHARE MODE``. Before, the run waited forever after run.json, and a SIGTERM at 60 s said
    "before anything could be written" with no report.html or junit.xml. Now the run answers
    within the bound with its verdicts' exit code, one warning naming the store, and every
    artifact of the run (the report reads the history: a SHARE lock lets reads through)."""
    import psycopg

    url = postgres.create_database()
    with open_store(url) as store:
        store.record([record(0)])
    (tmp_path / "p.toml").write_text('[[probe]]\nname = "toy-check"\nprobe = "toy"\noptions = { outcome = "pass" }\n')
    environ = {key: value for key, value in os.environ.items() if key != "GLMFB_HISTORY"}
    environ.update({"PYTHONPATH": os.pathsep.join([str(toy), str(REPO)]), LOCK_WAIT_ENV: str(BOUND_S)})
    holder = psycopg.connect(url)
    holder.execute("LOCK TABLE verdicts IN SHARE MODE")
    try:
        started = time.monotonic()
        ran = subprocess.run([sys.executable, "-m", "glmfb", "run", "p.toml", "--out", "reports", "--history", url],
                             capture_output=True, text=True, cwd=tmp_path, env=environ, timeout=120)
        elapsed = time.monotonic() - started
    finally:
        holder.rollback()
        holder.close()
    assert ran.returncode == 0, ran.stderr[-1500:]
    warnings = [line for line in ran.stderr.splitlines() if line.startswith("glmfb: warning:")]
    assert len(warnings) == 1 and describe(url) in warnings[0] and "locked or busy" in warnings[0], ran.stderr
    folder = next((tmp_path / "reports").glob("*/run.json")).parent
    assert {p.name for p in folder.iterdir()} >= {"run.json", "junit.xml", "report.html"}
    assert elapsed < 60, elapsed


def test_rows_a_locked_store_could_not_take_are_kept_and_recorded_by_the_next_run(tmp_path: Path, toy: Path) -> None:
    """Lock, run, release, run: the first run's rows wait in its run folder (the warning says
    where) and the second run records them before its own, so the history holds both runs,
    in order, each once."""
    path = tmp_path / "history.sqlite"
    url = f"sqlite:///{path}"
    write_one(url, 0)()
    (tmp_path / "p.toml").write_text('[[probe]]\nname = "toy-check"\nprobe = "toy"\noptions = { outcome = "pass" }\n')
    environ = {key: value for key, value in os.environ.items() if key != "GLMFB_HISTORY"}
    environ.update({"PYTHONPATH": os.pathsep.join([str(toy), str(REPO)]), LOCK_WAIT_ENV: str(BOUND_S)})

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "glmfb", "run", "p.toml", "--out", "reports", "--history", url,
                               "--json"], capture_output=True, text=True, cwd=tmp_path, env=environ, timeout=120)

    holder = exclusive(path)
    try:
        locked = run()
    finally:
        holder.rollback()
        holder.close()
    assert locked.returncode == 0, locked.stderr[-1500:]
    first = json.loads(locked.stdout)["id"]
    kept = tmp_path / "reports" / first / "history-pending.json"
    warnings = [line for line in locked.stderr.splitlines() if line.startswith("glmfb: warning:")]
    assert len(warnings) == 1 and "locked or busy" in warnings[0] and f"reports/{first}/history-pending.json" in warnings[0], locked.stderr
    with open_store(url) as store:
        assert [r.run_id for r in store.records()] == ["r0"]
    freed = run()
    assert freed.returncode == 0 and "warning" not in freed.stderr, freed.stderr[-1500:]
    second = json.loads(freed.stdout)["id"]
    with open_store(url) as store:
        assert list(dict.fromkeys(r.run_id for r in store.records())) == ["r0", first, second]
        assert sum(r.run_id == first for r in store.records()) == sum(r.run_id == second for r in store.records())
    assert not kept.exists()
