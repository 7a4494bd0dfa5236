"""The kernel layer: is the candidate kernel slower or faster than the baseline, and why.

Pieces, each in its own module: :mod:`.timers` (CPU and CUDA timing), :mod:`.allocations`
(loading factories, warm-up, calibration, interleaved ABBA blocks), :mod:`.decision`
(paired bootstrap, sequential stopping, A/A noise floor, FDR across shapes),
:mod:`.opdiff` (torch.profiler operator diff and the rules that turn it into a why),
:mod:`.roofline` (ceilings measured once per process), :mod:`.saved` (``--save`` files and
pytest-benchmark JSON), :mod:`.engine` (builds the verdict) and :mod:`.probe`
(``run_definition`` for ``glmfb run``). Torch is imported only inside functions.
"""

from __future__ import annotations

# What `glmfb --help` lists about this probe, read without importing it (glmfb.core.registry).
SUMMARY = (
    "Compare two kernels in one process (interleaved ABBA blocks): how much slower or faster the "
    "candidate is, with a confidence interval, and why (operator diff)."
)
COMMANDS: dict[str, str] = {}  # the commands it brings besides its own: none
