"""The frozen configurations the bench engine takes (built by the CLI or a probe definition)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from glmfb.errors import UsageError
from glmfb.targets import Target

DEFAULT_THRESHOLD = 0.05
DEFAULT_BUDGET_S = 10.0
DEFAULT_INPUT_SETS = 4
DEFAULT_SAMPLE_S = 1e-3


@dataclass(frozen=True)
class BenchConfig:
    """An in-process comparison (``candidate`` set) or a measurement of one target to save.

    ``budget_s`` is the measuring time for all shapes together (A/A calibration included);
    loading, warm-up, profiling and ceilings come on top. ``threads`` pins torch's intra-op
    thread count for the run (None leaves it as it is); it is restored afterwards.
    """

    name: str
    baseline: Target
    candidate: Target | None
    shapes: tuple[tuple[int, ...], ...]
    threshold: float = DEFAULT_THRESHOLD
    budget_s: float = DEFAULT_BUDGET_S
    threads: int | None = 1
    input_sets: int = DEFAULT_INPUT_SETS
    sample_s: float = DEFAULT_SAMPLE_S
    device: str = "auto"
    cuda_graph: bool = False
    profile: bool = True
    seed: int = 0
    save: Path | None = None
    on_progress: Callable[[str], None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.shapes:
            raise UsageError("no shape given", "pass at least one --shape, such as --shape 8x4096")
        if not self.budget_s > 0:
            raise UsageError(f"budget {self.budget_s} s is not positive", "use --budget 10")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"threads {self.threads} must be at least 1")
        if self.input_sets < 1:
            raise UsageError(f"input sets {self.input_sets} must be at least 1")
        if not self.sample_s > 0:
            raise UsageError(f"sample time {self.sample_s} s is not positive")
        if self.device not in ("auto", "cpu", "cuda"):
            raise UsageError(f"device {self.device!r} is not auto, cpu or cuda")

    def progress(self, message: str) -> None:
        if self.on_progress is not None:
            self.on_progress(message)


@dataclass(frozen=True)
class SavedCompareConfig:
    """A comparison of two saved result files (glmfb ``--save`` or pytest-benchmark JSON).

    Each path may end in ``#baseline`` or ``#candidate`` to pick a side of a file that holds
    both (one written by ``glmfb bench A B --save``).
    """

    name: str
    baseline: str
    candidate: str
    threshold: float = DEFAULT_THRESHOLD
    on_progress: Callable[[str], None] | None = field(default=None, compare=False)
