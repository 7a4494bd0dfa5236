"""The history store on a real PostgreSQL server that these tests start themselves (Debian's
``postgresql``: ``initdb`` and ``pg_ctl`` on a free loopback port, in a temporary folder, as
the ``postgres`` user when running as root, since initdb refuses root), torn down at the end.

Not skipped when PostgreSQL is missing: CI installs it (``.ci/setup``), so its absence is a
broken set-up and fails loudly."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from glmfb.workflows.history.store import POSTGRES, SCHEMA_VERSION, Record, migrate, open_store

REPO = Path(__file__).resolve().parents[1]
FAST = "scan-state-update-fp32"  # the fastest bundled definition (a small diff, ~4 s)
USER = "glmfb"


def _server_binaries() -> Path:
    """The folder of ``initdb`` and ``pg_ctl``: on PATH, else Debian's newest
    ``/usr/lib/postgresql/<version>/bin``."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not versions:
        pytest.fail("PostgreSQL's initdb is not installed (apt-get install postgresql; .ci/setup does)")
    return versions[-1].parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """A PostgreSQL cluster in a temporary folder, owned by the user that may run it."""

    def __init__(self) -> None:
        self.bin = _server_binaries()
        self.root = Path(tempfile.mkdtemp(prefix="glmfb-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.as_root = os.geteuid() == 0
        self.databases = 0
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *command: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if self.as_root else []
        done = subprocess.run([*prefix, *command], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.root / "server.log"
            pytest.fail(f"{' '.join(command)} failed: {done.stderr.strip()}\n"
                        f"{log.read_text() if log.is_file() else ''}")

    def start(self) -> None:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust", "-E", "UTF8")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                  "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1", "start")

    def stop(self) -> None:
        try:
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg

        self.databases += 1
        name = f"history{self.databases}"
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    running = Server()
    running.start()
    try:
        yield running
    finally:
        running.stop()


def record(index: int, **changes: object) -> Record:
    fields: dict[str, object] = dict(
        time=f"2026-01-01T00:{index // 60:02d}:{index % 60:02d}+00:00", run_id=f"r{index}", definition="d",
        definition_hash="abc", probe="bench", status="pass", layer="kernel", metric="time_change",
        value=0.01 * index, low=0.01 * index - 0.001, high=0.01 * index + 0.001, unit="fraction", threshold=0.05,
        worse="higher", relative=True, where={"kernel": "k", "shape": "8x4096"}, commit="c" * 40, dirty=False,
        machine="m", machine_label="host: cpu", glmfb_version="0.1.0")
    fields.update(changes)
    return Record(**fields)  # type: ignore[arg-type]


def test_rows_round_trip_through_postgresql(server: Server) -> None:
    url = server.create_database()
    written = [record(0), record(1, metric=None, value=None, low=None, high=None, unit=None, threshold=None,
                                commit=None, dirty=None, where={}, status="error", layer="harness")]
    with open_store(url) as store:
        assert store.version == SCHEMA_VERSION and store.record(written) == 2
    with open_store(url) as store:
        assert store.records() == written


def test_a_database_of_an_older_schema_is_migrated_when_opened(server: Server) -> None:
    import psycopg

    url = server.create_database()
    with psycopg.connect(url, autocommit=True) as old:
        with old.transaction():
            assert migrate(old, POSTGRES, target=1) == 1
        assert not old.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'verdicts_series'").fetchall()
    with open_store(url) as store:
        store.record([record(0)])
        assert store.version == SCHEMA_VERSION > 1
    with psycopg.connect(url) as check:
        assert check.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'verdicts_series'").fetchall()
        assert [v for (v,) in check.execute("SELECT version FROM schema_version ORDER BY version")] == [1, 2, 3]


WRITER = """
import sys
from glmfb.workflows.history.store import Record, open_store

url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
for index in range(count):  # a connection and a transaction per row; the first ones race to migrate
    with open_store(url) as store:
        store.record([Record(time="2026-01-01T00:00:00+00:00", run_id=f"{name}-{index}", definition=name,
                             definition_hash=None, probe="bench", status="pass", layer="kernel",
                             metric="time_change", value=float(index))])
"""


@pytest.mark.slow
def test_two_glmfb_runs_write_into_one_database_at_once(server: Server, tmp_path: Path) -> None:
    url = server.create_database()
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    environ.pop("GLMFB_HISTORY", None)
    runs = [subprocess.Popen([sys.executable, "-m", "glmfb", "run", "probes/diff.toml", "-k", FAST, "--out",
                              str(tmp_path / f"reports-{side}"), "--history", url], cwd=REPO, env=environ,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for side in "ab"]
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writers = [subprocess.Popen([sys.executable, str(script), url, name, "100"], env=environ,
                                stderr=subprocess.PIPE, text=True) for name in ("w1", "w2")]
    for process in (*runs, *writers):
        _, errors = process.communicate(timeout=300)
        assert process.returncode == 0, errors
        assert "warning" not in errors, errors  # both runs recorded: no warning line
    with open_store(url) as store:
        rows = store.records()
    run_ids = {json.loads(p.read_text())["id"] for p in tmp_path.glob("reports-*/*/run.json")}
    assert len(run_ids) == 2
    assert {r.run_id for r in rows if r.definition == FAST} == run_ids
    assert {r.run_id for r in rows if r.definition != FAST} == {f"{w}-{i}" for w in ("w1", "w2") for i in range(100)}
    assert len(rows) == 2 + 200
