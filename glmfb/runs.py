"""Run folders: ``reports/<run-id>/run.json``, and the pointer to the latest invocation.

Every ``glmfb run`` and every probe command writes ``<out>/LATEST`` (the run id) *first*,
before any probe runs, then ``<out>/<run-id>/run.json`` when it finishes (interrupted runs
included). ``glmfb gate`` with no path follows the pointer, so it gates the run of the latest
invocation or refuses: it never gates an older run.json because the latest invocation stopped
early (bad input, a crash, a kill) and wrote none.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from glmfb.errors import HarnessError, InputError, UsageError

POINTER = "LATEST"
RUN_FILE = "run.json"


def start_run(out: Path, run_id: str) -> Path:
    """Point ``out/LATEST`` at ``run_id`` and create its folder; returns the folder."""
    from glmfb.io import write_text_atomic

    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file", "give a folder for the reports (default: reports)")
    report_dir = out / run_id
    report_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / POINTER, run_id + "\n")
    return report_dir


def latest_run(out: Path) -> Path:
    """The run.json of the latest invocation that wrote into ``out``."""
    pointer = out / POINTER
    if not pointer.is_file():
        runs = sorted(out.glob(f"*/{RUN_FILE}")) if out.is_dir() else []
        if runs:
            raise UsageError(f"{out} holds runs but no {POINTER} pointer (written by glmfb 0.2 and later)",
                             f"give the run to gate, e.g. glmfb gate {runs[-1].parent}")
        raise UsageError(f"no run given and none found under {out}/", "pass a run.json or a run folder, or - for stdin")
    run_id = pointer.read_text(encoding="utf-8").strip()
    run_file = out / run_id / RUN_FILE
    if not run_file.is_file():
        raise HarnessError(
            f"the latest run into {out}/ ({run_id}) wrote no {RUN_FILE}: it stopped on bad input, crashed or was "
            "killed before it finished",
            "read its output; glmfb gate never gates an older run instead",
        )
    return run_file


def run_file_of(source: str) -> str:
    """A gate source as a file: ``-``, a run or verdict JSON file, or a run folder."""
    if source == "-":
        return source
    path = Path(source)
    if path.is_dir():
        if (path / RUN_FILE).is_file():
            return str(path / RUN_FILE)
        if (path / POINTER).is_file():
            return str(latest_run(path))
        raise InputError(f"{path} is a folder with no {RUN_FILE}", "give a run folder (reports/<run-id>) or a run.json")
    return source


def read_run_id(run_file: str) -> str | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return str(json.loads(Path(run_file).read_text(encoding="utf-8"))["id"])
    return None
