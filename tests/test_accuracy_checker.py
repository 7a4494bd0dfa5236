"""The accuracy table's own-frame check: glmfb's files are told by where they are installed,
never by a folder called glmfb in a path (CI's clone sits in one)."""

from __future__ import annotations

import sys
from pathlib import Path

import glmfb.gil.target_loop as runner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import accuracy


def test_a_user_file_under_a_folder_named_glmfb_is_not_glmfbs_own() -> None:
    why = "held at (/ci/glmfb/tests/acceptance/gil_workloads.py:105) in Worker.loop"
    assert accuracy._own_frames({"where": {"file": "/ci/glmfb/tests/x.py"}, "status": "fail", "why": why}) == []


def test_a_glmfb_file_in_the_why_or_where_is_found() -> None:
    verdict = {"where": {"file": runner.__file__}, "status": "fail", "why": f"at ({runner.__file__}:76)"}
    found = accuracy._own_frames(verdict)
    assert found == [f"where.file {runner.__file__}", f"why names {runner.__file__}"]


def _score(status: str, *evidence: dict[str, object]) -> object:
    case = next(c for c in accuracy.load_cases() if c.name == "gap-sender-plain-thread-per-layer")
    verdict = {"status": status, "layer": "transfer", "where": {}, "why": "Not decided", "next": [],
               "evidence": list(evidence), "probe": "gap"}
    return accuracy.Score(case, verdict, 1.0, wrong=["status: expected pass, got " + status])


def test_an_undecided_case_on_a_busy_host_is_counted_apart_never_right() -> None:
    from glmfb.core.measure.hostload import BUSY_OTHER_CPUS

    assert accuracy.BUSY_OTHER_CPUS == BUSY_OTHER_CPUS
    busy = _score("inconclusive", {"kind": "host_load", "other_busy_cpus": 1.3, "cpus": 2})
    assert busy.busy_host == "other processes kept 1.3 of 2 CPUs busy" and not busy.right
    assert accuracy.rows([busy])[0][3] == "undecided: busy host"
    assert "undecided on a busy host (neither right nor wrong): 1" in accuracy.summary([busy])
    gil = _score("inconclusive", {"kind": "diagnosis", "rule": "busy-host"})
    assert gil.busy_host == "the probe's busy-host rule busy-host"
    gap = _score("inconclusive", {"kind": "diagnosis", "rule": "undecided-busy-host"})
    assert gap.busy_host == "the probe's busy-host rule undecided-busy-host"
    # the probe's own reading, where the verdict has one: a short window's 0.3 CPUs is not busy
    short = _score("inconclusive", {"kind": "host_load", "other_busy_cpus": 0.3, "cpus": 2, "busy": False})
    assert short.busy_host is None
    # quiet, or not inconclusive: wrong as before
    assert _score("inconclusive", {"kind": "host_load", "other_busy_cpus": 0.05, "cpus": 2}).busy_host is None
    assert _score("fail", {"kind": "host_load", "other_busy_cpus": 1.3, "cpus": 2}).busy_host is None
    assert accuracy.rows([_score("inconclusive")])[0][3].startswith("WRONG")
