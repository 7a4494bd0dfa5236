"""One rule model for every probe: typed findings in, a diagnosis out.

A probe gathers what it measured into a *findings* object (a frozen dataclass of typed
evidence and figures, one type per probe). Its rules are tried in order; each looks at the
findings and returns a :class:`Diagnosis` (status, why, next steps, optionally ``where``) or
None when it does not apply. The first that applies wins, and the verdict records which rule
fired, where the rule came from and what it saw (evidence kind ``diagnosis``).

Users add rules, tried before the built-in ones:

- a ``rules = "my_rules.py"`` key in a probe definition (or ``--rules FILE`` on a probe
  command): the file defines ``RULES``, a list of :class:`Rule`;
- the entry-point group ``glmfb.core.rules``: each entry point names a :class:`Rule`, a list of
  them, or a function returning such a list.

A rule only sees the findings type of its probe (``Rule.probe``); rules for other probes in
the same file are skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from glmfb.contract.errors import InputError
from glmfb.contract.evidence import RuleFired
from glmfb.contract.step import Step, as_step
from glmfb.contract.verdict import Status

ENTRY_POINT_GROUP = "glmfb.rules"


class Findings(Protocol):
    """What a probe's rules look at; ``saw()`` is what the verdict records of it."""

    def saw(self) -> Mapping[str, Any]: ...


F = TypeVar("F", bound=Findings)
F_contra = TypeVar("F_contra", contravariant=True)


@dataclass(frozen=True)
class Diagnosis:
    """What a rule concluded. ``where`` replaces the probe's own where when given;
    ``saw`` overrides what the findings report as seen (for rules that looked deeper)."""

    status: Status
    why: str
    next: tuple[Step, ...] = ()  # a plain string is read as a plain step (Step(why=text))
    where: Mapping[str, Any] | None = None
    saw: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "next", tuple(as_step(step) for step in self.next))


@dataclass(frozen=True)
class Rule(Generic[F]):
    """A named check for one probe kind: ``check(findings) -> Diagnosis | None``."""

    name: str
    probe: str
    check: Callable[[F], Diagnosis | None]
    doc: str = ""
    source: str = "builtin"


@dataclass(frozen=True)
class Outcome:
    """The diagnosis that won, the rule that gave it, and the evidence recording both."""

    rule: Rule[Any]
    diagnosis: Diagnosis
    record: RuleFired


class NoRuleApplied(RuntimeError):
    """Every probe ends its list with a rule that always applies; this means one does not."""


def diagnose(rules: Sequence[Rule[F]], findings: F) -> Outcome:
    """Try ``rules`` in order on ``findings``; the first that applies wins."""
    checked: list[str] = []
    for rule in rules:
        diagnosis = rule.check(findings)
        if diagnosis is None:
            checked.append(rule.name)
            continue
        saw = dict(diagnosis.saw) if diagnosis.saw is not None else dict(findings.saw())
        record = RuleFired(rule=rule.name, source=rule.source, saw=saw, checked=tuple(checked))
        return Outcome(rule, diagnosis, record)
    raise NoRuleApplied(f"no rule applied (checked {', '.join(checked)})")


# --------------------------------------------------------------------------------------------
# User rules
# --------------------------------------------------------------------------------------------


def _as_rules(obj: Any, source: str) -> list[Rule[Any]]:
    if callable(obj) and not isinstance(obj, Rule):
        obj = obj()
    items = [obj] if isinstance(obj, Rule) else list(obj) if isinstance(obj, (list, tuple)) else None
    if items is None or not all(isinstance(item, Rule) for item in items):
        raise InputError(f"{source}: expected a Rule or a list of Rules (glmfb.core.rules.Rule), got {type(obj).__name__}")
    return [replace(item, source=source) if item.source == "builtin" else item for item in items]


def load_rules_file(path: Path) -> list[Rule[Any]]:
    """The rules a user file defines in ``RULES`` (imported like a target file)."""
    from glmfb.core.targets import import_file

    if not path.is_file():
        raise InputError(f"rules file {path} not found", "give a .py file that defines RULES")
    module = import_file(path, f"rules file {path}")
    if not hasattr(module, "RULES"):
        raise InputError(f"rules file {path} defines no RULES", "add RULES = [Rule(...), ...]")
    return _as_rules(module.RULES, f"file {path}")


def entry_point_rules() -> list[Rule[Any]]:
    """Rules installed by packages through the ``glmfb.core.rules`` entry-point group (read as the
    probes' are: :func:`glmfb.core.registry.entry_points`)."""
    from glmfb.core.registry import entry_points, import_ref

    rules: list[Rule[Any]] = []
    for name, value, _ in entry_points(ENTRY_POINT_GROUP):
        try:
            obj = import_ref(value)
        except Exception as exc:
            raise InputError(
                f"the rules entry point {name} ({value}) does not load: {type(exc).__name__}: {exc}",
                "fix or uninstall the package that provides it",
            ) from exc
        rules.extend(_as_rules(obj, f"entry point {name} ({value})"))
    return rules


def rules_for(kind: str, builtin: Iterable[Rule[Any]], files: Sequence[Path] = (),
              installed: bool = True) -> list[Rule[Any]]:
    """The ordered rule list of one probe run: users' files, installed rules, built-ins."""
    user: list[Rule[Any]] = []
    for path in files:
        user.extend(load_rules_file(path))
    if installed:
        user.extend(entry_point_rules())
    return [rule for rule in user if rule.probe == kind] + list(builtin)


@dataclass(frozen=True)
class RuleTable(Generic[F]):
    """A probe's built-in rules, in order (documentation lists them from here)."""

    probe: str
    rules: tuple[Rule[F], ...] = field(default_factory=tuple)

    def describe(self) -> list[tuple[str, str]]:
        return [(rule.name, rule.doc) for rule in self.rules]


@dataclass(frozen=True)
class Claim(Generic[F_contra]):
    """A kind of sentence a why can say, and its precondition on the findings: a why that
    matches ``says`` (a regular expression, searched) states something that is true only where
    ``holds(findings)``. Each probe writes its claims down once, beside its rules; its tests run
    the rules over generated findings and check that no why states what its evidence
    contradicts (:func:`contradicted`)."""

    name: str
    says: str
    holds: Callable[[F_contra], bool]


def contradicted(claims: Iterable[Claim[F]], findings: F, why: str) -> list[str]:
    """The claims ``why`` makes whose precondition the findings do not meet (empty: none)."""
    import re

    return [claim.name for claim in claims if re.search(claim.says, why) and not claim.holds(findings)]
