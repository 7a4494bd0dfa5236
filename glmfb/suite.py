"""Probe definitions: discover them in ``probes/`` (TOML), run them, judge their expectations.

A definition file holds one or more ``[[probe]]`` tables::

    [[probe]]
    name = "gated-norm-tiled-vs-fused"       # unique in the suite
    probe = "bench"                          # diff | bench | gil | gap
    baseline = "../scenarios/decode_norm/kernels.py:fused"
    candidate = "../scenarios/decode_norm/kernels.py:tiled"
    description = "CONTEXT.md bug 3: the tiled kernel recomputes the norm per tile"
    args = { heads = 8 }                     # to both sides (``--arg``)
    baseline_args = {}                       # to one side
    candidate_args = {}
    options = { shapes = ["8x4096"], threshold = "5%" }   # probe-specific
    expect = { status = "fail", layer = "kernel", where = { kernel = "tiled*" } }

Relative file paths in a definition are relative to the definition file. Each probe engine
exposes ``run_definition(definition, context) -> Verdict``; it validates its own options.
"""

from __future__ import annotations

import fnmatch
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from glmfb.errors import GlmfbError, InputError, UsageError
from glmfb.verdict import (
    Expectation,
    Layer,
    ProbeKind,
    Run,
    Status,
    Verdict,
    traceback_evidence,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Where each probe kind's engine lives: "module:function", imported only when needed.
ENGINES: dict[ProbeKind, str] = {
    ProbeKind.DIFF: "glmfb.diff.probe:run_definition",
    ProbeKind.BENCH: "glmfb.bench.probe:run_definition",
    ProbeKind.GIL: "glmfb.gil.probe:run_definition",
    ProbeKind.GAP: "glmfb.gap.probe:run_definition",
}

DEFINITION_KEYS = frozenset(
    {
        "name",
        "probe",
        "description",
        "baseline",
        "candidate",
        "target",
        "command",
        "args",
        "baseline_args",
        "candidate_args",
        "options",
        "expect",
    }
)
EXPECT_KEYS = frozenset({"status", "layer", "where"})


@dataclass(frozen=True)
class ProbeDefinition:
    """One probe of a suite, as read from a definition file."""

    name: str
    probe: ProbeKind
    source: Path
    description: str = ""
    baseline: str | None = None
    candidate: str | None = None
    target: str | None = None
    command: tuple[str, ...] = ()
    args: Mapping[str, Any] = field(default_factory=dict)
    baseline_args: Mapping[str, Any] = field(default_factory=dict)
    candidate_args: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    expect: Expectation | None = None

    @property
    def base_dir(self) -> Path:
        """The directory relative paths in this definition are resolved against."""
        return self.source.parent

    def resolve_path(self, value: str) -> Path:
        """A file path from this definition: absolute, relative to the definition, or cwd."""
        path = Path(value)
        if path.is_absolute():
            return path
        beside = Path(os.path.normpath(self.base_dir / path))
        in_cwd = Path.cwd() / path
        return in_cwd if not beside.exists() and in_cwd.exists() else beside

    def side_args(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Keyword arguments for the baseline and the candidate."""
        return (
            {**self.args, **self.baseline_args},
            {**self.args, **self.candidate_args},
        )

    def option(self, key: str, default: Any = None) -> Any:
        return self.options.get(key, default)

    @property
    def label(self) -> str:
        """How errors name this definition: ``probes/bench.toml: probe 'x'``."""
        return f"{self.source}: probe {self.name!r}"

    def check_options(self, known: Iterable[str]) -> None:
        """Raise :class:`InputError` naming the first option the engine does not know."""
        known = sorted(known)
        unknown = sorted(set(self.options) - set(known))
        if unknown:
            raise InputError(
                f"{self.label}: unknown {self.probe.value} option {unknown[0]!r}",
                f"known: {', '.join(known)}",
            )

    def number_option(self, key: str, default: float) -> float:
        """A numeric option; anything else (a string, a boolean) is an :class:`InputError`."""
        value = self.options.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{self.label}: option {key!r} must be a number, got {value!r}")
        return float(value)


@dataclass(frozen=True)
class RunContext:
    """What a probe engine gets besides its definition: where to put its artifacts."""

    run_id: str
    report_dir: Path
    on_progress: Callable[[str], None] | None = None

    def artifact_dir(self, probe_name: str) -> Path:
        """A directory for one probe's artifacts, created on first use."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in probe_name)
        path = self.report_dir / safe
        path.mkdir(parents=True, exist_ok=True)
        return path

    def progress(self, message: str) -> None:
        if self.on_progress is not None:
            self.on_progress(message)


def new_run_id(now: datetime | None = None) -> str:
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{time.monotonic_ns() % 0xFFFF:04x}"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------------------------


def discover(paths: Sequence[str | Path]) -> list[Path]:
    """Definition files (``*.toml``) under the given files or directories, sorted."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            if path.suffix != ".toml":
                raise InputError(f"{path}: not a probe definition (.toml)")
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(p for p in path.rglob("*.toml") if p.is_file()))
        else:
            raise InputError(
                f"{path}: no such file or directory", "give a probes/ folder or .toml files"
            )
    return found


def load_definitions(files: Iterable[Path]) -> list[ProbeDefinition]:
    """Parse and check definition files; a bad file is a usage error naming file and key."""
    definitions: list[ProbeDefinition] = []
    seen: dict[str, Path] = {}
    for path in files:
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{path}: invalid TOML: {exc}") from exc
        unknown_top = set(document) - {"probe"}
        if unknown_top:
            raise InputError(
                f"{path}: unknown top-level key {sorted(unknown_top)[0]!r}",
                "definitions go in [[probe]] tables",
            )
        tables = document.get("probe", [])
        if not isinstance(tables, list):
            raise InputError(f"{path}: 'probe' must be an array of tables", "write [[probe]]")
        for index, table in enumerate(tables):
            definition = _definition_from_table(path, index, table)
            if definition.name in seen:
                raise InputError(
                    f"{path}: probe name {definition.name!r} already defined in {seen[definition.name]}",
                    "names must be unique in a suite",
                )
            seen[definition.name] = path
            definitions.append(definition)
    return definitions


def _definition_from_table(path: Path, index: int, table: Mapping[str, Any]) -> ProbeDefinition:
    label = f"{path}: probe #{index + 1}"
    unknown = set(table) - DEFINITION_KEYS
    if unknown:
        raise InputError(
            f"{label}: unknown key {sorted(unknown)[0]!r}",
            f"known keys: {', '.join(sorted(DEFINITION_KEYS))}",
        )
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{label}: missing 'name'")
    label = f"{path}: probe {name!r}"
    try:
        kind = ProbeKind(table.get("probe"))
    except ValueError:
        raise InputError(
            f"{label}: 'probe' is {table.get('probe')!r}",
            f"use one of {', '.join(k.value for k in ProbeKind)}",
        ) from None
    for key in ("args", "baseline_args", "candidate_args", "options", "expect"):
        if key in table and not isinstance(table[key], dict):
            raise InputError(f"{label}: {key!r} must be a table")
    for key in ("baseline", "candidate", "target", "description"):
        if key in table and not isinstance(table[key], str):
            raise InputError(f"{label}: {key!r} must be a string")
    command = table.get("command", [])
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise InputError(f"{label}: 'command' must be a list of strings")
    expect = None
    if "expect" in table:
        raw = table["expect"]
        unknown = set(raw) - EXPECT_KEYS
        if unknown:
            raise InputError(
                f"{label}: unknown key expect.{sorted(unknown)[0]}", "use status, layer, where"
            )
        try:
            expect = Expectation(
                status=Status(raw["status"]) if "status" in raw else None,
                layer=Layer(raw["layer"]) if "layer" in raw else None,
                where=dict(raw.get("where", {})),
            )
        except ValueError as exc:
            raise InputError(f"{label}: bad expectation: {exc}") from exc
    return ProbeDefinition(
        name=name,
        probe=kind,
        source=path.resolve(),
        description=table.get("description", ""),
        baseline=table.get("baseline"),
        candidate=table.get("candidate"),
        target=table.get("target"),
        command=tuple(command),
        args=dict(table.get("args", {})),
        baseline_args=dict(table.get("baseline_args", {})),
        candidate_args=dict(table.get("candidate_args", {})),
        options=dict(table.get("options", {})),
        expect=expect,
    )


def select(
    definitions: Sequence[ProbeDefinition], patterns: Sequence[str]
) -> list[ProbeDefinition]:
    """Definitions whose name matches any glob (all when no patterns)."""
    if not patterns:
        return list(definitions)
    return [
        d
        for d in definitions
        if any(fnmatch.fnmatchcase(d.name, p) or p in d.name for p in patterns)
    ]


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------

Engine = Callable[[ProbeDefinition, RunContext], Verdict]


def load_engine(kind: ProbeKind) -> Engine:
    module_name, _, attr = ENGINES[kind].partition(":")
    module = importlib.import_module(module_name)
    engine: Engine = getattr(module, attr)
    return engine


def run_definition(definition: ProbeDefinition, context: RunContext) -> Verdict:
    """Run one definition; never raises for a probe failure: a broken probe is an error verdict."""
    started = time.perf_counter()
    try:
        verdict = load_engine(definition.probe)(definition, context)
    except GlmfbError as exc:
        verdict = Verdict.harness_error(definition.probe, definition.name, str(exc))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # a probe that broke is an error verdict, never a pass
        verdict = Verdict.harness_error(
            definition.probe,
            definition.name,
            f"the probe raised {type(exc).__name__}: {exc}",
            evidence=[traceback_evidence(exc)],
        )
    if verdict.duration_s == 0.0:
        verdict = replace(verdict, duration_s=time.perf_counter() - started)
    if definition.expect is not None:
        verdict = verdict.with_expectation(definition.expect)
    return verdict


def run_suite(
    definitions: Sequence[ProbeDefinition],
    context: RunContext,
    *,
    on_start: Callable[[ProbeDefinition], None] | None = None,
    on_done: Callable[[ProbeDefinition, Verdict], None] | None = None,
) -> Run:
    """Run every definition in order. Ctrl-C keeps what finished and marks the rest as error."""
    from glmfb.env import fingerprint

    started = utc_now()
    verdicts: list[Verdict] = []
    interrupted = False
    for definition in definitions:
        if interrupted:
            verdict = _interrupted_verdict(definition, "not run: the run was interrupted (Ctrl-C)")
        else:
            if on_start is not None:
                on_start(definition)
            try:
                verdict = run_definition(definition, context)
            except KeyboardInterrupt:
                interrupted = True
                verdict = _interrupted_verdict(definition, "interrupted (Ctrl-C) while running")
        verdicts.append(verdict)
        if on_done is not None:
            on_done(definition, verdict)
    return Run(
        id=context.run_id,
        started=started,
        finished=utc_now(),
        verdicts=tuple(verdicts),
        env=fingerprint(),
        interrupted=interrupted,
    )


def _interrupted_verdict(definition: ProbeDefinition, why: str) -> Verdict:
    verdict = Verdict.harness_error(
        definition.probe, definition.name, why, next=[f"glmfb run -k {definition.name}"]
    )
    if definition.expect is not None:  # an interrupted probe never meets its expectation
        verdict = replace(verdict, expect=definition.expect, expect_met=False)
    return verdict


def ensure_definitions(definitions: Sequence[ProbeDefinition], paths: Sequence[str | Path]) -> None:
    if not definitions:
        where = ", ".join(str(p) for p in paths)
        raise UsageError(
            f"no probe definitions found in {where}",
            "add [[probe]] tables in a .toml file there (README: Writing a probe definition)",
        )
