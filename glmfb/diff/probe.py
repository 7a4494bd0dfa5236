"""Suite entry point: a ``[[probe]]`` definition with ``probe = "diff"`` to a verdict.

Options (all optional except ``requests`` when a side is a target)::

    options = { requests = "../scenarios/numerics/scan_requests.jsonl",
                rtol = 0.01, atol = 0.05,                      # global tolerance override
                tolerances = { "layers.*.scan" = { rtol = 0.02 } },   # per tap glob
                taps = ["layers.*"], localize = true, minimize = true }
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from glmfb.diff.engine import DiffConfig, run_diff
from glmfb.diff.metrics import Tolerances
from glmfb.errors import InputError
from glmfb.suite import ProbeDefinition, RunContext
from glmfb.verdict import Verdict

OPTIONS = frozenset({"requests", "rtol", "atol", "tolerances", "taps", "localize", "minimize", "max_suspects"})


def _number(label: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise InputError(f"{label} must be a non-negative number, got {value!r}")
    return float(value)


def tolerances_from_options(options: Mapping[str, Any], label: str) -> Tolerances:
    per_tap: list[tuple[str, float | None, float | None]] = []
    table = options.get("tolerances", {})
    if not isinstance(table, Mapping):
        raise InputError(f"{label}: options.tolerances must be a table of glob -> {{rtol, atol}}")
    for glob, entry in table.items():
        if not isinstance(entry, Mapping) or set(entry) - {"rtol", "atol"}:
            raise InputError(f"{label}: options.tolerances.{glob} must be {{ rtol = X, atol = Y }}")
        per_tap.append((str(glob), _number(f"{label}: rtol", entry.get("rtol")), _number(f"{label}: atol", entry.get("atol"))))
    return Tolerances(_number(f"{label}: rtol", options.get("rtol")), _number(f"{label}: atol", options.get("atol")), tuple(per_tap))


def run_definition(definition: ProbeDefinition, context: RunContext) -> Verdict:
    label = definition.label
    definition.check_options(OPTIONS)
    if not definition.baseline or not definition.candidate:
        raise InputError(f"{label}: a diff needs baseline and candidate (capture directories or targets)")
    requests = definition.option("requests")
    taps = definition.option("taps", [])
    if not isinstance(taps, list) or not all(isinstance(t, str) for t in taps):
        raise InputError(f"{label}: options.taps must be a list of globs")
    baseline_args, candidate_args = definition.side_args()
    config = DiffConfig(
        name=definition.name,
        baseline=definition.baseline,
        candidate=definition.candidate,
        report_dir=context.artifact_dir(definition.name),
        baseline_args=baseline_args,
        candidate_args=candidate_args,
        requests=definition.resolve_path(requests) if requests else None,
        tolerances=tolerances_from_options(definition.options, label),
        taps=tuple(taps),
        base_dir=definition.base_dir,
        localize=bool(definition.option("localize", True)),
        minimize=bool(definition.option("minimize", True)),
        max_suspects=int(definition.option("max_suspects", 16)),
    )
    return run_diff(config, context.progress)
