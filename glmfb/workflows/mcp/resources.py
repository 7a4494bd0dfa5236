"""The runs under ``<root>/reports`` as MCP resources.

- ``glmfb://runs/latest``: the run.json of the latest invocation (the ``reports/LATEST``
  pointer, as ``glmfb gate`` follows it: never an older run instead);
- ``glmfb://runs/{run_id}``: any run's run.json;
- ``glmfb://runs/{run_id}/artifacts/{path}``: a file in that run's folder (artifacts,
  report.html, junit.xml, the probe's captured stdout and stderr), confined to the folder:
  no ``..``, no symbolic link out of it, regular files only;
- ``glmfb://schema``: the JSON Schema of verdicts and runs (``glmfb schema``).

Reading raises :class:`ResourceError` with what is wrong; the server turns it into an MCP
error.
"""

from __future__ import annotations

import base64
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from glmfb.contract.errors import GlmfbError, InputError
from glmfb.core.probe import safe_component
from glmfb.workflows.mcp.boundary import Boundary
from glmfb.workflows.mcp.tools import LATEST_URI, SCHEMA_URI

RUNS_PREFIX = "glmfb://runs/"
MAX_RESOURCE_BYTES = 32 * 1024 * 1024
LISTED_RUNS = 50
_TEXT_SUFFIXES = {".json", ".jsonl", ".txt", ".html", ".xml", ".csv", ".md", ".toml", ".py", ".log", ".svg"}


class ResourceError(InputError):
    """A resource that cannot be read; ``not_found`` tells a missing one from a bad URI."""

    def __init__(self, message: str, *, not_found: bool = True) -> None:
        super().__init__(message)
        self.not_found = not_found


@dataclass(frozen=True)
class Contents:
    """One resource's contents: text, or bytes (sent base64)."""

    uri: str
    mime_type: str
    text: str | None = None
    blob: str | None = None


@dataclass(frozen=True)
class Listed:
    uri: str
    name: str
    description: str
    mime_type: str = "application/json"


def list_runs(boundary: Boundary) -> list[Listed]:
    """The latest run, then the newest runs (at most :data:`LISTED_RUNS`)."""
    from glmfb.core.runs import POINTER, RUN_FILE

    reports = boundary.reports
    listed = [Listed(SCHEMA_URI, "glmfb schema", "JSON Schema (draft 2020-12) of verdicts and runs")]
    if (reports / POINTER).is_file():
        listed.append(Listed(LATEST_URI, "latest run", "run.json of the latest glmfb invocation into reports/"))
    runs = sorted((p.parent.name for p in reports.glob(f"*/{RUN_FILE}")), reverse=True) if reports.is_dir() else []
    for run_id in runs[:LISTED_RUNS]:
        listed.append(Listed(f"{RUNS_PREFIX}{run_id}", f"run {run_id}", f"reports/{run_id}/run.json"))
    return listed


def read(boundary: Boundary, uri: str) -> Contents:
    """The contents of one resource (see the module docstring)."""
    from glmfb.core.runs import RUN_FILE, latest_run

    if uri == SCHEMA_URI:
        from glmfb.core.documents import json_schema
        from glmfb.core.io import dumps_json

        return Contents(uri, "application/schema+json", text=dumps_json(json_schema()))
    if not uri.startswith(RUNS_PREFIX):
        raise ResourceError(f"unknown resource {uri!r}: glmfb serves glmfb://runs/... and glmfb://schema",
                            not_found=False)
    rest = uri[len(RUNS_PREFIX):]
    run_id, _, tail = rest.partition("/")
    reports = boundary.reports
    if run_id == "latest" and not tail:
        try:
            return _file(uri, latest_run(reports))
        except GlmfbError as exc:
            raise ResourceError(f"no latest run: {exc}") from None
    if not run_id or safe_component(run_id) != run_id:
        raise ResourceError(f"{uri}: {run_id!r} is not a run id", not_found=False)
    run_dir = reports / run_id
    if not tail:
        return _file(uri, run_dir / RUN_FILE)
    kind, _, relative = tail.partition("/")
    if kind != "artifacts" or not relative:
        raise ResourceError(f"{uri}: expected glmfb://runs/{run_id}/artifacts/<path>", not_found=False)
    return _file(uri, _confined(run_dir, relative, uri))


def _confined(run_dir: Path, relative: str, uri: str) -> Path:
    from urllib.parse import unquote

    parts = Path(unquote(relative)).parts
    if Path(unquote(relative)).is_absolute() or ".." in parts:
        raise ResourceError(f"{uri}: an artifact path stays inside its run folder (no '..', not absolute)",
                            not_found=False)
    base = run_dir.resolve()
    path = (run_dir / Path(*parts)).resolve()
    if not path.is_relative_to(base):
        raise ResourceError(f"{uri}: leads outside its run folder (a symbolic link)", not_found=False)
    return path


def _file(uri: str, path: Path) -> Contents:
    if not path.exists():
        raise ResourceError(f"{uri}: no such file ({path.name})")
    if not path.is_file():
        raise ResourceError(f"{uri}: not a regular file", not_found=False)
    size = path.stat().st_size
    if size > MAX_RESOURCE_BYTES:
        raise ResourceError(f"{uri}: {size} bytes is more than this server sends ({MAX_RESOURCE_BYTES} bytes)",
                            not_found=False)
    data = path.read_bytes()
    mime = mimetypes.guess_type(path.name)[0] or ("text/plain" if path.suffix in _TEXT_SUFFIXES
                                                   else "application/octet-stream")
    if path.suffix in _TEXT_SUFFIXES or mime.startswith("text/"):
        try:
            return Contents(uri, mime, text=data.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    return Contents(uri, mime, blob=base64.b64encode(data).decode("ascii"))
