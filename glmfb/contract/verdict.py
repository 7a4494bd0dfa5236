"""The verdict contract: what every probe answers, as frozen dataclasses and versioned JSON.

Format history (never renumber; a change bumps the version and keeps a reader for the old one):

- ``glmfb.verdict/1``, ``glmfb.run/1``: first version.
- still ``/1``, evidence typed: each evidence kind has its own schema in ``glmfb schema``
  (``$defs``). Readers accept the older spellings: kind ``env_mismatch`` reads as
  ``env_differences``, ``diagnosis_rule`` as ``diagnosis``; ``gil_holder.share_of_samples``
  (a copy of ``share_of_time``) is dropped on reading. ``probe`` is any registered kind
  (built-in or installed); a reader accepts kinds it does not know.
- ``glmfb.verdict/2``, ``glmfb.run/2``: ``next`` holds typed steps (:mod:`glmfb.contract.step`:
  ``{"why", "command", "arguments"}``), not strings. A ``/1`` document is still read: each
  string step becomes a plain step (``{"why": text}``); it is never parsed as a command.
- still ``/2``, an optional ``shard`` object on a run (``glmfb run --shard K/N``): which
  shard of which suite it is, and the names it ran (and, optional in it, each verdict's origin
  for the history). A run without it reads as before.
- still ``/2``, a step may say what it is for: an optional ``intent`` (``deeper``, ``confirm``,
  ``after_fix``, ``reproduce``; ``other`` when left out, and only then). A step without it reads
  as before, as ``other``.
- still ``/2``, an optional ``chain`` on a verdict (``glmfb --follow``): the follow-ups glmfb ran
  itself after a failing verdict, its ``deeper`` steps, each link ``{"step", "verdict"}`` (a
  whole verdict document, with its own ``chain``) or ``{"step", "stopped"}`` (why that step
  was not taken: a command line the boundary refuses, the depth reached, the budget spent).
  Written only when there is one; a verdict without it reads as before, with no chain. A
  field, not an evidence kind: a link is a verdict of its own, read and validated as one.

Reading a document validates it against :func:`json_schema` and names the first offending
field (``verdicts[3].metric.value: expected number or null, got 'fast'``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, TypeVar

from glmfb.contract.errors import ExitCode
from glmfb.contract.record import (
    Evidence,
    EvidenceError,
    RawEvidence,
    as_evidence,
    parse_evidence,
    to_json_value,
)
from glmfb.contract.step import STEP_SCHEMA, Intent, Step, as_step
from glmfb.contract.text import utf8_text

E = TypeVar("E", bound=Evidence)

VERDICT_SCHEMA = "glmfb.verdict/2"
RUN_SCHEMA = "glmfb.run/2"
# Older versions still read (upgraded on reading, see the module docstring).
VERDICT_SCHEMA_V1 = "glmfb.verdict/1"
RUN_SCHEMA_V1 = "glmfb.run/1"


class Status(str, Enum):
    """How a probe came out. Only ``pass`` and ``warn`` are green."""

    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"


class Layer(str, Enum):
    """The layer of the stack a verdict is about; ``harness`` when the probe itself broke."""

    NUMERICS = "numerics"
    KERNEL = "kernel"
    RUNTIME = "runtime"
    TRANSFER = "transfer"
    HARNESS = "harness"


STATUS_EXIT_CODE: dict[Status, ExitCode] = {
    Status.PASS: ExitCode.OK,
    Status.WARN: ExitCode.OK,
    Status.FAIL: ExitCode.REGRESSION,
    Status.ERROR: ExitCode.HARNESS_ERROR,
    Status.INCONCLUSIVE: ExitCode.INCONCLUSIVE,
}

# For a run, the first code that applies in this order (2 comes from usage, before any verdict).
EXIT_CODE_PRECEDENCE = (
    ExitCode.USAGE,
    ExitCode.HARNESS_ERROR,
    ExitCode.REGRESSION,
    ExitCode.INCONCLUSIVE,
    ExitCode.OK,
)


def combine_exit_codes(codes: Iterable[ExitCode]) -> ExitCode:
    """The exit code of a set of outcomes: the first of 2, 3, 1, 4 present, else 0."""
    present = set(codes)
    for code in EXIT_CODE_PRECEDENCE:
        if code in present:
            return code
    return ExitCode.OK


def _finite_or_none(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """The headline number of a verdict, with its unit, threshold and confidence interval."""

    name: str
    value: float | None
    unit: str = ""
    threshold: float | None = None
    ci: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", _finite_or_none(self.value))
        object.__setattr__(self, "threshold", _finite_or_none(self.threshold))
        if self.ci is not None:
            low, high = (_finite_or_none(x) for x in self.ci)
            ci = None if low is None or high is None else (low, high)
            object.__setattr__(self, "ci", ci)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "threshold": self.threshold,
            "ci": list(self.ci) if self.ci is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metric:
        ci = data.get("ci")
        return cls(
            name=data["name"],
            value=data.get("value"),
            unit=data.get("unit", ""),
            threshold=data.get("threshold"),
            ci=(ci[0], ci[1]) if ci is not None else None,
        )


@dataclass(frozen=True)
class Expectation:
    """The diagnosis a probe definition expects: a status, a layer, and ``where`` keys.

    String values in ``where`` match exactly or as a glob (``layers.*.mlp.up_proj``).
    """

    status: Status | None = None
    layer: Layer | None = None
    where: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status is not None:
            object.__setattr__(self, "status", Status(self.status))
        if self.layer is not None:
            object.__setattr__(self, "layer", Layer(self.layer))
        object.__setattr__(self, "where", to_json_value(dict(self.where)))

    def mismatches(self, verdict: Verdict) -> list[str]:
        """What differs between this expectation and ``verdict``, one phrase each."""
        problems: list[str] = []
        if verdict.status is Status.ERROR and self.status is not Status.ERROR:
            problems.append(f"status: expected {self.status.value if self.status else 'a verdict'}, got error "
                            "(the probe could not run)")
        elif verdict.status is Status.ERROR:
            problems.append("status: an error verdict never meets an expectation")
        elif self.status is not None and verdict.status != self.status:
            problems.append(f"status: expected {self.status.value}, got {verdict.status.value}")
        if self.layer is not None and verdict.layer != self.layer:
            problems.append(f"layer: expected {self.layer.value}, got {verdict.layer.value}")
        for key, expected in self.where.items():
            got = verdict.where.get(key)
            if not _where_value_matches(expected, got):
                problems.append(f"where.{key}: expected {expected!r}, got {got!r}")
        return problems

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.status is not None:
            data["status"] = self.status.value
        if self.layer is not None:
            data["layer"] = self.layer.value
        if self.where:
            data["where"] = dict(self.where)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Expectation:
        return cls(
            status=Status(data["status"]) if data.get("status") is not None else None,
            layer=Layer(data["layer"]) if data.get("layer") is not None else None,
            where=dict(data.get("where") or {}),
        )


def _where_value_matches(expected: Any, got: Any) -> bool:
    if isinstance(expected, str) and isinstance(got, str):
        return expected == got or fnmatch.fnmatchcase(got, expected)
    return bool(expected == got)


@dataclass(frozen=True)
class Verdict:
    """What a probe found: status, layer, where, why, with evidence and the next check.

    Built once and never changed; JSON-like fields are normalized to plain JSON data when
    built, so ``Verdict.from_dict(v.to_dict()) == v`` holds.
    """

    probe: str
    name: str
    status: Status
    layer: Layer
    why: str
    where: Mapping[str, Any] = field(default_factory=dict)
    metric: Metric | None = None
    evidence: tuple[Evidence, ...] = ()
    next: tuple[Step, ...] = ()
    artifacts: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    expect: Expectation | None = None
    expect_met: bool | None = None
    chain: tuple[Link, ...] = ()  # the deeper steps glmfb --follow took after this verdict failed

    def __post_init__(self) -> None:
        object.__setattr__(self, "chain", tuple(self.chain))
        if not isinstance(self.probe, str) or not self.probe:
            raise ValueError("a verdict needs a probe kind")
        object.__setattr__(self, "probe", str(self.probe))
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "layer", Layer(self.layer))
        if not self.name:
            raise ValueError("a verdict needs a non-empty name")
        object.__setattr__(self, "name", utf8_text(str(self.name)))
        object.__setattr__(self, "why", utf8_text(str(self.why)))
        object.__setattr__(self, "where", to_json_value(dict(self.where)))
        object.__setattr__(
            self, "evidence",
            tuple(as_evidence(item, f"evidence[{i}]") if isinstance(item, Evidence) else _typed(item, f"evidence[{i}]")
                  for i, item in enumerate(self.evidence)),
        )
        object.__setattr__(self, "next", tuple(as_step(step) for step in self.next))
        object.__setattr__(
            self, "artifacts", {utf8_text(str(k)): utf8_text(str(v)) for k, v in dict(self.artifacts).items()}
        )
        object.__setattr__(self, "env", to_json_value(dict(self.env)))
        duration = _finite_or_none(self.duration_s)
        object.__setattr__(self, "duration_s", max(0.0, duration or 0.0))

    # ---- derived -------------------------------------------------------------------------

    @property
    def outcome(self) -> Status:
        """The status that counts for exit codes and gates: with an expectation, a met one is
        a pass and an unmet one a fail (like a strict xfail), except that a probe which could
        not run (error) stays an error: that is a broken harness, not a wrong diagnosis.
        Without an expectation, the status itself."""
        if self.expect_met is None:
            return self.status
        if self.expect_met:
            return Status.PASS
        return Status.ERROR if self.status is Status.ERROR else Status.FAIL

    @property
    def exit_code(self) -> ExitCode:
        return STATUS_EXIT_CODE[self.outcome]

    def find(self, kind: type[E]) -> E | None:
        """The first evidence item of a type (``verdict.find(GilHolder)``)."""
        return next((item for item in self.evidence if isinstance(item, kind)), None)

    def find_all(self, kind: type[E]) -> list[E]:
        return [item for item in self.evidence if isinstance(item, kind)]

    @property
    def cause(self) -> Verdict:
        """The deepest failing verdict of the chain: from this one, the first link that failed,
        then its first that failed, and so on; this verdict when no link failed."""
        current = self
        while True:
            failed = next((link.verdict for link in current.chain
                           if link.verdict is not None and link.verdict.status is Status.FAIL), None)
            if failed is None:
                return current
            current = failed

    @property
    def stopped(self) -> str | None:
        """Why the chain could not go deeper below its deepest cause (the first stopped link
        there), or None."""
        return next((link.stopped for link in self.cause.chain if link.stopped), None)

    def with_expectation(self, expect: Expectation) -> Verdict:
        """This verdict judged against ``expect``. An error verdict never meets an expectation:
        a probe that could not run has not shown anything."""
        met = self.status is not Status.ERROR and not expect.mismatches(self)
        return replace(self, expect=expect, expect_met=met)

    # ---- constructors --------------------------------------------------------------------

    @classmethod
    def harness_error(
        cls,
        probe: str,
        name: str,
        why: str,
        *,
        next: Iterable[Step | str] = (),
        evidence: Iterable[Evidence | Mapping[str, Any]] = (),
        env: Mapping[str, Any] | None = None,
        duration_s: float = 0.0,
    ) -> Verdict:
        """A verdict for a probe that could not run: status error, layer harness."""
        return cls(
            probe=probe,
            name=name,
            status=Status.ERROR,
            layer=Layer.HARNESS,
            why=why,
            next=tuple(as_step(step) for step in next),
            evidence=tuple(item if isinstance(item, Evidence) else _typed(item) for item in evidence),
            env=env or {},
            duration_s=duration_s,
        )

    # ---- JSON ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": VERDICT_SCHEMA,
            "probe": self.probe,
            "name": self.name,
            "status": self.status.value,
            "layer": self.layer.value,
            "where": dict(self.where),
            "why": self.why,
            "metric": self.metric.to_dict() if self.metric is not None else None,
            "evidence": [item.to_dict() for item in self.evidence],
            "next": [step.to_dict() for step in self.next],
            "artifacts": dict(self.artifacts),
            "env": dict(self.env),
            "duration_s": self.duration_s,
        }
        if self.expect is not None:
            data["expect"] = self.expect.to_dict()
            data["expect_met"] = self.expect_met
        if self.chain:
            data["chain"] = [link.to_dict() for link in self.chain]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, typed: bool = True) -> Verdict:
        """Build a verdict from JSON data, validating it first (raises :class:`SchemaError`).

        With ``typed`` (the default) evidence is read into the typed classes registered (an item
        of another kind, or that does not fit its kind, stays as read, a
        :class:`~glmfb.contract.evidence.RawEvidence`); without it all evidence stays as read, which is
        all a gate needs. :func:`glmfb.core.documents.load_document` registers every probe's kinds
        first."""
        validate(upgrade(data), VERDICT_JSON_SCHEMA)
        return cls._from_valid_dict(upgrade(data), typed=typed)

    @classmethod
    def _from_valid_dict(cls, data: Mapping[str, Any], *, typed: bool = True, path: str = "") -> Verdict:
        """A verdict from JSON that :func:`validate` passed: plain data already, what
        ``__post_init__``'s normalizing would make it, so the fields are set as read
        (:func:`_as_read`; a thousand-verdict run is read by every ``glmfb gate``)."""
        metric = data.get("metric")
        expect = data.get("expect")
        return _as_read(
            cls,
            probe=data["probe"],
            name=data["name"],
            status=Status(data["status"]),
            layer=Layer(data["layer"]),
            why=data["why"],
            where=data.get("where") or {},
            metric=_metric_as_read(metric) if metric is not None else None,
            evidence=_read_evidence(data.get("evidence") or (), typed, path),
            next=tuple(_step_as_read(step) for step in data.get("next") or ()),
            artifacts=data.get("artifacts") or {},
            env=data.get("env") or {},
            duration_s=float(data.get("duration_s", 0.0)),
            expect=Expectation.from_dict(expect) if expect is not None else None,
            expect_met=data.get("expect_met"),
            chain=tuple(Link.from_dict(link, typed=typed) for link in data.get("chain") or ()),
        )


@dataclass(frozen=True)
class Link:
    """One link of a verdict's chain: the step taken and the whole verdict it gave, or the
    step and why it was not taken (``stopped``)."""

    step: Step
    verdict: Verdict | None = None
    stopped: str = ""

    def __post_init__(self) -> None:
        if (self.verdict is None) == (not self.stopped):
            raise ValueError("a link holds a verdict or says why it stopped, one of the two")
        object.__setattr__(self, "stopped", utf8_text(str(self.stopped)))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"step": self.step.to_dict()}
        if self.verdict is not None:
            data["verdict"] = self.verdict.to_dict()
        else:
            data["stopped"] = self.stopped
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, typed: bool = True) -> Link:
        """A link from its JSON (its verdict validated as a verdict document)."""
        verdict = data.get("verdict")
        return cls(step=Step.from_json(data["step"]),
                   verdict=Verdict.from_dict(verdict, typed=typed) if verdict is not None else None,
                   stopped=data.get("stopped", ""))


T = TypeVar("T")


def _as_read(cls: type[T], **fields: Any) -> T:
    """An instance of the frozen dataclass ``cls`` with ``fields`` set as given, without its
    ``__post_init__``: for validated JSON only, which is plain data already (no tuple, no
    non-finite number, no key that is not a string). A field not given gets its default."""
    instance = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(instance, name, value)
    for name, default in _defaults(cls):  # type: ignore[arg-type]
        if name not in fields:
            object.__setattr__(instance, name, default())
    return instance


def _same(value: Any) -> Any:
    return value


@functools.cache
def _defaults(cls: type) -> tuple[tuple[str, Callable[[], Any]], ...]:
    """Each field of a dataclass and a function giving its default (one that has none raises)."""
    found: list[tuple[str, Callable[[], Any]]] = []
    for spec in dataclasses.fields(cls):
        if spec.default is not dataclasses.MISSING:
            found.append((spec.name, functools.partial(_same, spec.default)))
        elif spec.default_factory is not dataclasses.MISSING:
            found.append((spec.name, spec.default_factory))
        else:
            def missing(name: str = spec.name) -> Any:
                raise TypeError(f"{cls.__name__}: field {name!r} needs a value")
            found.append((spec.name, missing))
    return tuple(found)


def _metric_as_read(data: Mapping[str, Any]) -> Metric:
    ci = data.get("ci")
    return _as_read(Metric, name=data["name"], value=_finite_or_none(data.get("value")), unit=data.get("unit", ""),
                    threshold=_finite_or_none(data.get("threshold")),
                    ci=(float(ci[0]), float(ci[1])) if ci is not None else None)


def _step_as_read(data: Any) -> Step:
    if isinstance(data, str) or (data.get("command") is None and data.get("arguments")):
        return Step.from_json(data)  # an old document's plain string; or what __post_init__ refuses
    return _as_read(Step, why=data["why"], command=data.get("command"), arguments=data.get("arguments") or {},
                    intent=Intent(data["intent"]) if "intent" in data else Intent.OTHER)


@dataclass(frozen=True)
class Shard:
    """What part of a suite a run is (``glmfb run --shard K/N``): shard ``index`` of ``count``
    (from 1), of the suite whose identity is ``suite`` (a hash over every selected
    definition's name and definition hash), holding ``names`` (in the order run) of the
    suite's ``total`` definitions. ``origins``: for the history, by definition name, where each
    verdict came from (``definition_hash``, ``commit``, ``dirty``), taken on the machine that ran
    it: a shard records no history itself, and ``glmfb gate`` records the shards as one run."""

    index: int
    count: int
    suite: str
    names: tuple[str, ...]
    total: int
    origins: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(self.names))

    @property
    def label(self) -> str:
        """``2/3``, as ``--shard`` takes it."""
        return f"{self.index}/{self.count}"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"index": self.index, "count": self.count, "suite": self.suite,
                                "names": list(self.names), "total": self.total}
        if self.origins:
            data["origins"] = {name: dict(origin) for name, origin in self.origins.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Shard:
        """A shard from its (schema-valid) JSON; one that cannot be a shard is refused."""
        if data["index"] > data["count"]:
            raise SchemaError("shard.index", f"shard {data['index']} of {data['count']}: the index is at most the count")
        return cls(index=data["index"], count=data["count"], suite=data["suite"], names=tuple(data["names"]),
                   total=data["total"], origins={name: dict(o) for name, o in data.get("origins", {}).items()})


@dataclass(frozen=True)
class Run:
    """A set of verdicts from one ``glmfb run`` (or one probe command)."""

    id: str
    started: str
    verdicts: tuple[Verdict, ...] = ()
    finished: str | None = None
    env: Mapping[str, Any] = field(default_factory=dict)
    interrupted: bool = False
    shard: Shard | None = None  # the part of a suite it ran (glmfb run --shard K/N); None: all of it

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdicts", tuple(self.verdicts))
        object.__setattr__(self, "env", to_json_value(dict(self.env)))

    @property
    def summary(self) -> dict[str, int]:
        """Counts of outcomes (expectations applied), plus met and unmet expectations."""
        counts = {status.value: 0 for status in Status}
        for verdict in self.verdicts:
            counts[verdict.outcome.value] += 1
        expected = [v for v in self.verdicts if v.expect_met is not None]
        counts["expect_met"] = sum(1 for v in expected if v.expect_met)
        counts["expect_unmet"] = sum(1 for v in expected if not v.expect_met)
        counts["total"] = len(self.verdicts)
        return counts

    @property
    def exit_code(self) -> ExitCode:
        return combine_exit_codes(v.exit_code for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": RUN_SCHEMA,
            "id": self.id,
            "started": self.started,
            "finished": self.finished,
            "interrupted": self.interrupted,
            "env": dict(self.env),
            "verdicts": [v.to_dict() for v in self.verdicts],
            "summary": self.summary,
        }
        if self.shard is not None:
            data["shard"] = self.shard.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, typed: bool = True) -> Run:
        data = upgrade(data)
        validate(data, RUN_JSON_SCHEMA)
        return cls(
            id=data["id"],
            started=data["started"],
            finished=data.get("finished"),
            interrupted=bool(data.get("interrupted", False)),
            env=data.get("env") or {},
            shard=Shard.from_dict(data["shard"]) if data.get("shard") is not None else None,
            verdicts=tuple(
                Verdict._from_valid_dict(v, typed=typed, path=f"verdicts[{i}].")
                for i, v in enumerate(data["verdicts"])
            ),
        )


def _typed(item: Mapping[str, Any], path: str = "evidence") -> Evidence:
    """Evidence data read into its kind, the contract's own kinds registered first: they are
    imported on the first typed read, so an untyped one (the gate) loads none of them."""
    import glmfb.contract.evidence  # noqa: F401  (registers the kinds every probe may use)

    return parse_evidence(item, path)


def _read_evidence(items: Iterable[Any], typed: bool, path: str) -> tuple[Evidence, ...]:
    if not typed:
        return tuple(_as_read(RawEvidence, raw_kind=item["kind"], data={k: v for k, v in item.items() if k != "kind"})
                     for item in items)
    result: list[Evidence] = []
    for index, item in enumerate(items):
        try:
            result.append(_typed(item, f"{path}evidence[{index}]"))
        except EvidenceError:
            # An item that does not fit its kind (written by another version, or by hand) is
            # kept as it was read: a reader never loses evidence, and never fails on it.
            result.append(RawEvidence(raw_kind=item["kind"], data={k: v for k, v in item.items() if k != "kind"}))
    return tuple(result)


def load_document(data: Any, *, typed: bool = True) -> Run:
    """A run from parsed JSON that holds either a run or a single verdict (evidence typed into
    the kinds registered so far; :func:`glmfb.core.documents.load_document` reads with every
    probe's kinds)."""
    if not isinstance(data, Mapping):
        raise SchemaError("(document)", f"expected a JSON object, got {_json_type(data)}")
    data = upgrade(data)
    schema = data.get("schema")
    if schema == RUN_SCHEMA:
        return Run.from_dict(data, typed=typed)
    if schema == VERDICT_SCHEMA:
        verdict = Verdict.from_dict(data, typed=typed)
        return Run(id=f"verdict-{verdict.name}", started="", verdicts=(verdict,))
    raise SchemaError(
        "schema",
        f"expected {RUN_SCHEMA!r} or {VERDICT_SCHEMA!r}, got {schema!r}",
    )


def upgrade(data: Any) -> Any:
    """A ``/1`` document as its ``/2`` form (string steps become plain steps); any other
    document as it is. The older form is never written."""
    if not isinstance(data, Mapping):
        return data
    schema = data.get("schema")
    if schema == VERDICT_SCHEMA_V1:
        return _upgrade_verdict_v1(data)
    if schema == RUN_SCHEMA_V1:
        verdicts = data.get("verdicts")
        upgraded = {**data, "schema": RUN_SCHEMA}
        if isinstance(verdicts, list):
            upgraded["verdicts"] = [_upgrade_verdict_v1(v) if isinstance(v, Mapping) else v for v in verdicts]
        return upgraded
    return data


def _upgrade_verdict_v1(data: Mapping[str, Any]) -> Mapping[str, Any]:
    if data.get("schema") != VERDICT_SCHEMA_V1:
        return data
    steps = data.get("next")
    upgraded = {**data, "schema": VERDICT_SCHEMA}
    if isinstance(steps, list):
        upgraded["next"] = [{"why": step} if isinstance(step, str) else step for step in steps]
    return upgraded


# --------------------------------------------------------------------------------------------
# JSON Schema (draft 2020-12) and a validator for the subset it uses
# --------------------------------------------------------------------------------------------

_SCALAR = {"type": ["string", "number", "integer", "boolean", "null"]}

_WHERE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Only the keys that apply.",
    "properties": {
        "request": {"type": "string"},
        "module": {"type": "string"},
        "position": {"type": "integer"},
        "kernel": {"type": "string"},
        "shape": {"type": "string"},
        "thread": {"type": "string"},
        "function": {"type": "string"},
        "file": {"type": "string"},
        "line": {"type": "integer"},
        "rank": {"type": "integer", "description": "the torch.distributed rank (distributed targets)"},
        "commit": {"type": "string", "description": "the git commit a regression starts at (glmfb bisect)"},
    },
    "additionalProperties": _SCALAR,
}

_METRIC_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "required": ["name", "value"],
    "properties": {
        "name": {"type": "string"},
        "value": {"type": ["number", "null"]},
        "unit": {"type": "string"},
        "threshold": {"type": ["number", "null"]},
        "ci": {
            "type": ["array", "null"],
            "items": {"type": "number"},
            "minItems": 2,
            "maxItems": 2,
        },
    },
    "additionalProperties": False,
}

_EXPECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"enum": [s.value for s in Status]},
        "layer": {"enum": [layer.value for layer in Layer]},
        "where": {"type": "object", "additionalProperties": _SCALAR},
    },
    "additionalProperties": False,
}

_LINK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["step"],
    "description": "a step glmfb --follow took, and the whole verdict it gave or why it was not taken",
    "properties": {
        "step": STEP_SCHEMA,
        "verdict": {"type": "object", "description": "a glmfb.verdict/2 document (read and validated as one)"},
        "stopped": {"type": "string", "minLength": 1},
    },
    "additionalProperties": False,
}

VERDICT_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://glmfb.dev/schema/verdict-2.json",
    "title": VERDICT_SCHEMA,
    "type": "object",
    "required": ["schema", "probe", "name", "status", "layer", "why"],
    "properties": {
        "schema": {"const": VERDICT_SCHEMA},
        "probe": {"type": "string", "minLength": 1},
        "name": {"type": "string", "minLength": 1},
        "status": {"enum": [s.value for s in Status]},
        "layer": {"enum": [layer.value for layer in Layer]},
        "where": _WHERE_SCHEMA,
        "why": {"type": "string"},
        "metric": _METRIC_SCHEMA,
        "evidence": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["kind"],
                "properties": {"kind": {"type": "string"}},
            },
        },
        "next": {"type": "array", "items": STEP_SCHEMA},
        "artifacts": {"type": "object", "additionalProperties": {"type": "string"}},
        "env": {"type": "object"},
        "duration_s": {"type": "number", "minimum": 0},
        "expect": _EXPECT_SCHEMA,
        "expect_met": {"type": ["boolean", "null"]},
        "chain": {"type": "array", "items": _LINK_SCHEMA,
                  "description": "glmfb --follow: the deeper steps taken after this verdict failed"},
    },
    "additionalProperties": False,
}

_SHARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["index", "count", "suite", "names", "total"],
    "properties": {
        "index": {"type": "integer", "minimum": 1},
        "count": {"type": "integer", "minimum": 1},
        "suite": {"type": "string", "minLength": 1},
        "names": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "total": {"type": "integer", "minimum": 0},
        "origins": {
            "type": "object",
            "description": "for the history, by definition name: where its verdict came from",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "definition_hash": {"type": ["string", "null"]},
                    "commit": {"type": ["string", "null"]},
                    "dirty": {"type": ["boolean", "null"]},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}

RUN_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://glmfb.dev/schema/run-2.json",
    "title": RUN_SCHEMA,
    "type": "object",
    "required": ["schema", "id", "started", "verdicts"],
    "properties": {
        "schema": {"const": RUN_SCHEMA},
        "id": {"type": "string", "minLength": 1},
        "started": {"type": "string"},
        "finished": {"type": ["string", "null"]},
        "interrupted": {"type": "boolean"},
        "env": {"type": "object"},
        "verdicts": {"type": "array", "items": VERDICT_JSON_SCHEMA},
        "summary": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
        "shard": _SHARD_SCHEMA,
    },
    "additionalProperties": False,
}


def json_schema(probes: Sequence[str] | None = None,
                evidence: Mapping[str, type[Evidence]] | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of both documents, verdict and run.

    ``probe`` lists the kinds given in ``probes`` (any string when None); each evidence kind
    given (default: those registered so far) has its schema under ``$defs`` and is checked
    when its ``kind`` matches. Other kinds stay valid (a newer probe's evidence), with only
    ``kind`` required. The schema of this installation, every probe's kinds in it, is
    :func:`glmfb.core.documents.json_schema`."""
    import copy

    from glmfb.contract.evidence import evidence_schema_defs

    evidence_defs = evidence_schema_defs(evidence)
    verdict = copy.deepcopy({k: v for k, v in VERDICT_JSON_SCHEMA.items() if not k.startswith("$")})
    if probes is not None:
        verdict["properties"]["probe"] = {
            "type": "string",
            "enum": list(probes),
            "description": "the probe kinds of this installation; readers accept others with a warning",
        }
    verdict["properties"]["evidence"]["items"] = {
        "type": "object",
        "required": ["kind"],
        "properties": {"kind": {"type": "string"}},
        "allOf": [
            {"if": {"properties": {"kind": {"const": name.removeprefix("evidence.")}}, "required": ["kind"]},
             "then": {"$ref": f"#/$defs/{name}"}}
            for name in evidence_defs if name.startswith("evidence.")
        ],
    }
    verdict["properties"]["chain"]["items"]["properties"]["verdict"] = {"$ref": "#/$defs/verdict"}
    run = {k: v for k, v in RUN_JSON_SCHEMA.items() if not k.startswith("$")}
    run["properties"] = {
        **run["properties"],
        "verdicts": {"type": "array", "items": {"$ref": "#/$defs/verdict"}},
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://glmfb.dev/schema/glmfb-2.json",
        "title": "glmfb verdict and run documents",
        "oneOf": [{"$ref": "#/$defs/verdict"}, {"$ref": "#/$defs/run"}],
        "$defs": {"verdict": verdict, "run": run, **evidence_defs},
    }


class SchemaError(ValueError):
    """A document does not match its schema; ``path`` names the first offending field."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


_JSON_TYPES = {
    "object": lambda v: isinstance(v, Mapping),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _JSON_TYPES[name](value):
            return name
    return type(value).__name__


class _Invalid(Exception):
    """Raised deep in validation; each level on the way up adds its path segment."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.segments: list[str | int] = []


def _format_path(segments: list[str | int]) -> str:
    path = ""
    for segment in reversed(segments):
        if isinstance(segment, int):
            path += f"[{segment}]"
        else:
            path += f".{segment}" if path else segment
    return path or "(document)"


def validate(data: Any, schema: Mapping[str, Any]) -> None:
    """Check ``data`` against the subset of JSON Schema used here; raise :class:`SchemaError`
    naming the first offending field (paths are only built on failure: reading a large run
    stays fast). A schema is compiled into nested checks once, on its first use."""
    try:
        _compiled(schema)(data)
    except _Invalid as exc:
        raise SchemaError(_format_path(exc.segments), exc.problem) from None


_Checker = Callable[[Any], None]
_COMPILED: dict[int, tuple[Mapping[str, Any], _Checker]] = {}
# The Python types that are each JSON type without a closer look (a Mapping that is not a
# dict, or a subclass, takes the slower isinstance test).
_EXACT_TYPES: dict[str, frozenset[type]] = {
    "object": frozenset({dict}), "array": frozenset({list}), "string": frozenset({str}),
    "integer": frozenset({int}), "number": frozenset({int, float}), "boolean": frozenset({bool}),
    "null": frozenset({type(None)}),
}


def _compiled(schema: Mapping[str, Any]) -> _Checker:
    entry = _COMPILED.get(id(schema))
    if entry is None or entry[0] is not schema:
        entry = (schema, _compile(schema))
        _COMPILED[id(schema)] = entry
    return entry[1]


def _compile(schema: Mapping[str, Any]) -> _Checker:
    """One schema node as a function that raises :class:`_Invalid` (each level on the way up
    adds its path segment)."""
    has_const, const = "const" in schema, schema.get("const")
    enum = schema.get("enum")
    declared = schema.get("type")
    names: tuple[str, ...] = (declared,) if isinstance(declared, str) else tuple(declared or ())
    exact = frozenset().union(*(_EXACT_TYPES[n] for n in names))
    tests = tuple(_JSON_TYPES[n] for n in names) if declared is not None else None
    required = tuple(schema.get("required", ()))
    properties = {key: _compile(sub) for key, sub in schema.get("properties", _EMPTY).items()}
    additional = schema.get("additionalProperties", True)
    other = _compile(additional) if isinstance(additional, Mapping) else None
    items = _compile(schema["items"]) if "items" in schema else None
    min_items, max_items = schema.get("minItems", 0), schema.get("maxItems")
    minimum, min_length = schema.get("minimum"), schema.get("minLength", 0)

    def check(data: Any) -> None:
        if has_const and data != const:
            raise _Invalid(f"expected {const!r}, got {data!r}")
        if enum is not None and data not in enum:
            raise _Invalid(f"expected one of {', '.join(enum)}, got {data!r}")
        kind = type(data)
        if tests is not None and kind not in exact and not any(test(data) for test in tests):
            raise _Invalid(f"expected {' or '.join(names)}, got {_json_type(data)} {data!r:.60}")
        if kind is dict or (kind is not list and isinstance(data, Mapping)):
            _check_object(data)
        elif kind is list:
            _check_array(data)
        elif kind is float or kind is int:
            if kind is float and not math.isfinite(data):
                raise _Invalid(f"expected a finite number, got {data!r}")
            if minimum is not None and data < minimum:
                raise _Invalid(f"expected at least {minimum}, got {data!r}")
        elif kind is str and len(data) < min_length:
            raise _Invalid("expected a non-empty string")

    def _check_object(data: Mapping[str, Any]) -> None:
        for key in required:
            if key not in data:
                invalid = _Invalid("required field is missing")
                invalid.segments.append(key)
                raise invalid
        for key, value in data.items():
            sub = properties.get(key)
            if sub is None:
                if additional is True:
                    continue
                if other is None:
                    invalid = _Invalid("unknown field")
                    invalid.segments.append(key)
                    raise invalid
                sub = other
            try:
                sub(value)
            except _Invalid as exc:
                exc.segments.append(key)
                raise

    def _check_array(data: list[Any]) -> None:
        if len(data) < min_items or (max_items is not None and len(data) > max_items):
            raise _Invalid(f"expected {schema.get('minItems')} items, got {len(data)}")
        if items is not None:
            for index, item in enumerate(data):
                try:
                    items(item)
                except _Invalid as exc:
                    exc.segments.append(index)
                    raise

    return check


_EMPTY: Mapping[str, Any] = {}
