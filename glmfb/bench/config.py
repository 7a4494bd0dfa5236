"""The frozen configuration of ``glmfb bench``; its options are declared here, once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from glmfb.contract.errors import UsageError
from glmfb.contract.options import (
    BOOL,
    FILE,
    FRACTION,
    INT,
    MILLISECONDS,
    NONNEGATIVE_INT,
    POSITIVE_INT,
    SECONDS,
    SHAPES,
    check_declared,
    choice,
    option,
)
from glmfb.core.targets import Target


def is_saved_ref(ref: str) -> bool:
    """A saved result file (glmfb ``--save`` or pytest-benchmark JSON), with an optional
    ``#baseline`` / ``#candidate`` suffix."""
    return ref.partition("#")[0].endswith(".json")


def kernel_name(ref: str) -> str:
    """The attribute part of a target reference: ``a/b.py:gated_norm_tiled`` -> ``gated_norm_tiled``."""
    return ref.rpartition(":")[2] or ref


@dataclass(frozen=True)
class BenchConfig:
    """An in-process comparison, a measurement of one target to save (no candidate), or a
    comparison of two saved files (both refs end in ``.json``).

    ``budget_s`` is the measuring time for all shapes together (A/A calibration included);
    loading, warm-up, profiling and ceilings come on top. ``threads`` pins torch's intra-op
    thread count for the run (0 leaves it as it is); it is restored afterwards.
    """

    name: str
    baseline: Target
    candidate: Target | None = None
    shapes: tuple[tuple[int, ...], ...] = option(
        (), SHAPES, "Input shape such as 8x4096. Repeatable (TOML: a list).", key="shapes", flag="--shape")
    threshold: float = option(0.05, FRACTION, "Smallest change that matters: 5% or 0.05.")
    budget_s: float = option(10.0, SECONDS, "Measuring time, all shapes together.", key="budget")
    threads: int = option(1, NONNEGATIVE_INT, "torch intra-op threads during the run (0: leave as is).")
    input_sets: int = option(4, POSITIVE_INT, "Input sets rotated per side (factory calls).")
    sample_ms: float = option(1.0, MILLISECONDS, "Target duration of one timed sample.")
    device: str = option("auto", choice("auto", "cpu", "cuda"), "Where to time: auto, cpu or cuda.")
    cuda_graph: bool = option(False, BOOL, "Replay a captured CUDA graph (CUDA only).")
    profile: bool = option(True, BOOL, "Profile both sides (torch.profiler) for the operator diff.")
    hot_check: bool = option(True, BOOL, "A pair: also time both sides briefly on one input set reused (inputs "
                                         "hot in cache) and give that change where it differs (docs/bench.md).")
    seed: int = option(0, INT, "Seed of the block order and the bootstrap.")
    save: Path | None = option(None, FILE, "Also write the raw samples here (glmfb.bench/1 JSON).")
    processes: int = option(1, POSITIVE_INT, "One target alone: fresh processes its budget is spread over (its "
                                             "interval is then their spread; docs/bench.md).")
    reference: bool = option(True, BOOL, "One target over 2+ processes: also time a fixed reference workload between "
                                         "its samples and record its time in the reference's units "
                                         "(normalized_time; docs/bench.md).")

    def __post_init__(self) -> None:
        check_declared(self)
        if self.saved:
            return
        if not self.shapes:
            raise UsageError("no shape given", "pass at least one, such as --shape 8x4096 (TOML: shapes = [\"8x4096\"])")
        if self.processes > 1 and self.candidate is not None:
            raise UsageError("processes applies to one target alone",
                             "a pair is interleaved in one process, which cancels a process's layout out of its change")
        if self.processes > 1 and self.device == "cuda":
            raise UsageError("processes runs on the CPU", "time a CUDA kernel alone in one process (processes = 1)")

    @property
    def saved(self) -> bool:
        """Both sides are saved result files: compare them across processes."""
        return is_saved_ref(self.baseline.ref) and self.candidate is not None and is_saved_ref(self.candidate.ref)

    @property
    def sample_s(self) -> float:
        return self.sample_ms / 1e3

    @property
    def torch_threads(self) -> int | None:
        return self.threads if self.threads > 0 else None
