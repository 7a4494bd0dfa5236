"""``glmfb run`` entry point for ``probe = "gap"`` definitions.

A definition names ``baseline`` and ``candidate`` targets (factories returning a zero-argument
callable that runs one iteration), with ``args`` / ``baseline_args`` / ``candidate_args``.
Options: ``threshold`` ("5%" or 0.05), ``repeats``, ``min_repeats``, ``warmup``, ``budget``
(s), ``attribute`` (bool), ``gil_duration`` and ``gil_startup`` (s), ``gil_rate`` (Hz)::

    [[probe]]
    name = "kv-transfer-dispatch-holds-gil"
    probe = "gap"
    baseline = "../scenarios/kv_transfer/scenario.py:prefill_only"
    candidate = "../scenarios/kv_transfer/scenario.py:prefill_transfer_holding"
    options = { threshold = "5%", budget = 30 }
    expect = { status = "fail", layer = "transfer", where = { function = "intranode_dispatch" } }
"""

from __future__ import annotations

from typing import Any

from glmfb.errors import InputError, UsageError
from glmfb.gap.config import GapConfig
from glmfb.gap.engine import run_gap
from glmfb.suite import ProbeDefinition, RunContext
from glmfb.targets import Target
from glmfb.units import parse_fraction
from glmfb.verdict import Verdict

KNOWN_OPTIONS = frozenset(
    {"threshold", "repeats", "min_repeats", "warmup", "budget", "attribute",
     "gil_duration", "gil_startup", "gil_rate"}
)


def config_from_definition(definition: ProbeDefinition) -> GapConfig:
    label = definition.label
    definition.check_options(KNOWN_OPTIONS)
    if not definition.baseline or not definition.candidate:
        raise InputError(f"{label}: a gap probe needs 'baseline' and 'candidate' targets")
    baseline_args, candidate_args = definition.side_args()
    defaults: dict[str, Any] = {name: f.default for name, f in GapConfig.__dataclass_fields__.items()}
    try:
        return GapConfig(
            name=definition.name,
            baseline=Target(definition.baseline, baseline_args, base_dir=definition.base_dir),
            candidate=Target(definition.candidate, candidate_args, base_dir=definition.base_dir),
            threshold=parse_fraction(definition.option("threshold", "5%")),
            repeats=int(definition.number_option("repeats", defaults["repeats"])),
            min_repeats=int(definition.number_option("min_repeats", defaults["min_repeats"])),
            warmup=int(definition.number_option("warmup", defaults["warmup"])),
            budget_s=definition.number_option("budget", defaults["budget_s"]),
            attribute=bool(definition.option("attribute", True)),
            gil_duration_s=definition.number_option("gil_duration", defaults["gil_duration_s"]),
            gil_startup_s=definition.number_option("gil_startup", defaults["gil_startup_s"]),
            gil_rate_hz=definition.number_option("gil_rate", defaults["gil_rate_hz"]),
        )
    except UsageError as exc:
        raise InputError(f"{label}: {exc}") from None


def run_definition(definition: ProbeDefinition, context: RunContext) -> Verdict:
    config = config_from_definition(definition)
    return run_gap(config, context.artifact_dir(definition.name), progress=context.progress)
