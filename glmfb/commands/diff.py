"""``glmfb capture`` and ``glmfb diff``: thin commands over glmfb.diff.engine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from glmfb.commands.common import (
    ArgOpt,
    BaselineArgOpt,
    CandidateArgOpt,
    JsonOpt,
    console,
    emit_verdict,
    progress_messages,
)
from glmfb.errors import UsageError

if TYPE_CHECKING:
    from glmfb.verdict import Verdict

TapOpt = Annotated[
    list[str] | None,
    typer.Option("--tap", help="Only tap submodules whose name matches this glob. Repeatable."),
]


def parse_tol(items: list[str]) -> tuple[tuple[str, float | None, float | None], ...]:
    """``GLOB=RTOL,ATOL`` (either number may be left empty) per --tol."""
    parsed: list[tuple[str, float | None, float | None]] = []
    for item in items:
        glob, sep, numbers = item.rpartition("=")
        rtol_text, comma, atol_text = numbers.partition(",")
        try:
            if not sep or not glob or not comma:
                raise ValueError
            rtol = float(rtol_text) if rtol_text.strip() else None
            atol = float(atol_text) if atol_text.strip() else None
        except ValueError:
            raise UsageError(f"--tol {item!r} does not parse", "write it as --tol 'GLOB=RTOL,ATOL', e.g. 'layers.*=1e-3,1e-5'") from None
        parsed.append((glob, rtol, atol))
    return tuple(parsed)


def capture_command(
    target: Annotated[str, typer.Argument(metavar="TARGET", help="Diff target: package.module:attr or path/file.py:attr.")],
    requests: Annotated[Path, typer.Option("--requests", help="Requests, one JSON object per line.")],
    out: Annotated[Path, typer.Option("--out", help="Capture directory to write.")],
    arg: ArgOpt = None,
    tap: TapOpt = None,
) -> None:
    """Run a target over a request set; store every tapped module output (safetensors) and a manifest."""
    from glmfb.diff.engine import CaptureConfig, run_capture
    from glmfb.targets import parse_args

    config = CaptureConfig(target=target, requests=requests, out=out, args=parse_args(arg or []), taps=tuple(tap or []))
    with progress_messages() as progress:
        manifest = run_capture(config, progress)
    taps = sum(len(r.taps) for r in manifest.requests)
    console(stderr=True).print(f"captured {len(manifest.requests)} requests, {taps} tensors into {out}")


def diff_command(
    baseline: Annotated[str, typer.Argument(metavar="BASELINE", help="Baseline: a capture directory or a target.")],
    candidate: Annotated[str, typer.Argument(metavar="CANDIDATE", help="Candidate: a capture directory or a target.")],
    requests: Annotated[Path | None, typer.Option("--requests", help="Requests (needed when a side is a target).")] = None,
    atol: Annotated[float | None, typer.Option("--atol", help="Absolute tolerance for every tap (default: by dtype).")] = None,
    rtol: Annotated[float | None, typer.Option("--rtol", help="Relative tolerance for every tap (default: by dtype).")] = None,
    tol: Annotated[list[str] | None, typer.Option("--tol", help="Per-tap tolerance GLOB=RTOL,ATOL (first match wins). Repeatable.")] = None,
    tap: TapOpt = None,
    arg: ArgOpt = None,
    baseline_arg: BaselineArgOpt = None,
    candidate_arg: CandidateArgOpt = None,
    name: Annotated[str, typer.Option("--name", help="Name of the verdict.")] = "diff",
    out: Annotated[Path, typer.Option("--out", help="Report folder: artifacts go to OUT/<run-id>/<name>/.")] = Path("reports"),
    no_minimize: Annotated[bool, typer.Option("--no-minimize", help="Skip the shortest-failing-prefix search.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Compare two sides per request and tap; localize the error to a module, a position and a cause."""
    from glmfb import suite
    from glmfb.diff.engine import DiffConfig, run_diff
    from glmfb.diff.metrics import Tolerances
    from glmfb.targets import side_args

    for label, value in (("--atol", atol), ("--rtol", rtol)):
        if value is not None and value < 0:
            raise UsageError(f"{label} must be non-negative, got {value}")
    baseline_args, candidate_args = side_args(arg or [], baseline_arg or [], candidate_arg or [])
    report_dir = out / suite.new_run_id() / name
    config = DiffConfig(
        name=name, baseline=baseline, candidate=candidate, report_dir=report_dir,
        baseline_args=baseline_args, candidate_args=candidate_args, requests=requests,
        tolerances=Tolerances(rtol, atol, parse_tol(tol or [])), taps=tuple(tap or []),
        minimize=not no_minimize,
    )
    with progress_messages() as progress:
        verdict = run_diff(config, progress)
    if not as_json:
        _print_requests(verdict)
    emit_verdict(verdict, as_json)


def _print_requests(verdict: Verdict) -> None:
    """The per-request table of the verdict's evidence, above the verdict panel."""
    from rich.table import Table

    rows = next((e["rows"] for e in verdict.evidence if e.get("kind") == "requests"), None)
    if not rows:
        return
    table = Table(title="requests", title_justify="left")
    for column in ("request", "length", "status", "first divergent tap", "failing taps", "output rel. L2"):
        table.add_column(column)
    for row in rows:
        table.add_row(str(row["request"]), str(row["length"] or ""), row["status"], row["first_divergent"] or "",
                      f"{row['failing_taps']}/{row['taps']}", f"{row['output_rel_l2']:.3g}")
    console().print(table)


def register(app: typer.Typer) -> None:
    app.command("capture")(capture_command)
    app.command("diff")(diff_command)
