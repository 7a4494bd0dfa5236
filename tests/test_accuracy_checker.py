"""The accuracy table's own-frame check: glmfb's files are told by where they are installed,
never by a folder called glmfb in a path (CI's clone sits in one)."""

from __future__ import annotations

import sys
from pathlib import Path

import glmfb.gil.runner as runner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import accuracy


def test_a_user_file_under_a_folder_named_glmfb_is_not_glmfbs_own() -> None:
    why = "held at (/ci/glmfb/tests/acceptance/gil_workloads.py:105) in Worker.loop"
    assert accuracy._own_frames({"where": {"file": "/ci/glmfb/tests/x.py"}, "status": "fail", "why": why}) == []


def test_a_glmfb_file_in_the_why_or_where_is_found() -> None:
    verdict = {"where": {"file": runner.__file__}, "status": "fail", "why": f"at ({runner.__file__}:76)"}
    found = accuracy._own_frames(verdict)
    assert found == [f"where.file {runner.__file__}", f"why names {runner.__file__}"]
