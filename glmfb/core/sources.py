"""Where in the user's own code something ran: the innermost frame outside glmfb, torch and the
standard library (told apart by the folders they are installed in), as a :class:`SourceSite`.
The diff's dtype trace names the line that narrowed a format with it; bench names the line that
calls the operator that changed."""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SourceSite:
    """A line of the user's code that ran an operation."""

    file: str
    line: int
    function: str
    code: str  # the line, stripped ("" when the file cannot be read)

    @property
    def shown_file(self) -> str:
        """The file relative to the working folder when it lies under it, else as it is."""
        try:
            return str(Path(self.file).resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            return self.file

    def describe(self) -> str:
        """``flash_attention, line 83 of tests/acceptance/ported_layers.py``."""
        return f"{self.function}, line {self.line} of {self.shown_file}"


@cache
def _library_roots() -> tuple[str, ...]:
    """The folders of glmfb, torch and the standard library in this interpreter (a rank runs the
    same one), found without importing torch, each ending in a separator."""
    import importlib.util

    import glmfb

    roots = [os.path.dirname(glmfb.__file__)]
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin is not None:
        roots.append(os.path.dirname(spec.origin))
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.append(path)
    return tuple(os.path.realpath(r) + os.sep for r in roots)


@cache
def is_users(filename: str) -> bool:
    """Whether a frame's file is the user's code: not a frame without a file (``<string>``),
    nor glmfb's, torch's or the standard library's, told apart by the folders those are installed
    in, never by a name in the path (a user's checkout may sit in a folder called ``torch``)."""
    if filename.startswith("<"):
        return False
    return not os.path.realpath(filename).startswith(_library_roots())


def user_site(boundary: Any = None) -> SourceSite | None:
    """The innermost frame of the caller's stack in the user's code (outside torch, glmfb and
    the standard library) below ``boundary`` (the frame that called the module: what called it
    is not the module's code), or None."""
    frame = sys._getframe(1)
    while frame is not None and frame is not boundary:
        code = frame.f_code
        if is_users(code.co_filename):
            line = frame.f_lineno
            text = linecache.getline(code.co_filename, line).strip()
            return SourceSite(code.co_filename, line, code.co_qualname, text)
        frame = frame.f_back  # type: ignore[assignment]
    return None
