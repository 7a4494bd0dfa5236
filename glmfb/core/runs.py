"""Run folders: ``reports/<run-id>/run.json``, and the pointer to the latest invocation.

Every invocation (:mod:`glmfb.workflows.invocation`) removes ``<out>/LATEST`` *first*, makes its run
folder, points ``LATEST`` at it before any probe runs, then writes
``<out>/<run-id>/run.json`` when it finishes (interrupted runs included) and points ``LATEST``
at the newest invocation into ``out`` again (itself, or a run into the same folder that started
after it). ``glmfb gate`` with no path follows the pointer, so it gates the run of the latest
invocation or refuses: it never gates an older run.json because the latest invocation stopped
early (bad input, a full disk, a crash, a kill) or is still running, nor because code it ran
(or a second run into the folder) rewrote the pointer: a run folder newer than the one named
is the latest.
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
from collections.abc import Iterator
from pathlib import Path

from glmfb.contract.errors import HarnessError, InputError, UsageError

POINTER = "LATEST"
RUN_FILE = "run.json"
JUNIT_FILE = "junit.xml"  # beside run.json: the default gate policy's JUnit
REPORT_FILE = "report.html"  # beside run.json: the page of the run
RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")  # glmfb.contract.clock.new_run_id


def start_run(out: Path, run_id: str) -> Path:
    """Begin an invocation in ``out``: remove ``out/LATEST`` first (removing needs no space, so
    even on a full disk the gate can no longer read the run before this one), create the run's
    folder, then point ``LATEST`` at it. Returns the folder. What cannot be written is a
    :class:`~glmfb.contract.errors.HarnessError` naming the path and what to do."""
    from glmfb.core.io import write_text_atomic

    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file", "give a folder for the reports (default: reports)")
    pointer = out / POINTER
    report_dir = out / run_id
    with writing(pointer, "remove"):
        pointer.unlink(missing_ok=True)
    with writing(report_dir, "create the run folder"):
        report_dir.mkdir(parents=True, exist_ok=True)
    with writing(pointer, "write"):
        write_text_atomic(pointer, run_id + "\n")
    return report_dir


def end_run(out: Path, run_id: str) -> None:
    """Once ``run_id``'s run.json is written, point ``out/LATEST`` at the newest invocation
    into ``out``: this one, or one that started after it (two runs into one folder at once),
    never an older one. Code the run ran (a target) may have rewritten the pointer meanwhile."""
    from glmfb.core.io import write_text_atomic

    pointer = out / POINTER
    newest = max([run_id, *(folder.name for folder in _run_folders(out))])
    with writing(pointer, "write"):
        if not pointer.is_file() or pointer.read_text(encoding="utf-8").strip() != newest:
            write_text_atomic(pointer, newest + "\n")


@contextlib.contextmanager
def writing(path: Path, action: str) -> Iterator[None]:
    """An :class:`OSError` while doing ``action`` to ``path`` as one line that says what to do
    (a :class:`~glmfb.contract.errors.HarnessError`, exit 3), never an internal error."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        hint = {errno.ENOSPC: "free space on that disk, or give --out a folder on another one",
                errno.EDQUOT: "free space under your quota, or give --out another folder",
                errno.EACCES: "give --out a folder you may write to", errno.EROFS: "give --out a writable folder",
                }.get(exc.errno or 0, "give --out a folder glmfb can write to")
        raise HarnessError(f"cannot {action} {path}: {reason}", hint) from None


def latest_run(out: Path) -> Path:
    """The run.json of the latest invocation that wrote into ``out``: the newer of the run
    ``LATEST`` names and the newest run folder (run ids are ordered by time, so a pointer that
    something rewrote to an older run, a target or a second run into the same folder, never
    hides a newer one). Refused (never an older run instead) when that invocation has no
    run.json (still running, or stopped before it finished), or when ``LATEST`` is gone (an
    invocation removed it and could not write it: a full disk)."""
    pointer = out / POINTER
    folders = _run_folders(out)
    if not pointer.is_file():
        if folders:
            raise HarnessError(
                f"{out} holds runs but no {POINTER} pointer: the latest invocation into it removed the pointer and "
                "could not write a new one (a full disk, a kill), or the runs were written by glmfb 0.1",
                f"read that invocation's output; to gate an older run on purpose, name it: glmfb gate {folders[-1]}")
        raise UsageError(f"no run given and none found under {out}/", "pass a run.json or a run folder, or - for stdin")
    run_id = pointer.read_text(encoding="utf-8").strip()
    # the newest invocation, also where something rewrote the pointer to an older run (a target
    # the run ran, or two runs into one folder at once): run ids are ordered by time
    run_id = max([run_id if RUN_ID.fullmatch(run_id) else "", *(folder.name for folder in folders)])
    run_file = out / run_id / RUN_FILE
    if not run_file.is_file():
        finished = [folder.name for folder in folders if folder.name < run_id and (folder / RUN_FILE).is_file()]
        raise HarnessError(
            f"the latest run into {out}/ ({run_id}) has no {RUN_FILE}: it is still running, or it stopped on bad "
            "input, crashed or was killed before it finished",
            "wait for it to finish, or read its output; glmfb gate never gates an older run instead"
            + (f" (to gate the newest finished one on purpose: glmfb gate {out / finished[-1]})" if finished else ""),
        )
    return run_file


def _run_folders(out: Path) -> list[Path]:
    """The run folders in ``out`` (named by a run id), oldest first."""
    if not out.is_dir():
        return []
    return sorted((p for p in out.iterdir() if RUN_ID.fullmatch(p.name) and p.is_dir()), key=lambda p: p.name)


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
