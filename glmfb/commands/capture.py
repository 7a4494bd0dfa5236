"""``glmfb capture``: store a target's taps over a request set, for a later ``glmfb diff``.

Not a probe (it answers with a capture directory, not a verdict), but its options come from
the declarations on :class:`~glmfb.diff.config.CaptureConfig`, like a probe's.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from glmfb.commands.common import console, progress_messages
from glmfb.commands.probes import given_options, option_parameters


def register(app: typer.Typer) -> None:
    from glmfb.diff.config import CaptureConfig

    def capture_command(**values: Any) -> None:
        from glmfb.diff.engine import run_capture
        from glmfb.targets import parse_args

        config = CaptureConfig(target=values["target"], out=values["out"], args=parse_args(values.get("arg") or []),
                               **given_options(CaptureConfig, values))
        with progress_messages() as progress:
            manifest = run_capture(config, progress)
        taps = sum(len(r.taps) for r in manifest.requests)
        console(stderr=True).print(f"captured {len(manifest.requests)} requests, {taps} tensors into {config.out}")

    pos = inspect.Parameter.POSITIONAL_OR_KEYWORD
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("target", pos, annotation=Annotated[str, typer.Argument(
            metavar="TARGET", help="Diff target: package.module:attr or path/file.py:attr.")]),
        inspect.Parameter("out", kw, annotation=Annotated[Path, typer.Option(
            "--out", metavar="DIR", help="Capture directory to write.")]),
        inspect.Parameter("arg", kw, default=None, annotation=Annotated[list[str] | None, typer.Option(
            "--arg", metavar="KEY=VALUE", help="Keyword argument for the target factory. Repeatable.")]),
        *option_parameters(CaptureConfig),
    ]
    capture_command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    app.command("capture", help="Run a target over a request set; store every tapped module output "
                                "(safetensors) and a manifest.")(capture_command)
