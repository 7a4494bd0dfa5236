"""``glmfb schema [DOCUMENT]``: the JSON Schema of verdict and run documents, or of the history
document."""

from __future__ import annotations

from typing import Annotated

import typer

from glmfb.cli.commands.common import dump_json
from glmfb.contract.errors import UsageError


def schema_command(
    document: Annotated[
        str, typer.Argument(metavar="[DOCUMENT]", help="verdict (verdict and run documents) or history "
                            "(glmfb history --json)."),
    ] = "verdict",
) -> None:
    if document == "history":
        from glmfb.workflows.history.series import HISTORY_JSON_SCHEMA

        dump_json(HISTORY_JSON_SCHEMA)
        return
    if document != "verdict":
        raise UsageError(f"no schema for {document!r}", "give verdict or history")
    from glmfb.core.documents import json_schema

    dump_json(json_schema())
