"""Typed evidence: one frozen dataclass per evidence kind; this module holds the kinds every
probe may use, and re-exports the machinery of :mod:`glmfb.contract.record` (``Evidence``,
``Record``, ``evidence_kind``, ``parse_evidence`` ...), so ``glmfb.contract.evidence`` is the
one place a probe imports evidence from.

Every item of a verdict's ``evidence`` is an :class:`Evidence`: a frozen dataclass whose
class attribute ``kind`` names it in JSON (``{"kind": "shape", ...}``). Cross-probe use goes
through these types: ``verdict.find(GilHolder)``, never a key lookup in a dict.

The kinds are registered when this module is imported, which the record module does itself
before a typed read: reading a run untyped (the gate) loads none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from glmfb.contract.record import *  # noqa: F403
from glmfb.contract.record import Evidence, Record, evidence_kind

# --------------------------------------------------------------------------------------------
# Kinds every probe may use
# --------------------------------------------------------------------------------------------


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Traceback(Evidence):
    """The innermost frames of an exception's traceback."""

    kind: ClassVar[str] = "traceback"
    text: str


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class TargetError(Evidence):
    """A target raised: which side, at what stage, the error in one line."""

    kind: ClassVar[str] = "target_error"
    side: str
    stage: str
    error: str


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ProcessExit(Evidence):
    """How a child process ended (a traced program, a supervised target)."""

    kind: ClassVar[str] = "process"
    returncode: int | None = None
    description: str | None = None
    stderr_tail: str | None = None
    stdout_tail: str | None = None
    stderr: str | None = None
    stdout: str | None = None


@dataclass(frozen=True, kw_only=True)
class StoppedProcess(Record):
    """A process a probe's child left running when it answered, which glmfb stopped."""

    pid: int
    command: str
    own_session: bool  # it had left the child's session (a daemon, start_new_session=True)
    found_by_cookie: bool  # never seen below the child: it left the tree (a double fork) between two walks


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class StoppedProcesses(Evidence):
    """What the target left running after the probe answered (servers, daemons, a thread's
    child process), found below the probe's child or by the cookie in their environment, and
    stopped: SIGTERM, then SIGKILL for those still running after the grace period."""

    kind: ClassVar[str] = "stopped_processes"
    processes: tuple[StoppedProcess, ...]
    killed: tuple[int, ...] = ()  # the pids that needed SIGKILL


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class HostActivity(Evidence):
    """How busy the host was while a probe measured (:mod:`glmfb.core.measure.hostload`): CPUs
    busy on average over the window, the whole host's, this probe's process tree's, and the
    rest (other processes, and CPU time a hypervisor gave to other machines)."""

    kind: ClassVar[str] = "host_load"
    window_s: float
    cpus: int
    host_busy_cpus: float
    own_busy_cpus: float
    other_busy_cpus: float
    busy: bool | None = None  # the probe's reading: others busy beyond the counters' resolution


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class MissingSignal(Evidence):
    """A signal a probe could not collect, and why: the verdict says less because of it."""

    kind: ClassVar[str] = "missing_signal"
    signal: str
    reason: str


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class EnvDifferences(Evidence):
    """Two measurements (or captures) were made in different environments: key -> [a, b]."""

    kind: ClassVar[str] = "env_differences"
    aliases: ClassVar[tuple[str, ...]] = ("env_mismatch",)
    differences: Mapping[str, Any]
    note: str | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class RuleFired(Evidence):
    """Which rule explained the verdict, where it came from, and what it saw."""

    kind: ClassVar[str] = "diagnosis"
    aliases: ClassVar[tuple[str, ...]] = ("diagnosis_rule",)
    rule: str
    source: str = "builtin"
    saw: Mapping[str, Any] = field(default_factory=dict)
    checked: tuple[str, ...] = ()  # rules tried before it, in order, that did not apply

    def summary_rows(self) -> list[tuple[str, str]]:
        rows = [("rule", self.rule), ("source", self.source)]
        rows += [(f"saw.{k}", f"{v:.4g}" if isinstance(v, float) else str(v)[:80]) for k, v in self.saw.items()]
        return rows


# --------------------------------------------------------------------------------------------
# A bisection (``glmfb bisect``): the evaluations that led to its answer
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BisectEvaluation(Record):
    """One evaluation of a bisection: the commit, the probe's verdict at it, what that made
    the commit (bad, good, inconclusive, skipped) and the budget it had."""

    commit: str
    subject: str
    attempt: int  # 1, then 2, 3 ... with more budget after an inconclusive one
    outcome: str  # bad | good | inconclusive | skipped
    status: str | None  # the verdict's status; None when the set-up failed and no probe ran
    metric: str | None = None
    value: float | None = None
    ci: tuple[float, ...] | None = None
    unit: str = ""
    budget: str | None = None  # the budget option as written ("2s"), when the probe has one
    duration_s: float = 0.0
    why: str = ""


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Bisection(Evidence):
    """How a bisection went: the range, every evaluation in order, the commits it went
    around, and its answer (the first bad commit, or the range it could not split)."""

    kind: ClassVar[str] = "bisection"
    show_in_terminal: ClassVar[bool] = True
    repository: str
    definition: str  # the definition file, relative to the repository
    good: str
    bad: str
    commits: int  # under test: BAD's first-parent chain after GOOD
    evaluations: tuple[BisectEvaluation, ...] = ()
    skipped: tuple[str, ...] = ()  # set-up or probe failed
    unknown: tuple[str, ...] = ()  # inconclusive with the most budget
    culprit: str | None = None
    last_good: str | None = None
    unsplit: tuple[str, ...] = ()  # first and last commit of the range that holds the change

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title=f"bisection: {len(self.evaluations)} evaluations over {self.commits} commits",
                      title_justify="left")
        for column in ("commit", "subject", "try", "outcome", "status", "metric", "budget"):
            table.add_column(column, overflow="fold")
        for row in self.evaluations:
            percent = row.unit == "fraction"
            shown = (lambda x: f"{x:+.1%}") if percent else (lambda x: f"{x:.4g}")
            metric = "" if row.value is None else f"{shown(row.value)}{'' if percent else ' ' + row.unit}".rstrip()
            if row.value is not None and row.ci is not None and len(row.ci) == 2:
                metric += f" [{shown(row.ci[0])}, {shown(row.ci[1])}]"
            table.add_row(row.commit[:10], row.subject[:50], str(row.attempt), row.outcome, row.status or "",
                          metric, row.budget or "")
        return table

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"bisection": [row.to_dict() for row in self.evaluations]}


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class BisectVerdict(Evidence):
    """The verdict of one commit a bisection's answer rests on (the last good commit, the
    first bad one, BAD against GOOD), as a whole ``glmfb.verdict/2`` document."""

    kind: ClassVar[str] = "bisect_verdict"
    role: str  # last good | first bad | BAD against GOOD
    commit: str
    subject: str
    verdict: Any
