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


def read_end(path: str | os.PathLike[str], limit_bytes: int) -> str:
    """The last ``limit_bytes`` of a file as text (undecodable bytes replaced), read by seeking:
    memory stays bounded however much a target wrote. "" when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - limit_bytes))
            data = handle.read(limit_bytes)
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def last_lines(path: str | os.PathLike[str], lines: int, limit: int) -> str:
    """The last ``lines`` non-blank lines of a file, at most ``limit`` characters, read from
    its end (:func:`read_end`)."""
    kept = [line for line in read_end(path, 8 * limit).splitlines() if line.strip()]
    return "\n".join(kept[-lines:])[-limit:]


LOG_KEEP_BYTES = 1 << 20  # of a target's log, the head and the tail each (bound_log)
_COPY_CHUNK = 1 << 20


def bound_log(path: str | os.PathLike[str], keep_bytes: int = LOG_KEEP_BYTES) -> int:
    """Cut a target's log down to its first and last ``keep_bytes`` with a line between them
    that says how many bytes were dropped; returns that count (0: the log was kept whole, or
    could not be read). Copied a chunk at a time, so memory stays bounded; the log is replaced
    in one rename."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return 0
    dropped = size - 2 * keep_bytes
    if dropped <= 0:
        return 0
    note = (f"\n[glmfb: {dropped:,} bytes dropped here; this log keeps the first {keep_bytes:,} and the "
            f"last {keep_bytes:,} bytes of the {size:,} the target wrote]\n").encode()
    try:
        with open(path, "rb") as source, atomic_writer(path, "wb") as bounded:
            _copy(source, bounded, keep_bytes)
            bounded.write(note)
            source.seek(size - keep_bytes)
            _copy(source, bounded, keep_bytes)
    except (OSError, InputError):
        return 0
    return dropped


def _copy(source: IO[bytes], target: IO[bytes], count: int) -> None:
    while count > 0:
        chunk = source.read(min(_COPY_CHUNK, count))
        if not chunk:
            return
        target.write(chunk)
        count -= len(chunk)


MAX_DEPTH = 64  # levels of nesting a definition, a policy or an argument may hold


def check_depth(value: Any, label: str, limit: int = MAX_DEPTH) -> None:
    """Refuse data nested deeper than ``limit`` levels (an :class:`InputError` naming
    ``label``): everything after reading walks it, and nothing a probe takes is that deep.
    Walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise InputError(f"{label} is nested more than {limit} levels deep",
                             "give glmfb flatter data: no definition, policy or argument needs that depth")
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


def read_toml(path: Path, label: str | None = None) -> dict[str, Any]:
    """A TOML file as data; a file that cannot be read, is not TOML or is nested deeper than
    :data:`MAX_DEPTH` levels is an :class:`InputError` that starts with ``label`` (default:
    the path)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    label = label or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{label}: cannot read: {exc}") from exc
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{label}: invalid TOML: {exc}") from exc
    except RecursionError:
        raise InputError(f"{label} is nested too deeply to read",
                         "give glmfb flatter data: no definition, policy or argument needs that depth") from None
    check_depth(document, label)
    return document
