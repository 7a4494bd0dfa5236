"""``glmfb gap``: prefill alone against prefill + KV transfer, with an attribution (thin CLI)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glmfb.commands.common import (
    ArgOpt,
    BaselineArgOpt,
    CandidateArgOpt,
    JsonOpt,
    emit_verdict,
    progress_messages,
)


def gap_command(
    baseline: Annotated[str, typer.Argument(metavar="BASELINE", help="Baseline target (file.py:factory): one iteration per call.")],
    candidate: Annotated[str, typer.Argument(metavar="CANDIDATE", help="Candidate target, e.g. prefill + KV transfer.")],
    threshold: Annotated[str, typer.Option("--threshold", help="Largest acceptable gap (5% or 0.05).")] = "5%",
    repeats: Annotated[
        int, typer.Option("--repeats", help="Most measured iterations per side (stops earlier once decided).")
    ] = 40,
    budget: Annotated[
        float, typer.Option("--budget", help="Seconds for the interleaved measurement; inconclusive when spent.")
    ] = 40.0,
    warmup: Annotated[int, typer.Option("--warmup", help="Unmeasured iterations per side first.")] = 2,
    attribute: Annotated[
        bool, typer.Option("--attribute/--no-attribute", help="On a failing gap: bandwidth ceiling and the gil probe.")
    ] = True,
    gil_duration: Annotated[
        float, typer.Option("--gil-duration", help="Seconds the gil probe samples the candidate in steady state.")
    ] = 6.0,
    args: ArgOpt = None,
    baseline_args: BaselineArgOpt = None,
    candidate_args: CandidateArgOpt = None,
    name: Annotated[str, typer.Option("--name", help="The verdict's name.")] = "gap",
    out: Annotated[Path, typer.Option("--out", help="Folder for reports/<run-id>/<name>/ (gil artifacts).")] = Path(
        "reports"
    ),
    as_json: JsonOpt = False,
) -> None:
    """Is the candidate more than THRESHOLD slower than the baseline? If so, what ate the time."""
    from glmfb.gap import GapConfig, run_gap
    from glmfb.suite import new_run_id
    from glmfb.targets import Target, side_args
    from glmfb.units import parse_fraction

    baseline_kwargs, candidate_kwargs = side_args(args or [], baseline_args or [], candidate_args or [])
    config = GapConfig(
        name=name,
        baseline=Target(baseline, baseline_kwargs),
        candidate=Target(candidate, candidate_kwargs),
        threshold=parse_fraction(threshold),
        repeats=repeats,
        budget_s=budget,
        warmup=warmup,
        attribute=attribute,
        gil_duration_s=gil_duration,
    )
    with progress_messages() as progress:
        verdict = run_gap(config, out / new_run_id() / name, progress=progress)
    emit_verdict(verdict, as_json)


def register(app: typer.Typer) -> None:
    app.command("gap")(gap_command)
