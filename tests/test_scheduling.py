"""tests/scheduling.py under a real ``pytest -n 2``: the timed tests run alone, the untimed side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.untimed  # it checks the order tests ran in, not how long they took

TESTS = Path(__file__).parent

RECORD = '''
import json, os, time
import pytest

def record(name):
    started = time.time()
    time.sleep(0.4)
    with open(os.path.join(os.environ["SPANS"], f"{name}-{os.getpid()}.json"), "w") as f:
        json.dump({"name": name, "start": started, "end": time.time(), "pid": os.getpid()}, f)
'''


def _project(root: Path) -> None:
    (root / "conftest.py").write_text(
        'pytest_plugins = ["scheduling"]\n\nimport pytest\n\n'
        '@pytest.fixture(scope="session")\ndef bundled_run():\n    return 1\n')
    (root / "spans.py").write_text(RECORD)
    (root / "test_a_timed.py").write_text(
        "from spans import record\n\n"
        + "".join(f"def test_timed_{i}():\n    record('timed-{i}')\n\n" for i in range(3)))
    for module in ("b", "c"):
        (root / f"test_{module}_untimed.py").write_text(
            "import pytest\nfrom spans import record\n\npytestmark = pytest.mark.untimed\n\n"
            + "".join(f"def test_untimed_{i}():\n    record('{module}-untimed-{i}')\n\n" for i in range(3)))
    (root / "test_d_bundled.py").write_text(
        "import pytest\nfrom spans import record\n\n"
        "@pytest.mark.untimed\ndef test_reads_the_suite(bundled_run):\n    record('bundled')\n")


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "SPANS": str(root / "spans")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_timed_tests_run_alone_and_first_and_the_untimed_side_by_side(tmp_path: Path) -> None:
    _project(tmp_path)
    (tmp_path / "spans").mkdir()
    result = _pytest(tmp_path, "-n", "2")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "10 passed" in result.stdout
    spans = [json.loads(path.read_text()) for path in (tmp_path / "spans").iterdir()]
    assert len(spans) == 10
    alone = [span for span in spans if "untimed" not in span["name"]]
    side_by_side = [span for span in spans if "untimed" in span["name"]]
    assert {span["name"] for span in alone} == {"timed-0", "timed-1", "timed-2", "bundled"}
    for span in alone:  # nothing else ran while a timed test (or one using bundled_run) ran
        overlapping = [other["name"] for other in spans if other is not span
                       and other["start"] < span["end"] and span["start"] < other["end"]]
        assert not overlapping, f"{span['name']} ran beside {overlapping}"
    assert len({span["pid"] for span in alone}) == 1  # one worker ran them all
    assert max(span["end"] for span in alone) <= min(span["start"] for span in side_by_side)
    assert len({span["pid"] for span in side_by_side}) == 2
    assert any(a["pid"] != b["pid"] and a["start"] < b["end"] and b["start"] < a["end"]
               for a in side_by_side for b in side_by_side), "the untimed tests never ran side by side"


def test_a_dist_mode_that_would_mix_them_is_refused(tmp_path: Path) -> None:
    _project(tmp_path)
    result = _pytest(tmp_path, "-n", "2", "--dist", "loadfile")
    assert result.returncode == 4, result.stdout[-1000:] + result.stderr[-1000:]
    assert "--dist loadfile: the tests that time must run alone; use -n N without --dist" in result.stderr
