"""Series and their change points: the ``glmfb.history/1`` document and ``--check``.

A series is the rows of one (definition, metric, machine), oldest first; machines are never
mixed unless asked (``all_machines``: one series per definition and metric). Its change points
come from :func:`glmfb.workflows.history.changepoints.change_points` on each run's value and interval;
each names the last run before it and the first run after it (with their commits), the size
of the step with its interval, and its confidence (1 - p).

``--check`` asks of each series whether its newest segment (the runs after its last change
point) is worse than the segment before by more than a threshold, in the metric's own terms
(:func:`glmfb.workflows.history.metrics.regression`); when the change points before it worsened too
(a creep cut into several steps), against the segment before the first of them.

A creep need not make a step: on a busy host a kernel growing 1.5% a commit shows no change
point, and the step test alone gave it a clean bill. So ``--check`` also reads the trend of
the newest segment's newest ``TREND_RUNS`` runs (a least-squares line, its variance floored by
the runs' own intervals, as a segment's level is): a series ``regressed`` when a step passes
the threshold, or when the trend is worse by more than the threshold and its one-sided 99.5%
lower bound is above 0; it ``cannot_tell`` when the trend's one-sided 95% upper bound passes
the threshold, or the half-width of that bound alone does (the runs scatter too much to rule
out a creep of that size, even where their trend happens to read better), or when it has
fewer than 4 runs and no change point; else it passes. ``cannot_tell`` is never a pass: it
exits 4 (inconclusive), as the gate does.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from glmfb.workflows.history.metrics import MetricKind, Worse, regression
from glmfb.workflows.history.store import Record

HISTORY_SCHEMA = "glmfb.history/1"


@dataclass(frozen=True)
class Step:
    """A change point of a series, with the runs on either side of it."""

    index: int  # the first run of the new segment
    before_run: Record
    after_run: Record
    before: float
    after: float
    change: float
    change_low: float | None
    change_high: float | None
    p_value: float
    regression: float  # how much worse after is than before (negative: better), as the metric compares
    regression_low: float | None
    regression_high: float | None
    earliest: int | None = None  # the runs the new segment may start at: from earliest ...
    latest: int | None = None  # ... to latest (indices like ``index``; None: not computed)
    location_level: float = 0.95  # the nominal level of those bounds (the change point's confidence)

    @property
    def confidence(self) -> float:
        return 1.0 - self.p_value


@dataclass(frozen=True)
class Series:
    """The runs of one definition and metric on one machine (or all, when asked)."""

    definition: str
    metric: str
    machine: str | None  # None: machines mixed (--all-machines)
    records: tuple[Record, ...]
    steps: tuple[Step, ...]

    @property
    def kind(self) -> MetricKind:
        newest = self.records[-1]
        return MetricKind(Worse(newest.worse), newest.relative)

    @property
    def newest(self) -> Record:
        return self.records[-1]

    @property
    def machine_label(self) -> str:
        return self.newest.machine_label if self.machine is not None else "all machines"

    def worsening(self) -> tuple[Step, ...]:
        """The newest change point and the unbroken run of worsening change points before it:
        a creep of +1% a commit is often cut into two or three steps, each under a threshold,
        that only add up to a regression together. Empty when the newest change point is an
        improvement or there is none."""
        chain: list[Step] = []
        for step in reversed(self.steps):
            if step.regression <= 0:
                break
            chain.insert(0, step)
        return tuple(chain) if chain and chain[-1] is self.steps[-1] else ()

    def check(self, threshold: float) -> float | None:
        """How much worse the newest segment is than the segment before its worsening began
        (:meth:`worsening`: the one before, unless the steps before it also worsened), when
        that exceeds ``threshold``; None otherwise (also with no change point). The step test
        only: :meth:`judge` adds the trend and "cannot tell"."""
        chain = self.worsening()
        if not chain:
            return None
        worse = chain[0].regression if len(chain) == 1 else regression(chain[0].before, chain[-1].after, self.kind)
        return worse if worse > threshold else None

    def window(self) -> tuple[int, int]:
        """``[start, stop)`` of the runs the trend test reads: the newest segment (the runs
        after the last change point), at most its newest ``TREND_RUNS``."""
        start = self.steps[-1].index if self.steps else 0
        return max(start, len(self.records) - TREND_RUNS), len(self.records)

    def judge(self, threshold: float) -> Judgement:
        """``--check``'s answer for this series (module docstring)."""
        from glmfb.workflows.history.changepoints import Observation, trend

        stepped = self.check(threshold)
        start, stop = self.window()
        rows = self.records[start:stop]
        found = trend([Observation(r.value if r.value is not None else 0.0, r.low, r.high) for r in rows])
        creep = None if found is None else _creep(found, start, self.kind)
        if stepped is not None:
            chain = self.worsening()
            return Judgement(REGRESSED, stepped, f"the newest segment is {_amount(stepped, self.kind)} worse than the "
                             f"runs before run {chain[0].index + 1} (a step test: change points)", creep)
        if found is None and self.steps:  # a newest segment of 3 runs after a change point: the step test judged it
            return Judgement(PASS, None, "the newest change point is not a regression past the threshold "
                             "(its segment is too short for a trend)", None)
        if found is None:
            return Judgement(CANNOT_TELL, None, f"{len(self.records)} run{'s' if len(self.records) != 1 else ''}: "
                             "too few to rule out a regression (4 or more judge a trend)", None)
        if creep is None:
            return Judgement(CANNOT_TELL, None, "the newest runs' level is 0: no fraction of it to judge a trend by",
                             None)
        over = f"over runs {start + 1}-{stop}"
        noise = (f"runs scatter {_amount(creep.scatter, self.kind, sign=False, pm=True)} about the trend"
                 f" (their own intervals {_amount(creep.own, self.kind, sign=False, pm=True)})")
        if creep.worse > threshold and creep.worse_low > 0.0:
            return Judgement(REGRESSED, creep.worse, f"a creep: the runs {over} trend {_amount(creep.worse, self.kind)} "
                             f"worse [{_amount(creep.worse_low, self.kind)}, {_amount(creep.worse_high, self.kind)}] "
                             f"(a trend test; no step past the threshold)", creep)
        if creep.worse_high > threshold or creep.resolution > threshold:
            return Judgement(CANNOT_TELL, None, f"{noise}: a creep of {_amount(threshold, self.kind, sign=False)} "
                             f"{over} cannot be ruled out (the trend reads {_amount(creep.worse, self.kind)}, "
                             f"at most {_amount(creep.worse_high, self.kind)}; the runs' noise alone leaves "
                             f"{_amount(creep.resolution, self.kind, sign=False, pm=True)} over them)", creep)
        return Judgement(PASS, None, f"no step past the threshold, and a creep of "
                         f"{_amount(threshold, self.kind, sign=False)} {over} is ruled out (the trend reads "
                         f"{_amount(creep.worse, self.kind)}, at most {_amount(creep.worse_high, self.kind)})", creep)


PASS, REGRESSED, CANNOT_TELL = "pass", "regressed", "cannot_tell"
TREND_RUNS = 20  # the newest runs of a segment the trend test reads
CREEP_CONFIDENCE = 0.995  # a creep's one-sided lower bound must be above 0 (alpha 1%, two-sided, as the steps')
RULE_OUT_CONFIDENCE = 0.95  # a creep of the threshold is ruled out when the one-sided upper bound is under it


@dataclass(frozen=True)
class Creep:
    """The trend of a series' newest runs (``start``..``stop``, indices of the series) in the
    metric's terms: ``worse`` over the window (negative: better), its one-sided bounds
    (``worse_low`` at ``CREEP_CONFIDENCE``, ``worse_high`` at ``RULE_OUT_CONFIDENCE``), and the
    runs' noise: ``scatter`` about the line and ``own`` (their intervals' sd), in the same
    terms (a fraction of the level, or points for a relative metric), and ``resolution``, the
    one-sided ``RULE_OUT_CONFIDENCE`` half-width of ``worse``: a creep smaller than that is
    hidden in the noise whatever the trend reads."""

    start: int
    stop: int
    worse: float
    worse_low: float
    worse_high: float
    scatter: float
    own: float
    resolution: float  # the one-sided half-width at RULE_OUT_CONFIDENCE: what the noise alone leaves open


@dataclass(frozen=True)
class Judgement:
    """``--check``'s answer for one series: ``status`` (``pass``, ``regressed`` or
    ``cannot_tell``), how much worse when regressed, the reason in words, and the trend read."""

    status: str
    worse: float | None
    reason: str
    creep: Creep | None


def _creep(found: Any, start: int, kind: MetricKind) -> Creep | None:
    """A :class:`~glmfb.workflows.history.changepoints.Trend` in the metric's terms (None
    when its level at the window's start is 0 for a quantity: no fraction of it)."""
    level = float(found.start)
    if not kind.relative and level == 0.0:
        return None
    scale = 1.0 if kind.relative else abs(level)
    low = regression(level, level + found.bound(CREEP_CONFIDENCE, upper=kind.worse is not Worse.HIGHER), kind)
    high = regression(level, level + found.bound(RULE_OUT_CONFIDENCE, upper=kind.worse is Worse.HIGHER), kind)
    resolution = (found.bound(RULE_OUT_CONFIDENCE, upper=True) - found.change) / scale
    return Creep(start, start + found.runs, regression(level, level + found.change, kind), low, high,
                 found.scatter / scale, found.own / scale, resolution)


def _amount(value: float, kind: MetricKind, *, sign: bool = True, pm: bool = False) -> str:
    """A fraction as the check speaks of it: ``+5.0%`` (of the level), ``+5.0 pts`` (relative)."""
    text = f"{value * 100:{'+' if sign else ''}.1f}" + (" pts" if kind.relative else "%")
    return "\u00b1" + text if pm else text


def matches(name: str, patterns: Sequence[str]) -> bool:
    """A definition name against ``glmfb run -k`` patterns (glob or substring; all when none)."""
    return not patterns or any(fnmatch.fnmatchcase(name, p) or p in name for p in patterns)


def build_series(records: Sequence[Record], patterns: Sequence[str] = (), *, all_machines: bool = False,
                 min_segment: int = 3, alpha: float = 0.01) -> list[Series]:
    """The series of the rows whose definition matches ``patterns`` (rows without a metric
    value, such as an error verdict's, are in none), sorted by definition, metric, machine."""
    groups: dict[tuple[str, str, str | None], list[Record]] = {}
    for record in records:
        if record.metric is None or record.value is None or not matches(record.definition, patterns):
            continue
        key = (record.definition, record.metric, None if all_machines else record.machine)
        groups.setdefault(key, []).append(record)
    return [_series(key, tuple(rows), min_segment, alpha)
            for key, rows in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1], item[0][2] or ""))]


def _series(key: tuple[str, str, str | None], records: tuple[Record, ...], min_segment: int, alpha: float) -> Series:
    from glmfb.workflows.history.changepoints import Observation, change_points

    observations = [Observation(r.value if r.value is not None else 0.0, r.low, r.high) for r in records]
    kind = MetricKind(Worse(records[-1].worse), records[-1].relative)
    steps = tuple(_step(point, records, kind) for point in change_points(observations, min_segment=min_segment,
                                                                         alpha=alpha))
    return Series(key[0], key[1], key[2], records, steps)


def _step(point: Any, records: Sequence[Record], kind: MetricKind) -> Step:
    """A change point with its runs, and its size as the metric compares (the interval of the
    change carried over the same way, oriented so that low <= high)."""
    before, after = float(point.before), float(point.after)
    low = high = None
    if point.change_low is not None and point.change_high is not None:
        ends = sorted(regression(before, before + float(edge), kind) for edge in (point.change_low, point.change_high))
        low, high = ends
    return Step(index=int(point.index), before_run=records[point.index - 1], after_run=records[point.index],
                before=before, after=after, change=float(point.change),
                change_low=None if point.change_low is None else float(point.change_low),
                change_high=None if point.change_high is None else float(point.change_high),
                p_value=float(point.p_value), regression=regression(before, after, kind),
                regression_low=low, regression_high=high,
                earliest=point.earliest, latest=point.latest, location_level=point.confidence)


# --------------------------------------------------------------------------------------------
# The document
# --------------------------------------------------------------------------------------------


def _run(record: Record) -> dict[str, Any]:
    return {"run_id": record.run_id, "time": record.time, "commit": record.commit, "dirty": record.dirty}


def _point(record: Record) -> dict[str, Any]:
    ci = [record.low, record.high] if record.low is not None and record.high is not None else None
    return {**_run(record), "value": record.value, "ci": ci, "status": record.status,
            "definition_hash": record.definition_hash, "machine": record.machine}


def _number(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None


def series_document(series: Series, threshold: float | None = None) -> dict[str, Any]:
    newest = series.newest
    data: dict[str, Any] = {
        "definition": series.definition, "metric": series.metric, "unit": newest.unit or "",
        "worse": newest.worse, "relative": newest.relative, "probe": newest.probe,
        "machine": series.machine, "machine_label": series.machine_label, "runs": len(series.records),
        "newest": _point(newest), "points": [_point(r) for r in series.records],
        "change_points": [{
            "index": step.index, "last_before": _run(step.before_run), "first_after": _run(step.after_run),
            "before": step.before, "after": step.after, "change": step.change,
            "change_ci": ([step.change_low, step.change_high]
                          if step.change_low is not None and step.change_high is not None else None),
            "regression": _number(step.regression),
            "regression_ci": ([_number(step.regression_low), _number(step.regression_high)]
                              if step.regression_low is not None and step.regression_high is not None else None),
            "p_value": step.p_value, "confidence": step.confidence,
            **({"location": {"earliest": step.earliest, "latest": step.latest, "nominal": step.location_level,
                             "earliest_run": _run(series.records[step.earliest]),
                             "latest_run": _run(series.records[step.latest])}}
               if step.earliest is not None and step.latest is not None else {}),
        } for step in series.steps],
    }
    if threshold is not None:
        judged = series.judge(threshold)
        data["regressed"] = judged.status == REGRESSED
        data["check"] = {"status": judged.status, "reason": judged.reason, "worse": _number_or_none(judged.worse)}
        if judged.creep is not None:
            c = judged.creep
            data["check"]["trend"] = {
                "first_run": c.start, "last_run": c.stop - 1, "worse": _number(c.worse),
                "worse_low": _number(c.worse_low), "worse_high": _number(c.worse_high),
                "scatter": _number(c.scatter), "own": _number(c.own), "resolution": _number(c.resolution)}
    return data


def _number_or_none(value: float | None) -> float | None:
    return None if value is None else _number(value)


def history_document(series: Sequence[Series], *, store: str, patterns: Sequence[str], all_machines: bool,
                     threshold: float | None = None) -> dict[str, Any]:
    """The ``glmfb.history/1`` document (``threshold``: the check's, when one was asked)."""
    documents = [series_document(s, threshold) for s in series]
    data: dict[str, Any] = {
        "schema": HISTORY_SCHEMA, "store": store, "patterns": list(patterns), "all_machines": all_machines,
        "series": documents,
    }
    if threshold is not None:
        data["threshold"] = threshold
        data["regressed"] = sum(1 for d in documents if d["check"]["status"] == REGRESSED)
        data["cannot_tell"] = sum(1 for d in documents if d["check"]["status"] == CANNOT_TELL)
        data["exit_code"] = check_exit_code(data)
    return data


def check_exit_code(document: dict[str, Any]) -> int:
    """What ``glmfb history --check`` exits with: 1 when a series regressed, else 4
    (inconclusive, never a pass) when a series cannot tell, else 0."""
    from glmfb.contract.errors import ExitCode

    if document.get("regressed"):
        return int(ExitCode.REGRESSION)
    if document.get("cannot_tell"):
        return int(ExitCode.INCONCLUSIVE)
    return int(ExitCode.OK)


_NUMBER_OR_NULL = {"type": ["number", "null"]}
_INTERVAL = {"type": ["array", "null"], "items": _NUMBER_OR_NULL, "minItems": 2, "maxItems": 2}
_RUN: dict[str, Any] = {
    "type": "object",
    "required": ["run_id", "time", "commit", "dirty"],
    "properties": {
        "run_id": {"type": "string"}, "time": {"type": "string"},
        "commit": {"type": ["string", "null"]}, "dirty": {"type": ["boolean", "null"]},
    },
    "additionalProperties": False,
}
_POINT: dict[str, Any] = {
    "type": "object",
    "required": ["run_id", "time", "commit", "dirty", "value", "ci", "status"],
    "properties": {
        **_RUN["properties"], "value": {"type": "number"}, "ci": _INTERVAL, "status": {"type": "string"},
        "definition_hash": {"type": ["string", "null"]}, "machine": {"type": "string"},
    },
    "additionalProperties": False,
}
_CHANGE_POINT: dict[str, Any] = {
    "type": "object",
    "required": ["index", "last_before", "first_after", "before", "after", "change", "regression", "p_value",
                 "confidence"],
    "properties": {
        "index": {"type": "integer", "minimum": 1, "description": "the first run of the new segment"},
        "last_before": _RUN, "first_after": _RUN,
        "before": {"type": "number", "description": "the level of the segment before"},
        "after": {"type": "number", "description": "the level of the segment after"},
        "change": {"type": "number", "description": "after - before, in the metric's unit"},
        "change_ci": _INTERVAL,
        "regression": {**_NUMBER_OR_NULL, "description": "how much worse after is (negative: better): the "
                       "difference for a relative metric, else a fraction of before (null: before is 0)"},
        "regression_ci": _INTERVAL,
        "p_value": {"type": "number", "minimum": 0},
        "confidence": {"type": "number", "minimum": 0},
        "location": {
            "type": "object",
            "description": "where the new segment may start: its first run is one of runs earliest..latest "
                           "(indices like `index`), the `nominal` quantiles of the best split over bootstraps of "
                           "the two segments (a nominal level, not the coverage: docs/history.md). On a noisy "
                           "series a neighbour of `index` may be the true start: the commits to bisect are those "
                           "after the run before `earliest_run`, up to `latest_run`",
            "required": ["earliest", "latest", "nominal", "earliest_run", "latest_run"],
            "properties": {"earliest": {"type": "integer", "minimum": 1}, "latest": {"type": "integer", "minimum": 1},
                           "nominal": {"type": "number"}, "earliest_run": _RUN, "latest_run": _RUN},
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}
_CHECK: dict[str, Any] = {
    "type": "object",
    "description": "with the check: this series' answer: `regressed` (a step past the threshold, or a creep: "
                   "the newest runs' trend significantly worse and past it), `cannot_tell` (the runs' noise, or "
                   "their number, cannot rule out a regression of the threshold's size: never a pass) or `pass`",
    "required": ["status", "reason", "worse"],
    "properties": {
        "status": {"enum": [PASS, REGRESSED, CANNOT_TELL]},
        "reason": {"type": "string"},
        "worse": {**_NUMBER_OR_NULL, "description": "how much worse, when regressed (as `regression`)"},
        "trend": {
            "type": "object",
            "description": "the least-squares trend of the newest segment's newest runs (`first_run`..`last_run`, "
                           "indices of `points`): how much worse over them, as `regression`, with a lower bound "
                           "(one-sided 99.5%) and an upper bound (one-sided 95%: a creep past the threshold is "
                           "ruled out when it is under it, and `resolution` is under it too: that bound's "
                           "half-width, what the noise alone leaves open), and the runs' noise in the same terms: "
                           "`scatter` (sd about the trend) and `own` (their own intervals' sd)",
            "required": ["first_run", "last_run", "worse", "worse_low", "worse_high", "scatter", "own", "resolution"],
            "properties": {
                "first_run": {"type": "integer", "minimum": 0}, "last_run": {"type": "integer", "minimum": 0},
                "worse": _NUMBER_OR_NULL, "worse_low": _NUMBER_OR_NULL, "worse_high": _NUMBER_OR_NULL,
                "scatter": _NUMBER_OR_NULL, "own": _NUMBER_OR_NULL, "resolution": _NUMBER_OR_NULL,
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}
HISTORY_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://glmfb.dev/schema/history-1.json",
    "title": HISTORY_SCHEMA,
    "type": "object",
    "required": ["schema", "store", "patterns", "all_machines", "series"],
    "properties": {
        "schema": {"const": HISTORY_SCHEMA},
        "store": {"type": "string", "description": "the store read (without a password)"},
        "patterns": {"type": "array", "items": {"type": "string"}},
        "all_machines": {"type": "boolean"},
        "threshold": {"type": "number", "minimum": 0},
        "regressed": {"type": "integer", "minimum": 0, "description": "series whose newest segment is worse "
                      "than the one before by more than the threshold, or whose newest runs creep past it"},
        "cannot_tell": {"type": "integer", "minimum": 0, "description": "with the check: series whose runs are too "
                        "noisy (or too few) to rule out a regression of the threshold's size (never a pass)"},
        "exit_code": {"type": "integer", "description": "with the check: what glmfb history --check exits with "
                      "(0 pass, 1 some series regressed, 4 none did but some cannot tell)"},
        "series": {"type": "array", "items": {
            "type": "object",
            "required": ["definition", "metric", "unit", "worse", "relative", "machine", "machine_label", "runs",
                         "newest", "points", "change_points"],
            "properties": {
                "definition": {"type": "string"}, "metric": {"type": "string"}, "unit": {"type": "string"},
                "worse": {"enum": [w.value for w in Worse]}, "relative": {"type": "boolean"},
                "probe": {"type": "string"},
                "machine": {"type": ["string", "null"], "description": "the machine fingerprint (null: all)"},
                "machine_label": {"type": "string"}, "runs": {"type": "integer", "minimum": 1},
                "newest": _POINT, "points": {"type": "array", "items": _POINT},
                "change_points": {"type": "array", "items": _CHANGE_POINT},
                "regressed": {"type": "boolean"},
                "check": _CHECK,
            },
            "additionalProperties": False,
        }},
    },
    "additionalProperties": False,
}


# --------------------------------------------------------------------------------------------
# The series of one run, for its report
# --------------------------------------------------------------------------------------------


REPORT_WINDOW = 200  # runs of a series a run's report reads, up to that run: its cost, whatever the history's length


def history_of_run(url: str, run_id: str, *, window: int = REPORT_WINDOW, min_runs: int = 2) -> list[dict[str, Any]]:
    """The series documents (as in ``glmfb.history/1``) of run ``run_id``'s verdicts, read from
    the store at ``url``: each series' newest ``window`` runs up to that run, with its change
    points found in them, and ``runs_in_store``, how many it holds up to that run (a series of
    fewer than ``min_runs`` is no history yet). None when that SQLite file does not exist. A
    store that cannot be read raises :class:`~glmfb.workflows.history.store.HistoryError`."""
    from glmfb.workflows.history.store import SQLITE_PREFIX, open_store, sqlite_path

    if url.startswith(SQLITE_PREFIX) and not sqlite_path(url).is_file():
        return []
    with open_store(url, create=False) as store:
        found = store.run_series(run_id, window)
    documents = []
    for records, total in found:
        for series in build_series(records):
            if len(series.records) >= min_runs:
                documents.append({**series_document(series), "runs_in_store": total})
    return documents
