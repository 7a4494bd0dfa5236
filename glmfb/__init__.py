"""glmfb: dense-feedback benchmarking and diagnostics for inference stacks.

Probes run against targets and answer with a :class:`~glmfb.contract.verdict.Verdict` that says which
layer of the stack regressed, where, and why. The public contracts (verdict JSON, exit codes,
target references) live in :mod:`glmfb.contract.verdict` and :mod:`glmfb.core.targets`.
"""

from __future__ import annotations

__version__ = "0.1.0"
