"""``glmfb bisect GOOD BAD DEFINITION``: the commit where a definition starts to fail.

The repository is the one that holds the definition file; the commits under test are BAD's
first-parent chain after GOOD (:mod:`glmfb.workflows.bisect.git`). Each commit under test is checked
out in a detached worktree of its own, and the definition is read there (same path in the
repository): its baseline resolves in GOOD's worktree and its candidate in the commit's, so
a definition that names the same target on both sides compares GOOD against that commit. A
single-target probe (gil, gap's target) runs at the commit. Everything else the definition
names (requests, rules) is read at the commit.

Each evaluation runs the probe in a supervised child process (:func:`glmfb.workflows.suite.run_definition`)
and counts as bad (fail), good (pass or warn), inconclusive or skipped (an error verdict: the
commit does not import, its set-up failed). An inconclusive one is run again with twice the
budget (the probe's ``budget``, or ``duration`` for gil), at most :data:`MAX_ATTEMPTS` times in
all; still inconclusive, the commit is unknown. The search goes around skipped and unknown
commits (:mod:`glmfb.workflows.bisect.search`).

BAD against GOOD is evaluated first: when it does not fail, the answer is a pass, "no
regression", and nothing else runs. The answer names a culprit (status fail, ``where.commit``)
only when the culprit fails and the commit before it passes, each with its own verdict in the
evidence; otherwise it is inconclusive and names the range that could not be split. Git
problems (not a repository, an unknown revision, GOOD not an ancestor of BAD) are error
verdicts. The verdict's ``probe`` is the definition's probe kind (a bisection is not a probe
of its own; docs/bisect.md).
"""

from __future__ import annotations

import ast
import dataclasses
import math
import os
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmfb.contract.clock import SYSTEM_CLOCK, Clock
from glmfb.contract.errors import GlmfbError, HarnessError, UsageError
from glmfb.contract.evidence import BisectEvaluation, Bisection, BisectVerdict
from glmfb.contract.step import Step
from glmfb.contract.verdict import Layer, Status, Verdict
from glmfb.core.probe import ProbeForm, ProbeSpec, get_probe
from glmfb.core.targets import ImportFence, Target, is_file_ref
from glmfb.workflows.bisect.git import (
    Commit,
    GitError,
    Worktrees,
    first_parent_chain,
    repository_of,
    resolve,
)
from glmfb.workflows.bisect.search import Outcome, Search
from glmfb.workflows.suite import (
    ProbeDefinition,
    SuiteContext,
    load_definitions,
    run_definition,
    select,
)

MAX_ATTEMPTS = 3  # an inconclusive evaluation is run again with 2x, then 4x the budget
BUDGET_FIELDS = ("budget_s", "duration_s")  # the option that bounds a probe's measuring time
DEFAULT_MAX_EVALUATIONS = 40
SETUP_TIMEOUT_S = 15 * 60.0
EVALUATIONS_DIR = "evaluations"


@dataclass(frozen=True)
class BisectRequest:
    """What to bisect: two revisions, a definition file and the name in it, how to set up a
    worktree, and the bounds."""

    good: str
    bad: str
    definition: Path
    select: tuple[str, ...] = ()
    setup: str | None = None
    max_evaluations: int = DEFAULT_MAX_EVALUATIONS
    timeout_s: float | None = None  # per evaluation (and per set-up): a definition's own, else 15 min


@dataclass(frozen=True)
class BisectResult:
    """The answer (one verdict) and whether the bisection was interrupted."""

    verdict: Verdict
    evaluations: int
    interrupted: bool = False


def choose_definition(path: Path, patterns: tuple[str, ...]) -> ProbeDefinition:
    """The one definition of ``path`` that ``-k`` selects (as the file is now); a file that does
    not load, or a selection of none or several, is a usage error."""
    definitions = load_definitions([path])
    chosen = select(definitions, patterns)
    if len(chosen) == 1:
        return chosen[0]
    names = ", ".join(d.name for d in definitions) or "none"
    if not chosen:
        raise UsageError(f"no probe in {path} matches -k {' '.join(repr(p) for p in patterns)}" if patterns
                         else f"no probe definitions in {path}", f"its definitions: {names}")
    raise UsageError(f"-k selects {len(chosen)} definitions in {path} ({', '.join(d.name for d in chosen)}); "
                     "a bisection follows one", "give -k the name of one")


def bisect(request: BisectRequest, run_id: str, report_dir: Path, *,
           progress: Callable[[str], None] | None = None, clock: Clock = SYSTEM_CLOCK,
           cancel: threading.Event | None = None, deadline: float | None = None) -> BisectResult:
    """Bisect ``request`` and answer with one verdict (see the module docstring). Usage errors
    (the definition file, ``-k``) are raised; everything else is the verdict. Ctrl-C removes
    the worktrees and answers with an error verdict that lists the evaluations so far; so do
    ``cancel`` (set: the running probe is stopped) and ``deadline`` (``clock.monotonic()``:
    no evaluation or set-up runs past it), which the agent server's tool gives."""
    definition = choose_definition(request.definition, request.select)
    started = clock.monotonic()
    session = _Session(request, definition, run_id, report_dir, progress or (lambda message: None),
                       clock=clock, cancel=cancel, deadline=deadline)
    interrupted = False
    try:
        verdict = session.run()
    except KeyboardInterrupt as exc:
        interrupted = True
        signal_name = getattr(exc, "signal_name", "SIGINT")
        verdict = session.error(f"interrupted ({signal_name}) after {len(session.rows)} evaluations; "
                                "its processes were stopped and its worktrees removed")
    except _Stopped as exc:
        interrupted = True
        verdict = session.error(f"stopped after {len(session.rows)} evaluations: {exc}; its processes were "
                                "stopped and its worktrees removed")
    from glmfb.core.env import fingerprint

    verdict = dataclasses.replace(verdict, duration_s=clock.monotonic() - started, env=verdict.env or fingerprint(),
                                  artifacts={EVALUATIONS_DIR: str(report_dir / EVALUATIONS_DIR)})
    return BisectResult(verdict, len(session.rows), interrupted)


# --------------------------------------------------------------------------------------------
# One bisection
# --------------------------------------------------------------------------------------------


class _Skip(HarnessError):
    """A commit cannot be evaluated (its set-up failed, its definition does not load): it is
    skipped, never raised out of the bisection."""


class _Stopped(HarnessError):
    """The bisection was cancelled or ran out of time: it stops where it is."""


@dataclass
class _Judged:
    """A commit's outcome and the verdict of its last evaluation (None: no probe ran)."""

    outcome: Outcome
    verdict: Verdict | None


@dataclass
class _Session:
    request: BisectRequest
    definition: ProbeDefinition
    run_id: str
    report_dir: Path
    progress: Callable[[str], None]
    rows: list[BisectEvaluation] = field(default_factory=list)
    repo: Path | None = None
    relative: Path | None = None
    good: Commit | None = None
    bad: Commit | None = None
    chain: list[Commit] = field(default_factory=list)
    skipped: list[Commit] = field(default_factory=list)
    unknown: list[Commit] = field(default_factory=list)
    clock: Clock = SYSTEM_CLOCK
    cancel: threading.Event | None = None
    deadline: float | None = None

    @property
    def kind(self) -> str:
        return self.definition.probe

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def paired(self) -> bool:
        return get_probe(self.kind).form is ProbeForm.PAIR

    # ---- the search -------------------------------------------------------------------------

    def run(self) -> Verdict:
        try:
            self.repo = repository_of(self.request.definition)
            self.relative = self.request.definition.resolve().relative_to(self.repo)
            self.good = resolve(self.repo, self.request.good)
            self.bad = resolve(self.repo, self.request.bad)
            self.chain = first_parent_chain(self.repo, self.good, self.bad)
            with Worktrees(self.repo) as trees:
                return self._search(trees)
        except GitError as exc:  # also a worktree git could not make
            return self.error(str(exc))

    def _search(self, trees: Worktrees) -> Verdict:
        assert self.good is not None and self.bad is not None
        good_tree = trees.add(self.good)
        try:
            self._set_up(good_tree, self.good)
            good_definition = self._definition_at(good_tree, self.good)
        except _Skip as exc:
            return self.error(f"GOOD {self.good.describe()} cannot be evaluated: {exc}")
        search = Search(len(self.chain))
        judged: dict[int, _Judged] = {}

        def evaluate(index: int) -> _Judged:
            commit = self.chain[index]
            with trees.checkout(commit) as tree:
                result = self._evaluate(commit, tree, good_tree, good_definition)
            judged[index] = result
            search.record(index, result.outcome)
            if result.outcome is Outcome.SKIPPED:
                self.skipped.append(commit)
            elif result.outcome is Outcome.UNKNOWN:
                self.unknown.append(commit)
            return result

        confirm = evaluate(len(self.chain) - 1)
        if confirm.outcome is not Outcome.BAD:
            return self._not_confirmed(confirm)
        while (index := search.next_index()) is not None:
            if len(self.rows) >= self.request.max_evaluations:
                return self._unsplit(search, budget_spent=True)
            evaluate(index)
        culprit = search.culprit
        if culprit is None:
            return self._unsplit(search)
        if search.low == -1:  # the commit before the culprit is GOOD: its own verdict, GOOD against GOOD
            if len(self.rows) >= self.request.max_evaluations:
                return self._unsplit(search, budget_spent=True)
            judged[-1] = self._evaluate(self.good, good_tree, good_tree, good_definition)
            if judged[-1].outcome is not Outcome.GOOD:
                return self._good_does_not_pass(judged[-1])
        return self._culprit(culprit, judged[culprit], judged[culprit - 1])

    # ---- one commit -------------------------------------------------------------------------

    def _evaluate(self, commit: Commit, tree: Path, good_tree: Path, good_definition: ProbeDefinition) -> _Judged:
        """Set up the worktree and run the probe, with more budget after an inconclusive try."""
        try:
            if tree != good_tree:
                self._set_up(tree, commit)
            definition = self._paired(good_definition, self._definition_at(tree, commit), commit)
        except _Skip as exc:
            self._record(commit, 1, Outcome.SKIPPED.value, None, _relative_to(str(exc), tree))
            return _Judged(Outcome.SKIPPED, None)
        budget_field = next((f for f in BUDGET_FIELDS if hasattr(definition.config, f)), None)
        attempts = MAX_ATTEMPTS if budget_field is not None else 1
        verdict: Verdict | None = None
        for attempt in range(1, attempts + 1):
            self._check_stop()
            config = definition.config
            if budget_field is not None and attempt > 1:
                config = dataclasses.replace(config, **{budget_field: getattr(config, budget_field) * 2 ** (attempt - 1)})
            number = len(self.rows) + 1
            context = SuiteContext(self.run_id, self.report_dir / EVALUATIONS_DIR / f"{number:02d}-{commit.short}",
                                   timeout_s=self.request.timeout_s, on_progress=None, cancel=self.cancel,
                                   workdir=self._workdir(tree), fence=self._fence(commit, tree, good_tree))
            self.progress(f"evaluation {number}: {commit.describe()}"
                          + (f" (try {attempt}, {self._budget(config, budget_field)})" if attempt > 1 else ""))
            limit = self._time_limit(definition.timeout_s if definition.timeout_s is not None
                                     else self.request.timeout_s)
            verdict = run_definition(dataclasses.replace(definition, config=config, timeout_s=limit), context)
            self._check_stop()  # a probe stopped by the cancellation is no evaluation of the commit
            outcome = _outcome(verdict.status)
            self._record(commit, attempt, outcome, verdict, _first_sentence(_relative_to(verdict.why, tree)),
                         self._budget(config, budget_field))
            if outcome != "inconclusive":
                break
            if len(self.rows) >= self.request.max_evaluations:
                break
        assert verdict is not None
        return _Judged(_commit_outcome(verdict.status), verdict)

    def _workdir(self, tree: Path) -> Path:
        """Where the commit's probe runs: the worktree's counterpart of the folder glmfb was
        started in when that is inside the repository (a path the definition writes relative
        to the working folder then means the same file of the commit), else the worktree's top."""
        assert self.repo is not None
        here = Path.cwd().resolve()
        if not here.is_relative_to(self.repo):
            return tree
        counterpart = tree / here.relative_to(self.repo)
        return counterpart if counterpart.is_dir() else tree

    def _fence(self, commit: Commit, tree: Path, good_tree: Path) -> ImportFence:
        """Nothing the probe imports may come from the user's checkout; a pair's two worktrees
        may share no module whose file differs between them."""
        assert self.repo is not None and self.good is not None
        sides = (("GOOD", str(good_tree)), (commit.short, str(tree))) if self.paired and tree != good_tree else ()
        return ImportFence(str(self.repo), sides)

    def _set_up(self, tree: Path, commit: Commit) -> None:
        if not self.request.setup:
            return
        self._check_stop()
        log = self.report_dir / EVALUATIONS_DIR / f"setup-{commit.short}.txt"
        problem = run_setup(self.request.setup, tree, min(self.request.timeout_s or SETUP_TIMEOUT_S, self._time_left()),
                            log)
        self._check_stop()
        if problem is not None:
            raise _Skip(f"set-up failed: {problem}")

    def _check_stop(self) -> None:
        """Raise :class:`_Stopped` once the bisection is cancelled or its time is spent."""
        if self.cancel is not None and self.cancel.is_set():
            raise _Stopped("the bisection was cancelled")
        if self.deadline is not None and self.clock.monotonic() >= self.deadline:
            raise _Stopped("its time budget ran out")

    def _time_left(self) -> float:
        """Seconds before the deadline (at least a moment; infinite without one)."""
        return math.inf if self.deadline is None else max(self.deadline - self.clock.monotonic(), 0.1)

    def _time_limit(self, limit: float | None) -> float | None:
        """``limit`` (seconds; None: the default), shortened to the time left before the deadline."""
        if self.deadline is None:
            return limit
        return self._time_left() if limit is None else min(limit, self._time_left())

    def _definition_at(self, tree: Path, commit: Commit) -> ProbeDefinition:
        assert self.relative is not None
        path = tree / self.relative
        if not path.is_file():
            raise _Skip(f"{self.relative} does not exist at {commit.short}")
        try:
            definitions = load_definitions([path])
        except GlmfbError as exc:
            raise _Skip(f"{self.relative} does not load at {commit.short}: {_relative_to(str(exc), tree)}") from None
        for definition in definitions:
            if definition.name == self.name:
                return definition
        raise _Skip(f"{self.relative} has no definition {self.name!r} at {commit.short}")

    def _paired(self, good: ProbeDefinition, commit: ProbeDefinition, at: Commit) -> ProbeDefinition:
        """The commit's definition with its baseline read in GOOD's worktree (pair probes); the
        config built as ``glmfb run`` builds it. Raises :class:`_Skip` when it cannot be built, or
        when both sides would be the same code in one process."""
        if not self.paired:
            spec = commit.spec
        else:
            baseline_args, _ = good.spec.side_args()
            _, candidate_args = commit.spec.side_args()
            spec = dataclasses.replace(
                commit.spec, baseline=good.spec.anchored(good.spec.baseline) if good.spec.baseline else None, args={},
                baseline_args=baseline_args, candidate_args=candidate_args,
            )
            problem = shared_code(spec)
            if problem is not None:
                raise _Skip(problem)
        try:
            config = get_probe(self.kind).build(spec)
        except UsageError as exc:
            raise _Skip(str(exc)) from None
        if self.paired and self.good is not None:  # a why names each side by its commit, not a worktree's folder
            config = _labelled(config, baseline=f"{good.spec.baseline} at {self.good.short} (GOOD)",
                               candidate=f"{commit.spec.candidate} at {at.short}")
        return dataclasses.replace(commit, spec=spec, config=config, expect=None)

    def _budget(self, config: Any, budget_field: str | None) -> str | None:
        if budget_field is None:
            return None
        from glmfb.contract.options import options_of

        spec = next((s for s in options_of(type(config)) if s.attr == budget_field), None)
        value = getattr(config, budget_field)
        return str(spec.write(value)) if spec is not None else f"{value:g}"

    def _record(self, commit: Commit, attempt: int, outcome: str, verdict: Verdict | None, why: str,
                budget: str | None = None) -> None:
        metric = verdict.metric if verdict is not None else None
        self.rows.append(BisectEvaluation(
            commit=commit.sha, subject=commit.subject, attempt=attempt, outcome=outcome,
            status=verdict.status.value if verdict is not None else None,
            metric=metric.name if metric is not None else None, value=metric.value if metric is not None else None,
            ci=metric.ci if metric is not None else None, unit=metric.unit if metric is not None else "",
            budget=budget, duration_s=verdict.duration_s if verdict is not None else 0.0, why=why,
        ))
        status = verdict.status.value if verdict is not None else "no probe ran"
        self.progress(f"  {commit.short}: {outcome} ({status})")

    # ---- answers ----------------------------------------------------------------------------

    def _bisection(self, *, culprit: Commit | None = None, last_good: Commit | None = None,
                   unsplit: tuple[Commit, ...] = ()) -> Bisection:
        return Bisection(
            repository=str(self.repo or ""), definition=str(self.relative or self.request.definition),
            good=self.good.sha if self.good else self.request.good, bad=self.bad.sha if self.bad else self.request.bad,
            commits=len(self.chain), evaluations=tuple(self.rows),
            skipped=tuple(c.sha for c in self.skipped), unknown=tuple(c.sha for c in self.unknown),
            culprit=culprit.sha if culprit else None, last_good=last_good.sha if last_good else None,
            unsplit=tuple(c.sha for c in unsplit),
        )

    def _counts(self) -> str:
        text = f"{len(self.rows)} evaluations over {len(self.chain)} commits"
        around = []
        if self.skipped:
            around.append(f"{len(self.skipped)} skipped")
        if self.unknown:
            around.append(f"{len(self.unknown)} unknown")
        return text + (f", around {' and '.join(around)}" if around else "")

    def error(self, why: str, *, next: tuple[Step | str, ...] = ()) -> Verdict:
        return Verdict.harness_error(self.kind, self.name, why, evidence=[self._bisection()], next=next)

    def _layer(self) -> Layer:
        return get_probe(self.kind).layer

    def _against(self) -> str:
        return " against GOOD" if self.paired else ""

    def _not_confirmed(self, confirm: _Judged) -> Verdict:
        assert self.good is not None and self.bad is not None
        held = [BisectVerdict(role="BAD against GOOD" if self.paired else "BAD", commit=self.bad.sha,
                              subject=self.bad.subject, verdict=confirm.verdict.to_dict())] if confirm.verdict else []
        evidence = [self._bisection(), *held]
        detail = _first_sentence(confirm.verdict.why) if confirm.verdict else self.rows[-1].why
        if confirm.outcome is Outcome.GOOD:
            assert confirm.verdict is not None
            return Verdict(
                probe=self.kind, name=self.name, status=Status.PASS, layer=confirm.verdict.layer,
                why=f"no regression between GOOD {self.good.describe()} and BAD {self.bad.describe()}: "
                    f"BAD{self._against()} {_verb(confirm.verdict.status)} ({detail})",
                metric=confirm.verdict.metric, evidence=tuple(evidence),
            )
        if confirm.outcome is Outcome.UNKNOWN:
            return Verdict(
                probe=self.kind, name=self.name, status=Status.INCONCLUSIVE, layer=self._layer(),
                why=f"could not tell whether BAD {self.bad.describe()} regressed{self._against()}: inconclusive "
                    f"in {len(self.rows)} tries{f', the last with budget {last}' if (last := self.rows[-1].budget) else ''} "
                    f"({detail})",
                metric=confirm.verdict.metric if confirm.verdict else None, evidence=tuple(evidence),
                next=(Step("make the definition decisive (a larger budget, a threshold further from the change), "
                           "then bisect again"),),
            )
        return Verdict.harness_error(self.kind, self.name,
                                     f"BAD {self.bad.describe()} cannot be evaluated: {detail}", evidence=evidence,
                                     next=("run the definition at BAD alone to see the error; fix it and rerun",))

    def _good_does_not_pass(self, judged: _Judged) -> Verdict:
        assert self.good is not None
        status = judged.verdict.status.value if judged.verdict else "no verdict"
        culprit = self.chain[0]
        return Verdict(
            probe=self.kind, name=self.name, status=Status.INCONCLUSIVE, layer=self._layer(),
            why=f"the first commit after GOOD, {culprit.describe()}, fails, but GOOD {self.good.short} "
                f"against itself does not pass ({status}), so the probe cannot separate the two; {self._counts()}",
            evidence=(self._bisection(unsplit=(culprit, culprit)),),
            next=(Step("make the definition pass GOOD against itself (a larger budget, a looser threshold), "
                       "then bisect again"),),
        )

    def _unsplit(self, search: Search, *, budget_spent: bool = False) -> Verdict:
        assert self.good is not None and self.bad is not None and self.repo is not None
        first_index, last_index = search.unsplit()
        first, last = self.chain[first_index], self.chain[last_index]
        size = last_index - first_index + 1
        before = self.chain[first_index - 1] if first_index > 0 else self.good
        if budget_spent:
            reason = f"the {self.request.max_evaluations} evaluations allowed (--max-evaluations) were spent"
            next_steps: tuple[Step, ...] = (Step(
                "bisect the range that is left, with more evaluations", command="bisect",
                arguments={"good": before.sha, "bad": last.sha, "definition": str(self.request.definition),
                           "select": [self.name], "max_evaluations": self.request.max_evaluations * 2}),)
        else:
            inside = [c.short for c in self.chain[first_index:last_index]]
            reason = f"{', '.join(inside)} could not be judged (skipped or unknown: see the evaluations)"
            next_steps = (Step(f"read the {size} commits: git -C {self.repo} log {before.short}..{last.short}"),)
        return Verdict(
            probe=self.kind, name=self.name, status=Status.INCONCLUSIVE, layer=self._layer(),
            why=f"the regression between GOOD {self.good.short} and BAD {self.bad.short} starts in "
                f"{first.short}..{last.short} ({size} commits, ending with {last.describe()}), which could not be "
                f"split: {reason}; {self._counts()}",
            evidence=(self._bisection(unsplit=(first, last)),), next=next_steps,
        )

    def _culprit(self, index: int, bad: _Judged, good: _Judged) -> Verdict:
        assert self.good is not None and self.bad is not None and self.repo is not None
        assert bad.verdict is not None and good.verdict is not None
        culprit = self.chain[index]
        before = self.chain[index - 1] if index > 0 else self.good
        where = {**bad.verdict.where, "commit": culprit.sha}
        return Verdict(
            probe=self.kind, name=self.name, status=Status.FAIL, layer=bad.verdict.layer, where=where,
            why=f"the regression starts at {culprit.describe()}: it fails{self._against()} "
                f"({_first_sentence(bad.verdict.why)}) and the commit before it, {before.describe()}, "
                f"{_verb(good.verdict.status)}; {self._counts()}",
            metric=bad.verdict.metric,
            evidence=(
                self._bisection(culprit=culprit, last_good=before),
                BisectVerdict(role="last good", commit=before.sha, subject=before.subject,
                              verdict=good.verdict.to_dict()),
                BisectVerdict(role="first bad", commit=culprit.sha, subject=culprit.subject,
                              verdict=bad.verdict.to_dict()),
            ),
            next=(Step(f"read the change: git -C {self.repo} show {culprit.short}"),),
            env=bad.verdict.env,
        )


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _outcome(status: Status) -> str:
    """What one evaluation made the commit: bad, good, inconclusive or skipped."""
    return {Status.FAIL: "bad", Status.PASS: "good", Status.WARN: "good",
            Status.INCONCLUSIVE: "inconclusive"}.get(status, "skipped")


def _commit_outcome(status: Status) -> Outcome:
    return {Status.FAIL: Outcome.BAD, Status.PASS: Outcome.GOOD, Status.WARN: Outcome.GOOD,
            Status.INCONCLUSIVE: Outcome.UNKNOWN}.get(status, Outcome.SKIPPED)


def _verb(status: Status) -> str:
    return {Status.PASS: "passes", Status.WARN: "warns", Status.FAIL: "fails"}.get(status, f"is {status.value}")


def _first_sentence(text: str, limit: int = 240) -> str:
    sentence = text.strip().split(". ")[0].rstrip(".")
    return sentence if len(sentence) <= limit else sentence[: limit - 3].rstrip() + "..."


def _relative_to(text: str, tree: Path) -> str:
    """An error message with the temporary worktree's path left out (it is gone afterwards)."""
    return text.replace(str(tree) + os.sep, "").replace(str(tree), ".")


def _labelled(config: Any, **labels: str) -> Any:
    """``config`` with its side targets (the fields ``labels`` names that hold a
    :class:`~glmfb.core.targets.Target`) labelled."""
    changes = {which: dataclasses.replace(target, label=label) for which, label in labels.items()
               if isinstance(target := getattr(config, which, None), Target)}
    return dataclasses.replace(config, **changes) if changes else config


def shared_code(spec: ProbeSpec) -> str | None:
    """Why the two sides of ``spec`` would run the same code, or None. Both sides are loaded
    in one process, and a module name is imported once there: a target inside a package (both
    versions import as ``package.module``), a target that imports a module kept beside it, or a
    reference by module name (found on the import path, not in a worktree) would compare a
    version against itself. Refusing is better than a pass that compares nothing."""
    for which in ("baseline", "candidate"):
        ref = getattr(spec, which)
        if not ref:
            continue
        location, sep, _ = ref.rpartition(":")
        location = location if sep else ref
        if not is_file_ref(location):
            return (f"the {which} {ref!r} names a module, which is imported from the import path, not from "
                    "the commit's worktree; name a file (path/to/file.py:factory)")
        path = Path(location) if Path(location).is_absolute() else (spec.base_dir or Path.cwd()) / location
        if path.suffix != ".py" or not path.is_file():
            continue
        if (path.parent / "__init__.py").is_file():
            return (f"the {which} {path.name} sits in the package {path.parent.name}, so both versions would import "
                    f"as {path.parent.name}.{path.stem} and one process holds only one of them; point the "
                    "definition at a file outside the package that loads what it needs")
        sibling = _imported_sibling(path)
        if sibling is not None:
            return (f"the {which} {path.name} imports {sibling}, which sits beside it: one process imports it once, "
                    "so both sides would run the same version; keep the target's code in the target file")
    return None


def _imported_sibling(path: Path) -> str | None:
    """The first module ``path`` imports that lives in its own folder (``import helpers`` with
    ``helpers.py`` or ``helpers/`` beside it), or None (also when the file does not parse: the
    probe reports that)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if (path.parent / f"{top}.py").is_file() or (path.parent / top / "__init__.py").is_file():
                return top
    return None


def run_setup(command: str, cwd: Path, timeout_s: float, log: Path) -> str | None:
    """Run the set-up shell command in a worktree (its output to ``log``); None when it
    succeeded, else what went wrong in one line. A set-up past its timeout, or interrupted, is
    stopped with every process it started."""
    from glmfb.core.process import ProcessTree

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as output:
        process = subprocess.Popen(command, shell=True, cwd=cwd, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            ProcessTree(process.pid, leads_group=True).stop()
            process.wait()
            return f"{command!r} did not finish in {timeout_s:g} s"
        except BaseException:
            ProcessTree(process.pid, leads_group=True).stop()
            process.wait()
            raise
    if returncode == 0:
        return None
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    tail = f": {lines[-1].strip()[:200]}" if lines else ""
    return f"{command!r} exited with status {returncode}{tail}"
