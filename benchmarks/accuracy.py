"""Accuracy of glmfb on the acceptance corpus: every case of tests/acceptance/ (third-party code
with a planted bug, or its clean twin) run through glmfb, its verdict scored against what the
case expects, one table row per case.

    python benchmarks/accuracy.py [-k PATTERN]... [--json FILE] [--out reports] [-v] [--smoke]

A case is a ``[[probe]]`` table in ``tests/acceptance/*.toml`` (``glmfb run tests/acceptance``
runs the same definitions). Its ``expect`` gives status, layer and ``where``; its description
starts with the rest of its expectation in brackets::

    description = "[rule=precision-rounding; why=bf16|bfloat16; why-not=fp16] text"

- ``rule``: the rule that must fire, named by the class of bug (the vocabulary is
  :data:`RULES`); ``rule=a|b`` accepts either, for a case whose regime sits on the threshold
  between two rules that name the same cause (its description says which figure decides);
- ``why`` / ``why-not``: regular expressions (case-insensitive) the why must match / that
  neither the why nor any next step may match;
- ``minimal-length``: the length the diff minimizer must shrink the failing request to.

A case is right only when status, layer, every expected ``where`` key, the rule and each of the
optional checks hold, glmfb names none of its own frames as a cause (``own-frame``), and a diff
verdict says nothing its own evidence contradicts (``claim``: :mod:`glmfb.diff.claims`). The
fired rule is read from an evidence item of kind ``diagnosis`` with a ``rule`` field (glmfb's
rule names that name one of the corpus's classes are read as that class: :data:`RENAMED`);
for verdicts that do not record one, from what older verdicts carry (diff's
``diagnosis_rule``, bench's ``op_diff`` and decisions), else inferred from the why (gil, gap).
The JSON says where each rule was read (``rule_source``). A case whose verdict is inconclusive
on a busy host (evidence ``host_load``: other processes kept 0.25 CPUs or more busy while it
measured; or a probe's busy-host rule) is neither right nor wrong: the table says
"undecided: busy host" and the summary counts it apart (``busy_host`` in the JSON), and the
corpus's pytest skips it with the verdict's why. Exit code 0 when every case is right, 1
otherwise, 2 for a corpus that does not parse.

``--smoke`` runs two fast cases (:data:`SMOKE_CASES`: a diff with a planted bug and a gil clean
twin) unless ``-k`` chooses: CI checks the script runs; that score is not the corpus's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "acceptance"

# The rules a case may expect, per probe kind (the classes of bug of issue 15).
RULES: dict[str, tuple[str, ...]] = {
    "diff": ("precision-rounding", "systematic-bias", "growing-with-length", "position-onset",
             "growing-along-sequence", "non-finite", "module-tree-differs", "rounding-size", "pass"),
    "gil": ("gil-hold-native", "gil-hold-compute", "gil-wait-share", "pass"),
    "gap": ("gil-starved-sender", "cpu-contention", "bandwidth-bound", "candidate-only-phase", "over-threshold", "pass"),
    "bench": ("redundant-recomputation", "lost-fusion", "slower-op", "memory-traffic", "more-calls", "equivalent"),
}
TAG_KEYS = frozenset({"rule", "why", "why-not", "minimal-length"})
TAG = re.compile(r"^\[([^\]]*)\]")
# glmfb's rule names (today's) that name one of the corpus's classes: read as that class.
RENAMED: dict[str, dict[str, str]] = {
    "diff": {},
    "bench": {},
    "gil": {},
    "gap": {},
}
PY_FILE = re.compile(r"[\w./-]+\.py\b")  # a file the why names (relative or absolute)
# Fast cases whose verdicts no load can change (numerics; a thread that releases the GIL).
SMOKE_CASES = ("diff-cp-scan-off-by-one", "gil-sqlite-query-releases")
SMOKE_NOTE = ("smoke run (--smoke): {cases} of the corpus; the score and seconds are measured but are not the "
              "corpus's")


class CorpusError(Exception):
    """A case that does not parse: file, case and what is wrong."""


@dataclass(frozen=True)
class Case:
    """One acceptance case: the probe definition and what a correct verdict says."""

    definition: Any  # glmfb.workflows.suite.ProbeDefinition
    rule: str
    why: str | None = None
    why_not: str | None = None
    minimal_length: int | None = None

    @property
    def name(self) -> str:
        return str(self.definition.name)

    @property
    def rules(self) -> tuple[str, ...]:
        """The rules a right verdict may fire (``rule=a|b``: either)."""
        return tuple(self.rule.split("|"))

    @property
    def kind(self) -> str:
        probe = self.definition.probe
        return str(getattr(probe, "value", probe))

    def expected(self) -> dict[str, Any]:
        expect = self.definition.expect
        data: dict[str, Any] = {
            "status": expect.status.value if expect and expect.status else None,
            "layer": expect.layer.value if expect and expect.layer else None,
            "where": dict(expect.where) if expect else {},
            "rule": self.rule,
        }
        for key, value in (("why", self.why), ("why_not", self.why_not),
                           ("minimal_length", self.minimal_length)):
            if value is not None:
                data[key] = value
        return data


def parse_tag(description: str, label: str) -> dict[str, str]:
    """``[rule=x; why=y]`` at the start of a description -> ``{"rule": "x", "why": "y"}``."""
    match = TAG.match(description)
    if match is None:
        raise CorpusError(f"{label}: the description must start with [rule=NAME; ...]")
    fields: dict[str, str] = {}
    for part in match.group(1).split(";"):
        key, sep, value = part.strip().partition("=")
        if not sep or not value.strip():
            raise CorpusError(f"{label}: {part.strip()!r} in the tag is not KEY=VALUE")
        if key not in TAG_KEYS:
            raise CorpusError(f"{label}: unknown tag key {key!r} (known: {', '.join(sorted(TAG_KEYS))})")
        fields[key] = value.strip()
    if "rule" not in fields:
        raise CorpusError(f"{label}: the tag names no rule")
    return fields


def load_cases(corpus: Path = CORPUS, patterns: Sequence[str] = ()) -> list[Case]:
    """Every case of the corpus (or those whose name matches a pattern), checked."""
    from glmfb.contract.errors import GlmfbError
    from glmfb.workflows.suite import discover, load_definitions, select

    try:
        definitions = select(load_definitions(discover([corpus])), list(patterns))
    except GlmfbError as exc:
        raise CorpusError(str(exc)) from exc
    cases = []
    for definition in definitions:
        label = definition.label
        fields = parse_tag(definition.description, label)
        kind = str(getattr(definition.probe, "value", definition.probe))
        for rule in fields["rule"].split("|"):
            if rule not in RULES[kind]:
                raise CorpusError(f"{label}: rule {rule!r} is not a {kind} rule ({', '.join(RULES[kind])})")
        if definition.expect is None or definition.expect.status is None or definition.expect.layer is None:
            raise CorpusError(f"{label}: expect needs status and layer")
        for key in ("why", "why-not"):
            if key in fields:
                try:
                    re.compile(fields[key])
                except re.error as exc:
                    raise CorpusError(f"{label}: {key} is not a regular expression: {exc}") from exc
        minimal = fields.get("minimal-length")
        if minimal is not None and not minimal.isdigit():
            raise CorpusError(f"{label}: minimal-length must be an integer, got {minimal!r}")
        cases.append(Case(definition, fields["rule"], fields.get("why"), fields.get("why-not"),
                          int(minimal) if minimal is not None else None))
    return cases


# --------------------------------------------------------------------------------------------
# The rule a verdict says fired
# --------------------------------------------------------------------------------------------


from glmfb.core.measure.hostload import BUSY_OTHER_CPUS  # noqa: E402  (what a probe's why calls a busy host)

# the inconclusive rules for a loaded host: the gil probe's, then the gap probe's
BUSY_HOST_RULES = ("busy-host", "busy-waiter", "undecided-wait-share", "undecided-busy-host")


def _evidence(verdict: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((item for item in verdict["evidence"] if item.get("kind") == kind), None)


def fired_rule(verdict: Mapping[str, Any]) -> tuple[str | None, str]:
    """``(rule, source)``: the rule a verdict (its JSON form) says fired and where that was read."""
    status = verdict["status"]
    if status in ("error", "inconclusive"):
        return None, status
    kind = verdict["probe"]
    diagnosis = _evidence(verdict, "diagnosis")
    if diagnosis is not None and diagnosis.get("rule"):
        raw = str(diagnosis["rule"])
        rule = RENAMED.get(kind, {}).get(raw, raw)
        return rule, "diagnosis" if rule == raw else f"diagnosis: {raw}"
    if kind == "diff":
        return _diff_rule(verdict)
    if kind == "bench":
        return _bench_rule(verdict)
    if kind == "gil":
        return _gil_rule(verdict)
    return _gap_rule(verdict)


def _diff_rule(verdict: Mapping[str, Any]) -> tuple[str | None, str]:
    recorded = _evidence(verdict, "diagnosis_rule")
    if recorded is None:
        return None, "none"
    rule = str(recorded.get("rule"))
    return RENAMED["diff"].get(rule, rule), "diagnosis_rule"


def _bench_rule(verdict: Mapping[str, Any]) -> tuple[str | None, str]:
    op_diff = _evidence(verdict, "op_diff")
    if op_diff is not None and op_diff.get("rule"):
        rule = str(op_diff["rule"])
        return RENAMED["bench"].get(rule, rule), "op_diff"
    decisions = {item.get("decision") for item in verdict["evidence"] if item.get("kind") == "shape"}
    if verdict["status"] == "pass" and decisions == {"equivalent"}:
        return "equivalent", "decision"
    if decisions:
        return "/".join(sorted(str(d) for d in decisions)), "decision"
    return None, "none"


def _gil_rule(verdict: Mapping[str, Any]) -> tuple[str | None, str]:
    why = verdict["why"]
    if verdict["status"] == "pass":
        return "pass", "status"
    if "holds the GIL inside a native call" in why:
        return "gil-hold-native", "why"
    if "hogs the interpreter" in why or " held the GIL in " in why:
        return "gil-hold-compute", "why"
    return None, "why"


def _gap_rule(verdict: Mapping[str, Any]) -> tuple[str | None, str]:
    if verdict["status"] == "pass":
        return "pass", "status"
    attribution = _evidence(verdict, "gil_attribution")
    if "the link is saturated" in verdict["why"]:
        return "bandwidth-bound", "why"
    if attribution is not None and attribution.get("holder_function") and attribution.get("starved_thread"):
        return "gil-starved-sender", "why"
    return None, "why"


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------


@dataclass
class Score:
    """One case's verdict against its expectation; ``wrong`` names each part that missed."""

    case: Case
    verdict: dict[str, Any]  # the verdict's JSON form (glmfb.verdict/1)
    seconds: float
    rule: str | None = None
    rule_source: str = ""
    wrong: list[str] = field(default_factory=list)

    @property
    def right(self) -> bool:
        return not self.wrong

    @property
    def busy_host(self) -> str | None:
        """Why this case's verdict is an undecided one on a busy host, else None: inconclusive,
        and either other processes kept :data:`BUSY_OTHER_CPUS` or more busy while it measured
        (evidence ``host_load``, the probe's ``busy`` reading where it has one) or a probe's
        busy-host rule fired. Such a case is not right, and not wrong either: the probe said it could not decide, and why."""
        if self.verdict["status"] != "inconclusive":
            return None
        load = _evidence(self.verdict, "host_load")
        if load is not None:
            busy = load.get("busy")  # the probe's own reading; older verdicts have none
            if busy is None:
                busy = float(load.get("other_busy_cpus") or 0.0) >= BUSY_OTHER_CPUS
            if busy:
                return f"other processes kept {float(load['other_busy_cpus']):.1f} of {load.get('cpus')} CPUs busy"
        diagnosis = _evidence(self.verdict, "diagnosis")
        if diagnosis is not None and diagnosis.get("rule") in BUSY_HOST_RULES:
            return f"the probe's busy-host rule {diagnosis['rule']}"
        return None

    def to_dict(self) -> dict[str, Any]:
        verdict = self.verdict
        return {
            "case": self.case.name,
            "probe": self.case.kind,
            "expected": self.case.expected(),
            "got": {
                "status": verdict["status"],
                "layer": verdict["layer"],
                "where": dict(verdict["where"]),
                "rule": self.rule,
                "rule_source": self.rule_source,
                "why": verdict["why"],
            },
            "right": self.right,
            "wrong": list(self.wrong),
            "busy_host": self.busy_host,
            "seconds": round(self.seconds, 2),
        }


def _own_frames(verdict: Mapping[str, Any]) -> list[str]:
    """Where glmfb names its own code as the cause (a file of the glmfb package)."""
    import glmfb

    package = Path(glmfb.__file__).resolve().parent
    found = []
    file = verdict["where"].get("file")
    if isinstance(file, str) and file:
        path = Path(file)
        resolved = (path if path.is_absolute() else Path.cwd() / path).resolve()
        if resolved.is_relative_to(package):
            found.append(f"where.file {file}")
    if verdict["status"] != "pass":
        # Told by where the file is, never by a name in its path: a checkout may well sit in a
        # folder called glmfb.
        for match in PY_FILE.finditer(verdict["why"]):
            path = Path(match.group(0))
            try:
                resolved = (path if path.is_absolute() else Path.cwd() / path).resolve()
            except (OSError, ValueError):
                continue
            if resolved.is_relative_to(package):
                found.append(f"why names {match.group(0)}")
    return found


def score(case: Case, verdict: Any, seconds: float) -> Score:
    """Judge one verdict (a glmfb Verdict) against its case."""
    data: dict[str, Any] = verdict.to_dict()
    result = Score(case, data, seconds)
    result.rule, result.rule_source = fired_rule(data)
    result.wrong.extend(case.definition.expect.mismatches(verdict))
    verdict = data
    if result.rule not in case.rules:
        result.wrong.append(f"rule: expected {case.rule}, got {result.rule or '-'} ({result.rule_source})")
    if case.why is not None and not re.search(case.why, verdict["why"], re.IGNORECASE):
        result.wrong.append(f"why: does not match /{case.why}/")
    if case.why_not is not None:
        # A next step is a typed step (a dict: why, command, arguments): read all of it.
        for item in (verdict["why"], *verdict["next"]):
            text = item if isinstance(item, str) else json.dumps(item)
            match = re.search(case.why_not, text, re.IGNORECASE)
            if match:
                result.wrong.append(f"why-not: says {match.group(0)!r}")
                break
    if case.minimal_length is not None:
        minimal = _evidence(verdict, "minimal_reproducer")
        got = minimal.get("length") if minimal else None
        if got != case.minimal_length:
            result.wrong.append(f"minimal-length: expected {case.minimal_length}, got {got if got is not None else '-'}")
    result.wrong.extend(f"own-frame: {item}" for item in _own_frames(verdict))
    result.wrong.extend(f"claim: {item}" for item in contradicted_claims(verdict))
    return result


def contradicted_claims(verdict: Mapping[str, Any]) -> list[str]:
    """What a diff verdict (its JSON form) says against its own evidence: each claim of
    :mod:`glmfb.diff.claims` said in its why, next steps or where whose precondition the
    diagnosis's ``saw`` does not meet."""
    if verdict["probe"] != "diff":
        return []
    from glmfb.diff.claims import contradicted

    diagnosis = _evidence(verdict, "diagnosis") or {}
    steps = [step if isinstance(step, str) else json.dumps(step) for step in verdict["next"]]
    return [f"{claim.name} said without {claim.requires}"
            for claim in contradicted(verdict["why"], steps, verdict["where"], diagnosis.get("saw") or {})]


def run_case(case: Case, context: Any) -> Score:
    """Run one case through glmfb (the suite's Python API) and score its verdict, which is kept
    as ``verdict.json`` beside the case's artifacts (a wrong case can be read after the run)."""
    from glmfb.core.io import write_json_atomic
    from glmfb.workflows.suite import run_definition

    started = time.perf_counter()
    verdict = run_definition(case.definition, context)
    elapsed = time.perf_counter() - started
    folder = context.probe_context(case.definition).artifact_dir
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "verdict.json", verdict.to_dict())
    return score(case, verdict, elapsed)


@contextlib.contextmanager
def corpus_context(out: Path, progress: bool = False) -> Iterator[Any]:
    """A suite context writing artifacts under ``out/accuracy-<run id>/``, with a pool open as
    ``glmfb run`` opens one while it is used: each case's probe forks from one warm zygote."""
    from glmfb.contract.clock import new_run_id
    from glmfb.core import workers
    from glmfb.workflows.suite import SuiteContext

    run_id = f"accuracy-{new_run_id()}"
    on_progress = (lambda message: print(f"    {message}", file=sys.stderr)) if progress else None
    with workers.pool("run"):
        yield SuiteContext(run_id=run_id, report_dir=out / run_id, on_progress=on_progress)


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


def _where_text(where: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in where.items()) or "-"


def _rule_text(s: Score) -> str:
    """The rule as scored, with glmfb's own name beside it when it was read as a class."""
    raw = s.rule_source.removeprefix("diagnosis: ") if s.rule_source.startswith("diagnosis: ") else None
    return f"{s.rule} ({raw})" if raw else (s.rule or "-")


def rows(scores: Sequence[Score]) -> list[tuple[str, str, str, str, str]]:
    table = []
    for s in scores:
        expected = s.case.expected()
        got = s.verdict
        table.append((
            s.case.name,
            f"{expected['status']}/{expected['layer']} {_where_text(expected['where'])} [{s.case.rule}]",
            f"{got['status']}/{got['layer']} {_where_text(got['where'])} [{_rule_text(s)}]",
            "right" if s.right else "undecided: busy host" if s.busy_host else
            "WRONG: " + ", ".join(w.split(":")[0] for w in s.wrong),
            f"{s.seconds:.1f}",
        ))
    return table


def format_table(scores: Sequence[Score], verbose: bool = False) -> str:
    header = ("case", "expected (status/layer where [rule])", "got", "result", "s")
    body = rows(scores)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for score_row, s in zip(body, scores, strict=True):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(score_row, widths, strict=True)).rstrip())
        if verbose and not s.right:
            for problem in s.wrong:
                lines.append(f"    - {problem}")
            lines.append(f"    why: {s.verdict['why']}")
    lines.append("")
    lines.append(summary(scores))
    return "\n".join(lines)


def summary(scores: Sequence[Score]) -> str:
    kinds = sorted({s.case.kind for s in scores})
    per_kind = ", ".join(
        f"{kind} {sum(s.right for s in scores if s.case.kind == kind)}/{sum(s.case.kind == kind for s in scores)}"
        for kind in kinds
    )
    twins = [s for s in scores if set(s.case.rules) & {"pass", "equivalent"}]
    busy = sum(1 for s in scores if not s.right and s.busy_host)
    return (f"right: {sum(s.right for s in scores)}/{len(scores)} ({per_kind}); clean twins "
            f"{sum(s.right for s in twins)}/{len(twins)}"
            + (f"; undecided on a busy host (neither right nor wrong): {busy}" if busy else "")
            + f"; {sum(s.seconds for s in scores):.0f} s of probes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-k", dest="patterns", action="append", default=[],
                        help="only cases whose name matches (glob or substring), repeatable")
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="the corpus folder")
    parser.add_argument("--json", type=Path, default=None, help="also write the table as JSON")
    parser.add_argument("--out", type=Path, default=None,
                        help="where artifacts go [default: reports, or a temporary folder with --smoke]")
    parser.add_argument("-v", "--verbose", action="store_true", help="each wrong part and the why")
    parser.add_argument("--smoke", action="store_true",
                        help=f"only {', '.join(SMOKE_CASES)} unless -k chooses (CI checks the script runs)")
    options = parser.parse_args(argv)
    scratch = None
    if options.out is None and options.smoke:  # CI's smoke leaves the checkout's reports/ alone
        import tempfile

        scratch = tempfile.TemporaryDirectory(prefix="glmfb-accuracy-")
        options.out = Path(scratch.name)
    elif options.out is None:
        options.out = Path("reports")
    if options.smoke:
        options.patterns = options.patterns or list(SMOKE_CASES)
        print(SMOKE_NOTE.format(cases=", ".join(options.patterns)), flush=True)
    try:
        cases = load_cases(options.corpus, options.patterns)
    except CorpusError as exc:
        print(f"accuracy: error: {exc}", file=sys.stderr)
        return 2
    if not cases:
        print(f"accuracy: error: no case matches {options.patterns}", file=sys.stderr)
        return 2
    scores: list[Score] = []
    started = time.perf_counter()
    with corpus_context(options.out) as context:
        for index, case in enumerate(cases, start=1):
            print(f"[{index}/{len(cases)}] {case.name}", file=sys.stderr, flush=True)
            scores.append(run_case(case, context))
    wall_s = time.perf_counter() - started
    print(format_table(scores, options.verbose))
    print(f"wall time {wall_s:.0f} s for {len(cases)} cases")
    if options.json is not None:
        from glmfb.core.io import write_json_atomic

        write_json_atomic(options.json, {
            "schema": "glmfb.accuracy/1",
            "corpus": str(options.corpus),
            "wall_s": round(wall_s, 1),
            "right": sum(s.right for s in scores),
            "cases": len(scores),
            "rows": [s.to_dict() for s in scores],
        })
    return 0 if all(s.right for s in scores) else 1


if __name__ == "__main__":
    raise SystemExit(main())
