"""``glmfb capture``: store a target's taps over a request set, for a later ``glmfb diff``.

Not a probe (it answers with a capture directory, not a verdict), but its options come from
the declarations on :class:`~glmfb.diff.config.CaptureConfig`, like a probe's.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from glmfb.commands.common import console, parse_timeout, progress_messages
from glmfb.commands.probes import given_options, option_parameters


def register(app: typer.Typer) -> None:
    from glmfb.diff.config import CaptureConfig

    def capture_command(**values: Any) -> None:
        import tempfile

        from glmfb.supervise import call_isolated
        from glmfb.targets import parse_args

        config = CaptureConfig(target=values["target"], out=values["out"], args=parse_args(values.get("arg") or []),
                               **given_options(CaptureConfig, values))
        if config.requests is not None and not config.requests.is_file():
            from glmfb.errors import UsageError

            raise UsageError(f"--requests {config.requests}: no such file")
        import os

        timeout_s = parse_timeout(values.get("timeout"))
        with progress_messages() as progress:
            if os.environ.get("GLMFB_ISOLATE", "1") == "0":  # debugging: in this process
                from glmfb.diff.engine import capture_job

                result = capture_job(config, progress)
            else:
                logs = Path(tempfile.mkdtemp(prefix="glmfb-capture-"))  # the child's stdout and stderr
                result = call_isolated("glmfb.diff.engine:capture_job", config, artifact_dir=logs,
                                       progress=progress, timeout_s=timeout_s)
        console(stderr=True).print(f"captured {result['requests']} requests, {result['tensors']} tensors into "
                                   f"{config.out}")

    pos = inspect.Parameter.POSITIONAL_OR_KEYWORD
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("target", pos, annotation=Annotated[str, typer.Argument(
            metavar="TARGET", help="Diff target: package.module:attr or path/file.py:attr.")]),
        inspect.Parameter("out", kw, annotation=Annotated[Path, typer.Option(
            "--out", metavar="DIR", help="Capture directory to write.")]),
        inspect.Parameter("arg", kw, default=None, annotation=Annotated[list[str] | None, typer.Option(
            "--arg", metavar="KEY=VALUE", help="Keyword argument for the target factory. Repeatable.")]),
        inspect.Parameter("timeout", kw, default=None, annotation=Annotated[str | None, typer.Option(
            "--timeout", metavar="DURATION", help="Stop the target (and what it started) after this long.")]),
        *option_parameters(CaptureConfig),
    ]
    capture_command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    app.command("capture", help="Run a target over a request set; store every tapped module output "
                                "(safetensors) and a manifest.")(capture_command)
