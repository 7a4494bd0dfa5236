from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from helpers import BundledRun

TOY = Path(__file__).parent / "toy"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy probe of tests/toy, installed through the glmfb.probes entry point (its folder
    holds a dist-info); yields that folder, for subprocesses' PYTHONPATH."""
    from glmfb.core.probe import reset_registry

    monkeypatch.syspath_prepend(str(TOY))
    reset_registry()
    yield TOY
    monkeypatch.undo()
    reset_registry()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked gpu when no CUDA device is present (torch imported only if needed)."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _process_floor_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own glmfb cache holding a between-process floor (2% sd, as
    measured on the development host), so no saved comparison in a test starts the fresh
    worker processes that measuring the floor takes. Tests of the floor itself override it."""
    monkeypatch.setenv("GLMFB_CACHE_DIR", str(tmp_path_factory.mktemp("glmfb-cache")))
    _save_test_floor()


def _save_test_floor() -> None:
    """The test floor, saved in ``$GLMFB_CACHE_DIR``."""
    from glmfb.core.measure.floor import ProcessFloor, machine_key, save_floor

    save_floor(ProcessFloor(0.02, 14.0, 8, 1.0, "2026-12-01T00:00:00+00:00", 0.5, "test floor",
                            machine_key(), {"softmax": [1e-4] * 8}))


# ---- the bundled suite, run once a session -------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "bundled(*files): reads the verdicts of probes/FILE from the session's one run of the bundled "
        "suite (fixture bundled_run); with no file, the test needs the whole suite's run",
    )


def _bundled_files(session: pytest.Session) -> list[str] | None:
    """The definition files the collected tests read (``bundled`` markers), or None when one
    of them needs the whole suite (a marker naming no file, or none at all)."""
    files: set[str] = set()
    for item in session.items:
        if "bundled_run" not in getattr(item, "fixturenames", ()):
            continue
        marker = item.get_closest_marker("bundled")
        if marker is None or not marker.args:
            return None
        files.update(marker.args)
    return sorted(files)


@pytest.fixture(scope="session")
def bundled_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> BundledRun:
    """The bundled suite, run once a session: ``glmfb run`` from the repository root, as the
    README runs it, when a collected test needs all of it (the report's browser test); else
    ``glmfb run`` of just the definition files the collected tests name in their ``bundled``
    marker. Either way each test finds every verdict it reads, whatever runs before it.

    Its own glmfb cache (the test floor of :func:`_process_floor_cache`) and history (the run
    folder's, whatever ``$GLMFB_HISTORY`` says). With GLMFB_TEST_REPORT_RUN set to an earlier
    run folder of the whole suite, that run is copied and its page re-rendered with ``glmfb
    report`` instead (a quicker loop while working on the page).
    """
    from helpers import BundledRun

    out = tmp_path_factory.mktemp("bundled")
    cache = tmp_path_factory.mktemp("bundled-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GLMFB_CACHE_DIR", str(cache))
        _save_test_floor()
    env = {key: value for key, value in os.environ.items() if key != "GLMFB_HISTORY"}
    env.update(PYTHONPATH=str(ROOT), GLMFB_CACHE_DIR=str(cache))
    earlier = os.environ.get("GLMFB_TEST_REPORT_RUN")
    files = None if earlier else _bundled_files(request.session)
    if earlier:
        copy = out / Path(earlier).name
        shutil.copytree(earlier, copy)
        (copy / "report.html").unlink(missing_ok=True)
        command = [sys.executable, "-m", "glmfb", "report", str(copy / "run.json")]
    else:
        paths = [str(Path("probes") / file) for file in files or ()]
        command = [sys.executable, "-m", "glmfb", "run", *paths, "--out", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    runs = list(out.glob("*/run.json"))
    assert len(runs) == 1 and (runs[0].parent / "report.html").is_file(), (
        f"{' '.join(command[3:5])} wrote no run with a report.html (exit {result.returncode}): {result.stderr[-2000:]}")
    return BundledRun(runs[0].parent, json.loads(runs[0].read_text()), result.returncode, result.stderr)


# ---- the checkout as the tests found it ------------------------------------------------------

# What pytest and Python write into any tree they run in: never a test's doing.
_TOOL_DIRS = frozenset({"__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache"})


def _reports_state() -> dict[str, object]:
    """The checkout's reports/ as a user left it: its listing, what LATEST names, and the
    history store's size and modification time (cheap enough to read around every test)."""
    reports = ROOT / "reports"
    latest = reports / "LATEST"
    history = reports / "history.sqlite"
    stat = history.stat() if history.is_file() else None
    return {"reports/": sorted(os.listdir(reports)) if reports.is_dir() else None,
            "reports/LATEST": latest.read_text(errors="replace").strip() if latest.is_file() else None,
            "reports/history.sqlite": (stat.st_size, stat.st_mtime_ns) if stat else None}


def _git_state() -> list[str] | None:
    """``git status --porcelain --ignored`` of the checkout, without the caches pytest and
    Python write themselves (None outside a git checkout)."""
    try:
        listed = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=normal"],
                                cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    return sorted(line for line in listed.stdout.splitlines()
                  if not _TOOL_DIRS.intersection(line[3:].rstrip("/").split("/")))


def _changed(before: dict[str, object], after: dict[str, object]) -> list[str]:
    return [f"{key}: {before[key]!r} -> {after[key]!r}" for key in before if before[key] != after[key]]


@pytest.fixture(scope="session", autouse=True)
def _checkout_untouched() -> Iterator[None]:
    """The whole session leaves the checkout as it found it: reports/ (listing, LATEST, the
    history store) and ``git status --ignored`` (tracked, untracked and ignored files) are the
    same after the last test as before the first; else the session fails here."""
    before = {**_reports_state(), "git status --ignored": _git_state()}
    yield
    after = {**_reports_state(), "git status --ignored": _git_state()}
    changed = _changed(before, after)
    if changed:
        pytest.fail("the tests changed the checkout (every test writes under its own temporary folder): "
                    + "; ".join(changed), pytrace=False)


@pytest.fixture(autouse=True)
def _reports_untouched(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test leaves the checkout's reports/ as it found it (named here, so the test that
    wrote there is the one that fails)."""
    before = _reports_state()
    yield
    changed = _changed(before, _reports_state())
    if changed:
        pytest.fail(f"{request.node.nodeid} wrote into the checkout's reports/ (give it --out under tmp_path): "
                    + "; ".join(changed), pytrace=False)
