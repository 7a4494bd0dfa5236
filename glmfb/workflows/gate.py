"""CI policy over a run: which outcomes fail the gate, and the exit code that follows.

A policy is a TOML file; every key is checked (an unknown key is an error, never ignored)::

    fail_on = ["fail", "error", "inconclusive"]   # the default
    max_inconclusive = 0                           # inconclusive verdicts tolerated

    [probes.bench]                                 # per probe kind
    fail_on = ["fail", "warn", "error", "inconclusive"]   # warn fails for bench

    [names."kda-*"]                                # per verdict name (glob)
    fail_on = ["fail", "error"]

    [[allow]]                                      # allow-list: never fails the gate
    name = "gil-shared-runner"
    reason = "runner has one core; tracked in #41"  # required

    allow_empty = false                            # a run with no verdicts fails the gate (exit 3)
    allow_interrupted = false                      # so does a run cut short by a signal

Exit code: 3 if a failing outcome is an error (or the run is empty or was interrupted), else 1
if one is a fail or warn, else 4 if more inconclusive verdicts fail than ``max_inconclusive``
allows, else 0.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from glmfb.contract.errors import InputError
from glmfb.contract.verdict import ExitCode, Run, Status, Verdict, combine_exit_codes

DEFAULT_FAIL_ON = frozenset({Status.FAIL, Status.ERROR, Status.INCONCLUSIVE})
_TOP_KEYS = frozenset({"fail_on", "max_inconclusive", "probes", "names", "allow", "allow_empty",
                       "allow_interrupted"})
_RULE_KEYS = frozenset({"fail_on"})
_ALLOW_KEYS = frozenset({"name", "reason"})


@dataclass(frozen=True)
class Allowance:
    name: str  # a glob over verdict names
    reason: str


@dataclass(frozen=True)
class Policy:
    """Which outcomes fail the gate, with overrides per probe kind and per name."""

    fail_on: frozenset[Status] = DEFAULT_FAIL_ON
    max_inconclusive: int = 0
    per_probe: Mapping[str, frozenset[Status]] = field(default_factory=dict)
    per_name: Mapping[str, frozenset[Status]] = field(default_factory=dict)
    allow: tuple[Allowance, ...] = ()
    allow_empty: bool = False  # a run with no verdicts passes (it fails by default: nothing was checked)
    allow_interrupted: bool = False  # a run cut short passes on what finished

    def fail_on_for(self, verdict: Verdict) -> frozenset[Status]:
        """The failing statuses for one verdict: a name rule beats a probe rule beats the default."""
        for pattern, statuses in self.per_name.items():
            if fnmatch.fnmatchcase(verdict.name, pattern):
                return statuses
        return self.per_probe.get(verdict.probe, self.fail_on)

    def allowance_for(self, verdict: Verdict) -> Allowance | None:
        for allowance in self.allow:
            if fnmatch.fnmatchcase(verdict.name, allowance.name):
                return allowance
        return None


def _statuses(value: Any, where: str) -> frozenset[Status]:
    if not isinstance(value, list):
        raise InputError(f"policy {where}: expected a list of statuses, got {value!r}")
    statuses: set[Status] = set()
    for item in value:
        try:
            status = Status(item)
        except ValueError:
            raise InputError(
                f"policy {where}: unknown status {item!r}",
                f"use {', '.join(s.value for s in Status if s is not Status.PASS)}",
            ) from None
        if status is Status.PASS:
            raise InputError(f"policy {where}: 'pass' cannot fail a gate")
        statuses.add(status)
    return frozenset(statuses)


def _rule_table(table: Any, where: str) -> frozenset[Status]:
    if not isinstance(table, dict):
        raise InputError(f"policy {where}: expected a table")
    unknown = set(table) - _RULE_KEYS
    if unknown:
        raise InputError(
            f"policy {where}: unknown key {sorted(unknown)[0]!r}", "only fail_on is allowed here"
        )
    if "fail_on" not in table:
        raise InputError(f"policy {where}: missing fail_on")
    return _statuses(table["fail_on"], f"{where}.fail_on")


def parse_policy(document: Mapping[str, Any], source: str = "policy") -> Policy:
    """A policy from parsed TOML; any unknown key or bad value raises :class:`InputError`."""
    unknown = set(document) - _TOP_KEYS
    if unknown:
        raise InputError(
            f"{source}: unknown key {sorted(unknown)[0]!r}",
            f"known keys: {', '.join(sorted(_TOP_KEYS))}",
        )
    fail_on = (
        _statuses(document["fail_on"], "fail_on") if "fail_on" in document else DEFAULT_FAIL_ON
    )
    max_inconclusive = document.get("max_inconclusive", 0)
    if (
        not isinstance(max_inconclusive, int)
        or isinstance(max_inconclusive, bool)
        or max_inconclusive < 0
    ):
        raise InputError(
            f"{source}: max_inconclusive must be a non-negative integer, got {max_inconclusive!r}"
        )
    probes = document.get("probes", {})
    if not isinstance(probes, dict):
        raise InputError(f"{source}: probes must be a table of [probes.<kind>] tables")
    per_probe: dict[str, frozenset[Status]] = {}
    from glmfb.core.registry import known_kinds

    kinds = known_kinds()
    for kind, table in probes.items():
        if kind not in kinds:
            raise InputError(
                f"{source}: unknown probe kind probes.{kind}",
                f"use {', '.join(sorted(kinds))} (the probes installed here)",
            )
        per_probe[kind] = _rule_table(table, f"probes.{kind}")
    names = document.get("names", {})
    if not isinstance(names, dict):
        raise InputError(f'{source}: names must be a table of [names."<glob>"] tables')
    per_name = {pattern: _rule_table(table, f"names.{pattern}") for pattern, table in names.items()}
    allow_tables = document.get("allow", [])
    if not isinstance(allow_tables, list):
        raise InputError(f"{source}: allow must be an array of tables", "write [[allow]]")
    allow: list[Allowance] = []
    for index, table in enumerate(allow_tables):
        where = f"allow[{index}]"
        if not isinstance(table, dict):
            raise InputError(f"{source}: {where} must be a table")
        unknown = set(table) - _ALLOW_KEYS
        if unknown:
            raise InputError(
                f"{source}: unknown key {where}.{sorted(unknown)[0]}", "use name and reason"
            )
        name, reason = table.get("name"), table.get("reason")
        if not isinstance(name, str) or not name:
            raise InputError(f"{source}: {where} needs a name")
        if not isinstance(reason, str) or not reason.strip():
            raise InputError(
                f"{source}: {where} ({name}) needs a reason",
                "say why it may fail, and where it is tracked",
            )
        allow.append(Allowance(name=name, reason=reason.strip()))
    flags = {}
    for key in ("allow_empty", "allow_interrupted"):
        value = document.get(key, False)
        if not isinstance(value, bool):
            raise InputError(f"{source}: {key} must be true or false, got {value!r}")
        flags[key] = value
    return Policy(fail_on, max_inconclusive, per_probe, per_name, tuple(allow), flags["allow_empty"],
                  flags["allow_interrupted"])


def load_policy(path: str | Path) -> Policy:
    file = Path(path)
    if not file.is_file():
        raise InputError(f"policy file {file} not found")
    from glmfb.core.io import read_toml

    document = read_toml(file, f"policy file {file}")
    return parse_policy(document, str(file))


class GateDecision(str, Enum):
    OK = "ok"  # does not fail the gate
    FAILED = "failed"  # a fail (or warn where the policy says so)
    ERRORED = "errored"  # a probe that could not run
    INCONCLUSIVE = "inconclusive"  # counts against max_inconclusive
    ALLOWED = "allowed"  # would fail, but is on the allow-list


@dataclass(frozen=True)
class GateRow:
    verdict: Verdict
    decision: GateDecision
    reason: str = ""  # the allow-list reason, when allowed


@dataclass(frozen=True)
class GateResult:
    run: Run
    rows: tuple[GateRow, ...]
    exit_code: ExitCode
    max_inconclusive: int
    warnings: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()  # what fails the gate besides the verdicts (empty, interrupted)

    def count(self, decision: GateDecision) -> int:
        return sum(1 for row in self.rows if row.decision is decision)

    @property
    def passed(self) -> bool:
        return self.exit_code is ExitCode.OK


def evaluate(run: Run, policy: Policy | None = None) -> GateResult:
    """Apply ``policy`` (the default one when None) to every verdict of ``run``."""
    policy = policy or Policy()
    rows: list[GateRow] = []
    for verdict in run.verdicts:
        outcome = verdict.outcome
        failing = outcome in policy.fail_on_for(verdict)
        allowance = policy.allowance_for(verdict) if failing else None
        if not failing:
            rows.append(GateRow(verdict, GateDecision.OK))
        elif allowance is not None:
            rows.append(GateRow(verdict, GateDecision.ALLOWED, allowance.reason))
        elif outcome is Status.ERROR:
            rows.append(GateRow(verdict, GateDecision.ERRORED))
        elif outcome is Status.INCONCLUSIVE:
            rows.append(GateRow(verdict, GateDecision.INCONCLUSIVE))
        else:
            rows.append(GateRow(verdict, GateDecision.FAILED))
    codes: list[ExitCode] = []
    for row in rows:
        if row.decision is GateDecision.ERRORED:
            codes.append(ExitCode.HARNESS_ERROR)
        elif row.decision is GateDecision.FAILED:
            codes.append(ExitCode.REGRESSION)
    inconclusive = sum(1 for row in rows if row.decision is GateDecision.INCONCLUSIVE)
    if inconclusive > policy.max_inconclusive:
        codes.append(ExitCode.INCONCLUSIVE)
    problems: list[str] = []
    if not run.verdicts and not policy.allow_empty:
        problems.append("the run has no verdicts: nothing was checked (allow_empty = true in a policy accepts that)")
    if run.interrupted and not policy.allow_interrupted:
        problems.append("the run was interrupted before it finished (allow_interrupted = true in a policy gates "
                        "what finished)")
    if problems:
        codes.append(ExitCode.HARNESS_ERROR)
    return GateResult(run, tuple(rows), combine_exit_codes(codes), policy.max_inconclusive,
                      _unknown_kind_warnings(run), tuple(problems))


def _unknown_kind_warnings(run: Run) -> tuple[str, ...]:
    """A verdict of a probe kind this installation does not know is gated on its status like
    any other (an older gate never rejects a newer probe's verdict), with a warning."""
    from glmfb.core.registry import unknown_kinds

    unknown = unknown_kinds({v.probe for v in run.verdicts})
    return tuple(f"probe kind {kind!r} is not installed here: its verdicts are gated on their status alone"
                 for kind in unknown)


def failing_rows(result: GateResult) -> Sequence[GateRow]:
    over_budget = result.count(GateDecision.INCONCLUSIVE) > result.max_inconclusive
    return [
        row
        for row in result.rows
        if row.decision in (GateDecision.FAILED, GateDecision.ERRORED)
        or (row.decision is GateDecision.INCONCLUSIVE and over_budget)
    ]
