"""The ``history`` tool: the recorded verdicts as series with their change points, like
``glmfb history --json`` (and ``--check``) run in the root.

The store is the one ``glmfb history`` run in the root reads: ``$GLMFB_HISTORY`` as the server
was started, else ``reports/history.sqlite`` under the root. A ``store`` argument names another:
a ``sqlite:///PATH`` file under the root, or a PostgreSQL database (``postgresql://...``)."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import GlmfbError, InputError
from glmfb.workflows.mcp.boundary import strings
from glmfb.workflows.mcp.tools.base import (
    Answer,
    CallContext,
    Prepared,
    ToolDef,
    refuse_unknown,
    with_defs,
)

if TYPE_CHECKING:
    from glmfb.workflows.mcp.tools import Toolbox

LABEL = "glmfb history"


def history_schema() -> dict[str, Any]:
    """The ``glmfb.history/1`` schema (``glmfb schema history``), to sit in an output's ``$defs``."""
    from glmfb.workflows.history.series import HISTORY_JSON_SCHEMA

    schema = copy.deepcopy(HISTORY_JSON_SCHEMA)
    for key in ("$schema", "$id"):
        schema.pop(key, None)
    return schema


@dataclass
class HistoryTool:
    """``history``: a series per definition, metric and machine, with its change points."""

    box: Toolbox

    @cached_property
    def definition(self) -> ToolDef:
        output = with_defs({
            "type": "object",
            "required": ["history"],
            "properties": {
                "history": {"$ref": "#/$defs/history"},
                "regressed": {"type": "integer", "minimum": 0, "description": "with check: the series whose newest "
                              "segment is worse than the one before by more than the threshold"},
                "cannot_tell": {"type": "integer", "minimum": 0, "description": "with check: the series whose runs "
                                "are too noisy or too few to rule out a regression of the threshold's size"},
                "exit_code": {"type": "integer", "description": "with check: what glmfb history --check exits with "
                              "(0 pass, 1 some series regressed, 4 none did but some cannot tell)"},
            },
        }, {"history": history_schema()})
        return ToolDef(
            "history", "glmfb history",
            "The history of recorded verdicts (every glmfb run and probe command records its verdicts), like glmfb "
            "history --json: a series per definition, metric and machine, each run with its value, interval and "
            "commit, and the change points (the commit range, the size with its interval, the confidence). With "
            "check, also whether each series regressed past the threshold (a step, or a creep in its newest runs) "
            "or cannot tell (its runs too noisy to rule that out), and the exit code glmfb history --check gives. Machines are never mixed unless all_machines.",
            {"type": "object", "additionalProperties": False, "properties": {
                "patterns": {"type": ["string", "array"], "items": {"type": "string"},
                             "description": "Definition names to show (glob or substring); all when none."},
                "all_machines": {"type": "boolean", "description": "One series per definition and metric over every "
                                 "machine (default: one per machine)."},
                "check": {"type": "boolean", "description": "Judge each series' newest segment against the one "
                          "before (glmfb history --check)."},
                "threshold": {"type": ["string", "number"], "description": "For check: how much worse counts, 5% or "
                              "0.05 (default 5%)."},
                "store": {"type": "string", "description": "The history store: sqlite:///PATH (a file under the root) "
                          "or postgresql://USER@HOST:PORT/DB (default: $GLMFB_HISTORY, else reports/history.sqlite)."},
            }}, output, read_only=True)

    def prepare(self, arguments: dict[str, Any]) -> Prepared:
        refuse_unknown(LABEL, arguments, self.definition.input_schema["properties"])
        patterns = strings(arguments.get("patterns", []), "patterns")
        all_machines = _flag(arguments, "all_machines")
        check = _flag(arguments, "check")
        threshold = _threshold(arguments.get("threshold", "5%"))
        url = self._store(arguments.get("store"))
        timeout_s, _ = self.box.boundary.timeout(None)

        def work(ctx: CallContext) -> Answer:
            try:
                return _history(url, patterns, all_machines, threshold if check else None)
            except GlmfbError as exc:
                message = exc.message if exc.message.startswith(LABEL) else f"{LABEL}: {exc.message}"
                raise InputError(message, exc.hint) from None

        return Prepared("history", timeout_s, work)

    def _store(self, value: Any) -> str:
        """The store's URL: a SQLite file resolved under the root, a PostgreSQL URL as given."""
        from glmfb.workflows.history.store import (
            POSTGRES_PREFIXES,
            SQLITE_PREFIX,
            check_url,
            chosen_url,
            sqlite_path,
        )

        if value is None:
            return chosen_url(None, self.box.boundary.reports, os.environ)
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"argument 'store': expected a URL as a non-empty string, got {value!r:.80}")
        url = value.strip()
        try:
            check_url(url)
        except GlmfbError as exc:
            raise InputError(f"argument 'store': {exc.message}", exc.hint) from None
        if url.startswith(POSTGRES_PREFIXES):
            return url
        path = self.box.boundary.path(str(sqlite_path(url)), "store")
        return SQLITE_PREFIX + str(path)


def _flag(arguments: dict[str, Any], key: str) -> bool:
    value = arguments.get(key, False)
    if not isinstance(value, bool):
        raise InputError(f"argument {key!r}: expected true or false, got {value!r:.80}")
    return value


def _threshold(value: Any) -> float:
    from glmfb.contract.units import OptionValueError, parse_fraction

    try:
        return parse_fraction(value)
    except OptionValueError as exc:
        raise InputError(f"argument 'threshold': {exc.problem}", exc.hint or None) from None


def _history(url: str, patterns: list[str], all_machines: bool, threshold: float | None) -> Answer:
    """The document, as glmfb history --json prints it, and a few lines for the model."""
    from glmfb.workflows.history.render import change_point_line, short_commit, show_value
    from glmfb.workflows.history.series import build_series, history_document
    from glmfb.workflows.history.store import describe, open_store

    with open_store(url, create=False) as store:
        records = store.records()
    if not records:
        raise InputError(f"the history {describe(url)} holds no verdicts", "glmfb run records every verdict it writes")
    series = build_series(records, patterns, all_machines=all_machines)
    if not series:
        names = sorted({r.definition for r in records if r.value is not None})
        raise InputError(f"no series in the history {describe(url)} matches {' '.join(repr(p) for p in patterns)}"
                         if patterns else f"the history {describe(url)} holds no verdict with a metric value",
                         f"definitions with values: {', '.join(names[:8])}" if names else None)
    document = history_document(series, store=describe(url), patterns=patterns, all_machines=all_machines,
                                threshold=threshold)
    structured: dict[str, Any] = {"history": document}
    lines = [f"glmfb history {describe(url)}: {len(series)} series"]
    if threshold is not None:
        structured["regressed"] = document["regressed"]
        structured["cannot_tell"] = document["cannot_tell"]
        structured["exit_code"] = document["exit_code"]
        lines[0] += (f"; {document['regressed']} regressed by more than {threshold:.1%} (a step in the newest "
                     f"segment or a creep), {document['cannot_tell']} cannot tell (exit code {structured['exit_code']})")
    for item in document["series"]:
        newest, unit = item["newest"], item["unit"]
        points = [change_point_line(point, unit, item["relative"]) for point in item["change_points"]]
        lines.append(f"- {item['definition']} {item['metric']} on {item['machine_label']}: {item['runs']} runs, "
                     f"newest {show_value(newest['value'], unit)} ({short_commit(newest)})"
                     + (" REGRESSED" if item.get("regressed") else "")
                     + (f" CANNOT TELL: {item['check']['reason']}" if item.get("check", {}).get("status") == "cannot_tell"
                        else f" ({item['check']['reason']})" if item.get("regressed") else "")
                     + "".join(f"\n  change point {line}" for line in points))
    return Answer("\n".join(lines), structured)
