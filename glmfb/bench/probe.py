"""``run_definition`` for ``glmfb run``: a bench probe definition to a verdict.

Options (``options = {...}`` in a ``[[probe]]`` table, all optional except ``shapes``)::

    shapes = ["8x4096", "32x2048"]   # required
    threshold = "5%"                 # or 0.05
    budget = 10                      # seconds of measuring, all shapes together
    threads = 1                      # torch intra-op threads (0: leave as it is)
    input_sets = 4
    sample_ms = 1.0                  # target duration of one timed sample
    device = "auto"                  # auto | cpu | cuda
    cuda_graph = false
    profile = true                   # torch.profiler operator diff for the why
    seed = 0
    save = true                      # write the samples to the probe's artifact folder

``baseline`` and ``candidate`` are factory targets, or both saved files (``.json``, a
``#side`` suffix allowed), which are then compared across processes.
"""

from __future__ import annotations

from typing import Any

from glmfb.bench.config import (
    DEFAULT_BUDGET_S,
    DEFAULT_INPUT_SETS,
    DEFAULT_SAMPLE_S,
    BenchConfig,
    SavedCompareConfig,
)
from glmfb.bench.engine import compare_saved, run_bench
from glmfb.errors import InputError
from glmfb.suite import ProbeDefinition, RunContext
from glmfb.targets import Target, portable_ref
from glmfb.units import parse_fraction, parse_shape
from glmfb.verdict import Verdict

OPTIONS = frozenset(
    {"shapes", "threshold", "budget", "threads", "input_sets", "sample_ms", "device", "cuda_graph",
     "profile", "seed", "save"}
)


def _is_saved(ref: str) -> bool:
    return ref.partition("#")[0].endswith(".json")


def run_definition(definition: ProbeDefinition, context: RunContext) -> Verdict:
    """Build the bench configuration from a definition and run it."""
    definition.check_options(OPTIONS)
    if not definition.baseline or not definition.candidate:
        raise InputError(f"probe {definition.name!r}: a bench probe needs baseline and candidate")
    threshold = parse_fraction(definition.option("threshold", "5%"))
    if _is_saved(definition.baseline) and _is_saved(definition.candidate):
        return compare_saved(SavedCompareConfig(
            name=definition.name,
            baseline=str(definition.resolve_path(definition.baseline.partition("#")[0]))
            + _suffix(definition.baseline),
            candidate=str(definition.resolve_path(definition.candidate.partition("#")[0]))
            + _suffix(definition.candidate),
            threshold=threshold,
            on_progress=context.progress,
        ))
    shapes_option: Any = definition.option("shapes")
    if not isinstance(shapes_option, list) or not shapes_option:
        raise InputError(f"probe {definition.name!r}: options.shapes must be a list such as ['8x4096']")
    baseline_args, candidate_args = definition.side_args()
    threads = int(definition.number_option("threads", 1))
    save = definition.option("save", True)
    config = BenchConfig(
        name=definition.name,
        baseline=Target(portable_ref(definition.baseline, definition.base_dir), baseline_args,
                        base_dir=definition.base_dir),
        candidate=Target(portable_ref(definition.candidate, definition.base_dir), candidate_args,
                         base_dir=definition.base_dir),
        shapes=tuple(parse_shape(s) for s in shapes_option),
        threshold=threshold,
        budget_s=definition.number_option("budget", DEFAULT_BUDGET_S),
        threads=threads if threads > 0 else None,
        input_sets=int(definition.number_option("input_sets", DEFAULT_INPUT_SETS)),
        sample_s=definition.number_option("sample_ms", DEFAULT_SAMPLE_S * 1e3) / 1e3,
        device=str(definition.option("device", "auto")),
        cuda_graph=bool(definition.option("cuda_graph", False)),
        profile=bool(definition.option("profile", True)),
        seed=int(definition.number_option("seed", 0)),
        save=context.artifact_dir(definition.name) / "bench-samples.json" if save else None,
        on_progress=context.progress,
    )
    return run_bench(config)


def _suffix(ref: str) -> str:
    _, sep, side = ref.partition("#")
    return f"#{side}" if sep else ""
