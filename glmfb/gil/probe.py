"""``glmfb run`` entry point for ``probe = "gil"`` definitions.

A definition gives either ``command`` (a list; ``"python"`` means the interpreter running
glmfb, and arguments naming files beside the definition are resolved there) or ``target``
(with ``args``). Options: ``duration`` (s), ``rate`` and ``native_rate`` (Hz),
``starvation_p99`` ("10ms" or a number of ms), ``trace``, ``native``, ``pyspy`` (booleans)::

    [[probe]]
    name = "dispatch-holds-gil"
    probe = "gil"
    command = ["python", "../scenarios/dispatch_gil/dispatch.py", "--mode", "hold"]
    options = { duration = 3, starvation_p99 = "10ms" }
    expect = { status = "fail", layer = "runtime", where = { function = "intranode_dispatch" } }
"""

from __future__ import annotations

import sys
from typing import Any

from glmfb.errors import InputError, UsageError
from glmfb.gil.config import (
    DEFAULT_DURATION_S,
    DEFAULT_NATIVE_RATE_HZ,
    DEFAULT_RATE_HZ,
    DEFAULT_STARVATION_P99_MS,
    GilConfig,
    parse_milliseconds,
)
from glmfb.gil.engine import trace_gil
from glmfb.suite import ProbeDefinition, RunContext
from glmfb.targets import Target
from glmfb.verdict import Verdict

KNOWN_OPTIONS = frozenset(
    {"duration", "rate", "native_rate", "starvation_p99", "trace", "native", "pyspy"}
)


def _milliseconds(value: Any, label: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return parse_milliseconds(str(value))
    except UsageError as exc:
        raise InputError(f"{label}: {exc}") from None


def resolve_command(definition: ProbeDefinition) -> tuple[str, ...]:
    """The definition's command with ``python`` and files beside the definition resolved."""
    resolved: list[str] = []
    for index, part in enumerate(definition.command):
        if index == 0 and part in ("python", "python3"):
            resolved.append(sys.executable)
        elif not part.startswith("-") and (definition.base_dir / part).exists() and "/" in part:
            resolved.append(str((definition.base_dir / part).resolve()))
        else:
            resolved.append(part)
    return tuple(resolved)


def config_from_definition(definition: ProbeDefinition) -> GilConfig:
    label = definition.label
    definition.check_options(KNOWN_OPTIONS)
    if bool(definition.command) == bool(definition.target):
        raise InputError(f"{label}: a gil probe needs exactly one of 'command' or 'target'")
    target = None
    if definition.target:
        target = Target(definition.target, {**definition.args}, base_dir=definition.base_dir)
    return GilConfig(
        name=definition.name,
        command=resolve_command(definition) if definition.command else (),
        target=target,
        duration_s=definition.number_option("duration", DEFAULT_DURATION_S),
        rate_hz=int(definition.number_option("rate", DEFAULT_RATE_HZ)),
        native_rate_hz=int(definition.number_option("native_rate", DEFAULT_NATIVE_RATE_HZ)),
        starvation_p99_ms=_milliseconds(
            definition.option("starvation_p99", DEFAULT_STARVATION_P99_MS),
            f"{label}: starvation_p99",
        ),
        trace=bool(definition.option("trace", False)),
        native=bool(definition.option("native", True)),
        use_pyspy=bool(definition.option("pyspy", True)),
    )


def run_definition(definition: ProbeDefinition, context: RunContext) -> Verdict:
    config = config_from_definition(definition)
    return trace_gil(config, context.artifact_dir(definition.name), progress=context.progress)
