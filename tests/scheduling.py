"""Which tests may run beside each other under pytest-xdist, and the scheduler that keeps to it.

A test that times (a bench, gap or gil verdict, a change point over timed runs, a bound on a
duration) has the machine to itself: two of them at once, or one beside a test that starts
servers or compiles, would move what it measures. A test marked ``untimed`` asserts on nothing
that a loaded machine changes (tensors compared, schemas, error verdicts of broken targets,
rendering from saved data), so untimed tests run side by side, one per worker. Unmarked tests
are timed, and so is a test marked ``timed`` in a module marked ``untimed``: a new test runs
alone until someone says it need not.

Under ``pytest -n N`` the tests that time form one group, ``ALONE``, run first on one worker
while every other worker waits; then each worker takes untimed groups (a module's tests by
default, or the group an ``xdist_group`` marker names, e.g. the tests that share a session's
servers) as it frees up. Without xdist every test runs one after another, as before.

This module is a pytest plugin (tests/conftest.py loads it). Each worker writes the group of
every test it collected to a file the controller's scheduler reads (xdist's own loadgroup writes
the group into each test's id, which pytest 9.2's ids no longer take).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling
from xdist.workermanage import WorkerController

ALONE = "glmfb-timed-alone"
"""The xdist group of every test that times."""

TIMING_FIXTURES = frozenset({"bundled_run"})
"""Fixtures that time (the bundled suite's run holds bench, gap and gil verdicts): a test that
uses one runs with the timed tests, whatever its marks."""


GROUPS_DIR = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "untimed: asserts on nothing a loaded machine changes; under pytest -n N it runs beside "
        "other untimed tests (tests/scheduling.py), every other test alone")
    config.addinivalue_line(
        "markers",
        "timed: rests on wall time (a timing verdict, a bound on a duration) or loads the machine "
        "itself: runs alone under pytest -n N, whatever its module's untimed mark says")
    dist = config.getoption("dist", default="no")
    if hasattr(config, "workerinput") or dist == "no":
        return
    if dist not in ("load", "loadgroup"):  # -n N alone means load
        raise pytest.UsageError(
            f"--dist {dist}: the tests that time must run alone; use -n N without --dist "
            "(tests/scheduling.py spreads the untimed ones)")
    config.stash[GROUPS_DIR] = Path(tempfile.mkdtemp(prefix="glmfb-xdist-groups-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if GROUPS_DIR in config.stash:
        shutil.rmtree(config.stash[GROUPS_DIR], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: WorkerController) -> None:
    """Tells each worker where to write its tests' groups."""
    node.workerinput["glmfb_groups"] = str(node.config.stash[GROUPS_DIR])


def is_timed(item: pytest.Item) -> bool:
    """Whether ``item`` runs alone: it is marked ``timed`` (over its module's ``untimed``), or
    not marked ``untimed``, or it uses a timing fixture."""
    return (item.get_closest_marker("timed") is not None
            or item.get_closest_marker("untimed") is None
            or bool(TIMING_FIXTURES.intersection(getattr(item, "fixturenames", ()))))


def group(item: pytest.Item) -> str:
    """``item``'s xdist group: ``ALONE`` for a timed test; for an untimed one, the group its
    closest ``xdist_group`` marker names, else its module (its module fixtures start once)."""
    if is_timed(item):
        return ALONE
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return str(marker.args[0] if marker.args else marker.kwargs.get("name", "default"))
    return item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which tells the controller the worker collected
def pytest_collection_finish(session: pytest.Session) -> None:
    """In a worker, writes each test's group for the scheduler (every worker collects the same
    tests; the scheduler reads one worker's file)."""
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is None or "glmfb_groups" not in workerinput:
        return
    path = Path(workerinput["glmfb_groups"]) / f"{workerinput['workerid']}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({item.nodeid: group(item) for item in session.items}))
    partial.replace(path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The scheduler that runs the timed tests alone, then the untimed ones side by side."""
    return AloneFirstScheduling(config, log)


class AloneFirstScheduling(LoadGroupScheduling):
    """LoadGroupScheduling, except that the group ``ALONE`` runs on one worker with every other
    worker idle: it is handed out only when no other worker has a test pending, and while it is
    pending no other worker gets work. Its worker gets its next group when two of its tests are
    left (a worker runs a test only once it knows the next), so the hand-over costs nothing."""

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:  # the initial distribution happened: a node came back
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        first = next(iter(self.registered_collections))
        self.collection = list(self.registered_collections[first])
        if not self.collection:
            return
        groups = Path(first.workerinput["glmfb_groups"]) / f"{first.workerinput['workerid']}.json"
        self._groups: dict[str, str] = json.loads(groups.read_text())
        for nodeid in self.collection:  # groups in the order collected
            self.workqueue.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        for node in self.nodes:
            self._reschedule(node)

    def _split_scope(self, nodeid: str) -> str:
        return self._groups.get(nodeid, nodeid)

    def mark_test_complete(self, node: WorkerController, item_index: int, duration: float = 0) -> None:
        was_alone = self._alone_pending()
        super().mark_test_complete(node, item_index, duration)
        if was_alone and not self._alone_pending():  # the timed tests are done: every worker starts
            for other in self.nodes:
                if other is not node:
                    self._reschedule(other)

    def _alone_pending(self) -> bool:
        """Whether a worker holds timed tests not yet complete."""
        return any(not done for work in self.assigned_work.values()
                   for done in work.get(ALONE, {}).values())

    def _reschedule(self, node: WorkerController) -> None:
        """Hands ``node`` groups until it holds more than two pending tests (a worker runs a test
        only once it knows the next one), or stops it when nothing is left to hand out."""
        if node.shutting_down:
            return
        while self._pending_of(self.assigned_work[node]) <= 2:
            if not self.workqueue:
                node.shutdown()
                return
            if ALONE in self.workqueue:
                if any(self._pending_of(work) for work in self.assigned_work.values()):
                    return  # the timed tests wait until every worker is idle
                self.workqueue.move_to_end(ALONE, last=False)
            elif self._alone_pending() and ALONE not in self.assigned_work[node]:
                return  # another worker runs the timed tests: this one waits
            self._assign_work_unit(node)
