"""File helpers: atomic writes (never a half-written file) and JSON reading with clear errors."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from glmfb.errors import InputError


@contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on success it replaces ``path`` in one rename.

    On an exception (Ctrl-C included) the temporary file is removed and ``path`` is untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


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
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{name}: cannot read: {exc}") from exc
        label = name
    if not text.strip():
        raise InputError(f"{label} is empty", "expected a glmfb run or verdict as JSON")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{label} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            "expected a glmfb run or verdict (glmfb run --json, glmfb bench --json, ...)",
        ) from exc
