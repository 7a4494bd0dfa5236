"""File helpers: atomic writes (never a half-written file) and JSON reading with clear errors."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from glmfb.contract.errors import InputError


@contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on success it replaces ``path`` in one rename.

    On an exception (Ctrl-C included) the temporary file is removed and ``path`` is untouched.
    A symlink is followed (the file it points at is replaced, the link stays). A character
    device (``/dev/stdout``, ``/dev/null``) is written through, not replaced; any other
    existing non-regular file (a folder, a FIFO, a socket) is refused with an
    :class:`~glmfb.contract.errors.InputError`.
    """
    target = Path(path)
    if target.is_symlink():
        target = target.resolve()
    try:
        info = os.stat(target)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise InputError(f"{target}: cannot write: {exc.strerror or exc}") from exc
    if info is not None and stat.S_ISCHR(info.st_mode):
        try:
            with open(target, mode, encoding=None if "b" in mode else "utf-8") as device:
                yield device
        except OSError as exc:
            raise InputError(f"cannot write {target}: {exc.strerror or exc}") from exc
        return
    if info is not None and not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise InputError(f"{target} is {kind}: glmfb writes only regular files", "give a file path")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o666 & ~_umask())  # as an ordinary open() would: the user's umask
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    with atomic_writer(path) as handle:
        handle.write(text)


def dumps_json(data: Any) -> str:
    """JSON text as glmfb writes it: indented, keys in insertion order, no NaN."""
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    write_text_atomic(path, dumps_json(data))


def read_json(source: str | os.PathLike[str]) -> Any:
    """Parse JSON from a file path, or from standard input when ``source`` is ``-``."""
    name = str(source)
    if name == "-":
        text = sys.stdin.read()
        label = "standard input"
    else:
        path = Path(name)
        if not path.is_file():
            raise InputError(f"{name}: no such file", "give the path of a run.json or a verdict")
        try:
            text = path.read_text(encoding="utf-8", errors="strict")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{name}: cannot read: {exc}") from exc
        label = name
    if not text.strip():
        raise InputError(f"{label} is empty", "expected a glmfb run or verdict as JSON")
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(f"{label} is nested too deeply to be a glmfb document",
                         "expected a glmfb run or verdict") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{label} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            "expected a glmfb run or verdict (glmfb run --json, glmfb bench --json, ...)",
        ) from exc
