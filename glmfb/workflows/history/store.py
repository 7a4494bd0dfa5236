"""The history store: one row per verdict, kept across runs.

A store is opened from a URL: ``sqlite:///PATH`` (the default, ``<out>/history.sqlite``: a
file beside the runs that needs nothing) or ``postgresql://user@host:port/db`` (one database
that a fleet of CI machines shares; psycopg 3, the ``postgres`` extra, imported only then).

The schema is versioned: the ``schema_version`` table logs each version applied, and opening
a store applies the missing :data:`MIGRATIONS` in order, in one transaction that holds the
database's write lock (SQLite's ``BEGIN IMMEDIATE``, PostgreSQL's advisory lock), so two
processes opening a new store at once migrate it once. A store written by a newer glmfb is
refused, never written into.

Writers never lose a row to each other: SQLite runs in WAL mode (readers never block the
writer) with a busy timeout, and a write that still finds the database locked is retried;
each record is one transaction, in both databases.

Nor does a store hang a run: waiting for another connection's lock is bounded, all retries
together, by :data:`LOCK_WAIT_S` (``$GLMFB_HISTORY_TIMEOUT_S`` overrides it). SQLite's busy
timeout is narrowed to what is left of it before each try; PostgreSQL's ``lock_timeout``
bounds every wait for a lock on the connection, and each write transaction gets the time left
as its ``lock_timeout`` and ``statement_timeout``. An index build (``SHARE`` lock) or a
forgotten ``BEGIN EXCLUSIVE`` then costs a run one warning line, not its end.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, TypeVar

from glmfb.contract.errors import UsageError

DEFAULT_NAME = "history.sqlite"
ENV_VAR = "GLMFB_HISTORY"
SQLITE_PREFIX = "sqlite:///"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")
LOCK_WAIT_S = 30.0  # the most one open or write waits on another connection's lock, all tries together
LOCK_WAIT_ENV = "GLMFB_HISTORY_TIMEOUT_S"  # overrides LOCK_WAIT_S (seconds)
WRITE_ATTEMPTS = 5  # tries after a failure that is not a lock wait (a serialization failure, a deadlock)


class HistoryError(UsageError):
    """The store cannot be opened, read or written (a bad URL, a server that refuses, a
    database of a newer glmfb, a lock another connection held past the bound)."""


def lock_wait_s(environ: Mapping[str, str] | None = None) -> float:
    """The bound on waiting for a lock: ``$GLMFB_HISTORY_TIMEOUT_S`` (seconds, above 0), else
    :data:`LOCK_WAIT_S`. A value that is no such number is refused, not silently replaced: the
    bound is what keeps a locked store from hanging a run."""
    raw = (os.environ if environ is None else environ).get(LOCK_WAIT_ENV, "").strip()
    if not raw:
        return LOCK_WAIT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise HistoryError(f"{LOCK_WAIT_ENV}={raw!r} is not a number of seconds above 0",
                           f"set it to one, e.g. {LOCK_WAIT_S:g}, or unset it")
    return seconds


def _locked_message(url: str, waited_s: float) -> HistoryError:
    """The one line for a store that another connection kept locked (or busy) past the bound."""
    return HistoryError(f"the history {describe(url)} was locked or busy for {waited_s:g} s, glmfb's bound on "
                        "waiting for it", f"another connection holds a lock on it (an index build, an open "
                        f"transaction); {LOCK_WAIT_ENV} sets the bound")


@dataclass(frozen=True)
class Record:
    """One verdict as the history keeps it.

    ``time`` is the run's start (ISO 8601, UTC), so the verdicts of one run sort together;
    ``definition`` and ``definition_hash`` name the probe definition (or the probe command's
    verdict name) and its canonical content; ``worse`` says which way the metric regresses
    (``higher`` or ``lower``) and ``relative`` whether the metric is already a change against
    a baseline (its segments are compared by difference, not by ratio), both as data
    (:mod:`glmfb.workflows.history.metrics`); ``commit`` and ``dirty`` are the git state of the
    repository the definition lives in (None outside git); ``machine`` is a stable hash of
    the environment fields that identify the machine, ``machine_label`` the same for people.
    """

    time: str
    run_id: str
    definition: str
    definition_hash: str | None
    probe: str
    status: str
    layer: str
    metric: str | None = None
    value: float | None = None
    low: float | None = None
    high: float | None = None
    unit: str | None = None
    threshold: float | None = None
    worse: str = "higher"
    relative: bool = False
    where: Mapping[str, Any] = field(default_factory=dict)
    commit: str | None = None
    dirty: bool | None = None
    machine: str = ""
    machine_label: str = ""
    glmfb_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (dict(self.where) if f.name == "where" else getattr(self, f.name)) for f in fields(self)}


# The columns, in Record's order; ``where`` is JSON text in ``where_json``.
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Record))
_SQL_COLUMNS: tuple[str, ...] = tuple(
    {"where": "where_json", "time": "recorded", "commit": "git_commit", "dirty": "git_dirty"}.get(c, c)
    for c in COLUMNS
)


@dataclass(frozen=True)
class Dialect:
    """What differs between the two databases' SQL."""

    name: str
    placeholder: str
    id_column: str
    real: str


SQLITE = Dialect("sqlite", "?", "INTEGER PRIMARY KEY AUTOINCREMENT", "REAL")
POSTGRES = Dialect("postgresql", "%s", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY", "DOUBLE PRECISION")

# Each version's statements, in order; a new version appends its own, never edits an old one.
# {id} and {real} are the dialect's identity column and floating-point type.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: a row per verdict
        """CREATE TABLE verdicts (
            id {id},
            recorded TEXT NOT NULL,
            run_id TEXT NOT NULL,
            definition TEXT NOT NULL,
            definition_hash TEXT,
            probe TEXT NOT NULL,
            status TEXT NOT NULL,
            layer TEXT NOT NULL,
            metric TEXT,
            value {real},
            low {real},
            high {real},
            unit TEXT,
            threshold {real},
            worse TEXT NOT NULL,
            relative BOOLEAN NOT NULL,
            where_json TEXT NOT NULL,
            git_commit TEXT,
            git_dirty BOOLEAN,
            machine TEXT NOT NULL,
            machine_label TEXT NOT NULL,
            glmfb_version TEXT NOT NULL
        )""",
    ),
    (  # 2: a series is read by definition, metric and machine, in time order
        "CREATE INDEX verdicts_series ON verdicts (definition, metric, machine, recorded)",
    ),
    (  # 3: a run's rows are found by its id (its report's series, recording a run once)
        "CREATE INDEX verdicts_run ON verdicts (run_id)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


class Connection(Protocol):
    """The part of a DB-API connection the store uses."""

    def execute(self, sql: str, parameters: Sequence[Any] = ...) -> Any: ...
    def close(self) -> None: ...


# --------------------------------------------------------------------------------------------
# URLs
# --------------------------------------------------------------------------------------------


def default_url(out: Path) -> str:
    """``sqlite:///<out>/history.sqlite``."""
    return SQLITE_PREFIX + str(out / DEFAULT_NAME)


def chosen_url(given: str | None, out: Path, environ: Mapping[str, str]) -> str:
    """The store a command records into: ``--history``, else ``$GLMFB_HISTORY``, else the
    default beside the runs."""
    return given or environ.get(ENV_VAR) or default_url(out)


def describe(url: str) -> str:
    """The URL for messages, without a password."""
    if url.startswith(POSTGRES_PREFIXES) and "@" in url:
        scheme, _, rest = url.partition("://")
        credentials, _, host = rest.rpartition("@")
        return f"{scheme}://{credentials.partition(':')[0]}@{host}"
    return url


def sqlite_path(url: str) -> Path:
    """The file of a ``sqlite:///`` URL (``sqlite:///reports/h.sqlite`` is relative,
    ``sqlite:////tmp/h.sqlite`` absolute)."""
    return Path(url[len(SQLITE_PREFIX):])


def check_url(url: str) -> None:
    """Refuse a URL that names no store this glmfb opens."""
    if url.startswith(SQLITE_PREFIX) and len(url) > len(SQLITE_PREFIX):
        return
    if url.startswith(POSTGRES_PREFIXES):
        return
    raise HistoryError(f"history URL {describe(url)!r} names no store",
                       "write sqlite:///PATH or postgresql://USER@HOST:PORT/DB")


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


T = TypeVar("T")


class Store:
    """An open history store: :meth:`record` appends rows, :meth:`records` reads them in time
    order. Use it as a context manager (it closes the connection)."""

    def __init__(self, connection: Connection, dialect: Dialect, url: str, transaction: Callable[[float], Any],
                 retryable: tuple[type[BaseException], ...], errors: tuple[type[BaseException], ...],
                 locked: Callable[[BaseException], bool], wait_s: float) -> None:
        self.connection = connection
        self.dialect = dialect
        self.url = url
        self._transaction = transaction  # a write transaction that waits at most the seconds given
        self._retryable = retryable  # another writer holds the lock: wait and try again
        self._errors = errors  # the database's own errors: a HistoryError that names the store
        self._locked = locked  # whether an error is a wait for another connection's lock that ran out
        self.wait_s = wait_s  # the bound on all the lock waits of one write, tries included

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.connection.close()

    @property
    def version(self) -> int:
        return current_version(self.connection)

    def _retrying(self, work: Callable[[], T]) -> T:
        """``work`` in a transaction, again (after a short wait) while the database is locked
        by another writer, until :attr:`wait_s` has passed in all: each try waits for the lock
        only as long as is left, so a lock held for good ends in a :class:`HistoryError` that
        says so (five full busy timeouts one after the other made a run answer after 153 s).
        Another retryable failure gets :data:`WRITE_ATTEMPTS` tries; its last one is raised."""
        deadline = time.monotonic() + self.wait_s
        attempt = 0
        while True:
            try:
                with self._transaction(max(deadline - time.monotonic(), 0.001)):
                    return work()
            except self._errors as exc:
                locked = self._locked(exc)
                if not locked and not isinstance(exc, self._retryable):
                    raise
                pause = 0.05 * 2 ** min(attempt, 4)
                attempt += 1
                out_of_time = time.monotonic() + pause >= deadline
                if locked and out_of_time:
                    raise _locked_message(self.url, self.wait_s) from None
                if not locked and (out_of_time or attempt >= WRITE_ATTEMPTS):
                    raise
                time.sleep(pause)

    def record(self, records: Iterable[Record], *, once: bool = False) -> int:
        """Append ``records`` in one transaction; returns how many. ``once``: nothing is written
        when the store already holds a row of a run being recorded (checked in the same
        transaction, so two processes recording one run write it once)."""
        records = list(records)
        rows = [_row(r) for r in records]
        if not rows:
            return 0
        marks = ", ".join([self.dialect.placeholder] * len(_SQL_COLUMNS))
        sql = f"INSERT INTO verdicts ({', '.join(_SQL_COLUMNS)}) VALUES ({marks})"
        runs = sorted({r.run_id for r in records})
        held = (f"SELECT 1 FROM verdicts WHERE run_id IN ({', '.join([self.dialect.placeholder] * len(runs))}) "
                "LIMIT 1")

        def insert() -> int:
            if once and self.connection.execute(held, runs).fetchone() is not None:
                return 0
            for row in rows:
                self.connection.execute(sql, row)
            return len(rows)

        try:
            return self._retrying(insert)
        except self._errors as exc:
            raise HistoryError(f"cannot write the history {describe(self.url)}: {_first_line(exc)}") from None

    def run_series(self, run_id: str, window: int) -> list[tuple[list[Record], int]]:
        """Each series (definition, metric, machine) that run ``run_id`` recorded a value in:
        its newest ``window`` rows with a value up to that run, oldest first, and how many such
        rows it holds up to that run. Read through the indexes (a run's rows by its id, a
        series in time order), so what it reads follows ``window``, not the history's length."""
        mark = self.dialect.placeholder
        key = f"definition = {mark} AND metric = {mark} AND machine = {mark} AND value IS NOT NULL AND recorded <= {mark}"
        try:
            keys = self.connection.execute(
                "SELECT DISTINCT definition, metric, machine, recorded FROM verdicts "
                f"WHERE run_id = {mark} AND metric IS NOT NULL AND value IS NOT NULL", [run_id]).fetchall()
            found = []
            for definition, metric, machine, recorded in sorted(keys):
                rows = self.connection.execute(
                    f"SELECT {', '.join(_SQL_COLUMNS)} FROM verdicts WHERE {key} "
                    f"ORDER BY recorded DESC, run_id DESC, id DESC LIMIT {mark}",
                    [definition, metric, machine, recorded, window]).fetchall()
                (total,) = self.connection.execute(f"SELECT COUNT(*) FROM verdicts WHERE {key}",
                                                   [definition, metric, machine, recorded]).fetchone()
                found.append(([_record(row) for row in reversed(rows)], int(total)))
            return found
        except self._errors as exc:
            raise HistoryError(f"cannot read the history {describe(self.url)}: {_first_line(exc)}") from None

    def records(self) -> list[Record]:
        """Every row, oldest first (by the run's time, then as written)."""
        try:
            cursor = self.connection.execute(
                f"SELECT {', '.join(_SQL_COLUMNS)} FROM verdicts ORDER BY recorded, run_id, id")
            return [_record(row) for row in cursor.fetchall()]
        except self._errors as exc:
            raise HistoryError(f"cannot read the history {describe(self.url)}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _row(record: Record) -> tuple[Any, ...]:
    values = []
    for name in COLUMNS:
        value = getattr(record, name)
        values.append(json.dumps(dict(value), sort_keys=True, default=str) if name == "where" else value)
    return tuple(values)


def _record(row: Sequence[Any]) -> Record:
    data = dict(zip(COLUMNS, row, strict=True))
    data["where"] = json.loads(data["where"] or "{}")
    data["relative"] = bool(data["relative"])
    data["dirty"] = None if data["dirty"] is None else bool(data["dirty"])
    return Record(**data)


def open_store(url: str, *, create: bool = True, wait_s: float | None = None) -> Store:
    """The store at ``url``, migrated to :data:`SCHEMA_VERSION`. ``create=False`` refuses a
    SQLite file that does not exist yet (reading a history that was never written). ``wait_s``
    bounds each wait for another connection's lock (default: :func:`lock_wait_s`)."""
    check_url(url)
    wait_s = lock_wait_s() if wait_s is None else wait_s
    if url.startswith(SQLITE_PREFIX):
        return _open_sqlite(url, create=create, wait_s=wait_s)
    return _open_postgres(url, wait_s=wait_s)


# --------------------------------------------------------------------------------------------
# SQLite
# --------------------------------------------------------------------------------------------


def _milliseconds(seconds: float) -> int:
    """A timeout of ``seconds`` in whole milliseconds, at least 1: 0 is no wait at all in
    SQLite's busy timeout and no limit at all in PostgreSQL's ``lock_timeout``."""
    return max(1, int(seconds * 1000))


def _sqlite_locked(exc: BaseException) -> bool:
    """Whether a SQLite error is another connection's lock ("database is locked", "... busy")."""
    return "locked" in str(exc) or "busy" in str(exc)


def _open_sqlite(url: str, *, create: bool, wait_s: float) -> Store:
    path = sqlite_path(url)
    if not create and not path.is_file():
        raise HistoryError(f"no history at {path}", "run glmfb run first, or give --history URL")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(path, timeout=wait_s, isolation_level=None)  # we BEGIN ourselves
        connection.execute(f"PRAGMA busy_timeout = {_milliseconds(wait_s)}")
        _write_ahead_log(connection, url, wait_s)
    except (OSError, sqlite3.Error) as exc:
        raise HistoryError(f"cannot open the history {path}: {exc}") from None

    @contextmanager
    def transaction(wait_s_left: float) -> Iterator[None]:
        connection.execute(f"PRAGMA busy_timeout = {_milliseconds(wait_s_left)}")  # this try waits what is left
        try:
            connection.execute("BEGIN IMMEDIATE")  # the write lock now, not at the first write
            try:
                yield
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
        finally:
            connection.execute(f"PRAGMA busy_timeout = {_milliseconds(wait_s)}")

    store = Store(connection, SQLITE, url, transaction, (sqlite3.OperationalError,), (sqlite3.Error,),
                  _sqlite_locked, wait_s)
    _migrate_or_close(store)
    return store


def _write_ahead_log(connection: sqlite3.Connection, url: str, wait_s: float) -> None:
    """Put the database in WAL mode (it stays so: the mode is kept in the file), retrying while
    another process holds it, for ``wait_s`` at most: switching the journal mode answers
    "database is locked" at once, without waiting on the busy timeout, and two ``glmfb run``
    starting together on a new history both try it (one of them failed so in a CI run)."""
    deadline = time.monotonic() + wait_s
    delay = 0.005
    while True:
        try:
            if str(connection.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if not _sqlite_locked(exc):
                raise
            if time.monotonic() + delay > deadline:
                connection.close()
                raise _locked_message(url, wait_s) from None
            time.sleep(delay)
            delay = min(2 * delay, 0.2)


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------

_MIGRATION_LOCK = 0x676C6D6662  # pg_advisory_xact_lock key: one migrator at a time ("glmfb")


def _open_postgres(url: str, *, wait_s: float) -> Store:
    try:
        import psycopg
    except ImportError:
        raise HistoryError("a PostgreSQL history needs psycopg",
                           "pip install 'glmfb[postgres]'") from None
    try:
        connection = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise HistoryError(f"cannot connect to the history {describe(url)}: {_first_line(exc)}") from None
    try:  # every wait for a lock on this connection, a read's too, is bounded (an index build's
        # SHARE lock held a run's recording forever)
        connection.execute(f"SET lock_timeout = {_milliseconds(wait_s)}")
    except psycopg.Error as exc:
        connection.close()
        raise HistoryError(f"cannot open the history {describe(url)}: {_first_line(exc)}") from None

    @contextmanager
    def transaction(wait_s_left: float) -> Iterator[None]:
        with connection.transaction():
            # For this transaction only: its lock waits and each statement get what is left.
            connection.execute(f"SET LOCAL lock_timeout = {_milliseconds(wait_s_left)}")
            connection.execute(f"SET LOCAL statement_timeout = {_milliseconds(wait_s_left)}")
            yield

    def locked(exc: BaseException) -> bool:
        """``lock_timeout`` or ``statement_timeout`` ran out (a statement cancelled by hand is not
        waited out again)."""
        return isinstance(exc, psycopg.errors.LockNotAvailable) or (
            isinstance(exc, psycopg.errors.QueryCanceled) and "timeout" in str(exc))

    store = Store(connection, POSTGRES, url, transaction,
                  (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected), (psycopg.Error,), locked,
                  wait_s)
    _migrate_or_close(store)
    return store


# --------------------------------------------------------------------------------------------
# Migrations
# --------------------------------------------------------------------------------------------


def _migrate_or_close(store: Store) -> None:
    """Migrate the store if it needs it (a read first: a store already at this version is
    opened without a write transaction); close it on failure."""
    try:
        if _up_to_date(store):
            return
        store._retrying(lambda: migrate(store.connection, store.dialect))
    except HistoryError:
        store.close()
        raise
    except store._errors as exc:
        store.close()
        raise HistoryError(f"cannot open the history {describe(store.url)}: {_first_line(exc)}") from None


def _up_to_date(store: Store) -> bool:
    try:  # a plain read, outside any transaction (both connections are in autocommit)
        return current_version(store.connection) == SCHEMA_VERSION
    except store._errors:  # no schema_version table yet: a new database
        return False


def current_version(connection: Connection) -> int:
    """The newest schema version applied (0: a new, empty database)."""
    row = connection.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def migrate(connection: Connection, dialect: Dialect, target: int = SCHEMA_VERSION) -> int:
    """Apply the migrations after the database's version, up to ``target``; call it inside a
    transaction that holds the write lock. Returns the version now."""
    if dialect is POSTGRES:
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
    connection.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL, applied TEXT NOT NULL)")
    version = current_version(connection)
    if version > SCHEMA_VERSION:
        raise HistoryError(f"the history was written by a newer glmfb (schema version {version}; this glmfb "
                           f"knows up to {SCHEMA_VERSION})", "upgrade glmfb, or give another --history")
    from glmfb.contract.clock import utc_now

    for number in range(version + 1, target + 1):
        for statement in MIGRATIONS[number - 1]:
            connection.execute(statement.format(id=dialect.id_column, real=dialect.real))
        connection.execute(f"INSERT INTO schema_version (version, applied) VALUES ({dialect.placeholder}, "
                           f"{dialect.placeholder})", (number, utc_now()))
    return max(version, target)

