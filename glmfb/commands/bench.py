"""``glmfb bench``: kernel microbenchmarks with a statistical verdict and a reason."""

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


def _is_saved(ref: str) -> bool:
    return ref.partition("#")[0].endswith(".json")


def bench_command(
    baseline: Annotated[str, typer.Argument(metavar="BASELINE", help="Baseline factory (pkg.mod:attr or file.py:attr), or a saved .json.")],
    candidate: Annotated[
        str | None,
        typer.Argument(metavar="CANDIDATE", help="Candidate factory or saved .json. Omit it with --save to only measure BASELINE."),
    ] = None,
    shape: Annotated[
        list[str] | None, typer.Option("--shape", help="Input shape such as 8x4096. Repeatable.")
    ] = None,
    threshold: Annotated[str, typer.Option("--threshold", help="Smallest change that matters: 5% or 0.05.")] = "5%",
    budget: Annotated[float, typer.Option("--budget", help="Seconds of measuring, all shapes together.")] = 10.0,
    as_json: JsonOpt = False,
    arg: ArgOpt = None,
    baseline_arg: BaselineArgOpt = None,
    candidate_arg: CandidateArgOpt = None,
    save: Annotated[Path | None, typer.Option("--save", help="Write the raw samples here (glmfb.bench/1 JSON).")] = None,
    threads: Annotated[
        int, typer.Option("--threads", help="torch intra-op threads during the run (0: leave as is).")
    ] = 1,
    input_sets: Annotated[int, typer.Option("--input-sets", help="Input sets rotated per side (factory calls).")] = 4,
    sample_ms: Annotated[float, typer.Option("--sample-ms", help="Target duration of one timed sample.")] = 1.0,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    cuda_graph: Annotated[bool, typer.Option("--cuda-graph", help="Replay a captured CUDA graph (CUDA only).")] = False,
    profile: Annotated[bool, typer.Option("--profile/--no-profile", help="torch.profiler operator diff for the why.")] = True,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the block order and the bootstrap.")] = 0,
    name: Annotated[str | None, typer.Option("--name", help="Name of the verdict.")] = None,
) -> None:
    """Compare two kernels in one process (interleaved ABBA blocks) and say how much slower or
    faster the candidate is, with a confidence interval, and why (operator diff)."""
    from glmfb.errors import UsageError
    from glmfb.units import parse_fraction, parse_shape

    fraction = parse_fraction(threshold)
    if _is_saved(baseline) or (candidate is not None and _is_saved(candidate)):
        if candidate is None or not (_is_saved(baseline) and _is_saved(candidate)):
            raise UsageError("comparing saved results needs two .json files", "glmfb bench OLD.json NEW.json")
        from glmfb.bench.config import SavedCompareConfig
        from glmfb.bench.engine import compare_saved

        with progress_messages() as report:
            verdict = compare_saved(SavedCompareConfig(
                name=name or "bench-saved", baseline=baseline, candidate=candidate,
                threshold=fraction, on_progress=report,
            ))
        emit_verdict(verdict, as_json)
    if candidate is None and save is None:
        raise UsageError("give BASELINE and CANDIDATE", "or one target with --save FILE to only measure it")
    if not shape:
        raise UsageError("no --shape given", "pass at least one, such as --shape 8x4096")
    from glmfb.bench.config import BenchConfig
    from glmfb.bench.engine import kernel_name, run_bench
    from glmfb.targets import Target, side_args

    shapes = tuple(parse_shape(s) for s in shape)
    base_args, cand_args = side_args(arg or [], baseline_arg or [], candidate_arg or [])
    default_name = kernel_name(baseline) if candidate is None else f"{kernel_name(candidate)}-vs-{kernel_name(baseline)}"
    with progress_messages() as report:
        config = BenchConfig(
            name=name or default_name,
            baseline=Target(baseline, base_args),
            candidate=Target(candidate, cand_args) if candidate is not None else None,
            shapes=shapes, threshold=fraction, budget_s=budget,
            threads=threads if threads > 0 else None, input_sets=input_sets,
            sample_s=sample_ms / 1e3, device=device, cuda_graph=cuda_graph, profile=profile,
            seed=seed, save=save, on_progress=report,
        )
        verdict = run_bench(config)
    emit_verdict(verdict, as_json)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_command)
